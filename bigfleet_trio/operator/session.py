"""One shard session: Hello, then the send, receive and roll-up Trio tasks over one stream.

Sits between the agent's reconnect loop (:mod:`.agent`), which opens a stream and runs one
:class:`Session` on it, and the injected roll-up source and handlers (those types, the config
and the counters: :mod:`.sessiontypes`). The queue and coalescing rules are sans-IO in
:mod:`bigfleet_trio.operator.queues`; this module wires them to Trio tasks, all in one nursery
owned by :meth:`Session.run`: send, receive (plus the bootstrap lane when the stream has one),
roll-up, the node-state worker pool, one writer task per supersedes_key with an
AvailableCapacityUpdate pending, one task per other dispatched frame, and the acknowledgement
hook. The first failure of send/receive/roll-up ends the session. Task
layout, send timeout, dispatch and backpressure: ``docs/wire.md#the-session``.
"""

from __future__ import annotations

import contextvars
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import betterproto
import trio

from bigfleet_trio.observability import metrics
from bigfleet_trio.operator.queues import BOOTSTRAP_ANSWER_DEADLINE, NodeStateCoalescer, SendQueues
from bigfleet_trio.operator.sessiontypes import (
    Frame,
    Handlers,
    RollupSource,
    SendStalled,
    SessionConfig,
    SessionStats,
)
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.codec import EncodedFrame, NodeStateFrame
from bigfleet_trio.shard.enums import REPORTER, UnknownEnum, describe, unknown_enum_values
from bigfleet_trio.shard.transport import OperatorStream, PriorityReceive, StreamClosed

__all__ = ["Session", "current_session"]

log = logging.getLogger(__name__)

_current: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "bigfleet_current_session", default=None
)


def current_session() -> Session | None:
    """The :class:`Session` whose task tree the caller runs in (None outside a session)."""
    return _current.get()


_KINDS_IN = ("ack", "bootstrap_request", "reclaim_instruction", "node_state_update",
             "available_capacity", "unknown")
_KINDS_OUT = ("hello", "rollup", "bootstrap_response", "reclaim_ack", "unknown")
_FRAMES_IN = {k: metrics.FRAMES.labels("in", k) for k in _KINDS_IN}
_FRAMES_OUT = {k: metrics.FRAMES.labels("out", k) for k in _KINDS_OUT}
_HANDLER_ERRORS = {k: metrics.HANDLER_ERRORS.labels(k) for k in _KINDS_IN}
_COALESCED_NODE_STATES = metrics.COALESCED_FRAMES.labels("node_state_update")


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            out.extend(_leaves(exc))
        else:
            out.append(exc)
    return out


def _kind_out(msg: Frame) -> str:
    if isinstance(msg, EncodedFrame):
        return msg.kind if msg.kind in _FRAMES_OUT else "unknown"
    name, _ = betterproto.which_one_of(msg, "payload")
    return name if name in _FRAMES_OUT else "unknown"


class Session:
    """The tasks of one connected ``Shard.Session`` stream. Queues live and die with it.

    Args:
        stream: the agent end of an open stream (the caller owns and closes it).
        config: :class:`SessionConfig`.
        source: the injected :class:`RollupSource`.
        handlers: the injected :class:`Handlers`.
        stats: counters to add to (shared across sessions by the agent); a fresh one if None.
    """

    def __init__(
        self,
        stream: OperatorStream,
        config: SessionConfig,
        source: RollupSource,
        handlers: Handlers,
        stats: SessionStats | None = None,
    ) -> None:
        self.config = config
        self.stats = stats if stats is not None else SessionStats()
        self.queues = SendQueues(config.outbox_capacity)
        # A frame from a stream with receive_deferred stays a NodeStateFrame until a worker
        # takes it: the superseded ones are never converted (docs/wire.md#downlink-decoding).
        self.node_states: NodeStateCoalescer[str, pb.NodeStateUpdate | NodeStateFrame] = (
            NodeStateCoalescer(config.node_state_pending_cap))
        # One writer per supersedes_key, newest pending update next
        # (docs/rules.md#availablecapacity-ordering). No cap of its own: a key that becomes
        # ready takes an admission token, so the ready keys are bounded by the admission limit
        # and further frames for them only replace the pending one.
        self.available: NodeStateCoalescer[str, pb.AvailableCapacityUpdate] = NodeStateCoalescer()
        #: set as soon as the session starts tearing down (first task ended or cancelled).
        self.closing = trio.Event()
        self._stream = stream
        self._source = source
        self._handlers = handlers
        self._wakeup = trio.Event()
        self._slots = trio.Semaphore(config.dispatch_concurrency)
        self._admission = trio.Semaphore(config.dispatch_concurrency + config.dispatch_backlog)
        self._ready_keys = trio.Semaphore(0)  # one token per machine on the ready queue
        self._frames_read = 0  # frames the recv pump has taken off the stream (this session)
        self._claim_turn = trio.Lock()  # one worker at a time waits at the read-ahead gate
        self._quiet_at = -1  # _frames_read when the pump was last seen waiting (see the gate)
        self._room: trio.Event | None = None  # set when node-state pending drops below the cap
        self._ack_dirty = False
        self._ack_running = False
        self._drops_quiet_until = -math.inf  # drops before this time only add to the summary
        self._drops_unlogged = 0
        self._expired_unlogged = 0
        self._expired_quiet_until = -math.inf
        self._drops_pending = trio.Event()  # set when _drops_unlogged becomes > 0

    # ---- public, non-blocking ----------------------------------------------------------------

    def enqueue(self, msg: pb.OperatorMessage) -> bool:
        """Put a response frame in the outbox without blocking (the handlers' ``reply``).

        Returns:
            False when the outbox was full and the frame was dropped (metric + warning logged;
            the shard re-issues on its own timeout), or when the session has already ended.
        """
        if self.closing.is_set():
            log.debug("reply after the session ended ignored cluster=%s", self.config.cluster_id)
            return False
        if not self.queues.outbox.offer(msg):
            self.stats.outbox_dropped += 1
            metrics.OUTBOX_DROPPED.inc()
            self._log_drop(msg)
            return False
        self._wakeup.set()
        return True

    def enqueue_bootstrap(self, msg: pb.OperatorMessage, received: float) -> bool:
        """Queue a bootstrap answer in its own lane, ahead of other frames, without blocking.

        Kept until ``received`` (when the request was read; the session's clock, seconds) plus
        :data:`~bigfleet_trio.operator.queues.BOOTSTRAP_ANSWER_DEADLINE`, then dropped unsent:
        never dropped for being behind other answers (docs/wire.md#send-queues).

        Returns:
            False when the session has already ended.
        """
        if self.closing.is_set():
            log.debug("reply after the session ended ignored cluster=%s", self.config.cluster_id)
            return False
        expired = self.queues.bootstrap.expired
        self.queues.bootstrap.offer(msg, received + BOOTSTRAP_ANSWER_DEADLINE, trio.current_time())
        self._note_expired(expired)
        self._wakeup.set()
        return True

    def _note_expired(self, before: int) -> None:
        """Count bootstrap answers found past their deadline; log them at most once per
        ``drop_log_interval`` (a shard that stopped reading would otherwise flood the log)."""
        n = self.queues.bootstrap.expired - before
        if n <= 0:
            return
        self.stats.bootstrap_answers_expired += n
        metrics.BOOTSTRAP_ANSWERS_EXPIRED.inc(n)
        self._expired_unlogged += n
        now = trio.current_time()
        if now < self._expired_quiet_until:
            return
        count, self._expired_unlogged = self._expired_unlogged, 0
        self._expired_quiet_until = now + self.config.drop_log_interval
        log.warning("%d bootstrap answer(s) dropped unsent: their %gs deadline passed while "
                    "queued (the shard has given up on those machines) cluster=%s", count,
                    BOOTSTRAP_ANSWER_DEADLINE, self.config.cluster_id,
                    extra={"cluster": self.config.cluster_id, "expired": count})

    def _log_drop(self, msg: pb.OperatorMessage) -> None:
        """First drop of an episode: one WARNING; later ones wait for the summary task."""
        now = trio.current_time()
        if self._drops_unlogged == 0 and now >= self._drops_quiet_until:
            name, value = betterproto.which_one_of(msg, "payload")
            ident = getattr(value, "request_id", "") or getattr(value, "instruction_id", "")
            log.warning(
                "outbox full; dropped frame kind=%s id=%s capacity=%d cluster=%s "
                "(shard will re-issue on timeout; further drops summarised every %gs)",
                name, ident, self.queues.outbox.capacity, self.config.cluster_id,
                self.config.drop_log_interval,
            )
            self._drops_quiet_until = now + self.config.drop_log_interval
            return
        self._drops_unlogged += 1
        self._drops_pending.set()

    def _log_drop_summary(self) -> None:
        count, self._drops_unlogged = self._drops_unlogged, 0
        if count:
            log.warning(
                "outbox full; %d more frames dropped in the last %gs capacity=%d cluster=%s "
                "(total dropped %d)",
                count, self.config.drop_log_interval, self.queues.outbox.capacity,
                self.config.cluster_id, self.stats.outbox_dropped,
            )

    async def _drop_summary_loop(self) -> NoReturn:
        while True:
            await self._drops_pending.wait()
            await trio.sleep_until(self._drops_quiet_until)
            self._log_drop_summary()
            self._drops_quiet_until = trio.current_time() + self.config.drop_log_interval
            self._drops_pending = trio.Event()

    def enqueue_rollup(self, needs: pb.ClusterCapacityNeeds | EncodedFrame) -> None:
        """Store a roll-up in the pending slot (replacing an unsent one). Never blocks.

        Args:
            needs: the roll-up message, or an already serialized ``OperatorMessage{rollup}``
                (sent byte for byte; its cluster_id must be set by whoever encoded it).
        """
        frame: Frame
        if isinstance(needs, EncodedFrame):
            frame = needs
        else:
            if not needs.cluster_id:
                needs.cluster_id = self.config.cluster_id
            frame = pb.OperatorMessage(rollup=needs)
        if self.queues.rollup.put(frame):
            self.stats.rollups_replaced += 1
            metrics.COALESCED_FRAMES.labels("rollup").inc()
            log.debug("pending roll-up replaced by a newer one cluster=%s", self.config.cluster_id)
        self._wakeup.set()

    # ---- lifecycle ---------------------------------------------------------------------------

    async def run(self, on_established: Callable[[], None] | None = None) -> NoReturn:
        """Send Hello, then run send/recv/roll-up until one fails; never returns normally.

        Args:
            on_established: called once, right after Hello was sent.

        Raises:
            SendStalled: a frame (Hello included) was not accepted within ``send_timeout``.
            StreamClosed: the stream ended (peer close, transport error).
            Exception: any other failure of the three tasks (a bug); the reconnect loop logs it.
        """
        token = _current.set(self)
        try:
            hello = pb.OperatorMessage(
                hello=pb.Hello(
                    cluster_id=self.config.cluster_id,
                    protocol_version=self.config.protocol_version,
                )
            )
            await self._send_frame(hello)
            log.info(
                "session established cluster=%s protocol=%s",
                self.config.cluster_id, self.config.protocol_version,
            )
            if on_established is not None:
                on_established()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._guard, self._send_loop, name="session-send")
                    nursery.start_soon(self._guard, self._recv_loop, nursery, name="session-recv")
                    if isinstance(self._stream, PriorityReceive):
                        nursery.start_soon(
                            self._bootstrap_pump, self._stream, nursery, name="session-bootstrap"
                        )
                    nursery.start_soon(
                        self._guard, self._rollup_loop, nursery, name="session-rollup"
                    )
                    nursery.start_soon(self._drop_summary_loop, name="session-drop-log")
                    for i in range(self.config.dispatch_concurrency):
                        nursery.start_soon(self._node_state_worker, name=f"session-node-state-{i}")
            except BaseExceptionGroup as group:
                # The first failure cancels the rest, so the group normally holds one error (plus
                # Cancelled when an outer cancel raced it): re-raise that error bare so callers
                # can ``except StreamClosed``. An outer cancel re-fires at the caller's next
                # checkpoint, so nothing is lost by dropping Cancelled here.
                errors = [e for e in _leaves(group) if not isinstance(e, trio.Cancelled)]
                if errors and all(isinstance(e, Exception) for e in errors):
                    for extra in errors[1:]:
                        log.warning("session: further error while tearing down: %r", extra)
                    raise errors[0] from None
                raise
            raise AssertionError("session tasks never return normally")  # pragma: no cover
        finally:
            self.closing.set()
            self._log_drop_summary()
            _current.reset(token)

    async def _guard(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        try:
            await fn(*args)
        finally:
            self.closing.set()

    # ---- send --------------------------------------------------------------------------------

    async def _send_frame(self, msg: Frame) -> None:
        timeout = self.config.send_timeout
        with trio.move_on_after(timeout) as scope:
            await self._stream.send(msg)
        if scope.cancelled_caught:
            raise SendStalled(
                f"send stalled: {_kind_out(msg)} frame not accepted within {timeout:g}s "
                "(shard not reading)"
            )
        self.stats.frames_out += 1
        _FRAMES_OUT[_kind_out(msg)].inc()

    async def _send_loop(self) -> NoReturn:
        while True:
            expired = self.queues.bootstrap.expired
            msg = self.queues.next_frame(trio.current_time())
            self._note_expired(expired)
            if msg is None:
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            await self._send_frame(msg)

    # ---- roll-up -----------------------------------------------------------------------------

    async def _rollup_loop(self, nursery: trio.Nursery) -> NoReturn:
        interval = self.config.rollup_interval
        next_tick = trio.current_time()
        while True:
            await self._rollup_once(nursery)
            next_tick += interval
            # A build slower than the interval makes the next tick fire at once (no burst).
            next_tick = max(next_tick, trio.current_time())
            await trio.sleep_until(next_tick)

    async def _rollup_once(self, nursery: trio.Nursery) -> None:
        started = time.perf_counter()
        build_encoded = getattr(self._source, "build_encoded", None)
        needs: pb.ClusterCapacityNeeds | EncodedFrame
        try:
            needs = await (self._source.build() if build_encoded is None else build_encoded())
        except Exception:
            self.stats.rollup_errors += 1
            metrics.ROLLUP_ERRORS.labels("build").inc()
            log.exception("roll-up build failed; keeping the session cluster=%s",
                          self.config.cluster_id)
            return
        enqueue_start = time.perf_counter()
        self.enqueue_rollup(needs)
        self.stats.rollups_built += 1
        now = time.perf_counter()
        metrics.ROLLUP_PHASE_DURATION.labels("enqueue").observe(now - enqueue_start)
        metrics.ROLLUP_DURATION.observe(now - started)
        log.debug(
            "roll-up enqueued cluster=%s %s", self.config.cluster_id,
            f"bytes={len(needs.data)}" if isinstance(needs, EncodedFrame)
            else f"needs={len(needs.needs)}",
        )
        self._schedule_after_enqueue(nursery)

    def _schedule_after_enqueue(self, nursery: trio.Nursery) -> None:
        self._ack_dirty = True
        if not self._ack_running:
            self._ack_running = True
            nursery.start_soon(self._after_enqueue_runner, name="session-after-enqueue")

    async def _after_enqueue_runner(self) -> None:
        try:
            while self._ack_dirty:
                self._ack_dirty = False
                try:
                    await self._source.after_enqueue()
                except Exception:
                    self.stats.rollup_errors += 1
                    metrics.ROLLUP_ERRORS.labels("after_enqueue").inc()
                    log.exception("roll-up after_enqueue hook failed cluster=%s",
                                  self.config.cluster_id)
        finally:
            self._ack_running = False

    # ---- receive and dispatch ----------------------------------------------------------------

    async def _recv_loop(self, nursery: trio.Nursery) -> NoReturn:
        receive = getattr(self._stream, "receive_deferred", None) or self._stream.receive
        while True:
            msg = await receive()
            self._frames_read += 1
            await self._dispatch(msg, nursery)

    async def _bootstrap_pump(self, stream: PriorityReceive, nursery: trio.Nursery) -> None:
        """Serve the stream's BootstrapRequest lane, independent of the ordered pump.

        The ordered pump may be paused (node-state cap, admission limit) or behind a backlog;
        this one is not, so a bootstrap pull is answered as soon as it is read off the
        connection. The end of the stream is left to the ordered pump, which ends the session.
        """
        try:
            while True:
                await self._dispatch(await stream.receive_priority(), nursery)
        except StreamClosed:
            await trio.sleep_forever()

    async def _dispatch(self, msg: pb.ShardMessage | NodeStateFrame,
                        nursery: trio.Nursery) -> None:
        """Route one decoded frame by kind (see the module docstring)."""
        self.stats.frames_in += 1
        value: Any
        if isinstance(msg, NodeStateFrame):
            kind, value = "node_state_update", msg
        else:
            kind, value = betterproto.which_one_of(msg, "payload")
        unknown = unknown_enum_values(kind, value)
        if unknown:
            self._refuse_unknown_enums(kind, value, unknown)
            return
        if kind == "node_state_update":
            _FRAMES_IN[kind].inc()
            before = self.node_states.coalesced
            if self.node_states.offer(value.machine_id, value):
                self._ready_keys.release()
            elif self.node_states.coalesced != before:
                self.stats.node_states_coalesced += 1
                _COALESCED_NODE_STATES.inc()
            if self.node_states.full:
                await self._wait_for_room()
        elif kind == "reclaim_instruction":
            _FRAMES_IN[kind].inc()
            await self._admit()
            nursery.start_soon(
                self._bounded, kind, self._handlers.on_reclaim_instruction, value, self.enqueue
            )
        elif kind == "available_capacity":
            _FRAMES_IN[kind].inc()
            # Each update is the whole state for its key, so only the newest one pending matters,
            # and two writes for one key must never overlap: a retried older write landing after
            # a newer one would leave the stale value, and the shard sends only on change.
            if self.available.offer(value.supersedes_key, value):
                await self._admit()
                nursery.start_soon(self._bounded, kind, self._drain_available)
            else:
                self.stats.available_coalesced += 1
                metrics.COALESCED_FRAMES.labels("available_capacity").inc()
        elif kind == "bootstrap_request":
            _FRAMES_IN[kind].inc()
            nursery.start_soon(self._bootstrap, value, trio.current_time())
        elif kind == "ack":
            _FRAMES_IN[kind].inc()
            level = logging.INFO if value.echo == "hello" else logging.DEBUG
            log.log(level, "shard ack echo=%s term=%d epoch=%d cluster=%s", value.echo,
                    value.coordinator_term, value.shard_epoch, self.config.cluster_id)
        else:
            _FRAMES_IN["unknown"].inc()
            log.warning("unknown ShardMessage payload ignored cluster=%s",
                        self.config.cluster_id)

    def _refuse_unknown_enums(self, kind: str, value: Any, unknown: list[UnknownEnum]) -> None:
        """A frame carrying enum values this build does not know never reaches its handler.

        Mapping an unknown value to a known one would write a wrong phase or availability
        (docs/wire.md#unknown-enum-values); the frame is skipped instead, and the shard's next
        frame for the same key supersedes it. A BootstrapRequest is answered with an error so
        the shard falls back at once instead of waiting out its deadline.
        """
        _FRAMES_IN[kind].inc()
        self.stats.unknown_enum_frames += 1
        if kind == "bootstrap_request":
            REPORTER.report(kind, unknown, "answered with an error")
            answer = pb.BootstrapBlobResponse(
                request_id=value.request_id,
                error=f"operator: unknown enum values: {describe(unknown)}",
            )
            self.enqueue_bootstrap(pb.OperatorMessage(bootstrap_response=answer),
                                   trio.current_time())
        else:
            REPORTER.report(kind, unknown, "frame skipped")

    async def _admit(self) -> None:
        """Take an admission token; blocks (backpressure on the recv pump) only when full."""
        try:
            self._admission.acquire_nowait()
        except trio.WouldBlock:
            await self._admission.acquire()

    async def _call_handler(self, kind: str, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Run one handler; log and count an exception (return None) instead of raising it."""
        try:
            return await fn(*args)
        except Exception:
            self.stats.handler_errors += 1
            _HANDLER_ERRORS[kind].inc()
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
        if limit == 0 or self._frames_read == self._quiet_at:
            return
        async with self._claim_turn:
            start = self._frames_read
            while self._frames_read != self._quiet_at:
                seen = self._frames_read
                # Two schedule points span one whole batch, whatever the batch order: a pump
                # with a frame ready runs in it, so an unchanged count means the pump is waiting.
                await trio.lowlevel.checkpoint()
                await trio.lowlevel.checkpoint()
                if self._frames_read == seen:
                    self._quiet_at = seen
                elif self._frames_read - start >= limit:
                    return

    async def _node_state_worker(self) -> NoReturn:
        """One pool worker: take a ready machine, hold a slot while draining its latest frames."""
        while True:
            await self._ready_keys.acquire()
            await self._read_ahead_gate()
            async with self._slots:
                machine_id = self.node_states.claim()
                if machine_id is None:  # pragma: no cover - one token per ready key
                    continue
                clean = False
                metrics.DISPATCH_INFLIGHT.inc()
                try:
                    while (u := self.node_states.take_next(machine_id)) is not None:
                        if self._room is not None and not self.node_states.full:
                            self._room.set()
                            self._room = None
                        if isinstance(u, NodeStateFrame):
                            u = u.to_message()
                        await self._call_handler(
                            "node_state_update", self._handlers.on_node_state_update, u
                        )
                    clean = True
                finally:
                    metrics.DISPATCH_INFLIGHT.dec()
                    if not clean:
                        self.node_states.abandon(machine_id)

    async def _drain_available(self) -> None:
        """Own one ready supersedes_key and write its updates, newest pending first, until none
        is left (one task per ready key, started by the dispatcher with an admission token)."""
        key = self.available.claim()
        if key is None:  # pragma: no cover - one task per ready key
            return
        clean = False
        try:
            while (u := self.available.take_next(key)) is not None:
                await self._call_handler(
                    "available_capacity", self._handlers.on_available_capacity, u
                )
            clean = True
        finally:
            if not clean:
                self.available.abandon(key)

    async def _bootstrap(self, req: pb.BootstrapRequest, received: float) -> None:
        metrics.DISPATCH_INFLIGHT.inc()
        try:
            try:
                resp = await self._handlers.on_bootstrap_request(req)
            except Exception as exc:
                self.stats.handler_errors += 1
                _HANDLER_ERRORS["bootstrap_request"].inc()
                log.exception("dispatch failed kind=bootstrap_request request_id=%s cluster=%s",
                              req.request_id, self.config.cluster_id)
                # Answer with an error so the shard falls back now instead of timing out.
                resp = pb.BootstrapBlobResponse(
                    request_id=req.request_id, error=f"operator: bootstrap handler failed: {exc}"
                )
            if not resp.request_id:
                resp.request_id = req.request_id
            self.enqueue_bootstrap(pb.OperatorMessage(bootstrap_response=resp), received)
        finally:
            metrics.DISPATCH_INFLIGHT.dec()
