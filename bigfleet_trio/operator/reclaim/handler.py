"""Reclaim I/O: :class:`ReclaimHandler`, the session's ``on_reclaim_instruction``.

Resolves each entry of a ReclaimInstruction to a Node, cordons it, walks its UpcomingNode to
Draining (remembered in the shared :class:`~bigfleet_trio.operator.upcoming.plan.DrainMemory`),
acks ``nodes_started`` through the outbox, then hands the drains to the operator's
:class:`~.drain.DrainManager` (docs/rules.md#reclaim).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

import trio

from bigfleet_trio.kube.api import KubeAPI
from bigfleet_trio.kube.errors import KubeError, NotFound
from bigfleet_trio.kube.resources import NODES, UPCOMING_NODES, Resource
from bigfleet_trio.kube.retry import TRANSIENT, conflict_retrying
from bigfleet_trio.observability import metrics
from bigfleet_trio.operator.kubeevents import REASON_CORDONED, REASON_RECLAIM, EventRecorder
from bigfleet_trio.operator.upcoming.handler import patch_upcoming_status
from bigfleet_trio.operator.upcoming.plan import PHASE_DRAINING, DrainMemory, upcoming_node_name
from bigfleet_trio.proto import pb

from .drain import DrainManager
from .plan import effective_grace
from .resume import drain_annotations, utc_now

__all__ = ["CachedGet", "NodeLookup", "ReclaimHandler", "Reply", "UpcomingLookup",
           "pointing_at", "resolve_cached", "with_provider_id"]

# The package's logger: log lines keep the logger name they had before the package was split.
log = logging.getLogger(__package__)

Reply = Callable[[pb.OperatorMessage], bool]
UpcomingLookup = Callable[[str], Iterable[Mapping[str, Any]]]
"""Node name -> UpcomingNodes whose ``status.nodeRef.name`` is that node (e.g. an informer
index lookup over the UpcomingNode store, as ``operator/runtime.py`` builds it)."""


NodeLookup = Callable[[str], Iterable[Mapping[str, Any]]]
"""``spec.providerID`` -> Nodes with that providerID (e.g. an informer index lookup over the Node
store, as ``operator/runtime.py`` builds it). Each returned Node is re-checked, so a stale index
entry is harmless."""

CachedGet = Callable[[str], Mapping[str, Any] | None]
"""Name -> the cached object or None (an informer store's ``get``)."""


@dataclass
class _Instruction:
    content: tuple[tuple[str, ...], float] = ((), 0.0)  # (entries, effective grace seconds)
    done: trio.Event = field(default_factory=trio.Event)
    nodes_started: int = 0
    acked: bool = False  # False when done is set: the attempt failed and was forgotten
    waiters: list[Reply] = field(default_factory=list)  # re-issues answered with this ack


@dataclass(frozen=True)
class _Resolved:
    entry: str
    node: str | None
    un_name: str | None
    how: str


def pointing_at(candidates: Iterable[Mapping[str, Any]], node: str) -> list[Mapping[str, Any]]:
    """The UpcomingNodes of ``candidates`` whose ``status.nodeRef.name`` is ``node``, by name."""
    return sorted((un for un in candidates
                   if ((un.get("status") or {}).get("nodeRef") or {}).get("name") == node
                   and _name(un) is not None), key=lambda un: _name(un) or "")


def with_provider_id(nodes: Iterable[Mapping[str, Any]], provider_id: str) -> str | None:
    """The name of the first of ``nodes`` whose ``spec.providerID`` is ``provider_id``, or
    None (an index entry is re-checked, so a stale one is harmless)."""
    for n in nodes:
        spec = n.get("spec")
        if isinstance(spec, Mapping) and spec.get("providerID") == provider_id:
            name = _name(n)
            if name is not None:
                return name
    return None


def resolve_cached(
    entry: str,
    node_get: CachedGet,
    upcoming_get: CachedGet,
    upcoming_lookup: UpcomingLookup,
    node_lookup: NodeLookup,
) -> tuple[str, str | None, str] | None:
    """Resolve a reclaim entry from the informers' caches, in the order of the reads
    (docs/rules.md#reclaim): ``(node, UpcomingNode name or None, how)``, or None when the
    caches do not show a Node for it (the caller then reads from the apiserver).

    A Node of the entry's name (its UpcomingNode: ``un-<entry>``, else the first by name whose
    ``status.nodeRef`` is it); else the UpcomingNode ``un-<entry>``'s ``status.nodeRef``, else
    its ``status.providerID`` against ``Node.spec.providerID``.
    """
    un_name = upcoming_node_name(entry)
    un = upcoming_get(un_name) if un_name else None
    if node_get(entry) is not None:
        if un is None:
            found = pointing_at(upcoming_lookup(entry), entry)
            un = found[0] if found else None
        return (entry, _name(un), "node name (cache)")
    if un is None:
        return None
    status = un.get("status") or {}
    ref = (status.get("nodeRef") or {}).get("name")
    if isinstance(ref, str) and ref and node_get(ref) is not None:
        return (ref, _name(un), "upcoming nodeRef (cache)")
    provider_id = status.get("providerID")
    if provider_id and isinstance(provider_id, str):
        name = with_provider_id(sorted(node_lookup(provider_id), key=lambda n: _name(n) or ""),
                                provider_id)
        if name is not None:
            return (name, _name(un), "upcoming providerID (cache)")
    return None


class ReclaimHandler:
    """Handles ReclaimInstruction frames: resolve, cordon, mark Draining, ack, start drains.

    The session's ``on_reclaim_instruction``, inline and bounded (cordons only; drains run in
    the :class:`~.drain.DrainManager`). The shard sends machine IDs, not Node names
    (docs/reference.md#reclaim-names-machines-not-nodes), so each entry is resolved: a Node of
    that name; else the UpcomingNode ``un-<entry>`` and its ``status.nodeRef``; else that
    UpcomingNode's ``status.providerID`` against ``Node.spec.providerID``. An entry with no
    Node (already gone) is acked but not counted in ``nodes_started``
    (docs/reference.md#nodes_started-always-counts-every-entry).

    Idempotent, because the shard re-issues an instruction it saw no ack for: a repeated
    instruction id naming the same nodes and grace is re-acked with the first answer and does
    nothing else; one naming other nodes or another grace is a new instruction, logged and
    counted (docs/rules.md#reclaim-instruction-ids); a node already draining is cordoned again
    (a no-op), counted, and gets no second drain.

    Args:
        client: a KubeClient.
        drains: the operator's :class:`DrainManager` (already running).
        memory: the DrainMemory shared with the UpcomingNode handler.
        seen_capacity: how many instruction ids to remember for duplicate detection.
        upcoming_lookup: Node name -> UpcomingNodes pointing at it (an informer index); None
            lists every UpcomingNode from the apiserver instead (one list per such entry).
        node_lookup: providerID -> Nodes with it (an informer index); None lists every Node
            from the apiserver instead (one list per entry resolved by providerID).
        node_get, upcoming_get: the Node and UpcomingNode informers' stores by name. Given
            (with both lookups), an entry is resolved from the caches (:func:`resolve_cached`)
            and only cordoned and marked, no reads; the caches not showing a Node for it, or
            the cordon finding the cached Node gone, it is resolved by reads as without them.
        cordon_concurrency: entries resolved and cordoned at once (16): an instruction naming
            100 nodes is acked after ~7 cordon round trips, not 100.
        events: optional :class:`EventRecorder`: ``Reclaim`` and ``Cordoned`` Events on each
            Node cordoned (with its uid, from the cordon's answer, for later Events too).
        wall_clock: the wall clock (aware) the drain deadline recorded on the UpcomingNode is
            computed from (docs/rules.md#reclaim-resume-after-restart).
    """

    def __init__(
        self,
        client: KubeAPI,
        drains: DrainManager,
        memory: DrainMemory,
        *,
        seen_capacity: int = 4096,
        upcoming_lookup: UpcomingLookup | None = None,
        node_lookup: NodeLookup | None = None,
        node_get: CachedGet | None = None,
        upcoming_get: CachedGet | None = None,
        cordon_concurrency: int = 16,
        events: EventRecorder | None = None,
        wall_clock: Callable[[], datetime] = utc_now,
    ) -> None:
        if cordon_concurrency < 1:
            raise ValueError("cordon_concurrency must be >= 1")
        self._cordon_concurrency = cordon_concurrency
        self._client = client
        self._upcoming_lookup = upcoming_lookup
        self._node_lookup = node_lookup
        self._node_get = node_get
        self._upcoming_get = upcoming_get
        self._drains = drains
        self.memory = memory
        self._seen: OrderedDict[str, _Instruction] = OrderedDict()
        self._seen_capacity = seen_capacity
        self._events = events
        self._wall_clock = wall_clock

    async def on_reclaim_instruction(self, instr: pb.ReclaimInstruction, reply: Reply) -> None:
        """Cordon inline, hand drains to the DrainManager, ack ``nodes_started`` via ``reply``."""
        iid = instr.instruction_id
        log.info(
            "reclaim: instruction instruction_id=%s nodes=%s grace=%ss preemptor_priority=%s",
            iid,
            list(instr.nodes),
            instr.grace_period_seconds,
            instr.preemptor_priority,
        )
        content = (tuple(e for e in dict.fromkeys(instr.nodes) if e),
                   effective_grace(instr.grace_period_seconds))
        if (prior := self._seen.get(iid) if iid else None) is not None:
            if prior.content != content:
                # The id names another reclaim (a shard that numbers from 1 again after a
                # restart): a duplicate is the same instruction re-issued, so this one is new.
                # Re-acking it would let the shard take Nodes nobody cordoned or drained.
                # docs/rules.md#reclaim-instruction-ids
                log.warning(
                    "reclaim: instruction id reused for another reclaim, handled as a new "
                    "instruction instruction_id=%s nodes=%s grace=%ss earlier_nodes=%s "
                    "earlier_grace=%ss", iid, list(content[0]), content[1],
                    list(prior.content[0]), prior.content[1])
                metrics.RECLAIM_IDS_REUSED.inc()
            elif not prior.done.is_set():
                # Still being handled: answered with the first attempt's ack when it comes.
                # Waiting here would hold a dispatch slot shared with the NodeStateUpdate
                # workers, and the shard re-issues an unacked instruction on every timeout.
                # If the first attempt fails, nothing is acked and the shard re-issues again.
                log.info("reclaim: duplicate of an instruction in progress, acked when it is "
                         "instruction_id=%s", iid)
                prior.waiters.append(reply)
                return
            else:
                log.info(
                    "reclaim: duplicate instruction, re-acking instruction_id=%s "
                    "nodes_started=%d", iid, prior.nodes_started,
                )
                self._ack(iid, prior.nodes_started, reply)
                return
        record = _Instruction(content=content)
        if iid:
            self._seen[iid] = record
            while len(self._seen) > self._seen_capacity:
                self._seen.popitem(last=False)
        unrecorded: list[str] = []
        try:
            cordoned = await self._cordon_all(instr, unrecorded)
        except BaseException:
            self._forget(iid, record)  # never completed: a re-issue must do the work again
            raise
        if unrecorded:
            # No ack without the drain record (docs/rules.md#reclaim-ack): an acked drain that
            # only runs in memory is lost with the process, and the shard, acked, never
            # re-issues. Unacked, the shard re-issues on its timeout and this is tried again
            # (the cordons stay: they are idempotent and keep new Pods off the machines).
            log.error(
                "reclaim: not acked, the drain record could not be written for nodes=%s; "
                "the shard will re-issue instruction_id=%s", unrecorded, iid,
            )
            self._forget(iid, record)
            return
        record.nodes_started = len(cordoned)
        record.acked = True
        record.done.set()
        self._record_cordons(instr, cordoned)
        # Order: cordon every node, ack, then drain (docs/rules.md#reclaim-cordon): no new Pod
        # lands on a leaving machine, and no eviction starts before every node is cordoned. The
        # ack and the drain starts are
        # all synchronous (no checkpoint between them), so a session cancelled after the ack
        # cannot lose a drain, and no eviction starts before every node is cordoned.
        self._ack(iid, len(cordoned), reply)
        for waiter in record.waiters:
            self._ack(iid, len(cordoned), waiter)
        record.waiters.clear()
        grace = effective_grace(instr.grace_period_seconds)
        for node, un_name in cordoned:
            if self._drains.is_draining(node):
                log.info("reclaim: node already draining node=%s", node)
                continue
            self._drains.start(node, un_name=un_name, grace_seconds=grace, instruction_id=iid)

    def _forget(self, iid: str, record: _Instruction) -> None:
        """End a failed attempt: forget its id (a re-issue starts afresh), wake its waiters."""
        if iid and self._seen.get(iid) is record:
            del self._seen[iid]
        if record.waiters:
            log.warning("reclaim: %d re-issues of a failed attempt left unacked; the shard "
                        "will re-issue instruction_id=%s", len(record.waiters), iid)
            record.waiters.clear()
        record.done.set()

    def _record_cordons(
        self, instr: pb.ReclaimInstruction, cordoned: list[tuple[str, str | None]]
    ) -> None:
        """``Reclaim`` then ``Cordoned`` on each Node cordoned (queued: no checkpoint)."""
        if self._events is None:
            return
        grace = effective_grace(instr.grace_period_seconds)
        for node, _ in cordoned:
            ref = self._events.node(node)
            self._events.record(
                ref, reason=REASON_RECLAIM,
                message=f"Reclaim instruction {instr.instruction_id} from the BigFleet shard: "
                f"cordon and drain within {grace:g}s",
            )
            self._events.record(
                ref, reason=REASON_CORDONED,
                message=f"Cordoned (unschedulable) for reclaim {instr.instruction_id}",
            )

    def _ack(self, iid: str, nodes_started: int, reply: Reply) -> None:
        msg = pb.OperatorMessage(
            reclaim_ack=pb.ReclaimAck(instruction_id=iid, nodes_started=nodes_started)
        )
        if reply(msg):
            log.info("reclaim: acked instruction_id=%s nodes_started=%d", iid, nodes_started)
        else:
            log.warning(
                "reclaim: ack not queued (outbox full or session ended), shard will re-issue "
                "instruction_id=%s",
                iid,
            )

    async def _cordon_all(
        self, instr: pb.ReclaimInstruction, unrecorded: list[str]
    ) -> list[tuple[str, str | None]]:
        """Cordon every resolvable node of ``instr`` (walking its UpcomingNode to Draining).

        Entries are resolved and cordoned concurrently, at most ``cordon_concurrency`` at once.
        Nodes cordoned whose drain record could not be written are appended to ``unrecorded``.

        Returns:
            ``[(node name, UpcomingNode name or None)]`` for the nodes actually cordoned, in
            instruction order (duplicates removed): the ack's ``nodes_started`` and the drains.
        """
        entries = [e for e in dict.fromkeys(instr.nodes) if e]  # de-duplicated, order kept
        deadline = self._wall_clock() + timedelta(
            seconds=effective_grace(instr.grace_period_seconds)
        )
        results: list[tuple[str, str | None] | None] = [None] * len(entries)
        limiter = trio.CapacityLimiter(self._cordon_concurrency)

        async def one(i: int, entry: str) -> None:
            async with limiter:
                results[i] = await self._cordon_entry(entry, deadline, unrecorded)

        async with trio.open_nursery() as nursery:
            for i, entry in enumerate(entries):
                nursery.start_soon(one, i, entry)
        cordoned: list[tuple[str, str | None]] = []
        for item in results:
            if item is not None and all(node != item[0] for node, _ in cordoned):
                cordoned.append(item)
        return cordoned

    async def _cordon_entry(
        self, entry: str, deadline: datetime, unrecorded: list[str]
    ) -> tuple[str, str | None] | None:
        """Resolve one entry, cordon its Node and mark its UpcomingNode Draining (a Node whose
        drain record could not be written goes to ``unrecorded``)."""
        r = await self._resolve_from_caches_or_read(entry)
        if r is not None and r.how == "error":
            return None
        outcome = await self._cordon(r.node) if r is not None and r.node else None
        if outcome is None or outcome == "gone":
            # the caches show no Node for the entry, or the one they show is gone: what the
            # apiserver says now decides, as without caches
            if outcome == "gone" and r is not None:
                log.info("reclaim: cached node gone, resolving by reads entry=%s node=%s",
                         entry, r.node)
            r = await self._resolve(entry)
            if r.node is None:
                log.info(
                    "reclaim: no Node for entry, nothing to cordon entry=%s upcoming=%s",
                    entry,
                    r.un_name,
                )
                if r.un_name is not None:
                    await self._mark_draining(r.un_name)
                return None
            outcome = await self._cordon(r.node)
        if outcome != "cordoned" or r is None or r.node is None:
            return None
        if r.un_name is not None and not await self._mark_draining(
            r.un_name, drain=(r.node, deadline)
        ):
            unrecorded.append(r.node)
        log.info("reclaim: cordoned node=%s entry=%s via=%s", r.node, entry, r.how)
        return (r.node, r.un_name)

    async def _call(self, fn: Callable[[], Any]) -> Any:
        """``await fn()`` under the handlers' retry policy (conflicts and transient failures)."""
        async for attempt in conflict_retrying(also=TRANSIENT):
            with attempt:
                return await fn()
        raise AssertionError("unreachable")

    async def _get(self, res: Resource, name: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._call(lambda: self._client.get(res, name))
        except NotFound:
            return None
        return result

    def _resolve_from_caches(self, entry: str) -> _Resolved | None:
        """:func:`resolve_cached` when the handler has the informers' caches, else None."""
        if (self._node_get is None or self._upcoming_get is None
                or self._upcoming_lookup is None or self._node_lookup is None):
            return None
        found = resolve_cached(entry, self._node_get, self._upcoming_get,
                               self._upcoming_lookup, self._node_lookup)
        return None if found is None else _Resolved(entry, *found)

    async def _resolve_from_caches_or_read(self, entry: str) -> _Resolved | None:
        """:meth:`_resolve_from_caches`; a Node found there without an UpcomingNode has
        ``un-<entry>`` read, since the ack must wait for the drain record on it and an
        UpcomingNode the cache has not seen yet would otherwise go without one."""
        r = self._resolve_from_caches(entry)
        if r is not None and r.un_name is None:
            un_name = upcoming_node_name(entry)
            try:
                un = await self._get(UPCOMING_NODES, un_name) if un_name else None
            except KubeError as exc:
                log.error("reclaim: resolving entry failed entry=%s error=%s", entry, exc)
                return _Resolved(entry, None, None, "error")
            if un is not None:
                r = _Resolved(entry, r.node, _name(un), r.how)
        return r

    async def _resolve(self, entry: str) -> _Resolved:
        try:
            return await self._resolve_inner(entry)
        except KubeError as exc:
            log.error("reclaim: resolving entry failed entry=%s error=%s", entry, exc)
            return _Resolved(entry, None, None, "error")

    async def _resolve_inner(self, entry: str) -> _Resolved:
        un_name = upcoming_node_name(entry)
        un = await self._get(UPCOMING_NODES, un_name) if un_name else None
        node = await self._get(NODES, entry)
        if node is not None:
            if un is None:
                un = await self._upcoming_by_node_ref(entry)
            return _Resolved(entry, entry, _name(un), "node name")
        if un is None:
            return _Resolved(entry, None, None, "unresolved")
        status = un.get("status") or {}
        ref = (status.get("nodeRef") or {}).get("name")
        if ref and await self._get(NODES, ref) is not None:
            return _Resolved(entry, ref, _name(un), "upcoming nodeRef")
        provider_id = status.get("providerID")
        if provider_id and isinstance(provider_id, str):
            name = with_provider_id(await self._nodes_by_provider_id(provider_id), provider_id)
            if name is not None:
                return _Resolved(entry, name, _name(un), "upcoming providerID")
        return _Resolved(entry, None, _name(un), "upcoming without node")

    async def _nodes_by_provider_id(self, provider_id: str) -> list[Mapping[str, Any]]:
        if self._node_lookup is not None:
            return sorted(self._node_lookup(provider_id), key=lambda n: _name(n) or "")
        listing = await self._call(lambda: self._client.list(NODES))
        return list(listing.items)

    async def _upcoming_by_node_ref(self, node: str) -> dict[str, Any] | None:
        if self._upcoming_lookup is not None:
            candidates = list(self._upcoming_lookup(node))
        else:
            listing = await self._call(lambda: self._client.list(UPCOMING_NODES))
            candidates = list(listing.items)
        found = pointing_at(candidates, node)
        if len(found) > 1:
            log.warning(
                "reclaim: several upcoming nodes point at node=%s names=%s, using the first",
                node,
                [_name(un) for un in found],
            )
        return dict(found[0]) if found else None

    async def _cordon(self, node: str) -> Literal["cordoned", "gone", "failed"]:
        """Cordon ``node``: ``"cordoned"``, ``"gone"`` (404) or ``"failed"`` (logged)."""
        try:
            patched = await self._call(
                lambda: self._client.patch(NODES, node, {"spec": {"unschedulable": True}})
            )
            if self._events is not None:
                self._events.note_node(patched)
        except NotFound:
            log.info("reclaim: node gone before cordon node=%s", node)
            return "gone"
        except KubeError as exc:
            log.error("reclaim: cordon failed node=%s error=%s", node, exc)
            return "failed"
        return "cordoned"

    async def _mark_draining(
        self, un_name: str, *, drain: tuple[str, datetime] | None = None
    ) -> bool:
        """Walk ``un_name`` to Draining; with ``drain`` (node, deadline) record the drain first.

        The annotations come before the phase, both before the ack: a restarted operator
        resumes a Draining object that has them (docs/rules.md#reclaim-resume-after-restart). A
        node already draining keeps the deadline its running drain was recorded with.

        Returns:
            False when a write failed for good (after the handler's retries): no record, so
            the caller must not ack. True otherwise (an object already gone has nothing to
            resume from, and nothing to record).
        """
        self.memory.mark_draining(un_name)
        try:
            if drain is not None and not self._drains.is_draining(drain[0]):
                body = {"metadata": {"annotations": drain_annotations(*drain)}}
                try:
                    await self._call(lambda: self._client.patch(UPCOMING_NODES, un_name, body))
                except NotFound:
                    log.info("reclaim: upcoming node gone name=%s", un_name)
                    return True
            if not await patch_upcoming_status(self._client, un_name, {"phase": PHASE_DRAINING}):
                log.info("reclaim: upcoming node gone name=%s", un_name)
        except KubeError as exc:
            log.error("reclaim: marking Draining failed name=%s error=%s", un_name, exc)
            return False
        return True


def _name(obj: Mapping[str, Any] | None) -> str | None:
    if obj is None:
        return None
    name = (obj.get("metadata") or {}).get("name")
    return name if isinstance(name, str) and name else None
