"""NodeStateUpdate -> UpcomingNode: the engine's machine lifecycle made visible in the cluster.

One cluster-scoped ``UpcomingNode`` named ``un-<machine_id>`` per machine
(docs/rules.md#upcomingnode-phases). :mod:`.plan` decides (pure: naming, phases, spec, drain
memory, :func:`plan_node_state_update`); :mod:`.handler` reads, writes and retries
(:class:`UpcomingNodeHandler`). This package re-exports the public names of both.
"""

from bigfleet_trio.kube.mergepatch import merge_diff
from bigfleet_trio.kube.retry import Replan

from . import handler, plan
from .handler import *  # noqa: F403
from .plan import *  # noqa: F403

# The public names of both modules, plus two that moved to bigfleet_trio.kube (still importable
# from here, as before the split).
__all__ = ["Replan", "merge_diff"]
__all__ += plan.__all__
__all__ += handler.__all__
