"""Reclaim: cordon, ack, then drain on the operator's clock (docs/rules.md#reclaim).

:mod:`.plan` holds the pure rules (which Pods, which grace, what an eviction error means),
:mod:`.drain` the :class:`DrainManager` that runs one drain task per node, :mod:`.handler` the
:class:`ReclaimHandler` that resolves, cordons and acks, :mod:`.resume` the drains a restarted
operator takes up again. This package re-exports their public names.
"""

from . import drain, handler, plan, resume
from .drain import *  # noqa: F403
from .handler import *  # noqa: F403
from .plan import *  # noqa: F403
from .resume import *  # noqa: F403

__all__: list[str] = []
__all__ += plan.__all__
__all__ += drain.__all__
__all__ += handler.__all__
__all__ += resume.__all__
