"""Glue between the informers, the pure roll-up core and the shard session.

Data flow (docs/architecture.md#data-flow)::

    CapacityRequests --informer--> CapacityRequestRollup (RollupAggregator) --build()--> session
                                          \\--after_enqueue()--> Acknowledger (operator-owned)

:class:`CapacityRequestRollup` is the session's roll-up source; :class:`OperatorHandlers`
composes the four handler objects into the session's
:class:`~bigfleet_trio.operator.session.Handlers` and publishes one event-feed entry per decision.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import trio
from prometheus_client import Counter, Gauge

from bigfleet_trio.observability import metrics
from bigfleet_trio.observability.events import EventFeed
from bigfleet_trio.operator.acknowledge import Acknowledger
from bigfleet_trio.operator.kubeevents import KubeEventSink
from bigfleet_trio.operator.rollup.aggregate import RollupAggregator, ScratchBuild
from bigfleet_trio.operator.rollup.encoding import build_rollup_message
from bigfleet_trio.operator.rollup.errors import CapacityRequestError
from bigfleet_trio.operator.rollup.translate import cr_key
from bigfleet_trio.operator.session.types import Reply
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.codec import EncodedFrame

__all__ = [
    "CapacityRequestRollup",
    "EventSink",
    "OperatorHandlers",
    "RollupStatistics",
    "node_ref_index",
    "slim_node",
]

log = logging.getLogger(__name__)

# --- metrics (ours; metrics.py is the shared module, these live with the code that feeds them) ---

EXCLUDED = Counter(
    "bigfleet_operator_capacityrequests_excluded",
    "CapacityRequest versions left out of the roll-up (reported once per resourceVersion).",
    ["reason"],
)
EXCLUDED_CURRENT = Gauge(
    "bigfleet_operator_capacityrequests_excluded_current",
    "CapacityRequests currently left out of the roll-up.",
)
ROLLUP_NEEDS = Gauge(
    "bigfleet_operator_rollup_needs",
    "CapacityNeeds in the last roll-up built.",
)
ROLLUP_CRS = Gauge(
    "bigfleet_operator_rollup_capacityrequests",
    "CapacityRequests contributing to the last roll-up built.",
)
CONSISTENCY_MISMATCHES = Counter(
    "bigfleet_operator_rollup_consistency_mismatches",
    "Periodic checks where the incremental aggregate differed from a from-scratch rebuild.",
)

#: CRs the consistency check's rebuild handles between two yields to the event loop.
CONSISTENCY_CHUNK = 2000

#: Default seconds between from-scratch consistency checks of the incremental aggregate.
DEFAULT_CONSISTENCY_INTERVAL = 300.0
#: Bound of the queue of Kubernetes Events waiting to be written (drop-newest, logged).
EVENT_QUEUE_CAPACITY = 1024
EVENT_COMPONENT = "bigfleet-operator"


EventSink = KubeEventSink
"""The one KubeClient method used to record exclusions (``create_event``), as kubeevents has it."""


class StoreLike(Protocol):
    """What the consistency check reads from the CR informer store."""

    def items(self) -> Any: ...


@dataclass
class RollupStatistics:
    """Snapshot of :class:`CapacityRequestRollup` (for ``Operator.statistics()``).

    Attributes:
        rollups_built: roll-ups handed to the session.
        needs_last_rollup: CapacityNeeds in the last one (None before the first).
        crs_contributing: CRs currently in the aggregate.
        crs_excluded: CRs currently left out.
        exclusions_reported: exclusion reports made (one per CR version).
        consistency_checks / consistency_mismatches: periodic from-scratch comparisons.
        acks_submitted: CRs handed to the acknowledger.
    """

    rollups_built: int = 0
    needs_last_rollup: int | None = None
    crs_contributing: int = 0
    crs_excluded: int = 0
    exclusions_reported: int = 0
    consistency_checks: int = 0
    consistency_mismatches: int = 0
    acks_submitted: int = 0


def _split_key(key: str) -> tuple[str, str] | None:
    ns, sep, name = key.partition("/")
    if not sep or not ns or not name:
        return None
    return ns, name


def _rv(obj: Mapping[str, Any]) -> str:
    md = obj.get("metadata")
    rv = md.get("resourceVersion") if isinstance(md, Mapping) else None
    return rv if isinstance(rv, str) else ""


class CapacityRequestRollup:
    """The operator's :class:`~bigfleet_trio.operator.session.RollupSource`, fed by the CR informer.

    * informer add/update/delete -> :meth:`RollupAggregator.upsert` / ``delete`` (O(resources)
      per event), so :meth:`build` costs O(needs), never O(CRs);
    * a CR excluded from the roll-up (``UnsupportedRequirement``,
      a malformed quantity, ...) is reported once per CR *version* (resourceVersion): a Warning
      Kubernetes Event on the CR, a log line, a metric and an event-feed entry -- never silently
      lost demand (docs/reference.md#unsupported-operators-drop-demand);
    * every ``consistency_interval`` seconds the aggregate is compared with a from-scratch
      rebuild over the informer store; a mismatch is logged, counted and repaired by rebuilding;
    * :meth:`after_enqueue` hands the Pending CRs seen by the last build to the operator-owned
      :class:`~bigfleet_trio.operator.acknowledge.Acknowledger` (non-blocking), so
      acknowledgement never delays the next roll-up tick.

    Usage::

        source = CapacityRequestRollup("c1", events=client, acknowledger=ack, feed=feed)
        await nursery.start(source.run)          # event writer + consistency checks
        source.attach(cr_informer)               # before the informer runs
        ... Agent(connector, source, handlers, ...)

    Args:
        cluster_id: filled into every roll-up.
        events: where exclusion Events go (a KubeClient); None disables Events (log + metric only).
        acknowledger: the operator-owned :class:`Acknowledger` (running before the first build).
        feed: optional :class:`EventFeed` for "rollup" / "capacityrequest_excluded" entries.
        store: the CR informer store (for the consistency check); set by :meth:`attach`.
        consistency_interval: seconds between from-scratch checks (``inf`` disables).
        now_ns: wall clock for ``timestamp_unix_nanos`` (injectable for tests).
    """

    def __init__(
        self,
        cluster_id: str,
        *,
        events: EventSink | None,
        acknowledger: Acknowledger | None,
        feed: EventFeed | None = None,
        store: StoreLike | None = None,
        consistency_interval: float = DEFAULT_CONSISTENCY_INTERVAL,
        now_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        if not cluster_id:
            raise ValueError("cluster_id is required")
        if not consistency_interval > 0:
            raise ValueError(f"consistency_interval must be > 0, got {consistency_interval}")
        self.cluster_id = cluster_id
        self.aggregator = RollupAggregator()
        self._events = events
        self._ack = acknowledger
        self._feed = feed
        self._store = store
        self._interval = consistency_interval
        self._now_ns = now_ns
        self._reported: dict[str, str] = {}  # key -> resourceVersion already reported
        # keys of the Pending CRs in the last build (read-only, see pending_snapshot)
        self._last_pending: frozenset[str] | set[str] = frozenset()
        self._stats = RollupStatistics()
        self._event_send, self._event_recv = trio.open_memory_channel[
            tuple[dict[str, Any], CapacityRequestError]
        ](EVENT_QUEUE_CAPACITY)

    # ------------------------------------------------------------------ informer side (sync)
    def attach(self, informer: Any) -> None:
        """Register the handlers on a CapacityRequest informer and use its store for checks."""
        informer.add_handler(on_add=self.on_add, on_update=self.on_update, on_delete=self.on_delete)
        self._store = informer.store

    def on_add(self, cr: dict[str, Any]) -> None:
        """Informer ADD: fold the CR into the aggregate (non-blocking)."""
        self._upsert(cr)

    def on_update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        """Informer UPDATE: replace the CR's contribution (a no-op if its demand is unchanged)."""
        self._upsert(new)

    def on_delete(self, cr: dict[str, Any]) -> None:
        """Informer DELETE: withdraw the CR's contribution."""
        key = cr_key(cr)
        self.aggregator.delete(key)
        if self._reported.pop(key, None) is not None:
            EXCLUDED_CURRENT.set(len(self._reported))

    def _upsert(self, cr: dict[str, Any]) -> None:
        key = cr_key(cr)
        err = self.aggregator.upsert(key, cr)
        if err is None:
            if self._reported.pop(key, None) is not None:
                log.info("capacityrequest included again cr=%s", key)
                EXCLUDED_CURRENT.set(len(self._reported))
            return
        rv = _rv(cr)
        if key in self._reported and self._reported[key] == rv:
            return  # this version was reported already
        self._reported[key] = rv
        EXCLUDED_CURRENT.set(len(self._reported))
        self._report(key, rv, cr, err)

    def _report(self, key: str, rv: str, cr: dict[str, Any], err: CapacityRequestError) -> None:
        self._stats.exclusions_reported += 1
        EXCLUDED.labels(err.reason).inc()
        log.warning(
            "capacityrequest excluded from the roll-up cr=%s resourceVersion=%s reason=%s "
            "field=%s error=%s",
            key, rv, err.reason, err.field, err,
        )
        if self._feed is not None:
            self._feed.publish(
                "capacityrequest_excluded", cr=key, reason=err.reason, field=err.field,
                message=str(err),
            )
        if self._events is None:
            return
        try:
            self._event_send.send_nowait((cr, err))
        except trio.WouldBlock:
            log.warning("event queue full; Event for excluded CR not written cr=%s", key)

    # ------------------------------------------------------------------ tasks
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write exclusion Events and run periodic consistency checks until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._event_writer, name="rollup-events")
            nursery.start_soon(self._consistency_loop, name="rollup-consistency")
            task_status.started()

    async def _event_writer(self) -> None:
        async for cr, err in self._event_recv:
            if self._events is None:
                continue
            await self._events.create_event(
                cr,
                reason=err.reason,
                message=f"excluded from the BigFleet roll-up: {err}",
                type="Warning",
                component=EVENT_COMPONENT,
            )

    async def _consistency_loop(self) -> None:
        if math.isinf(self._interval):
            return
        while True:
            await trio.sleep(self._interval)
            await self.check_consistency()

    async def check_consistency(self, chunk: int = CONSISTENCY_CHUNK) -> bool:
        """Compare the aggregate with a from-scratch rebuild over the store; repair on mismatch.

        The store's items and the aggregate's needs are taken at one instant (no checkpoint
        between them: the cached objects are replaced, never changed in place, so the snapshot
        stays as it was); the rebuild over the snapshot then yields to the event loop every
        ``chunk`` CRs and between needs, so 150,000 CRs never hold the loop. A mismatch is
        repaired by a rebuild from the store as it is then (synchronous; rare). O(CRs); runs
        every ``consistency_interval`` seconds.

        Returns:
            True when they agreed (or there is no store yet); False after a repair.
        """
        if self._store is None:
            return True
        self._stats.consistency_checks += 1
        items = list(self._store.items())
        actual = [bytes(n) for n in self.aggregator.needs()]
        build = ScratchBuild()
        for start in range(0, len(items), chunk):
            build.add(cr for _, cr in items[start:start + chunk])
            await trio.lowlevel.checkpoint()
        expected = []
        for need in build.needs():
            expected.append(bytes(need))
            await trio.lowlevel.checkpoint()
        if expected == actual:
            log.debug("roll-up consistency check ok needs=%d crs=%d", len(actual), len(items))
            return True
        self._stats.consistency_mismatches += 1
        CONSISTENCY_MISMATCHES.inc()
        log.error(
            "roll-up consistency check failed; rebuilding the aggregate cluster=%s "
            "incremental_needs=%d from_scratch_needs=%d crs=%d",
            self.cluster_id, len(actual), len(expected), len(items),
        )
        self.aggregator.rebuild(list(self._store.items()))
        return False

    # ------------------------------------------------------------------ RollupSource
    async def build(self) -> pb.ClusterCapacityNeeds:
        """The full roll-up from the aggregate (O(needs)); remembers the Pending CRs in it."""
        started = time.perf_counter()
        needs = self.aggregator.needs()
        self._note_build(len(needs))
        msg = build_rollup_message(self.cluster_id, needs, self._now_ns())
        metrics.ROLLUP_PHASE_DURATION.labels("build").observe(time.perf_counter() - started)
        return msg

    async def build_encoded(self) -> EncodedFrame:
        """The roll-up :meth:`build` returns, already serialized from the aggregator's cached
        per-need encodings (what the session sends; docs/wire.md#roll-up-encoding)."""
        started = time.perf_counter()
        self._note_build(self.aggregator.need_count)
        frame = self.aggregator.encoded_rollup(self.cluster_id, self._now_ns())
        metrics.ROLLUP_PHASE_DURATION.labels("build").observe(time.perf_counter() - started)
        return frame

    def _note_build(self, needs: int) -> None:
        # The Pending CRs are only snapshotted here; splitting their keys waits for
        # after_enqueue, so a first roll-up at 100K Pending CRs is not delayed by it.
        self._last_pending = self.aggregator.pending_snapshot()
        self._stats.rollups_built += 1
        self._stats.needs_last_rollup = needs
        ROLLUP_NEEDS.set(needs)
        ROLLUP_CRS.set(len(self.aggregator))
        if self._feed is not None:
            self._feed.publish(
                "rollup", cluster=self.cluster_id, needs=needs, crs=len(self.aggregator),
                excluded=len(self._reported), pending=len(self._last_pending),
            )

    async def after_enqueue(self) -> None:
        """Hand the Pending CRs of the last build to the acknowledger (never blocks)."""
        pending, self._last_pending = self._last_pending, frozenset()
        if self._ack is None or not pending:
            return
        keys = [split for key in pending if (split := _split_key(key)) is not None]
        try:
            self._stats.acks_submitted += self._ack.submit_keys(keys)
        except RuntimeError as exc:  # acknowledger not running (shutting down)
            log.warning("acknowledgement skipped this cycle: %s", exc)

    def statistics(self) -> RollupStatistics:
        """A copy of the counters plus the current aggregate sizes."""
        s = RollupStatistics(**vars(self._stats))
        s.crs_contributing = len(self.aggregator)
        s.crs_excluded = len(self._reported)
        return s


class OperatorHandlers:
    """The session's :class:`~bigfleet_trio.operator.session.Handlers`, composed from four objects.

    Each call is forwarded unchanged; a feed entry is published per frame when ``feed`` is set.

    Args:
        bootstrap: has ``on_bootstrap_request`` (:class:`~.bootstrap.BootstrapHandler`).
        reclaim: has ``on_reclaim_instruction`` (:class:`~.reclaim.ReclaimHandler`).
        upcoming: has ``on_node_state_update`` (:class:`~.upcoming.UpcomingNodeHandler`).
        available: has ``on_available_capacity`` (:class:`~.available.AvailableCapacityHandler`).
        feed: optional :class:`EventFeed`.
    """

    def __init__(
        self, *, bootstrap: Any, reclaim: Any, upcoming: Any, available: Any,
        feed: EventFeed | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.reclaim = reclaim
        self.upcoming = upcoming
        self.available = available
        self._feed = feed

    def _publish(self, kind: str, **fields: Any) -> None:
        if self._feed is not None:
            self._feed.publish(kind, **fields)

    async def on_bootstrap_request(self, req: pb.BootstrapRequest) -> pb.BootstrapBlobResponse:
        """Render the blob (never waits behind the dispatch semaphore)."""
        resp: pb.BootstrapBlobResponse = await self.bootstrap.on_bootstrap_request(req)
        self._publish(
            "bootstrap", request_id=req.request_id, bytes=len(resp.user_data), error=resp.error
        )
        return resp

    async def on_reclaim_instruction(self, instr: pb.ReclaimInstruction, reply: Reply) -> None:
        """Cordon, ack via ``reply``, start drains in the operator-owned DrainManager."""
        acks: list[int] = []

        def recording_reply(msg: pb.OperatorMessage) -> bool:
            acks.append(msg.reclaim_ack.nodes_started)
            return reply(msg)

        self._publish(
            "reclaim", instruction_id=instr.instruction_id, nodes=list(instr.nodes),
            grace_seconds=instr.grace_period_seconds,
        )
        await self.reclaim.on_reclaim_instruction(instr, recording_reply)
        if acks:
            self._publish(
                "reclaim_ack", instruction_id=instr.instruction_id, nodes_started=acks[-1]
            )

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> bool:
        """Reflect the machine's latest state into its UpcomingNode; True when it has none."""
        gone: bool = await self.upcoming.on_node_state_update(u)
        self._publish(
            "node_state", machine_id=u.machine_id, node=u.node_name,
            state=_state_name(u.state),
        )
        return gone

    async def on_available_capacity(self, u: pb.AvailableCapacityUpdate) -> None:
        """Upsert the AvailableCapacity object."""
        await self.available.on_available_capacity(u)
        self._publish(
            "available_capacity", supersedes_key=u.supersedes_key, count=u.available_count
        )


def _state_name(state: int) -> str:
    """``MachineState`` name, or the number for a state this build does not know (a newer
    shard; betterproto decodes it as a nameless member and ``MachineState(n)`` would raise)."""
    return pb.MachineState.try_value(int(state)).name or str(int(state))


# ------------------------------------------------------------------ informer helpers
def node_ref_index(un: Mapping[str, Any]) -> list[str]:
    """Index function: the Node name an UpcomingNode points at (``status.nodeRef.name``)."""
    status = un.get("status")
    ref = status.get("nodeRef") if isinstance(status, Mapping) else None
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return [name] if isinstance(name, str) and name else []


def provider_id_index(node: Mapping[str, Any]) -> list[str]:
    """Index function: a Node's ``spec.providerID`` (none for an empty or non-string value)."""
    spec = node.get("spec")
    pid = spec.get("providerID") if isinstance(spec, Mapping) else None
    return [pid] if isinstance(pid, str) and pid else []


def slim_node(node: dict[str, Any]) -> dict[str, Any]:
    """Informer transform for Nodes: identity, labels, cordon flag, providerID, Ready condition."""
    md = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    ready = ""
    for cond in status.get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            ready = str(cond.get("status", ""))
    return {
        "apiVersion": node.get("apiVersion", "v1"),
        "kind": node.get("kind", "Node"),
        "metadata": {k: md[k] for k in ("name", "uid", "resourceVersion", "labels") if k in md},
        "spec": {k: spec[k] for k in ("unschedulable", "providerID") if k in spec},
        "status": {"ready": ready},
    }
