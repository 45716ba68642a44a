"""Roll-up pure core: CapacityRequest -> Profile/group/demand -> aggregated CapacityNeeds.

Builds the roll-up as the Go agent does, minus its known bugs
(docs/deviations.md#2-roll-up-and-acknowledgement-operatorrolluppy-wiringpy-acknowledgepy).
No I/O: :mod:`.translate` turns one CR into a contribution (keys from :mod:`.profile`),
:mod:`.aggregate` sums them (:class:`RollupAggregator`, driven from informer events by
``operator/wiring.py``), :mod:`.encoding` writes the wire form. Import from this package.
"""

from . import aggregate, encoding, errors, profile, translate
from .aggregate import *  # noqa: F403
from .encoding import *  # noqa: F403
from .errors import *  # noqa: F403
from .profile import *  # noqa: F403
from .translate import *  # noqa: F403

# The public names of the five modules (the public names of the one module before the split).
__all__: list[str] = []
__all__ += errors.__all__
__all__ += profile.__all__
__all__ += translate.__all__
__all__ += encoding.__all__
__all__ += aggregate.__all__
