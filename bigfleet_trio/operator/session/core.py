"""One shard session: Hello, then the send, receive and roll-up Trio tasks over one stream.

Sits between the agent's reconnect loop (:mod:`.agent`), which opens a stream and runs one
:class:`Session` on it, and the injected roll-up source and handlers (those types, the config,
the counters and the route table: :mod:`.session.types`). A session is three parts plus the
roll-up loop, all its tasks in one nursery owned by :meth:`Session.run`:

* :class:`~.session.send.SendSide`: the send queues and the send task;
* :class:`~.session.router.FrameRouter`: each received frame to its route (table-driven);
* :class:`~.session.work.WorkerPool`: where routed frames run (node-state pool, one writer per
  key, admitted tasks, answers).

The queue and coalescing rules are sans-IO in :mod:`.queues`. The first
failure of send/receive/roll-up ends the session. Task layout, send timeout, dispatch and
backpressure: ``docs/wire.md#the-session``.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import trio

from bigfleet_trio.observability import metrics
from bigfleet_trio.operator.session.queues import KeyedCoalescer, SendQueues
from bigfleet_trio.operator.session.router import FrameRouter
from bigfleet_trio.operator.session.send import SendSide
from bigfleet_trio.operator.session.types import (
    ROUTES,
    Handlers,
    RollupSource,
    SessionConfig,
    SessionStats,
)
from bigfleet_trio.operator.session.work import WorkerPool
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.codec import EncodedFrame, NodeStateFrame
from bigfleet_trio.shard.transport import OperatorStream, PriorityReceive, StreamClosed

__all__ = ["Session", "current_session"]

log = logging.getLogger(__name__)

_current: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "bigfleet_current_session", default=None
)


def current_session() -> Session | None:
    """The :class:`Session` whose task tree the caller runs in (None outside a session)."""
    return _current.get()


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            out.extend(_leaves(exc))
        else:
            out.append(exc)
    return out


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
        self._stream = stream
        self._source = source
        self._send = SendSide(stream, config, self.stats)
        self._work = WorkerPool(ROUTES, config, self.stats, handlers, self._send)
        self._router = FrameRouter(ROUTES, self._work, self._send, config, self.stats)
        self._ack_dirty = False
        self._ack_running = False

    # ---- the parts' state, as before the split ------------------------------------------------

    @property
    def closing(self) -> trio.Event:
        """Set as soon as the session starts tearing down (first task ended or cancelled)."""
        return self._send.closing

    @property
    def queues(self) -> SendQueues:
        """The send queues (roll-up slot, outbox, bootstrap lane)."""
        return self._send.queues

    @property
    def node_states(self) -> KeyedCoalescer[str, pb.NodeStateUpdate | NodeStateFrame]:
        """Latest NodeStateUpdate per machine waiting for a worker."""
        return self._work.node_states

    @property
    def available(self) -> KeyedCoalescer[str, Any]:
        """Latest AvailableCapacityUpdate per supersedes_key waiting for its writer."""
        return self._work.keyed["available_capacity"]

    def requeue_machine(self, machine_id: str) -> bool:
        """Reconcile the machine's latest frame again (see :meth:`WorkerPool.requeue_machine`)."""
        return self._work.requeue_machine(machine_id)

    # ---- public, non-blocking ----------------------------------------------------------------

    def enqueue(self, msg: pb.OperatorMessage) -> bool:
        """Put a response frame in the outbox without blocking (the handlers' ``reply``);
        see :meth:`SendSide.enqueue`."""
        return self._send.enqueue(msg)

    def enqueue_bootstrap(self, msg: pb.OperatorMessage, received: float) -> bool:
        """Queue a bootstrap answer in its own lane; see :meth:`SendSide.enqueue_bootstrap`."""
        return self._send.enqueue_bootstrap(msg, received)

    def enqueue_rollup(self, needs: pb.ClusterCapacityNeeds | EncodedFrame) -> None:
        """Store a roll-up in the pending slot; see :meth:`SendSide.enqueue_rollup`."""
        self._send.enqueue_rollup(needs)

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
            await self._send.send_frame(hello)
            log.info(
                "session established cluster=%s protocol=%s",
                self.config.cluster_id, self.config.protocol_version,
            )
            if on_established is not None:
                on_established()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._guard, self._send.run, name="session-send")
                    nursery.start_soon(self._guard, self._recv_loop, nursery, name="session-recv")
                    if isinstance(self._stream, PriorityReceive):
                        nursery.start_soon(
                            self._bootstrap_pump, self._stream, nursery, name="session-bootstrap"
                        )
                    nursery.start_soon(
                        self._guard, self._rollup_loop, nursery, name="session-rollup"
                    )
                    nursery.start_soon(self._send.run_drop_log, name="session-drop-log")
                    self._work.start(nursery)
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
            self._send.log_drop_summary()
            _current.reset(token)

    async def _guard(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        try:
            await fn(*args)
        finally:
            self.closing.set()

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

    # ---- receive -----------------------------------------------------------------------------

    async def _recv_loop(self, nursery: trio.Nursery) -> NoReturn:
        receive = getattr(self._stream, "receive_deferred", None) or self._stream.receive
        while True:
            msg = await receive()
            self._work.note_read()
            await self._router.dispatch(msg, nursery)

    async def _bootstrap_pump(self, stream: PriorityReceive, nursery: trio.Nursery) -> None:
        """Serve the stream's BootstrapRequest lane, independent of the ordered pump.

        The ordered pump may be paused (node-state cap, admission limit) or behind a backlog;
        this one is not, so a bootstrap pull is answered as soon as it is read off the
        connection. The end of the stream is left to the ordered pump, which ends the session.
        """
        try:
            while True:
                await self._router.dispatch(await stream.receive_priority(), nursery)
        except StreamClosed:
            await trio.sleep_forever()
