"""The pod controller: one CapacityRequest per non-terminal Pod.

Seed 000 "The unschedulable-pod controller: one CapacityRequest per Pod" and seed 003
(ADR-0039). :mod:`.translate` is the pure Pod -> CapacityRequest translation,
:mod:`.defaults` loads the PriorityClass penalty defaults file, and :mod:`.expand` turns
workload manifests into the Pods their controllers and admission would create.
"""
