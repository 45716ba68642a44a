"""The session's send side: the three send queues, their drop accounting, the send task.

:class:`SendSide` is one part of a :class:`~bigfleet_trio.operator.session.core.Session`: handlers
and the roll-up loop put frames in without blocking (:meth:`SendSide.enqueue`,
:meth:`~SendSide.enqueue_bootstrap`, :meth:`~SendSide.enqueue_rollup`); :meth:`SendSide.run`
writes them to the stream in the order :class:`~bigfleet_trio.operator.session.queues.SendQueues`
decides, each within ``send_timeout``. Queues and drop policies: ``docs/wire.md#send-queues``.
"""

from __future__ import annotations

import logging
import math
from typing import NoReturn

import betterproto
import trio

from bigfleet_trio.observability import metrics
from bigfleet_trio.operator.session.queues import BOOTSTRAP_ANSWER_DEADLINE, SendQueues
from bigfleet_trio.operator.session.types import Frame, SendStalled, SessionConfig, SessionStats
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.codec import EncodedFrame
from bigfleet_trio.shard.transport import OperatorStream

__all__ = ["SendSide"]

log = logging.getLogger(__name__)

_KINDS_OUT = ("hello", "rollup", "bootstrap_response", "reclaim_ack", "unknown")
_FRAMES_OUT = {k: metrics.FRAMES.labels("out", k) for k in _KINDS_OUT}


def _kind_out(msg: Frame) -> str:
    if isinstance(msg, EncodedFrame):
        return msg.kind if msg.kind in _FRAMES_OUT else "unknown"
    name, _ = betterproto.which_one_of(msg, "payload")
    return name if name in _FRAMES_OUT else "unknown"


class SendSide:
    """Send queues and the task that drains them onto one stream.

    Args:
        stream: the agent end of the open stream (only ``send`` is used here).
        config: the session's :class:`SessionConfig` (send timeout, outbox size, log interval).
        stats: the session's counters (shared).

    Attributes:
        queues: the :class:`SendQueues` (roll-up slot, outbox, bootstrap lane).
        closing: set once the session tears down; frames offered after it are ignored.
    """

    def __init__(self, stream: OperatorStream, config: SessionConfig, stats: SessionStats) -> None:
        self.config = config
        self.stats = stats
        self.queues = SendQueues(config.outbox_capacity)
        self.closing = trio.Event()
        self._stream = stream
        self._wakeup = trio.Event()
        self._drops_quiet_until = -math.inf  # drops before this time only add to the summary
        self._drops_unlogged = 0
        self._drops_pending = trio.Event()  # set when _drops_unlogged becomes > 0
        self._expired_unlogged = 0
        self._expired_quiet_until = -math.inf

    # ---- putting frames in (never blocks) ----------------------------------------------------

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
        :data:`~.queues.BOOTSTRAP_ANSWER_DEADLINE`, then dropped unsent:
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

    # ---- writing them out --------------------------------------------------------------------

    async def send_frame(self, msg: Frame) -> None:
        """Write one frame to the stream within ``send_timeout``.

        Raises:
            SendStalled: not accepted in time (the shard stopped reading).
            StreamClosed: the stream ended.
        """
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

    async def run(self) -> NoReturn:
        """The send task: the next frame the queues give, or wait until one is offered."""
        while True:
            expired = self.queues.bootstrap.expired
            msg = self.queues.next_frame(trio.current_time())
            self._note_expired(expired)
            if msg is None:
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            await self.send_frame(msg)

    # ---- drop accounting ---------------------------------------------------------------------

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

    def log_drop_summary(self) -> None:
        """Log the drops not yet summarised (the summary task, and once when the session ends)."""
        count, self._drops_unlogged = self._drops_unlogged, 0
        if count:
            log.warning(
                "outbox full; %d more frames dropped in the last %gs capacity=%d cluster=%s "
                "(total dropped %d)",
                count, self.config.drop_log_interval, self.queues.outbox.capacity,
                self.config.cluster_id, self.stats.outbox_dropped,
            )

    async def run_drop_log(self) -> NoReturn:
        """The summary task: at most one drop summary per ``drop_log_interval``."""
        while True:
            await self._drops_pending.wait()
            await trio.sleep_until(self._drops_quiet_until)
            self.log_drop_summary()
            self._drops_quiet_until = trio.current_time() + self.config.drop_log_interval
            self._drops_pending = trio.Event()
