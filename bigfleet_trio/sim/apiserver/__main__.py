"""Run the server.

Usage: ``python -m bigfleet_trio.sim.apiserver [PORT] [KUBECONFIG] [hypercorn|fast]``.
"""

import sys

from .serving import run_cli

raise SystemExit(
    run_cli(
        int(sys.argv[1]) if len(sys.argv) > 1 else 0,
        sys.argv[2] if len(sys.argv) > 2 else "kubeconfig.yaml",
        engine=sys.argv[3] if len(sys.argv) > 3 else "hypercorn",
    )
)
