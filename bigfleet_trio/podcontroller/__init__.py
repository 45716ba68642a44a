"""The pod controller: one CapacityRequest per non-terminal Pod.

Every non-terminal Pod gets exactly one CapacityRequest (upstream ADR-0039).
:mod:`.translate` is the pure Pod -> CapacityRequest translation, :mod:`.plan` the pure
per-Pod decision, :mod:`.controller` and :mod:`.apply` the I/O, and :mod:`.defaults` loads the
PriorityClass penalty defaults file.
"""
