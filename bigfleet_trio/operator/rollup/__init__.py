"""Roll-up pure core: CapacityRequest -> Profile/group/demand -> aggregated CapacityNeeds.

Builds the roll-up as the Go agent does, minus its known bugs
(docs/deviations.md#2-roll-up-and-acknowledgement-operatorrollup-wiringpy-acknowledgepy).
No I/O: :mod:`.translate` turns one CR into a contribution (keys from :mod:`.profile`),
:mod:`.aggregate` sums them (:class:`RollupAggregator`, driven from informer events by
``operator/wiring.py``), :mod:`.encoding` writes the wire form. Import from the defining
module.
"""
