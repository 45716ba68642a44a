"""The session's worker pool: where routed frames run, with slots, admission and coalescing.

:class:`WorkerPool` is one part of a :class:`~bigfleet_trio.operator.session.core.Session`. The
router hands it each frame with its :class:`~bigfleet_trio.operator.session.types.Route`;
:meth:`WorkerPool.submit` applies the route's :class:`~bigfleet_trio.operator.session.types.
Dispatch` policy: the node-state pool behind the read-ahead gate, one writer per key, one
admitted task per frame, or an answer task. Handlers share ``dispatch_concurrency`` slots;
their exceptions are logged and counted, never raised. Rules: ``docs/wire.md#the-session``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NoReturn

import trio

from bigfleet_trio.kube import reqtrace
from bigfleet_trio.kube.retry import RECONCILE_RETRIABLE
from bigfleet_trio.observability import metrics
from bigfleet_trio.operator.session.queues import KeyedCoalescer
from bigfleet_trio.operator.session.send import SendSide
from bigfleet_trio.operator.session.types import (
    Dispatch,
    Handlers,
    Route,
    SessionConfig,
    SessionStats,
)
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.codec import NodeStateFrame

__all__ = ["WorkerPool"]

log = logging.getLogger(__name__)

RETRIABLE = RECONCILE_RETRIABLE
FAILING_REPORT_INTERVAL = 5.0
"""Seconds between refreshes of ``bigfleet_operator_reconcile_failing_oldest_seconds`` while
some key's write keeps failing."""

_TRACED_KEYS = {"node_state_update": "machine_id", "reclaim_instruction": "instruction_id"}


def _trace_frame(trace: reqtrace.FrameTrace, kind: str, value: Any) -> None:
    attr = _TRACED_KEYS.get(kind)
    if attr is not None:
        trace.read(kind, str(getattr(value, attr, "")))


class WorkerPool:
    """Runs the handlers of routed frames (see the module docstring).

    Args:
        routes: the route table (:data:`~bigfleet_trio.operator.session.types.ROUTES`).
        config: the session's :class:`SessionConfig`.
        stats: the session's counters (shared).
        handlers: the injected :class:`Handlers`.
        send: the session's :class:`SendSide` (replies and answers go there).

    Attributes:
        node_states: the MACHINE_POOL route's coalescer (latest frame per machine).
        keyed: the coalescer of each KEYED_WRITER route, by frame kind.
        frames_read: frames the receive pump has taken off the stream (the read-ahead gate).
    """

    def __init__(
        self,
        routes: Mapping[str, Route],
        config: SessionConfig,
        stats: SessionStats,
        handlers: Handlers,
        send: SendSide,
    ) -> None:
        self.config = config
        self.stats = stats
        self._handlers = handlers
        self._send = send
        pools = [(k, r) for k, r in routes.items() if r.dispatch is Dispatch.MACHINE_POOL]
        if len(pools) > 1:
            raise ValueError(f"one MACHINE_POOL route at most, got {[k for k, _ in pools]}")
        self._pool_route = pools[0] if pools else None
        # A frame from a stream with receive_deferred stays a NodeStateFrame until a worker
        # takes it: the superseded ones are never converted (docs/wire.md#downlink-decoding).
        self.node_states: KeyedCoalescer[str, pb.NodeStateUpdate | NodeStateFrame] = (
            KeyedCoalescer(config.node_state_pending_cap))
        # One writer per key, newest pending frame next (docs/rules.md#availablecapacity-ordering).
        # No cap of its own: a key that becomes ready takes an admission token, so the ready
        # keys are bounded by the admission limit and further frames only replace the pending one.
        self.keyed: dict[str, KeyedCoalescer[str, Any]] = {
            k: KeyedCoalescer() for k, r in routes.items()
            if r.dispatch is Dispatch.KEYED_WRITER
        }
        self._handler_errors = {k: metrics.HANDLER_ERRORS.labels(k) for k in [*routes, "unknown"]}
        # the node-state series exists from the start (the hot path); others on first use
        self._coalesced = {k: metrics.COALESCED_FRAMES.labels(k) for k, r in routes.items()
                           if r.dispatch is Dispatch.MACHINE_POOL}
        self._slots = trio.Semaphore(config.dispatch_concurrency)
        self._admission = trio.Semaphore(config.dispatch_concurrency + config.dispatch_backlog)
        self._ready_keys = trio.Semaphore(0)  # one token per machine on the ready queue
        self.frames_read = 0
        self._claim_turn = trio.Lock()  # one worker at a time waits at the read-ahead gate
        self._quiet_at = -1  # frames_read when the pump was last seen waiting (see the gate)
        self._room: trio.Event | None = None  # set when node-state pending drops below the cap
        # when each machine waiting on the ready queue became ready (for its queue time)
        self._ready_at: dict[str, float] = {}
        self._routes = routes
        # machine ID -> its latest frame, kept while the machine has an UpcomingNode: what
        # requeue_machine reconciles again (one entry per live machine)
        self.last_frames: dict[str, Any] = {}
        self._parked_changed = trio.Event()  # a key was parked: the retry timer recomputes
        # (kind, key) -> when its write first failed, while it keeps failing (the gauge behind
        # the not-converged alert); one entry per failing key
        self._failing_since: dict[tuple[str, str], float] = {}
        self._nursery: trio.Nursery | None = None
        self._gate_wait = metrics.NODE_STATE_WORKER_WAIT.labels("read_ahead")
        self._slot_wait = metrics.NODE_STATE_WORKER_WAIT.labels("slot")

    def start(self, nursery: trio.Nursery) -> None:
        """Start the node-state workers (``dispatch_concurrency`` of them) and the retry timer
        in ``nursery``."""
        self._nursery = nursery
        metrics.RECONCILE_FAILING_OLDEST.set(0)  # a new session: the shard replays its state
        nursery.start_soon(self._retry_timer, name="session-retry-timer")
        if self._pool_route is None:
            return
        for i in range(self.config.dispatch_concurrency):
            nursery.start_soon(self._node_state_worker, name=f"session-node-state-{i}")

    # ---- retries ------------------------------------------------------------------------------

    def _coalescers(self) -> list[tuple[str, KeyedCoalescer[str, Any]]]:
        out: list[tuple[str, KeyedCoalescer[str, Any]]] = list(self.keyed.items())
        if self._pool_route is not None:
            out.append((self._pool_route[0], self.node_states))
        return out

    def _report_failing(self, now: float) -> None:
        oldest = min(self._failing_since.values(), default=now)
        metrics.RECONCILE_FAILING_OLDEST.set(now - oldest)

    def _reached(self, kind: str, coalescer: KeyedCoalescer[str, Any], key: str) -> None:
        """``key``'s frame landed: its backoff starts again and it no longer counts as failing."""
        coalescer.forget(key)
        if self._failing_since and self._failing_since.pop((kind, key), None) is not None:
            self._report_failing(trio.current_time())

    async def _retry_timer(self) -> NoReturn:
        """Make parked keys ready when their backoff ends: a node-state key wakes a worker, a
        keyed-writer key gets a writer task (with an admission token, as a frame would). While
        keys are failing, also refreshes the failing-oldest gauge every few seconds."""
        while True:
            deadline = min((c.next_deadline() for _, c in self._coalescers()), default=math.inf)
            if self._failing_since:
                self._report_failing(trio.current_time())
                deadline = min(deadline, trio.current_time() + FAILING_REPORT_INTERVAL)
            self._parked_changed = trio.Event()
            with trio.move_on_at(deadline):
                await self._parked_changed.wait()
            now = trio.current_time()
            for kind, coalescer in self._coalescers():
                for key in coalescer.promote(now):
                    if coalescer is self.node_states:
                        self._ready_at[key] = now
                        self._ready_keys.release()
                    else:
                        await self._admit()
                        route = self._routes[kind]
                        assert self._nursery is not None
                        self._nursery.start_soon(self._bounded, kind, self._drain_key, kind, route)

    def _retry(self, kind: str, coalescer: KeyedCoalescer[str, Any], key: str, value: Any,
               exc: Exception) -> None:
        """Park ``value`` (whose write failed retriably with ``exc``) for ``key``'s backoff."""
        now = trio.current_time()
        delay = coalescer.retry(key, value, now)
        metrics.RECONCILE_RETRIES.labels(kind).inc()
        self._failing_since.setdefault((kind, key), now)
        failures = coalescer.failures(key)
        # the first failure and every tenth after it: an outage of minutes stays readable
        level = logging.WARNING if failures % 10 == 1 else logging.DEBUG
        log.log(level, "write failed, will retry kind=%s key=%s failures=%d retry_in=%s "
                "error=%s cluster=%s", kind, key, failures,
                "newer frame" if delay is None else f"{delay:.2f}s", exc,
                self.config.cluster_id)
        if delay is not None:
            self._parked_changed.set()

    async def submit(self, kind: str, route: Route, value: Any, nursery: trio.Nursery) -> None:
        """Dispatch one frame of ``kind`` by ``route``; waits only for admission or room
        (backpressure on the receive pump), never for the handler."""
        policy = route.dispatch
        if reqtrace.frames is not None:  # measuring only (docs/kube-api.md#request-trace)
            _trace_frame(reqtrace.frames, kind, value)
        if policy is Dispatch.MACHINE_POOL:
            self.last_frames[getattr(value, route.key or "")] = value
            self._count_coalesced(kind, route, self.node_states, value)
            if self.node_states.full:
                await self._wait_for_room()
        elif policy is Dispatch.KEYED_WRITER:
            # Each frame is the key's whole state, so only the newest one pending matters, and
            # two writes for one key must never overlap: a retried older write landing after a
            # newer one would leave the stale value, and the shard sends only on change.
            if self._count_coalesced(kind, route, self.keyed[kind], value):
                await self._admit()
                nursery.start_soon(self._bounded, kind, self._drain_key, kind, route)
        elif policy is Dispatch.TASK:
            await self._admit()
            args = (value, self._send.enqueue) if route.reply else (value,)
            nursery.start_soon(self._bounded, kind, self._handler(route), *args)
        elif policy is Dispatch.ANSWER:
            nursery.start_soon(self._answer, kind, route, value, trio.current_time())
        else:
            assert route.inline is not None
            route.inline(value, self.config.cluster_id)

    def requeue_machine(self, machine_id: str) -> bool:
        """Reconcile ``machine_id``'s latest frame again (its UpcomingNode was deleted or edited
        by someone else, as controller-runtime's ``Owns()`` re-queues an owner). Returns False
        when the machine has no frame kept (never seen, or gone for good) or is in flight
        already."""
        frame = self.last_frames.get(machine_id)
        if frame is None or self._pool_route is None or self.node_states.in_flight(machine_id):
            return False
        if self.node_states.offer(machine_id, frame):
            self._ready_at[machine_id] = trio.current_time()
            self._ready_keys.release()
        return True

    def note_read(self) -> None:
        """The receive pump took one more frame off the stream (for the read-ahead gate)."""
        self.frames_read += 1

    # ---- helpers ------------------------------------------------------------------------------

    def _handler(self, route: Route) -> Callable[..., Awaitable[Any]]:
        assert route.handler is not None
        fn: Callable[..., Awaitable[Any]] = getattr(self._handlers, route.handler)
        return fn

    def _count_coalesced(
        self, kind: str, route: Route, coalescer: KeyedCoalescer[str, Any], value: Any
    ) -> bool:
        """Offer ``value`` under its key; count a superseded frame. True: the key became ready."""
        assert route.key is not None
        before = coalescer.coalesced
        key = getattr(value, route.key)
        if coalescer.offer(key, value):
            if coalescer is self.node_states:
                self._ready_at[key] = trio.current_time()
                self._ready_keys.release()
            return True
        if coalescer.coalesced != before:
            if route.coalesced is not None:
                setattr(self.stats, route.coalesced, getattr(self.stats, route.coalesced) + 1)
            counter = self._coalesced.get(kind)
            if counter is None:
                counter = self._coalesced[kind] = metrics.COALESCED_FRAMES.labels(kind)
            counter.inc()
        return False

    async def _admit(self) -> None:
        """Take an admission token; blocks (backpressure on the recv pump) only when full."""
        try:
            self._admission.acquire_nowait()
        except trio.WouldBlock:
            await self._admission.acquire()

    async def _call_handler(self, kind: str, fn: Callable[..., Awaitable[Any]], *args: Any,
                            retriable: bool = False) -> Any:
        """Run one handler; log and count an exception (return None) instead of raising it.
        With ``retriable``, a :data:`RETRIABLE` one is raised for the caller to retry."""
        try:
            return await fn(*args)
        except RETRIABLE:
            if retriable:
                raise
            self.stats.handler_errors += 1
            self._handler_errors[kind].inc()
            log.exception("dispatch failed kind=%s cluster=%s", kind, self.config.cluster_id)
            return None
        except Exception:
            self.stats.handler_errors += 1
            self._handler_errors[kind].inc()
            log.exception("dispatch failed kind=%s cluster=%s", kind, self.config.cluster_id)
            return None

    async def _bounded(self, kind: str, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        try:
            async with self._slots:
                metrics.DISPATCH_INFLIGHT.inc()
                try:
                    await self._call_handler(kind, fn, *args)
                finally:
                    metrics.DISPATCH_INFLIGHT.dec()
        finally:
            self._admission.release()

    # ---- KEYED_WRITER -------------------------------------------------------------------------

    async def _drain_key(self, kind: str, route: Route) -> None:
        """Own one ready key and hand its frames to the handler, newest pending next, until none
        is left or a write fails retriably (then the frame is parked for the key's backoff and
        the retry timer starts a new task; one task per ready key, started with an admission
        token)."""
        coalescer = self.keyed[kind]
        key = coalescer.claim()
        if key is None:  # pragma: no cover - one task per ready key
            return
        handler = self._handler(route)
        clean = False
        try:
            while (value := coalescer.take_next(key)) is not None:
                try:
                    await self._call_handler(kind, handler, value, retriable=True)
                except RETRIABLE as exc:
                    self._retry(kind, coalescer, key, value, exc)
                    if coalescer.is_parked(key):
                        coalescer.release(key)
                        clean = True
                        return
                    # a newer frame came meanwhile and replaced it: this task writes it next
                else:
                    self._reached(kind, coalescer, key)
            clean = True
        finally:
            if not clean:
                coalescer.abandon(key)

    # ---- ANSWER -------------------------------------------------------------------------------

    async def _answer(self, kind: str, route: Route, req: Any, received: float) -> None:
        """Run an answering handler (BootstrapRequest) and queue its answer in the bootstrap
        lane; a failure is answered with an error so the shard falls back at once."""
        metrics.DISPATCH_INFLIGHT.inc()
        try:
            try:
                resp = await self._handler(route)(req)
            except Exception as exc:
                self.stats.handler_errors += 1
                self._handler_errors[kind].inc()
                log.exception("dispatch failed kind=%s request_id=%s cluster=%s",
                              kind, req.request_id, self.config.cluster_id)
                # Answer with an error so the shard falls back now instead of timing out.
                resp = pb.BootstrapBlobResponse(
                    request_id=req.request_id, error=f"operator: bootstrap handler failed: {exc}"
                )
            if not resp.request_id:
                resp.request_id = req.request_id
            self._send.enqueue_bootstrap(pb.OperatorMessage(bootstrap_response=resp), received)
        finally:
            metrics.DISPATCH_INFLIGHT.dec()

    # ---- MACHINE_POOL -------------------------------------------------------------------------

    async def _wait_for_room(self) -> None:
        """Pause the recv pump while node_state_pending_cap machines have a frame waiting."""
        log.warning(
            "node-state backlog at cap: recv paused machines_pending=%d cap=%d cluster=%s",
            self.node_states.pending, self.node_states.max_pending, self.config.cluster_id,
        )
        started = trio.current_time()
        while self.node_states.full:
            self._room = trio.Event()
            await self._room.wait()
        log.info("node-state backlog below cap: recv resumed after %.3fs cluster=%s",
                 trio.current_time() - started, self.config.cluster_id)

    async def _read_ahead_gate(self) -> None:
        """Let the recv pump read ahead before a worker starts on a new machine.

        Returns once the pump has had a scheduler batch without reading a frame (it is waiting
        for the stream, or paused at the cap), or has read ``node_state_read_ahead`` frames
        since this wait began. One worker waits at a time (FIFO lock), so while the pump is
        backlogged at most one new machine is started per ``node_state_read_ahead`` frames.
        Once the pump was seen waiting, every worker passes at once until it reads again.
        """
        limit = self.config.node_state_read_ahead
        if limit == 0 or self.frames_read == self._quiet_at:
            return
        async with self._claim_turn:
            start = self.frames_read
            while self.frames_read != self._quiet_at:
                seen = self.frames_read
                # Two schedule points span one whole batch, whatever the batch order: a pump
                # with a frame ready runs in it, so an unchanged count means the pump is waiting.
                await trio.lowlevel.checkpoint()
                await trio.lowlevel.checkpoint()
                if self.frames_read == seen:
                    self._quiet_at = seen
                elif self.frames_read - start >= limit:
                    return

    async def _node_state_worker(self) -> NoReturn:
        """One pool worker: take a ready machine, hold a slot while draining its latest frames."""
        assert self._pool_route is not None
        kind, route = self._pool_route
        handler = self._handler(route)
        while True:
            await self._ready_keys.acquire()
            # where a ready machine's wait goes (docs/wire.md#the-session): a free worker (this
            # acquire), the read-ahead gate, a slot held by other handlers
            t0 = trio.current_time()
            await self._read_ahead_gate()
            t1 = trio.current_time()
            async with self._slots:
                t2 = trio.current_time()
                machine_id = self.node_states.claim()
                if machine_id is None:  # pragma: no cover - one token per ready key
                    continue
                self._gate_wait.observe(t1 - t0)
                self._slot_wait.observe(t2 - t1)
                metrics.NODE_STATE_QUEUE.observe(t2 - self._ready_at.pop(machine_id, t2))
                clean = False
                metrics.DISPATCH_INFLIGHT.inc()
                try:
                    # One frame per claim: a machine whose frames keep coming goes back to the
                    # ready queue's tail instead of holding this worker and its slot.
                    u = raw = self.node_states.take_next(machine_id)
                    if self._room is not None and not self.node_states.full:
                        self._room.set()
                        self._room = None
                    if u is not None:
                        if isinstance(u, NodeStateFrame):
                            u = u.to_message()
                        try:
                            gone = await self._call_handler(kind, handler, u, retriable=True)
                        except RETRIABLE as exc:
                            self._retry(kind, self.node_states, machine_id, u, exc)
                        else:
                            self._reached(kind, self.node_states, machine_id)
                            if gone is True and self.last_frames.get(machine_id) is raw:
                                del self.last_frames[machine_id]
                        if self.node_states.release(machine_id):
                            self._ready_at[machine_id] = trio.current_time()
                            self._ready_keys.release()
                    clean = True
                finally:
                    metrics.DISPATCH_INFLIGHT.dec()
                    if not clean:
                        self.node_states.abandon(machine_id)
