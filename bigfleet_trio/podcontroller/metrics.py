"""Prometheus metrics of the pod controller.

* ``bigfleet_unschedulable_pod_controller_reconciles_total{outcome}`` (the reference's name), with
  outcomes :data:`OUTCOMES`: ``cr_created``, ``cr_exists``, ``cr_updated``, ``pod_gone``,
  ``pod_terminal``, ``invalid_pod``, ``error`` (plus ``orphan_deleted`` for our orphan clean-up,
  ``unsupported_requirement`` for a Pod whose requirement operator is not a node-selector one,
  ``cr_rejected`` for a CR write the apiserver refused with 422 Invalid, ``excluded`` and
  ``unmanaged_node`` for a Pod that gets no CR on purpose:
  docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out).
* ``bigfleet_unschedulable_pod_controller_zone_pins_total{decision}``: reconciles of a Pod with
  a required zone co-location term, by the zone pin's decision (:data:`PIN_DECISIONS`; rule:
  docs/rules.md#pod-translation-co-location-zone-pin).
* The work queue reports client-go's ``workqueue_*`` names, labelled ``name``, through
  :class:`~bigfleet_trio.observability.stdmetrics.StandardQueueMetrics` (kept here as
  :data:`PrometheusQueueMetrics`).

Module-level singletons in :data:`prometheus_client.REGISTRY` (served by
:func:`bigfleet_trio.observability.http.serve_observability`).
"""

from __future__ import annotations

from prometheus_client import Counter

from bigfleet_trio.observability.stdmetrics import StandardQueueMetrics

__all__ = [
    "OUTCOMES",
    "PIN_DECISIONS",
    "RECONCILES",
    "ZONE_PINS",
    "PrometheusQueueMetrics",
    "count_reconcile",
    "count_zone_pin",
]

OUTCOMES = (
    "cr_created",
    "cr_exists",
    "cr_updated",
    "pod_gone",
    "pod_terminal",
    "invalid_pod",
    "unsupported_requirement",
    "cr_rejected",
    "orphan_deleted",
    "excluded",
    "unmanaged_node",
    "error",
)

RECONCILES = Counter(
    "bigfleet_unschedulable_pod_controller_reconciles",
    "Pod controller reconciles by outcome.",
    ["outcome"],
)
for _outcome in OUTCOMES:  # export every series from the start (zero), as Go does after use
    RECONCILES.labels(outcome=_outcome)

PIN_DECISIONS = ("pinned", "several_zones", "not_running", "own_zone", "opted_out",
                 "namespace_selector")
ZONE_PINS = Counter(
    "bigfleet_unschedulable_pod_controller_zone_pins",
    "Reconciles of co-located Pods (zone term) by the zone pin's decision.",
    ["decision"],
)
for _decision in PIN_DECISIONS:
    ZONE_PINS.labels(decision=_decision)


def count_zone_pin(decision: str) -> None:
    """Count one zone pin decision (one of :data:`PIN_DECISIONS`)."""
    ZONE_PINS.labels(decision=decision).inc()


def count_reconcile(outcome: str) -> None:
    """Count one reconcile with ``outcome`` (one of :data:`OUTCOMES`)."""
    RECONCILES.labels(outcome=outcome).inc()


PrometheusQueueMetrics = StandardQueueMetrics
"""The pod controller's queue metrics (client-go's ``workqueue_*``; kept name)."""
