"""The agent's end of the downlink: lanes, decoding on the Trio side, and a bulk gRPC reader.

:class:`OperatorBridge` is the Trio end of one ``Shard.Session`` stream: uplink frames wait
until grpclib has written them; downlink frames cross as raw bytes, sorted into a
BootstrapRequest lane and an ordered lane (docs/wire.md#bootstrap-first), and are decoded when
taken. :func:`read_downlink` is the asyncio-side reader that fills those lanes.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import trio
from grpclib.const import Status
from grpclib.exceptions import GRPCError, ProtocolError

from bigfleet_trio.proto import pb
from bigfleet_trio.shard.bridge import BridgeState, TrioEnd, aio_put
from bigfleet_trio.shard.codec import (
    EncodedFrame,
    MalformedFrame,
    NodeStateFrame,
    decode_deferred,
    decode_shard_message,
    is_bootstrap_frame,
)
from bigfleet_trio.shard.transport import StreamClosed

__all__ = [
    "MALFORMED_LOG_EVERY",
    "MALFORMED_LOG_FIRST",
    "OperatorBridge",
    "Outgoing",
    "read_downlink",
]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Outgoing:
    """One uplink frame handed to the asyncio side; ``written`` is set once it is settled."""

    msg: Any
    written: trio.Event = field(default_factory=trio.Event)
    ok: bool = False  # True when grpclib wrote it to the transport


class OperatorBridge(TrioEnd):
    """The agent's end of one grpclib ``Shard.Session`` stream (an ``OperatorStream``).

    Uplink: :meth:`send` returns once grpclib has written the frame to the transport (the
    shard's HTTP/2 window and the transport's write buffer allowing), so a timeout around it
    bounds how long a frame waits at the wire, not in a buffer (``docs/wire.md#send-timeout``).

    Downlink: the asyncio reader takes frames off the connection as raw bytes as fast as grpclib
    reads them and sorts them by their first byte into two lanes: BootstrapRequests, and every
    other frame in arrival order. Frames are decoded on the Trio side when taken
    (:meth:`receive`, :meth:`receive_priority`); a frame that is not a valid ShardMessage is
    logged, counted and skipped (``docs/wire.md#malformed-frames``).
    """

    def __init__(
        self,
        out_send: trio.MemorySendChannel[Outgoing],
        ordered: trio.MemoryReceiveChannel[bytes],
        bootstrap: trio.MemoryReceiveChannel[bytes],
        state: BridgeState,
        *,
        yield_every: int = 64,
    ) -> None:
        self._out = out_send
        self._ordered = ordered
        self._bootstrap = bootstrap
        self._state = state
        self._channels = (out_send, ordered, bootstrap)
        self._yield_every = max(1, yield_every)
        self._fast = 0
        self.malformed = 0
        self.closed = False
        #: set by the first :meth:`receive_priority` call; until then the reader keeps
        #: BootstrapRequests in the ordered lane, so a caller that only uses :meth:`receive`
        #: still gets every frame
        self.priority_consumer = False

    async def send(self, msg: pb.OperatorMessage | EncodedFrame) -> None:
        """Hand one frame over and wait until it is written to the transport.

        Raises:
            StreamClosed: the stream ended before the frame was written.
        """
        item = Outgoing(msg)
        await self._hand_over(self._out, item)
        await item.written.wait()
        if not item.ok:
            raise StreamClosed(self._state.reason)

    async def receive(self) -> pb.ShardMessage:
        """The next frame in arrival order (BootstrapRequests excepted, see the class doc).

        Takes ready frames without a schedule point, but yields to the scheduler once per
        ``yield_every`` frames so a deep backlog cannot starve other tasks.
        """
        msg: pb.ShardMessage = await self._next(self._decode)
        return msg

    async def receive_deferred(self) -> pb.ShardMessage | NodeStateFrame:
        """:meth:`receive`, with a NodeStateUpdate frame left unconverted (checked, then
        converted by whoever takes it: :class:`~bigfleet_trio.shard.codec.NodeStateFrame`)."""
        msg: pb.ShardMessage | NodeStateFrame = await self._next(self._decode_deferred)
        return msg

    async def _next(self, decode: Any) -> Any:
        while True:
            await trio.lowlevel.checkpoint_if_cancelled()
            self._fast += 1
            if self._fast >= self._yield_every:
                self._fast = 0
                await trio.lowlevel.cancel_shielded_checkpoint()
            with self._receiving():
                try:
                    data = self._ordered.receive_nowait()
                except trio.WouldBlock:
                    self._fast = 0
                    data = await self._ordered.receive()
            msg = decode(data)
            if msg is not None:
                return msg

    async def receive_priority(self) -> pb.ShardMessage:
        """The next BootstrapRequest frame, ahead of any backlog of other frames.

        From the first call on, BootstrapRequests are delivered only here, not by
        :meth:`receive`.
        """
        self.priority_consumer = True
        while True:
            with self._receiving():
                data = await self._bootstrap.receive()
            msg = self._decode(data)
            if msg is not None:
                return msg

    def _decode(self, data: bytes) -> pb.ShardMessage | None:
        return self._decode_with(decode_shard_message, data)  # type: ignore[return-value]

    def _decode_deferred(self, data: bytes) -> pb.ShardMessage | NodeStateFrame | None:
        return self._decode_with(decode_deferred, data)

    def _decode_with(
        self, decode: Any, data: bytes
    ) -> pb.ShardMessage | NodeStateFrame | None:
        try:
            return decode(data)  # type: ignore[no-any-return]
        except MalformedFrame as exc:
            self.malformed += 1
            if self.malformed <= MALFORMED_LOG_FIRST or self.malformed % MALFORMED_LOG_EVERY == 0:
                log.warning(
                    "downlink frame skipped: %s; first bytes %s (%d malformed on this stream)",
                    exc, data[:16].hex(" "), self.malformed,
                    extra={"problem": exc.problem, "frame_bytes": exc.size},
                )
            return None


MALFORMED_LOG_FIRST = 10
"""Malformed frames logged one by one per stream; after that one line per MALFORMED_LOG_EVERY."""
MALFORMED_LOG_EVERY = 1000


class _BulkReader:
    """asyncio-flavoured: reads the gRPC messages of one client stream in bulk.

    grpclib's ``Stream.recv_message`` costs ~30 µs per message (two buffer reads through an
    asyncio queue, one flow-control acknowledgement per DATA frame); at tens of thousands of
    frames per second that is the largest cost of the whole downlink. This reader takes every
    DATA chunk grpclib has buffered at once, acknowledges them together and splits the gRPC
    length-prefixed messages itself. It reaches into grpclib's stream buffer (``_stream``,
    ``buffer``); where those are not as expected it falls back to ``recv_message``.
    """

    def __init__(self, stream: Any, max_message_bytes: int) -> None:
        self._stream = stream
        self._max = max_message_bytes
        self._pending = bytearray()
        self._ready: deque[bytes] = deque()
        proto = getattr(stream, "_stream", None)
        buf = getattr(proto, "buffer", None)
        queue = getattr(getattr(buf, "_unacked", None), "_queue", None)
        self._buf = buf if hasattr(buf, "_acked_size") and queue is not None else None
        self._proto: Any = proto

    async def next(self) -> bytes | None:
        """The next message's bytes, or None at the end of the stream."""
        if self._buf is None:
            data: bytes | None = await self._stream.recv_message()
            return data
        while not self._ready:
            if not await self._fill():
                if self._pending:
                    raise ProtocolError("stream ended inside a gRPC message")
                return None
        return self._ready.popleft()

    async def _fill(self) -> bool:
        stream, buf = self._stream, self._buf
        assert buf is not None
        if not stream._recv_initial_metadata_done:  # noqa: SLF001 - see the class docstring
            await stream.recv_initial_metadata()
        with stream._wrapper:  # noqa: SLF001 - grpclib's error translation for this stream
            first = await buf.read(1)  # waits for data; b"" at the end of the stream
            if not first:
                return False
            more = buf._acked_size + sum(  # noqa: SLF001
                item.data_size for item in buf._unacked._queue  # noqa: SLF001
            )
            rest = await buf.read(more) if more else b""
        self._proto.connection.last_message_received = time.monotonic()
        pending = self._pending
        pending += first
        pending += rest
        pos, end, out = 0, len(pending), self._ready
        while end - pos >= 5:
            if pending[pos]:
                raise GRPCError(Status.UNIMPLEMENTED, "compressed messages are not supported")
            size = int.from_bytes(pending[pos + 1 : pos + 5], "big")
            if size > self._max:
                raise GRPCError(
                    Status.RESOURCE_EXHAUSTED,
                    f"received message of {size} bytes exceeds {self._max}",
                )
            if end - pos - 5 < size:
                break
            out.append(bytes(pending[pos + 5 : pos + 5 + size]))
            pos += 5 + size
        del pending[:pos]
        return True


async def read_downlink(
    stream: Any,
    max_message_bytes: int,
    ordered: trio.MemorySendChannel[bytes],
    bootstrap: trio.MemorySendChannel[bytes] | None,
    end: OperatorBridge,
) -> None:
    """asyncio-flavoured: move raw downlink frames into the agent's two lanes until the end.

    Frames are sorted by their first byte, so read-ahead costs no decoding. BootstrapRequests go
    to ``bootstrap`` once ``end`` has a priority consumer (None: one ordered lane for all).
    Returns at the end of the stream or when the Trio side closed its end.
    """
    reader = _BulkReader(stream, max_message_bytes)
    while True:
        data = await reader.next()
        if data is None:
            return
        lane = (
            bootstrap
            if bootstrap is not None and end.priority_consumer and is_bootstrap_frame(data)
            else ordered
        )
        try:
            await aio_put(lane, data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return  # the Trio side closed its end
