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
* Work-queue metrics named like client-go's ``workqueue_*`` (controller-runtime exposes those
  for the Go controller), labelled ``name``: ``workqueue_depth``, ``workqueue_adds_total``,
  ``workqueue_retries_total``, ``workqueue_queue_duration_seconds``,
  ``workqueue_work_duration_seconds``.

Module-level singletons in :data:`prometheus_client.REGISTRY` (served by
:func:`bigfleet_trio.observability.http.serve_observability`).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from bigfleet_trio.observability.metrics import exponential_buckets

__all__ = [
    "OUTCOMES",
    "PIN_DECISIONS",
    "RECONCILES",
    "ZONE_PINS",
    "QUEUE_ADDS",
    "QUEUE_DEPTH",
    "QUEUE_LATENCY",
    "QUEUE_RETRIES",
    "QUEUE_WORK",
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

QUEUE_DEPTH = Gauge("workqueue_depth", "Current depth of the work queue.", ["name"])
QUEUE_ADDS = Counter(
    "workqueue_adds", "Keys added to the work queue (after de-duplication).", ["name"]
)
QUEUE_RETRIES = Counter(
    "workqueue_retries", "Rate-limited re-adds (retries) of the work queue.", ["name"]
)
QUEUE_LATENCY = Histogram(
    "workqueue_queue_duration_seconds",
    "Seconds a key waits in the work queue before a worker takes it.",
    ["name"],
    buckets=exponential_buckets(1e-6, 10, 10),
)
QUEUE_WORK = Histogram(
    "workqueue_work_duration_seconds",
    "Seconds a worker holds a key (one reconcile).",
    ["name"],
    buckets=exponential_buckets(1e-6, 10, 10),
)


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


class PrometheusQueueMetrics:
    """:class:`~bigfleet_trio.kube.workqueue.QueueMetrics` backed by the gauges above.

    Args:
        name: the ``name`` label (the controller name).
    """

    def __init__(self, name: str) -> None:
        self._depth = QUEUE_DEPTH.labels(name=name)
        self._adds = QUEUE_ADDS.labels(name=name)
        self._retries = QUEUE_RETRIES.labels(name=name)
        self._latency = QUEUE_LATENCY.labels(name=name)
        self._work = QUEUE_WORK.labels(name=name)

    def added(self) -> None:
        self._adds.inc()

    def depth(self, n: int) -> None:
        self._depth.set(n)

    def retried(self) -> None:
        self._retries.inc()

    def waited(self, seconds: float) -> None:
        self._latency.observe(seconds)

    def worked(self, seconds: float) -> None:
        self._work.observe(seconds)
