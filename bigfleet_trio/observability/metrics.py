"""Prometheus metrics of the operator, and each binary's view of the process's metrics.

Names follow the Go binaries' ``pkg/metrics`` so dashboards carry over; the extra operator
metrics (frames, coalescing, handler errors, session state) are ours. Metrics are module-level
singletons in :data:`prometheus_client.REGISTRY`; each binary serves a :class:`BinaryRegistry`
over it, so the pod controller never exports an operator family (an alert on
``bigfleet_operator_session_up`` would fire on it forever) and vice versa. Add new metrics in
your own section below, with your binary's name prefix; never rename one that exists.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Mapping

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

BINARY_PREFIXES: Mapping[str, tuple[str, ...]] = {
    "operator": ("bigfleet_operator_",),
    "pod-controller": ("bigfleet_unschedulable_pod_controller_",),
}
"""Metric family name prefixes owned by each binary; other families (``process_``,
``python_``, the Kubernetes client's) are shared and exported by every binary."""


def owner_of(family: str) -> str | None:
    """The binary that owns metric family ``family`` (None: shared by all)."""
    for binary, prefixes in BINARY_PREFIXES.items():
        if family.startswith(prefixes):
            return binary
    return None


class BinaryRegistry(CollectorRegistry):
    """The registry one binary serves on ``/metrics``: its own families plus shared ones.

    Args:
        binary: a key of :data:`BINARY_PREFIXES`, or None for every family (the demo, which
            runs both binaries in one process).
        source: the registry the metrics are registered in.
    """

    def __init__(self, binary: str | None, source: CollectorRegistry = REGISTRY) -> None:
        super().__init__(auto_describe=False)
        if binary is not None and binary not in BINARY_PREFIXES:
            raise ValueError(f"unknown binary {binary!r}")
        self.binary = binary
        self._source = source

    def collect(self) -> Iterable[Metric]:
        for family in self._source.collect():
            owner = owner_of(family.name)
            if self.binary is None or owner is None or owner == self.binary:
                yield family

    def restricted_registry(self, names: Iterable[str]) -> _Restricted:  # type: ignore[override]
        """``/metrics?name[]=…``: only those samples, still only this binary's families."""
        return _Restricted(self, self._source.restricted_registry(names))

    def families(self) -> list[str]:
        """Names of the families this binary exports, sorted."""
        return sorted(f.name for f in self.collect())


def exponential_buckets(start: float, factor: float, count: int) -> list[float]:
    """``count`` buckets ``start * factor**k``, k = 0..count-1 (Go ExponentialBuckets)."""
    if start <= 0 or factor <= 1 or count < 1:
        raise ValueError(f"bad buckets: start={start} factor={factor} count={count}")
    return [start * factor**k for k in range(count)]


class _Restricted:
    def __init__(self, owner: BinaryRegistry, inner: object) -> None:
        self._owner = owner
        self._inner = inner

    def collect(self) -> Iterable[Metric]:
        for family in self._inner.collect():  # type: ignore[attr-defined]
            owner = owner_of(family.name)
            if self._owner.binary is None or owner is None or owner == self._owner.binary:
                yield family


# --- shared: the Kubernetes layer (ours; kube/informer.py; every binary runs informers) -------

INFORMER_RELISTS = Counter(
    "bigfleet_informer_relists",
    "Informer LISTs applied to the cache, by resource plural and reason (initial|expired: a 410 "
    "on the watch|too_large_rv: a watch refused as newer than the server|rv_rollback: the "
    "server's resourceVersion went backwards|not_served: the resource itself answered 404, a "
    "CRD deleted, and is listed afresh once back).",
    ["resource", "reason"],
)

INFORMER_UNCHANGED = Counter(
    "bigfleet_informer_unchanged_events",
    "Watch MODIFIED events an informer skipped before its projection because they change "
    "nothing it keeps (a Pod's status heartbeat: docs/kube-api.md#unchanged-pod-events), by "
    "resource plural.",
    ["resource"],
)

INFORMER_SYNCED = Gauge(
    "bigfleet_informer_synced",
    "1 once the informer's cache holds its first complete LIST, 0 before (by resource plural); "
    "the binary is not ready and does not act while any of its informers is at 0.",
    ["resource"],
)

LEADER = Gauge(
    "bigfleet_leader_election_is_leader",
    "1 while this replica leads (or runs without --leader-elect, so acts alone), else 0: the "
    "sum over a binary's replicas is 1 when healthy (docs/operate.md#bigfleetnoleader).",
)

BUILD_INFO = Gauge(
    "bigfleet_build_info",
    "Always 1; the labels say which build runs (version of bigfleet-trio, python version).",
    ["version", "python"],
)

KUBE_STALE_REPLAYS = Counter(
    "bigfleet_kube_client_stale_connection_replays",
    "Requests sent once more on a fresh connection after a reused keep-alive connection failed "
    "before any answer byte (the server had closed it); only replay-safe requests "
    "(docs/kube-api.md#connections).",
)

GC_FROZEN_OBJECTS = Gauge(
    "bigfleet_gc_frozen_objects",
    "Objects in the garbage collector's permanent generation, which the informers fill with "
    "gc.freeze() (docs/kube-api.md#garbage-collector). It follows the caches; growth while they "
    "hold steady is garbage a freeze kept.",
)
GC_FROZEN_OBJECTS.set_function(gc.get_freeze_count)

KUBE_CONNECTIONS_OPENED = Counter(
    "bigfleet_kube_client_connections_opened",
    "Connections opened to the apiserver, by pool (requests|watches). Requests reuse keep-alive "
    "connections, so against requests_total this is a small fraction; a rate that follows the "
    "request rate means the pool closes and reopens connections (docs/kube-api.md#connections).",
    ["pool"],
)

KUBE_THROTTLED = Counter(
    "bigfleet_kube_client_throttled",
    "429 answers from the apiserver that held the client for their Retry-After (API Priority "
    "and Fairness refusals; an eviction's PodDisruptionBudget 429 is not counted).",
)

KUBE_REQUEST_DURATION = Histogram(
    "bigfleet_kube_client_request_duration_seconds",
    "Apiserver requests as the client saw them, from sending (after the rate limiter) to the "
    "answer read, by HTTP method and status class (2xx|3xx|4xx|5xx|error: no answer). Watches "
    "are not counted.",
    ["verb", "code"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)

KUBE_LIMITER_WAIT = Histogram(
    "bigfleet_kube_client_rate_limiter_wait_seconds",
    "Time the client-side token bucket (--qps/--burst) and any hold after a 429 imposed on "
    "each request before it was sent (not the event loop's scheduling latency).",
    buckets=(0.001, 0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)

LEASE_ERRORS = Counter(
    "bigfleet_leader_election_lease_errors",
    "Leader-election Lease requests refused in a way waiting cannot cure, by reason "
    "(forbidden: no RBAC grant in the Lease namespace|not_found: the namespace does not exist).",
    ["reason"],
)

DIAGNOSTICS_AUTH = Counter(
    "bigfleet_diagnostics_auth_decisions",
    "Requests to /metrics and /events checked with TokenReview and SubjectAccessReview "
    "(--metrics-auth), by decision (allowed|unauthenticated|forbidden|refused: too many "
    "reviews in flight|error).",
    ["decision"],
)

DIAGNOSTICS_CERT_RELOADS = Counter(
    "bigfleet_diagnostics_cert_reloads",
    "Reads of changed --metrics-cert-path files by result (loaded: now served; error: "
    "unreadable or not a pair, the previous certificate stays).",
    ["result"],
)


# --- operator: the Go binary's names -----------------------------------------------------------

ROLLUP_DURATION = Histogram(
    "bigfleet_operator_rollup_duration_seconds",
    "Wall time of one roll-up cycle (build + enqueue).",
    buckets=exponential_buckets(0.001, 2, 16),
)
ROLLUP_PHASE_DURATION = Histogram(
    "bigfleet_operator_rollup_phase_duration_seconds",
    "Wall time of one roll-up phase (list|build|enqueue).",
    ["phase"],
    buckets=exponential_buckets(0.001, 2, 16),
)
ACKNOWLEDGE_DURATION = Histogram(
    "bigfleet_operator_acknowledge_duration_seconds",
    "Wall time of one Pending->Acknowledged batch.",
    buckets=exponential_buckets(0.01, 2, 16),
)
OUTBOX_DROPPED = Counter(
    "bigfleet_operator_outbox_dropped",
    "Responses (BootstrapBlobResponse/ReclaimAck) dropped because the outbox was full.",
)
ACKNOWLEDGED = Counter(
    "bigfleet_operator_acknowledged",
    "CapacityRequests walked Pending->Acknowledged.",
)
SESSION_CLOSES = Counter(
    "bigfleet_operator_session_closes",
    "Shard sessions ended, by reason: the gRPC status the shard ended them with, lower case "
    "(aborted: replaced by a newer session for the same cluster ID|unavailable|...), or "
    "peer_closed (no status), connect_failed, error.",
    ["reason"],
)
SESSION_RECONNECTS = Counter(
    "bigfleet_operator_session_reconnects",
    "Shard sessions that ended (or failed to open) and led to a reconnect.",
)
NODE_STATE_UPDATE_DURATION = Histogram(
    "bigfleet_operator_node_state_update_duration_seconds",
    "Wall time of NodeStateUpdate handling by phase.",
    ["phase"],
    buckets=exponential_buckets(0.001, 2, 17),
)
NODE_STATE_QUEUE = Histogram(
    "bigfleet_operator_node_state_queue_seconds",
    "Seconds a machine with a NodeStateUpdate waited for a node-state worker: from the frame "
    "that made it ready (read off the stream) to a worker claiming it (client-go's "
    "workqueue_queue_duration_seconds).",
    buckets=exponential_buckets(0.001, 2, 17),
)
NODE_STATE_WORKER_WAIT = Histogram(
    "bigfleet_operator_node_state_worker_wait_seconds",
    "Seconds a node-state worker with a ready machine waited before claiming it, by what it "
    "waited for: read_ahead (the receive pump reading ahead first) or slot (a dispatch slot "
    "held by other handlers).",
    ["waited_for"],
    buckets=exponential_buckets(0.001, 2, 17),
)
UPCOMING_NODE_WRITES = Counter(
    "bigfleet_operator_upcoming_node_writes",
    "UpcomingNode apiserver writes by op and outcome.",
    ["op", "outcome"],
)
DISPATCH_INFLIGHT = Gauge(
    "bigfleet_operator_dispatch_inflight",
    "Running dispatch tasks (handlers and node-state coalescer workers).",
)

# --- operator: session extras (ours) ----------------------------------------------------------

SESSION_UP = Gauge(
    "bigfleet_operator_session_up",
    "1 while a shard session is established (Hello sent), else 0.",
)
FRAMES = Counter(
    "bigfleet_operator_frames",
    "Frames on the shard stream by direction (in|out) and payload kind.",
    ["direction", "kind"],
)
COALESCED_FRAMES = Counter(
    "bigfleet_operator_coalesced_frames",
    "Frames superseded before being processed (kind=rollup|node_state_update|available_capacity).",
    ["kind"],
)
RECONCILE_RETRIES = Counter(
    "bigfleet_operator_reconcile_retries",
    "Shard frames whose write failed retriably and was parked for a retry with per-key backoff "
    "(docs/rules.md#level-triggered-operator)",
    ["kind"],
)
RECONCILE_PERMANENT_ERRORS = Counter(
    "bigfleet_operator_reconcile_permanent_errors",
    "Shard frames whose write the apiserver refused for good (422 Invalid and the like): logged, "
    "not retried; the key waits for its next frame (docs/rules.md#level-triggered-operator)",
    ["kind"],
)
RECONCILE_FAILING_OLDEST = Gauge(
    "bigfleet_operator_reconcile_failing_oldest_seconds",
    "Seconds since the oldest shard frame whose write keeps failing retriably first failed: the "
    "operator has not converged on what the shard said for that long (0: every desired state "
    "reached; docs/operate.md#bigfleetoperatornotconverged)",
)
HANDLER_ERRORS = Counter(
    "bigfleet_operator_handler_errors",
    "Inbound-frame handlers that raised (the session goes on).",
    ["kind"],
)
ROLLUP_ERRORS = Counter(
    "bigfleet_operator_rollup_errors",
    "Roll-up builds or post-enqueue hooks that raised (the session goes on).",
    ["stage"],
)

# --- operator: drains (ours; reclaim.py) ------------------------------------------------------

RECLAIM_IDS_REUSED = Counter(
    "bigfleet_operator_reclaim_instruction_ids_reused",
    "ReclaimInstructions whose id an earlier one of other nodes or grace carried (a shard "
    "that numbers from 1 again after a restart), handled as new "
    "(docs/rules.md#reclaim-instruction-ids).",
)
DRAINS = Counter(
    "bigfleet_operator_drains",
    "Node drains finished, by outcome (drained|failed|abandoned).",
    ["outcome"],
)
DRAINS_ACTIVE = Gauge(
    "bigfleet_operator_drains_active",
    "Node drains running now.",
)
EVICTIONS = Counter(
    "bigfleet_operator_evictions",
    "Pod eviction calls by result (evicted|gone|blocked|refused).",
    ["result"],
)

# --- operator: bootstrap (ours; operator/app.py) ----------------------------------------------

BOOTSTRAP_RENDER_FAILURES = Counter(
    "bigfleet_operator_bootstrap_render_failures",
    "BootstrapRequests whose template render failed (answered with an error; the shard turns "
    "it into a shortfall).",
)

# --- operator: downlink enums (ours; shard/enums.py) ------------------------------------------

UNKNOWN_ENUM_VALUES = Counter(
    "bigfleet_operator_unknown_enum_values",
    "Enum values on the downlink this build does not know (a newer shard), by enum; the frame "
    "is skipped (a BootstrapRequest is answered with an error).",
    ["enum"],
)
BOOTSTRAP_ANSWERS_EXPIRED = Counter(
    "bigfleet_operator_bootstrap_answers_expired",
    "Bootstrap answers dropped unsent because their deadline (request read + 10 s) passed "
    "while they waited to be written.",
)
