"""Transport seam for the ``Shard.Session`` stream, and the in-memory implementation.

The agent holds one outbound stream to its shard. The session logic
(``bigfleet_trio.operator.session``) and the simulated shard (``bigfleet_trio.sim.shard``) only
see these protocol classes; the grpclib transport (``bigfleet_trio.shard.grpc``) and
:func:`memory_stream_pair` implement them.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import trio

from bigfleet_trio.proto import pb
from bigfleet_trio.shard.codec import EncodedFrame


class StreamClosed(Exception):
    """The stream ended: the peer closed it, the connection broke, or it was closed locally.

    ``reason`` is a short human-readable cause (e.g. ``"peer closed"``,
    ``"grpc: UNAVAILABLE ..."``).
    """

    def __init__(self, reason: str = "stream closed", *, grpc_status: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.grpc_status = grpc_status
        """The status name the peer ended the stream with (``ABORTED``...), None if it did not
        say (a closed connection, a local close)."""


@dataclass(frozen=True)
class CloseStatus:
    """In-memory stand-in for a gRPC status at the end of a stream (what the shard's
    :meth:`close_with_status` sends through a memory pair)."""

    status: str
    message: str


async def close_with_status(stream: object, status: str, message: str) -> None:
    """End a shard-side stream with a gRPC status and message (``ABORTED``, "session
    replaced..."): the agent sees them in its :class:`StreamClosed`. Streams that cannot carry a
    status are just closed."""
    closer = getattr(stream, "close_with_status", None)
    if closer is not None:
        await closer(status, message)
    else:
        await stream.aclose()  # type: ignore[attr-defined]


class OperatorStream(Protocol):
    """The agent's end of one ``Shard.Session`` stream (agent sends OperatorMessage)."""

    async def send(self, msg: pb.OperatorMessage | EncodedFrame) -> None:
        """Send one frame (a message, or one already serialized).

        Raises :class:`StreamClosed` if the stream is gone.
        """

    async def receive(self) -> pb.ShardMessage:
        """Wait for the next frame. Raises :class:`StreamClosed` at end of stream or on error."""

    async def aclose(self) -> None:
        """Close the stream (idempotent). Pending ``receive`` calls raise :class:`StreamClosed`."""


@runtime_checkable
class PriorityReceive(Protocol):
    """An agent stream that reads ahead and hands BootstrapRequests out of band.

    Once :meth:`receive_priority` has been called, such a stream's ``receive`` returns every
    other frame in arrival order, and :meth:`receive_priority` returns the BootstrapRequests as
    soon as they are read off the connection, ahead of any backlog
    (``docs/wire.md#bootstrap-first``).
    """

    async def receive_priority(self) -> pb.ShardMessage:
        """Wait for the next BootstrapRequest frame. Raises :class:`StreamClosed` at the end."""
        ...


class ShardStream(Protocol):
    """The shard's end of one ``Shard.Session`` stream (shard sends ShardMessage)."""

    async def send(self, msg: pb.ShardMessage) -> None:
        """Send one frame. Raises :class:`StreamClosed` if the stream is gone."""

    async def receive(self) -> pb.OperatorMessage:
        """Wait for the next frame. Raises :class:`StreamClosed` at end of stream or on error."""

    async def aclose(self) -> None:
        """Close the stream (idempotent)."""


class Connector(Protocol):
    """Opens one agent-side stream per call; the reconnect loop calls it once per session."""

    def connect(self) -> AbstractAsyncContextManager[OperatorStream]:
        """Return an async context manager that opens a stream and closes it on exit.

        Raises :class:`StreamClosed` (or an OSError subclass) when the shard cannot be reached.
        """
        ...


class _MemoryEnd:
    """One end of an in-memory stream pair.

    Holds a send channel to the peer and a receive channel from it.
    """

    def __init__(
        self,
        send: trio.MemorySendChannel[object],
        recv: trio.MemoryReceiveChannel[object],
    ) -> None:
        self._send = send
        self._recv = recv
        self.closed = False

    async def send(self, msg: object) -> None:
        if self.closed:
            raise StreamClosed("closed locally")
        if isinstance(msg, EncodedFrame):  # what the wire does: the peer gets a message
            msg = pb.OperatorMessage().parse(msg.data)
        try:
            await self._send.send(msg)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise StreamClosed("peer closed") from exc

    async def receive(self) -> object:
        try:
            msg = await self._recv.receive()
        except trio.EndOfChannel as exc:
            raise StreamClosed("peer closed") from exc
        except trio.ClosedResourceError as exc:
            raise StreamClosed("closed locally") from exc
        if isinstance(msg, CloseStatus):
            raise StreamClosed(f"grpc: {msg.status} {msg.message}", grpc_status=msg.status)
        return msg

    async def close_with_status(self, status: str, message: str) -> None:
        """Close, telling the peer ``status`` and ``message`` first (when the buffer has room)."""
        if not self.closed:
            try:
                self._send.send_nowait(CloseStatus(status, message))
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        await self.aclose()

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        await self._send.aclose()
        await self._recv.aclose()


def memory_stream_pair(buffer: float = math.inf) -> tuple[OperatorStream, ShardStream]:
    """Create a connected (agent end, shard end) pair backed by Trio memory channels.

    Args:
        buffer: frames each direction may hold before ``send`` blocks (``math.inf`` = unbounded;
            ``0`` makes every send wait for the peer's receive, like a stalled HTTP/2 window).

    Returns:
        ``(operator_end, shard_end)``. Closing either end makes the other's ``receive`` raise
        :class:`StreamClosed` once buffered frames are consumed.
    """
    up_send, up_recv = trio.open_memory_channel[object](buffer)
    down_send, down_recv = trio.open_memory_channel[object](buffer)
    operator_end = _MemoryEnd(up_send, down_recv)
    shard_end = _MemoryEnd(down_send, up_recv)
    return operator_end, shard_end  # type: ignore[return-value]


class MemoryConnector:
    """A :class:`Connector` whose every ``connect()`` creates a fresh in-memory pair.

    The shard ends are delivered on :attr:`accepted` (a Trio receive channel), so a test or the
    simulated shard can ``async for shard_end in connector.accepted`` and serve each session.
    ``fail_next`` makes the next N connects raise :class:`StreamClosed` (to exercise backoff).
    """

    def __init__(self, buffer: float = math.inf) -> None:
        self._buffer = buffer
        self._accept_send, self.accepted = trio.open_memory_channel[ShardStream](math.inf)
        self.fail_next = 0
        self.connects = 0

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[OperatorStream]:
        self.connects += 1
        if self.fail_next > 0:
            self.fail_next -= 1
            raise StreamClosed("connection refused (injected)")
        op_end, shard_end = memory_stream_pair(self._buffer)
        self._accept_send.send_nowait(shard_end)
        try:
            yield op_end
        finally:
            with trio.CancelScope(shield=True):
                await op_end.aclose()
