"""bigfleet-trio: BigFleet's per-cluster agent and pod controller on Trio.

Seed 000 ("The operator and the unschedulable-pod controller") is the design this package
implements; ``../shared/protocol.md`` fixes the wire.
"""

__version__ = "0.1.0"
