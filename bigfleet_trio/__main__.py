"""``python -m bigfleet_trio``: the ``bigfleet-trio`` console script (:mod:`bigfleet_trio.cli`)."""

import sys

from bigfleet_trio.cli import main

if __name__ == "__main__":
    sys.exit(main())
