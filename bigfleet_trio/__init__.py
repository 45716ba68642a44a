"""bigfleet-trio: BigFleet's per-cluster agent and pod controller on Trio.

The operator and the pod controller; how they fit together is ``docs/architecture.md``, the
rules they follow ``docs/rules.md``, the wire contract ``docs/wire.md``.
"""

__version__ = "0.1.0"
