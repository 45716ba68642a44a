"""``python -m bigfleet_trio``: the same as the ``bigfleet-trio`` console script (design.md CLI)."""

import sys

from bigfleet_trio.cli import main

if __name__ == "__main__":
    sys.exit(main())
