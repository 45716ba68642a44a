"""Observability: Prometheus metrics (:mod:`.metrics`) for the operator and the pod controller.

Seed 000 names the operator's metrics; the list is in reference-behavior.md §15. Other components
add their metrics to :mod:`bigfleet_trio.observability.metrics` next to the operator's.
"""
