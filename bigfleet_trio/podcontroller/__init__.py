"""The pod controller: one CapacityRequest per non-terminal Pod.

Every non-terminal Pod gets exactly one CapacityRequest (upstream ADR-0039).
:mod:`.translate` is the pure Pod -> CapacityRequest translation,
:mod:`.defaults` loads the PriorityClass penalty defaults file, and :mod:`.expand` turns
workload manifests into the Pods their controllers and admission would create.
"""
