"""The Kubernetes ecosystem's standard metric names, fed alongside our ``bigfleet_*`` series.

Dashboards and alerts written for Go controllers read client-go's and controller-runtime's
names; each series here is fed from the same call as its ``bigfleet_*`` counterpart, so the two
move together (docs/operate.md#standard-metric-names):

* client-go work queue, labelled ``name`` (the queue's): ``workqueue_depth``,
  ``workqueue_adds_total``, ``workqueue_retries_total``, ``workqueue_queue_duration_seconds``,
  ``workqueue_work_duration_seconds``, and, read at scrape time from the start times of the
  keys workers hold, ``workqueue_unfinished_work_seconds`` and
  ``workqueue_longest_running_processor_seconds``; :class:`StandardQueueMetrics` is the
  :class:`~bigfleet_trio.kube.workqueue.QueueMetrics` a queue takes (one line per queue).
* client-go REST client: ``rest_client_requests_total{code,method,host}`` and
  ``rest_client_request_duration_seconds{verb,host}`` (:func:`observe_request`).
* controller-runtime: ``controller_runtime_reconcile_total{controller,result}``,
  ``controller_runtime_reconcile_errors_total{controller}``,
  ``controller_runtime_reconcile_time_seconds{controller}`` (:func:`observe_reconcile`).
* client-go leader election: ``leader_election_master_status{name}`` (:func:`set_leader`).

Shared by both binaries (no binary prefix in
:data:`~bigfleet_trio.observability.metrics.BINARY_PREFIXES`).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Counter, Gauge, Histogram

from bigfleet_trio.observability.metrics import LEADER, exponential_buckets

__all__ = [
    "QUEUE_ADDS",
    "QUEUE_DEPTH",
    "QUEUE_LATENCY",
    "QUEUE_RETRIES",
    "QUEUE_WORK",
    "QUEUE_UNFINISHED",
    "QUEUE_LONGEST",
    "RECONCILE_ERRORS",
    "RECONCILE_RESULTS",
    "RECONCILE_TIME",
    "REST_REQUESTS",
    "REST_REQUEST_DURATION",
    "LEADER_MASTER_STATUS",
    "StandardQueueMetrics",
    "observe_reconcile",
    "observe_request",
    "set_leader",
    "acting_alone",
]

_QUEUE_BUCKETS = exponential_buckets(1e-6, 10, 10)  # 1 µs .. 1000 s

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
    buckets=_QUEUE_BUCKETS,
)
QUEUE_WORK = Histogram(
    "workqueue_work_duration_seconds",
    "Seconds a worker holds a key (one reconcile).",
    ["name"],
    buckets=_QUEUE_BUCKETS,
)

QUEUE_UNFINISHED = Gauge(
    "workqueue_unfinished_work_seconds",
    "Seconds of work in progress not yet done: the time every key a worker holds has been held, "
    "summed (client-go's name; read at scrape time). Large values indicate stuck workers.",
    ["name"],
)
QUEUE_LONGEST = Gauge(
    "workqueue_longest_running_processor_seconds",
    "Seconds the longest-held key has been held by its worker (client-go's name; read at scrape "
    "time).",
    ["name"],
)

REST_REQUESTS = Counter(
    "rest_client_requests",
    "Apiserver requests by HTTP status code (\"<error>\": no answer), method and host; the same "
    "requests as bigfleet_kube_client_request_duration_seconds.",
    ["code", "method", "host"],
)
REST_REQUEST_DURATION = Histogram(
    "rest_client_request_duration_seconds",
    "Apiserver request latency in seconds by verb and host (client-go's name).",
    ["verb", "host"],
    buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0),
)

RECONCILE_RESULTS = Counter(
    "controller_runtime_reconcile",
    "Reconciles per controller by result (success|error|requeue).",
    ["controller", "result"],
)
RECONCILE_ERRORS = Counter(
    "controller_runtime_reconcile_errors", "Reconcile errors per controller.", ["controller"]
)
RECONCILE_TIME = Histogram(
    "controller_runtime_reconcile_time_seconds",
    "Seconds per reconcile, per controller.",
    ["controller"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6,
             0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5, 6, 7, 8, 9,
             10, 15, 20, 25, 30, 40, 50, 60),
)

LEADER_MASTER_STATUS = Gauge(
    "leader_election_master_status",
    "1 while this replica leads under the lock ``name``, else 0 (client-go's name; the same "
    "value as bigfleet_leader_election_is_leader).",
    ["name"],
)


class StandardQueueMetrics:
    """:class:`~bigfleet_trio.kube.workqueue.QueueMetrics` feeding client-go's ``workqueue_*``.

    Args:
        name: the ``name`` label (the controller's or queue's name, bounded: one per queue).
    """

    def __init__(self, name: str) -> None:
        self._depth = QUEUE_DEPTH.labels(name=name)
        self._adds = QUEUE_ADDS.labels(name=name)
        self._retries = QUEUE_RETRIES.labels(name=name)
        self._latency = QUEUE_LATENCY.labels(name=name)
        self._work = QUEUE_WORK.labels(name=name)
        self._unfinished = QUEUE_UNFINISHED.labels(name=name)
        self._longest = QUEUE_LONGEST.labels(name=name)

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

    def watch(self, in_flight: Callable[[], tuple[float, float]]) -> None:
        """Read the two in-flight gauges from ``in_flight()`` at each scrape (a later queue of
        the same name replaces an earlier one's probe)."""
        self._unfinished.set_function(lambda: in_flight()[0])
        self._longest.set_function(lambda: in_flight()[1])


def observe_request(method: str, status: int, host: str, seconds: float) -> None:
    """Count one apiserver request.

    Args:
        method: the HTTP method (``GET`` …), the ``method`` and ``verb`` labels.
        status: the HTTP status, 0 for no answer (``code="<error>"`` as client-go).
        host: ``host[:port]`` of the apiserver (one per process).
        seconds: from sending to the answer read.
    """
    code = str(status) if status else "<error>"
    REST_REQUESTS.labels(code=code, method=method, host=host).inc()
    REST_REQUEST_DURATION.labels(verb=method, host=host).observe(seconds)


def observe_reconcile(controller: str, result: str, seconds: float) -> None:
    """Count one reconcile of ``controller``.

    Args:
        result: ``success``, ``error`` (also counted in the errors total) or ``requeue``.
        seconds: the reconcile's duration.
    """
    RECONCILE_RESULTS.labels(controller=controller, result=result).inc()
    if result == "error":
        RECONCILE_ERRORS.labels(controller=controller).inc()
    RECONCILE_TIME.labels(controller=controller).observe(seconds)


def set_leader(name: str, leading: bool) -> None:
    """``leader_election_master_status{name}``: 1 while leading under lock ``name``."""
    LEADER_MASTER_STATUS.labels(name=name).set(1.0 if leading else 0.0)


def acting_alone(name: str) -> None:
    """Without ``--leader-elect`` the replica acts alone, so leads: both leader gauges at 1
    (docs/operate.md#bigfleetnoleader); ``name`` is the ``--leader-election-id``."""
    LEADER.set(1)
    set_leader(name, True)
