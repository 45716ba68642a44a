"""Prometheus metrics (prometheus_client, default registry).

Names follow reference-behavior.md §15 (the Go ``pkg/metrics/metrics.go``) so dashboards carry
over; the extra operator metrics (frames, coalescing, handler errors, session state) are ours.
Metrics are module-level singletons registered in :data:`prometheus_client.REGISTRY`; serve them
with ``prometheus_client.make_asgi_app()``. Other engineers: add new metrics in their own section
below, never rename one that exists.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram


def exponential_buckets(start: float, factor: float, count: int) -> list[float]:
    """``count`` buckets ``start * factor**k``, k = 0..count-1 (Go ExponentialBuckets)."""
    if start <= 0 or factor <= 1 or count < 1:
        raise ValueError(f"bad buckets: start={start} factor={factor} count={count}")
    return [start * factor**k for k in range(count)]


# --- operator: reference §15 names -----------------------------------------------------------

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
    "Frames superseded before being processed (kind=rollup|node_state_update).",
    ["kind"],
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
