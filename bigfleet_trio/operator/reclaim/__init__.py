"""Reclaim: cordon, ack, then drain on the operator's clock (docs/rules.md#reclaim).

:mod:`.plan` holds the pure rules (which Pods, which grace, what an eviction error means),
:mod:`.drain` the :class:`DrainManager` that runs one drain task per node, :mod:`.handler` the
:class:`ReclaimHandler` that resolves, cordons and acks, :mod:`.resume` the drains a restarted
operator takes up again. Import from the defining module.
"""
