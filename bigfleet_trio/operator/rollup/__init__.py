"""Roll-up pure core: CapacityRequest -> Profile/group/demand -> aggregated CapacityNeeds.

Builds the roll-up as the Go agent does, minus its known bugs
(docs/deviations.md#2-roll-up-and-acknowledgement-operatorrolluppy-wiringpy-acknowledgepy).
No I/O: :mod:`.translate` turns one CR into a contribution (keys from :mod:`.profile`),
:mod:`.aggregate` sums them (:class:`RollupAggregator`, driven from informer events by
``operator/wiring.py``), :mod:`.encoding` writes the wire form. Import from this package.
"""

from __future__ import annotations

from .aggregate import RollupAggregator, build_from_scratch
from .encoding import (
    build_rollup_message,
    encode_need,
    encode_operator_rollup,
    encode_rollup,
    need_to_wire,
)
from .errors import CapacityRequestError, InvalidCapacityRequest, UnsupportedRequirement
from .profile import (
    OP_DOES_NOT_EXIST,
    OP_EXISTS,
    OP_IN,
    OP_NOT_IN,
    OP_SAME,
    PENALTY_HALF_DOLLAR,
    PENALTY_PINNED,
    PENALTY_UNSPECIFIED,
    PENALTY_ZERO,
    WHEN_DO_NOT_SCHEDULE,
    WHEN_UNSPECIFIED,
    Profile,
    Requirement,
    Spread,
    bucket_for_dollars,
    canonical_label_selector,
    co_location_group,
    penalty_bucket,
    with_same_requirement,
)
from .translate import Contribution, contribution_from_cr, cr_key, is_pending

__all__ = [
    "OP_DOES_NOT_EXIST",
    "OP_EXISTS",
    "OP_IN",
    "OP_NOT_IN",
    "OP_SAME",
    "PENALTY_HALF_DOLLAR",
    "PENALTY_PINNED",
    "PENALTY_UNSPECIFIED",
    "PENALTY_ZERO",
    "WHEN_DO_NOT_SCHEDULE",
    "WHEN_UNSPECIFIED",
    "CapacityRequestError",
    "Contribution",
    "InvalidCapacityRequest",
    "Profile",
    "Requirement",
    "RollupAggregator",
    "Spread",
    "UnsupportedRequirement",
    "bucket_for_dollars",
    "build_from_scratch",
    "build_rollup_message",
    "canonical_label_selector",
    "co_location_group",
    "contribution_from_cr",
    "encode_need",
    "encode_operator_rollup",
    "encode_rollup",
    "cr_key",
    "is_pending",
    "need_to_wire",
    "penalty_bucket",
    "with_same_requirement",
]
