"""The shard session's types: its knobs, counters, the injected interfaces, the frame routes.

:class:`SessionConfig`, :class:`SessionStats`, the :class:`RollupSource` and :class:`Handlers`
protocols a :class:`~bigfleet_trio.operator.session.core.Session` is given, :data:`ROUTES` (how each
kind of downlink frame is dispatched to its handler), and :class:`SendStalled`, the error that
ends a session whose shard stopped reading. Import them from here.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from bigfleet_trio.knobs import DURATION, Settings, knob
from bigfleet_trio.operator.session.queues import NODE_STATE_PENDING_CAP, OUTBOX_CAPACITY
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.codec import EncodedFrame
from bigfleet_trio.shard.transport import StreamClosed

__all__ = [
    "DEFAULT_DROP_LOG_INTERVAL",
    "DEFAULT_SEND_TIMEOUT",
    "PROTOCOL_VERSION",
    "ROUTES",
    "Dispatch",
    "Frame",
    "Handlers",
    "Reply",
    "Route",
    "RollupSource",
    "SendStalled",
    "SessionConfig",
    "SessionStats",
]

PROTOCOL_VERSION = "v1alpha1"

Frame = pb.OperatorMessage | EncodedFrame
"""An uplink frame: a message, or one already serialized (the roll-up from cached encodings)."""

Reply = Callable[[pb.OperatorMessage], bool]
"""Enqueue one frame into the session's outbox without blocking; False when it was dropped."""


DEFAULT_SEND_TIMEOUT = 30.0
"""Seconds one frame may wait to be written to the connection (``docs/wire.md#send-timeout``)."""
DEFAULT_DROP_LOG_INTERVAL = 10.0
"""Seconds between outbox-drop summary log lines."""


class SendStalled(StreamClosed):
    """A frame was not written to the connection within ``send_timeout``: the shard stopped reading.

    A :class:`StreamClosed`, so the reconnect loop treats it as "stream gone" (reconnect with
    backoff). ``reason`` names the frame kind and the timeout.
    """


class RollupSource(Protocol):
    """Builds the cluster's complete desired state: every roll-up is the whole demand."""

    async def build(self) -> pb.ClusterCapacityNeeds:
        """Return the full roll-up (never a delta). Errors are logged; the session goes on."""
        ...

    # Optional: ``def build_encoded(self) -> EncodedRollup`` -- the same roll-up, serialized
    # (an ``OperatorMessage{rollup}``) from the source's cached per-need encodings. When the
    # source has it, the session sends those bytes and never re-encodes the roll-up.

    async def after_enqueue(self) -> None:
        """Post-enqueue hook (Pending->Acknowledged walk of the CRs seen by the last build).

        Runs in a background task of the session, never delaying the next tick, and never
        overlapping itself: if roll-ups are enqueued while it runs, it runs exactly once more
        afterwards. Cancelled when the session ends.
        """
        ...


class Handlers(Protocol):
    """Inbound frame handlers, dispatched by cost as :data:`ROUTES` says
    (``docs/wire.md#the-session``).

    Every handler runs in a task inside the session nursery and is cancelled when the session
    ends. Exceptions are logged and counted; they never end the session.
    """

    async def on_bootstrap_request(self, req: pb.BootstrapRequest) -> pb.BootstrapBlobResponse:
        """Render the bootstrap blob; the session enqueues the response (request_id echoed)."""
        ...

    async def on_reclaim_instruction(self, instr: pb.ReclaimInstruction, reply: Reply) -> None:
        """Cordon, then ``reply(OperatorMessage(reclaim_ack=...))``; hand the drain elsewhere."""
        ...

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> bool | None:
        """Reflect the (latest) machine state; called by at most one worker per machine_id.
        True: the machine needs no more reconciles (its UpcomingNode is gone for good)."""
        ...

    async def on_available_capacity(self, u: pb.AvailableCapacityUpdate) -> None:
        """Upsert the AvailableCapacity object for ``u.supersedes_key``.

        Called by at most one task per key at a time, newest pending update next
        (docs/rules.md#availablecapacity-ordering).
        """
        ...


class Dispatch(enum.Enum):
    """How the session runs the handler of one kind of frame (``docs/wire.md#the-session``)."""

    MACHINE_POOL = "machine_pool"
    """Latest frame per ``Route.key`` kept (coalesced), taken by the fixed pool of
    ``dispatch_concurrency`` workers behind the read-ahead gate; the receive pump pauses at
    ``node_state_pending_cap`` keys waiting. One route only (NodeStateUpdate)."""
    KEYED_WRITER = "keyed_writer"
    """Latest frame per ``Route.key`` kept; one admitted task per key with a frame waiting,
    which writes it, then the next newer one, until none is left (never two at once per key)."""
    TASK = "task"
    """One admitted task per frame (``dispatch_concurrency`` slots, ``dispatch_backlog`` more
    may wait; then the receive pump waits)."""
    ANSWER = "answer"
    """One task per frame, never waiting for a slot; the handler returns the answer, which goes
    to the bootstrap lane (an error answer when it raises)."""
    INLINE = "inline"
    """``Route.inline(payload, cluster_id)`` runs on the receive pump (cheap, never awaits)."""


@dataclass(frozen=True)
class Route:
    """One row of :data:`ROUTES`: how frames of one ShardMessage kind reach their handler.

    Attributes:
        dispatch: the :class:`Dispatch` policy.
        handler: name of the :class:`Handlers` method (None for INLINE).
        key: payload field that keys coalescing (MACHINE_POOL, KEYED_WRITER).
        reply: the handler also gets the session's ``enqueue`` (:data:`Reply`) (TASK).
        coalesced: :class:`SessionStats` field counting frames superseded while waiting.
        inline: INLINE's function of ``(payload, cluster_id)``.
    """

    dispatch: Dispatch
    handler: str | None = None
    key: str | None = None
    reply: bool = False
    coalesced: str | None = None
    inline: Callable[[Any, str], None] | None = None


_log = logging.getLogger(__name__)


def _log_ack(ack: pb.Acknowledgement, cluster_id: str) -> None:
    level = logging.INFO if ack.echo == "hello" else logging.DEBUG
    _log.log(level, "shard ack echo=%s term=%d epoch=%d cluster=%s", ack.echo,
             ack.coordinator_term, ack.shard_epoch, cluster_id)


ROUTES: Final[Mapping[str, Route]] = {
    # ShardMessage oneof field name -> route. Adding a frame kind: a row here and its method
    # on Handlers (plus the implementation); the recipe is in CONTRIBUTING.md.
    "node_state_update": Route(Dispatch.MACHINE_POOL, "on_node_state_update", key="machine_id",
                               coalesced="node_states_coalesced"),
    "available_capacity": Route(Dispatch.KEYED_WRITER, "on_available_capacity",
                                key="supersedes_key", coalesced="available_coalesced"),
    "reclaim_instruction": Route(Dispatch.TASK, "on_reclaim_instruction", reply=True),
    "bootstrap_request": Route(Dispatch.ANSWER, "on_bootstrap_request"),
    "ack": Route(Dispatch.INLINE, inline=_log_ack),
}
"""How each kind of downlink frame is dispatched; a kind not here is logged and ignored."""


@dataclass(init=False, eq=True)
class SessionConfig(Settings):
    """The shard session's settings; its knobs are the operator's ``shard session`` flags.

    The operator's settings (``bigfleet_trio.config.OperatorConfig``) nest this object and fill
    ``cluster_id`` from ``--cluster-id``; the other plain fields have no flag.

    Attributes:
        cluster_id: sent in Hello and filled into roll-ups that lack it.
        rollup_interval: seconds between roll-up ticks (first tick at connect). Default 10.
        dispatch_concurrency: semaphore size for apiserver-writing handlers. Default 32.
        send_timeout: seconds one ``stream.send`` may block before the session ends with
            :class:`SendStalled` (> 0; ``math.inf`` disables). Default 30.
        dispatch_backlog: Reclaim/AvailableCapacity frames that may wait for a slot before the
            recv pump blocks (node-state frames do not count; see node_state_pending_cap).
        node_state_pending_cap: machines with a NodeStateUpdate waiting for a worker at which
            the recv pump pauses until a worker takes one (>= 1). Default 100,000.
        node_state_read_ahead: while the recv pump has frames ready, at most one new machine is
            started per this many frames read (>= 0; 0 disables the gate). Default 256.
        outbox_capacity: bound of the response outbox (drop-newest). Default 256.
        protocol_version: Hello.protocol_version. Default "v1alpha1".
        drop_log_interval: seconds between outbox-drop summary lines (>= 0). Default 10.

    Raises:
        ValueError: from the constructor, a value out of range, naming the field
            (``send_timeout must be > 0, got 0``).
    """

    rollup_interval: float = knob(10.0, "time between roll-ups; 0 = default", unit=DURATION)
    dispatch_concurrency: int = knob(32, "parallel shard instructions", metavar="N")
    send_timeout: float = knob(
        DEFAULT_SEND_TIMEOUT,
        "end the shard session when a frame waits longer than this to be written to the "
        "connection (the shard stopped reading; bound: this plus one roll-up interval)",
        unit=DURATION,
    )
    cluster_id: str = ""
    dispatch_backlog: int = 1024
    node_state_pending_cap: int = NODE_STATE_PENDING_CAP
    node_state_read_ahead: int = 256
    outbox_capacity: int = OUTBOX_CAPACITY
    protocol_version: str = PROTOCOL_VERSION
    drop_log_interval: float = DEFAULT_DROP_LOG_INTERVAL

    def __init__(self, cluster_id: str = "", **values: object) -> None:
        super().__init__(cluster_id=cluster_id, **values)
        self.check_ranges()

    def check_ranges(self) -> None:
        """The session's own rules (the constructor runs them; a caller that changed a field
        runs them again).

        Raises:
            ValueError: the first value out of range, naming the field.
        """
        if not self.rollup_interval > 0:
            raise ValueError(f"rollup_interval must be > 0, got {self.rollup_interval}")
        if self.dispatch_concurrency < 1:
            raise ValueError(f"dispatch_concurrency must be >= 1, got {self.dispatch_concurrency}")
        if self.dispatch_backlog < 0:
            raise ValueError(f"dispatch_backlog must be >= 0, got {self.dispatch_backlog}")
        if self.node_state_pending_cap < 1:
            raise ValueError(
                f"node_state_pending_cap must be >= 1, got {self.node_state_pending_cap}"
            )
        if self.node_state_read_ahead < 0:
            raise ValueError(
                f"node_state_read_ahead must be >= 0, got {self.node_state_read_ahead}"
            )
        if self.outbox_capacity < 1:
            raise ValueError(f"outbox_capacity must be >= 1, got {self.outbox_capacity}")
        if not self.send_timeout > 0:
            raise ValueError(f"send_timeout must be > 0, got {self.send_timeout}")
        if not self.drop_log_interval >= 0:
            raise ValueError(f"drop_log_interval must be >= 0, got {self.drop_log_interval}")


@dataclass
class SessionStats:
    """Counters, cumulative over every session that shares the object (the agent keeps one)."""

    sessions: int = 0
    reconnects: int = 0
    frames_in: int = 0
    frames_out: int = 0
    rollups_built: int = 0
    rollups_replaced: int = 0
    outbox_dropped: int = 0
    node_states_coalesced: int = 0
    available_coalesced: int = 0
    handler_errors: int = 0
    rollup_errors: int = 0
    unknown_enum_frames: int = 0
    bootstrap_answers_expired: int = 0
