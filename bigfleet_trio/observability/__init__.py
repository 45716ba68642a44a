"""Observability: Prometheus metrics (:mod:`.metrics`) for the operator and the pod controller.

Also structured logs (:mod:`.logs`), the decision event feed (:mod:`.events`) and the
diagnostics listener (:mod:`.http`). Operator metrics keep the Go binary's names.
"""
