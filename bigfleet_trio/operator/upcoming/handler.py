"""UpcomingNode I/O: :class:`UpcomingNodeHandler` carries out :mod:`.plan`'s plans.

The session's ``on_node_state_update``: read the stored object (informer cache plus our own
last write, or a live GET), plan, write with the KubeAPI under the one handler retry policy
(:func:`~bigfleet_trio.kube.retry.conflict_retrying`), count writes in metrics. Also the two
status writes the reclaim path uses (:func:`patch_upcoming_status`, :func:`delete_upcoming`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import trio

from bigfleet_trio.kube.api import KubeAPI
from bigfleet_trio.kube.errors import AlreadyExists, Conflict, KubeError, NotFound
from bigfleet_trio.kube.informer import drop_managed_fields
from bigfleet_trio.kube.resources import UPCOMING_NODES
from bigfleet_trio.kube.retry import RECONCILE_RETRIABLE, TRANSIENT, Replan, conflict_retrying
from bigfleet_trio.observability import events as kinds
from bigfleet_trio.observability import metrics
from bigfleet_trio.observability.events import EventFeed
from bigfleet_trio.operator.kubeevents import REASON_WRITE_REFUSED, EventRecorder, object_ref
from bigfleet_trio.proto import pb

from .plan import (
    DELETE,
    DrainMemory,
    UpcomingPlan,
    apply_memory,
    phase_for_state,
    plan_node_state_update,
    spec_from_update,
    upcoming_node_name,
)

__all__ = [
    "CachedLookup",
    "LastWrite",
    "UpcomingNodeHandler",
    "choose_view",
    "delete_upcoming",
    "duration_phase_label",
    "patch_upcoming_status",
]

# The package's logger: log lines keep the logger name they had before the package was split.
log = logging.getLogger(__package__)


# bigfleet_operator_upcoming_node_writes_total{op,outcome} counts every write attempt. conflict is
# AlreadyExists/Conflict, or a patch finding the object deleted: all resolved by re-planning; noop
# is a status write skipped because nothing changed, or a delete of an object already gone.
WriteOp = Literal["create", "spec_update", "status_update", "delete"]
WriteOutcome = Literal["success", "conflict", "error", "noop"]


def _count_write(op: WriteOp, outcome: WriteOutcome) -> None:
    metrics.UPCOMING_NODE_WRITES.labels(op, outcome).inc()


def _failed_write_outcome(exc: BaseException) -> WriteOutcome:
    """conflict for AlreadyExists/Conflict/NotFound-on-patch (re-plan material), else error."""
    return "conflict" if isinstance(exc, (AlreadyExists, Conflict, NotFound)) else "error"


def duration_phase_label(state: int) -> str:
    """``phase`` label of ``bigfleet_operator_node_state_update_duration_seconds`` (observed once
    per update, retries included): the phase before Drained inference, ``Deleting`` for DELETING
    and ``Unknown`` for UNSPECIFIED/unknown states."""
    phase = phase_for_state(state)
    if phase is None:
        return "Unknown"
    return "Deleting" if phase == DELETE else phase


async def patch_upcoming_status(
    client: KubeAPI, name: str, status: dict[str, Any], *, attempts: int = 8
) -> bool:
    """Merge-patch ``{"status": status}`` on an UpcomingNode, retrying transient errors.

    Returns:
        True if written, False if the object does not exist.

    Raises:
        KubeError: a permanent failure, or the last transient one after ``attempts`` tries.
    """
    try:
        async for attempt in conflict_retrying(attempts, also=TRANSIENT):
            with attempt:
                await client.patch(UPCOMING_NODES, name, {"status": status}, subresource="status")
    except NotFound:
        return False
    return True


async def delete_upcoming(client: KubeAPI, name: str, *, attempts: int = 8) -> bool:
    """Delete an UpcomingNode, retrying transient errors. Returns False if it was already gone."""
    try:
        async for attempt in conflict_retrying(attempts, also=TRANSIENT):
            with attempt:
                await client.delete(UPCOMING_NODES, name)
    except NotFound:
        return False
    return True


CachedLookup = Callable[[str], Mapping[str, Any] | None]
"""``get_cached(name) -> object | None``: an UpcomingNode from the informer cache (not mutated)."""


def _resource_version(obj: Mapping[str, Any] | None) -> int | None:
    """``metadata.resourceVersion`` as an int, or None (absent or not an integer)."""
    if not isinstance(obj, Mapping):
        return None
    meta = obj.get("metadata")
    raw = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    try:
        return int(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class LastWrite:
    """What our last write left on the apiserver for one UpcomingNode (the handler's overlay).

    Attributes:
        obj: the object the apiserver returned from our create/patch (or a live GET), or None
            after we deleted it (a tombstone).
        rv: its resourceVersion as an int (for a tombstone: that of the deleted object), or None
            when unknown / not an integer.
    """

    obj: Mapping[str, Any] | None
    rv: int | None

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> LastWrite:
        """The object we just wrote (or read live)."""
        return cls(obj, _resource_version(obj))

    @classmethod
    def deleted(cls, resource_version: Any) -> LastWrite:
        """A tombstone: we deleted the object whose last resourceVersion was this."""
        return cls(None, _resource_version({"metadata": {"resourceVersion": resource_version}}))


def choose_view(
    cached: Mapping[str, Any] | None, written: LastWrite | None
) -> tuple[Mapping[str, Any] | None, bool]:
    """The object to plan from: the informer cache or our last write, whichever is fresher.

    Pure. Why: the session runs one worker per machine, sequentially, so the next frame can
    arrive before the informer's watch event for our previous write. Planning from that lagging
    cache alone would turn a real change into a spurious no-op (Registered -> Idle must delete,
    not no-op against a cached Launched) or lose sticky fields and the Drained inference. A cache
    that caught up, or saw a later write by someone else (the reclaim path), wins. The residual
    risk is a write by another party that neither has seen yet: the same race a live GET has,
    only a few milliseconds wider.

    Args:
        cached: the object in the informer cache, or None (not there).
        written: our overlay entry for the same name, or None.

    Returns:
        ``(view, keep)``: ``view`` is the object to plan from (None = does not exist);
        ``keep`` is False when the overlay entry is superseded and can be dropped.

    Rules: no overlay -> the cache. Cache absent -> our object (cache lags our create; if someone
    deleted it the patch's NotFound re-plans), or None after our delete (tombstone dropped: the
    cache saw it). Both present -> the larger integer resourceVersion, the cache on a tie (it
    caught up; overlay dropped); a tombstone hides cached copies up to the deleted rv (stale
    pre-delete state) and yields to a larger one (a new object). A non-integer rv keeps ours.
    """
    if written is None:
        return cached, False
    if cached is None:
        return written.obj, written.obj is not None
    cached_rv = _resource_version(cached)
    if cached_rv is not None and written.rv is not None:
        if written.obj is None:
            return (cached, False) if cached_rv > written.rv else (None, True)
        return (cached, False) if cached_rv >= written.rv else (written.obj, True)
    return written.obj, True


def settled_by_event(written: LastWrite, obj: Mapping[str, Any], *, deleted: bool) -> bool:
    """Whether an informer event about the overlay entry's object makes the entry redundant.

    Pure. The overlay only bridges the watch's lag behind our own writes; an entry kept after
    the cache caught up would stay until the machine's next frame, which for a machine that
    left (deleted, or Ready for good) never comes: the operator grew by an UpcomingNode per
    machine it ever wrote (docs/kube-api.md#informer-memory).

    Args:
        written: our overlay entry for the object's name.
        obj: the object the event carries (for a deletion: its last state, whose
            resourceVersion is the deletion's on a real apiserver).
        deleted: the event is a deletion.

    Returns:
        An add or update: True when :func:`choose_view` would drop the entry (the cache now has
        our write or a later one). A deletion: True when it is at or after our write (the
        cache's "gone" is the truth, our tombstone included); an older one (a former life, or
        a relist's removal of a copy that predates our write) leaves the entry. Without
        integer resourceVersions on both sides: False (the capacity bound still applies).
    """
    if not deleted:
        return not choose_view(obj, written)[1]
    rv = _resource_version(obj)
    return rv is not None and written.rv is not None and rv >= written.rv


def _as_cached(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """An overlay entry's object as the informer caches it (without managedFields)."""
    return drop_managed_fields(obj) if isinstance(obj, dict) else obj


def _once(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` wrapped to run on the first call only (later calls do nothing)."""
    done = False

    def call() -> None:
        nonlocal done
        if not done:
            done = True
            fn()

    return call


class UpcomingNodeHandler:
    """Applies NodeStateUpdates to UpcomingNode objects (the session's ``on_node_state_update``).

    Every update is retried (:func:`conflict_retrying` with transient failures): the shard does
    not resend a NodeStateUpdate, so a dropped write would strand the object.

    Args:
        client: a KubeClient.
        memory: the :class:`DrainMemory` shared with the reclaim path.
        now: wall clock (aware datetime), injectable for tests.
        attempts: tries per update for transient errors (Conflict, 429, 5xx, transport).
        get_cached: optional :data:`CachedLookup` (the UpcomingNode informer store's ``get``):
            plan from it plus our :class:`LastWrite` overlay (:func:`choose_view`) instead of a
            live GET, so a frame costs one request (the status PATCH) instead of two; the writes
            are merge-patches of changed fields, so a slightly stale view is harmless for the
            fields they write, and a phase change carries the resourceVersion it was planned
            from (a stale one gets 409: docs/rules.md#upcomingnode-phases). Falls back to the
            live GET after AlreadyExists (created concurrently), NotFound on a patch (deleted
            concurrently) or Conflict. None: always a live GET.
        overlay_capacity: most overlay entries kept (oldest forgotten first); entries are also
            dropped as soon as the cache catches up.
        feed: optional :class:`EventFeed`: one ``upcoming_node_written`` per write (machine_id,
            upcoming_node, op ``create|spec_update|status_update|delete``, phase).

    Log lines of writes carry ``machine_id``, ``upcoming_node`` and ``phase`` as ``extra=`` keys.
    """

    def __init__(
        self,
        client: KubeAPI,
        memory: DrainMemory,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        attempts: int = 8,
        get_cached: CachedLookup | None = None,
        overlay_capacity: int = 65536,
        feed: EventFeed | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        self._client = client
        self._events = events
        self.memory = memory
        self._now = now
        self._attempts = attempts
        self._get_cached = get_cached
        self._written: OrderedDict[str, LastWrite] = OrderedDict()
        self._overlay_capacity = overlay_capacity
        self._feed = feed
        # UpcomingNode name -> machine ID, for the machines that have one (an object deleted by
        # someone else re-queues its machine: docs/rules.md#level-triggered-operator)
        self.machine_of: dict[str, str] = {}

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> bool:
        """Reflect one update. Returns True when the machine has no UpcomingNode after it (the
        update deleted it or needs none): the session may forget the machine's desired state.

        Raises:
            Exception: one of :data:`~bigfleet_trio.kube.retry.RECONCILE_RETRIABLE` when the
                write did not land (the session retries it); a permanent refusal is logged
                and counted instead.
        """
        started = trio.current_time()
        live = self._get_cached is None
        # Once per update, so retries repeat neither the naming nor its log lines (the planner
        # computes both again, quietly): the name here, malformed quantities on the first write.
        name = upcoming_node_name(u.machine_id) if u.machine_id else None
        warn_quantities = _once(lambda: spec_from_update(u))
        op = "ignore"
        try:
            # Re-plans only: a transient failure (after the client's own retries) goes back to
            # the session, which parks the frame with per-key backoff and never gives up while
            # it is the machine's latest (docs/rules.md#level-triggered-operator).
            async for attempt in conflict_retrying(self._attempts):
                with attempt:
                    try:
                        op = await self._apply_once(u, name, warn_quantities, live=live)
                    except (Replan, Conflict):
                        if not live:
                            log.info(
                                "upcoming: cached view out of date, re-reading live "
                                "machine_id=%s state=%s",
                                u.machine_id,
                                u.state,
                            )
                        live = True
                        raise
        except (KubeError, Replan) as exc:
            if isinstance(exc, RECONCILE_RETRIABLE):
                raise
            metrics.RECONCILE_PERMANENT_ERRORS.labels("node_state_update").inc()
            if self._events is not None and name is not None:
                # on the object, where `kubectl describe upcomingnode` shows it: the log line
                # alone reaches only whoever reads the operator's logs
                self._events.record(
                    object_ref(UPCOMING_NODES.api_version, UPCOMING_NODES.kind, name),
                    reason=REASON_WRITE_REFUSED, type="Warning",
                    message=f"the apiserver refused machine {u.machine_id}'s "
                            f"{pb.MachineState(u.state).name} update: {exc}; waiting for the "
                            "machine's next frame")
            log.error(
                "upcoming: write refused, waiting for the machine's next frame machine_id=%s "
                "state=%s error=%s",
                u.machine_id,
                u.state,
                exc,
            )
        finally:
            metrics.NODE_STATE_UPDATE_DURATION.labels(duration_phase_label(u.state)).observe(
                trio.current_time() - started
            )
        gone = op in ("delete", "ignore")
        if name is not None:
            if gone:
                self.machine_of.pop(name, None)
            else:
                self.machine_of[name] = u.machine_id
        return gone

    @property
    def overlay_entries(self) -> int:
        """Overlay entries held now (writes the informer cache has not shown yet)."""
        return len(self._written)

    def attach(self, informer: Any) -> None:
        """Drop overlay entries as the UpcomingNode informer (the one ``get_cached`` reads)
        delivers what they bridge (:func:`settled_by_event`); register before it runs."""
        informer.add_handler(on_add=self._cache_saw, on_update=self._cache_updated,
                             on_delete=self._cache_deleted)

    def _cache_saw(self, obj: Mapping[str, Any], *, deleted: bool = False) -> None:
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str):
            return
        entry = self._written.get(name)
        if entry is not None and settled_by_event(entry, obj, deleted=deleted):
            del self._written[name]

    def _cache_updated(self, _old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        self._cache_saw(new)

    def _cache_deleted(self, obj: Mapping[str, Any]) -> None:
        self._cache_saw(obj, deleted=True)

    def _written_one(self, machine_id: str, name: str, op: WriteOp, phase: str | None) -> None:
        if self._feed is not None:
            self._feed.publish(
                kinds.UPCOMING_NODE_WRITTEN, machine_id=machine_id, upcoming_node=name, op=op,
                phase=phase,
            )

    async def _get(self, name: str) -> dict[str, Any] | None:
        try:
            return await self._client.get(UPCOMING_NODES, name)
        except NotFound:
            return None

    def _remember(self, name: str, entry: LastWrite | None) -> None:
        """Set (or with None drop) the overlay entry; only kept when a cache is in use."""
        if self._get_cached is None:
            return
        # the watch event for this write may have come before its answer: then the cache
        # holds it already, and no later event would drop the entry (settled_by_event)
        if entry is None or not choose_view(self._get_cached(name), entry)[1]:
            self._written.pop(name, None)
            return
        self._written[name] = entry
        self._written.move_to_end(name)
        while len(self._written) > self._overlay_capacity:
            self._written.popitem(last=False)

    def _remember_obj(self, name: str, obj: Any) -> None:
        """Overlay the object the apiserver returned from a write (ignored if not an object),
        without its managedFields, as the informer caches it."""
        if isinstance(obj, Mapping):
            self._remember(name, LastWrite.of(_as_cached(obj)))

    async def _existing(self, name: str, live: bool) -> Mapping[str, Any] | None:
        """The object to plan from: live GET, or cache + overlay (:func:`choose_view`)."""
        if self._get_cached is None:
            return await self._get(name)
        if live:
            obj = await self._get(name)
            self._remember(name, LastWrite.of(_as_cached(obj)) if obj is not None else None)
            return obj
        view, keep = choose_view(self._get_cached(name), self._written.get(name))
        if not keep:
            self._written.pop(name, None)
        return view

    async def _apply_once(
        self,
        u: pb.NodeStateUpdate,
        name: str | None,
        before_write: Callable[[], object],
        *,
        live: bool = True,
    ) -> str:
        """One attempt (returns the plan's op): plan from the current view of ``name``
        (``upcoming_node_name`` of the update's machine_id, None if unusable) and write;
        ``before_write`` runs before a create or update (not for ignore/delete).

        Raises:
            Replan, KubeError: the attempt failed; the caller retries (see conflict_retrying).
        """
        existing = await self._existing(name, live) if name else None
        plan = plan_node_state_update(
            u, existing, self.memory.get(name) if name else None, self._now()
        )
        keys = {"machine_id": u.machine_id, "upcoming_node": plan.name, "phase": plan.phase}
        if plan.op == "ignore":
            log.info(
                "upcoming: ignored machine_id=%r name=%s reason=%s",
                u.machine_id,
                plan.name,
                plan.reason,
                extra=keys,
            )
            apply_memory(self.memory, plan)
            return plan.op
        if plan.op == "delete":
            await self._apply_delete(u, plan, existing, keys)
            apply_memory(self.memory, plan)
            return plan.op
        before_write()
        if plan.op == "create":
            await self._apply_create(u, plan, keys)
        elif plan.spec_patch is not None:
            existing = await self._patch(plan.name, plan.spec_patch, None) or existing
            log.info(
                "upcoming: spec updated name=%s fields=%s",
                plan.name,
                sorted(plan.spec_patch["spec"]),
                extra=keys,
            )
            self._written_one(u.machine_id, plan.name, "spec_update", plan.phase)
        if plan.status_patch is not None:
            body = plan.status_patch
            meta = existing.get("metadata") if existing is not None else None
            rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
            if plan.op == "update" and "phase" in body["status"] and isinstance(rv, str) and rv:
                # A phase change is guarded by the resourceVersion it was planned from: planned
                # from a stale view (the cache behind a reclaim's Draining), it is refused with
                # 409 and re-planned from a live read, where the phase order holds
                # (docs/rules.md#upcomingnode-phases). Other status fields merge unguarded.
                body = {**body, "metadata": {"resourceVersion": rv}}
            await self._patch(plan.name, body, "status")
            log.info(
                "upcoming: status written name=%s phase=%s fields=%s",
                plan.name,
                plan.phase,
                sorted(plan.status_patch["status"]),
                extra=keys,
            )
            self._written_one(u.machine_id, plan.name, "status_update", plan.phase)
        else:
            _count_write("status_update", "noop")
            if plan.spec_patch is None:
                log.debug("upcoming: no-op name=%s phase=%s", plan.name, plan.phase, extra=keys)
        apply_memory(self.memory, plan)
        return plan.op

    async def _apply_delete(
        self,
        u: pb.NodeStateUpdate,
        plan: UpcomingPlan,
        existing: Mapping[str, Any] | None,
        keys: dict[str, Any],
    ) -> None:
        gone = not await self._delete(plan.name)
        meta = existing.get("metadata") if existing is not None else None
        last_rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        self._remember(plan.name, LastWrite.deleted(last_rv))
        log.info(
            "upcoming: deleted name=%s phase=%s reason=%s already_gone=%s",
            plan.name,
            plan.phase,
            plan.reason,
            gone,
            extra=keys,
        )
        if not gone:
            self._written_one(u.machine_id, plan.name, "delete", plan.phase)

    async def _apply_create(
        self, u: pb.NodeStateUpdate, plan: UpcomingPlan, keys: dict[str, Any]
    ) -> None:
        body = {
            "apiVersion": UPCOMING_NODES.api_version,
            "kind": UPCOMING_NODES.kind,
            "metadata": {"name": plan.name},
            "spec": plan.spec,
        }
        try:
            created = await self._client.create(UPCOMING_NODES, body)
        except AlreadyExists as exc:
            _count_write("create", "conflict")
            raise Replan(f"UpcomingNode {plan.name} created concurrently") from exc
        except KubeError as exc:
            _count_write("create", _failed_write_outcome(exc))
            raise
        _count_write("create", "success")
        self._remember_obj(plan.name, created)
        log.info("upcoming: created name=%s phase=%s", plan.name, plan.phase, extra=keys)
        self._written_one(u.machine_id, plan.name, "create", plan.phase)

    async def _patch(
        self, name: str, body: dict[str, Any], subresource: str | None
    ) -> Mapping[str, Any] | None:
        """Write one patch; returns the object the apiserver answered (None if not an object).

        Raises:
            Replan: the object was deleted concurrently.
            KubeError: any other failure (a Conflict included: the caller re-reads live).
        """
        op: WriteOp = "status_update" if subresource == "status" else "spec_update"
        try:
            written = await self._client.patch(UPCOMING_NODES, name, body, subresource=subresource)
        except NotFound as exc:
            _count_write(op, "conflict")
            raise Replan(f"UpcomingNode {name} deleted concurrently") from exc
        except KubeError as exc:
            _count_write(op, _failed_write_outcome(exc))
            raise
        _count_write(op, "success")
        self._remember_obj(name, written)
        return written if isinstance(written, Mapping) else None

    async def _delete(self, name: str) -> bool:
        try:
            await self._client.delete(UPCOMING_NODES, name)
        except NotFound:
            _count_write("delete", "noop")
            return False
        except KubeError as exc:
            _count_write("delete", _failed_write_outcome(exc))
            raise
        _count_write("delete", "success")
        return True
