"""grpclib transport for the ``Shard.Session`` stream, run from Trio through trio-asyncio.

The agent dials and holds one bidirectional stream; dial options as the Go agent's (256 MiB
message limits both ways, optional mTLS). Frame-level behaviour (decoding, malformed frames,
the bootstrap lane, what the send timeout bounds): ``docs/wire.md``.

How it works. grpclib is asyncio-only and ties cancellation and deadlines to the *current
asyncio task*, and each ``aio_as_trio`` call runs in a fresh task. So one session = ONE
asyncio-flavoured coroutine (:meth:`GrpcConnector._aio_call`), entered once via
``trio_asyncio.aio_as_trio``: it creates the :class:`grpclib.client.Channel` inside the loop,
opens the stream, runs a send loop (reads a Trio memory channel) and a receive loop (writes a
Trio memory channel) as asyncio tasks, and closes everything on the way out. The Trio side only
sees :class:`OperatorBridge` (an :class:`~bigfleet_trio.shard.transport.OperatorStream`).

Crossing the bridge is cheap on the fast path: the asyncio side calls the channels'
``send_nowait``/``receive_nowait`` directly (same thread, same Trio run) and only falls back to a
``trio_as_aio`` call when it would block; a full downlink lane therefore stops grpclib from
reading, which back-pressures the shard through HTTP/2 flow control. On the agent side
(:class:`OperatorBridge`) downlink frames cross as raw bytes, sorted into a BootstrapRequest lane
and an ordered lane, and uplink ``send`` waits until grpclib has written its frame.

Who opens the asyncio loop. Wrap the program (or the agent's ``run()``) in
``async with trio_asyncio.open_loop():`` -- or :func:`open_loop`, which reuses a loop that is
already open. If no loop is open, :meth:`GrpcConnector.connect` opens one for the lifetime of
that stream, which works but costs a loop per session.

Liveness. HTTP/2 keepalive pings through grpclib's underscore ``Configuration`` fields
(``_keepalive_time`` default 60 s here, ``_keepalive_timeout`` 20 s). A Go shard's default
enforcement policy (MinTime 5 min) tolerates this while it sends data (the roll-up Acks every
10 s reset its ping strikes); lower the interval only if the shard permits it.

Message limits. grpclib has none of its own; :class:`LimitedProtoCodec` refuses to encode or
decode a message above ``max_message_bytes`` (256 MiB default, as the Go dial options).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import trio
import trio_asyncio  # type: ignore[import-untyped]
from grpclib.client import Channel
from grpclib.config import Configuration
from grpclib.const import Cardinality, Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from bigfleet_trio.proto import pb
from bigfleet_trio.shard.codec import (
    EncodedFrame,
    MalformedFrame,
    decode_shard_message,
    is_bootstrap_frame,
)
from bigfleet_trio.shard.tls import TLSFiles, client_ssl_context
from bigfleet_trio.shard.transport import StreamClosed

log = logging.getLogger(__name__)

SESSION_METHOD = "/bigfleet.v1alpha1.Shard/Session"
MAX_MESSAGE_BYTES = 256 * 1024 * 1024

S = TypeVar("S")
R = TypeVar("R")


class MessageTooLarge(ValueError):
    """An outbound message exceeds the configured limit."""


class LimitedProtoCodec(ProtoCodec):
    """grpclib's protobuf codec (works with betterproto messages) with a size limit both ways.

    Also writes pre-encoded :class:`~bigfleet_trio.shard.codec.EncodedFrame` bytes as they are.
    """

    def __init__(self, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.max_message_bytes = max_message_bytes

    def encode(self, message: Any, message_type: Any) -> bytes:
        """Serialize ``message``; an :class:`EncodedFrame` is written as is."""
        data: bytes = (
            message.data
            if isinstance(message, EncodedFrame)
            else super().encode(message, message_type)
        )
        if len(data) > self.max_message_bytes:
            raise MessageTooLarge(
                f"message of {len(data)} bytes exceeds the {self.max_message_bytes} byte limit"
            )
        return data

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self.max_message_bytes:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"received message of {len(data)} bytes exceeds {self.max_message_bytes}",
            )
        return super().decode(data, message_type)


class OperatorCodec(LimitedProtoCodec):
    """The agent's codec: downlink frames stay raw bytes (the Trio side looks at the first byte,
    then decodes them with :func:`~bigfleet_trio.shard.codec.decode_shard_message`)."""

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self.max_message_bytes:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"received message of {len(data)} bytes exceeds {self.max_message_bytes}",
            )
        return bytes(data)


@asynccontextmanager
async def open_loop() -> AsyncIterator[None]:
    """Make sure a trio-asyncio loop is open for the block (reuse the current one if any)."""
    if trio_asyncio.current_loop.get() is not None:
        yield
    else:
        # trio_asyncio wraps exceptions from the block in groups; callers expect them bare.
        async with unwrap_single_group(), trio_asyncio.open_loop():
            yield


# ---- the bridge (shared with bigfleet_trio.shard.server) ---------------------------------------


@dataclass
class BridgeState:
    """Why the asyncio side ended (read by the Trio side to explain :class:`StreamClosed`)."""

    reason: str = "stream closed"
    open_error: BaseException | None = None
    opened: trio.Event = field(default_factory=trio.Event)


class BridgedStream(Generic[S, R]):
    """Trio end of a bridged stream: sends ``S`` frames, receives ``R`` frames.

    Implements :class:`~bigfleet_trio.shard.transport.OperatorStream` (``S`` = OperatorMessage)
    and :class:`~bigfleet_trio.shard.transport.ShardStream` (``S`` = ShardMessage).
    """

    def __init__(
        self,
        out_send: trio.MemorySendChannel[S],
        in_recv: trio.MemoryReceiveChannel[R],
        state: BridgeState,
    ) -> None:
        self._out = out_send
        self._in = in_recv
        self._state = state
        self.closed = False

    # Both directions take a fast path when the channel is ready: a cancel point but no
    # schedule point (like trio's own fast paths), bounded by the channel size, so a burst of
    # frames is consumed without a scheduler round trip per frame.

    async def send(self, msg: S) -> None:
        if self.closed:
            raise StreamClosed("closed locally")
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                self._out.send_nowait(msg)
            except trio.WouldBlock:
                await self._out.send(msg)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise StreamClosed(self._state.reason) from exc

    async def receive(self) -> R:
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                return self._in.receive_nowait()
            except trio.WouldBlock:
                return await self._in.receive()
        except trio.EndOfChannel as exc:
            raise StreamClosed(self._state.reason) from exc
        except trio.ClosedResourceError as exc:
            raise StreamClosed("closed locally") from exc

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        """Synchronous close (idempotent): end the outgoing side, stop receiving."""
        if self.closed:
            return
        self.closed = True
        self._out.close()
        self._in.close()


@dataclass(eq=False)
class _Outgoing:
    """One uplink frame handed to the asyncio side; ``written`` is set once it is settled."""

    msg: Any
    written: trio.Event = field(default_factory=trio.Event)
    ok: bool = False  # True when grpclib wrote it to the transport


class OperatorBridge:
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
        out_send: trio.MemorySendChannel[_Outgoing],
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
        if self.closed:
            raise StreamClosed("closed locally")
        item = _Outgoing(msg)
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                self._out.send_nowait(item)
            except trio.WouldBlock:
                await self._out.send(item)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise StreamClosed(self._state.reason) from exc
        await item.written.wait()
        if not item.ok:
            raise StreamClosed(self._state.reason)

    async def receive(self) -> pb.ShardMessage:
        """The next frame in arrival order (BootstrapRequests excepted, see the class doc).

        Takes ready frames without a schedule point, but yields to the scheduler once per
        ``yield_every`` frames so a deep backlog cannot starve other tasks.
        """
        while True:
            await trio.lowlevel.checkpoint_if_cancelled()
            self._fast += 1
            if self._fast >= self._yield_every:
                self._fast = 0
                await trio.lowlevel.cancel_shielded_checkpoint()
            try:
                try:
                    data = self._ordered.receive_nowait()
                except trio.WouldBlock:
                    self._fast = 0
                    data = await self._ordered.receive()
            except trio.EndOfChannel as exc:
                raise StreamClosed(self._state.reason) from exc
            except trio.ClosedResourceError as exc:
                raise StreamClosed("closed locally") from exc
            msg = self._decode(data)
            if msg is not None:
                return msg

    async def receive_priority(self) -> pb.ShardMessage:
        """The next BootstrapRequest frame, ahead of any backlog of other frames.

        From the first call on, BootstrapRequests are delivered only here, not by
        :meth:`receive`.
        """
        self.priority_consumer = True
        while True:
            try:
                data = await self._bootstrap.receive()
            except trio.EndOfChannel as exc:
                raise StreamClosed(self._state.reason) from exc
            except trio.ClosedResourceError as exc:
                raise StreamClosed("closed locally") from exc
            msg = self._decode(data)
            if msg is not None:
                return msg

    def _decode(self, data: bytes) -> pb.ShardMessage | None:
        try:
            return decode_shard_message(data)
        except MalformedFrame as exc:
            self.malformed += 1
            if self.malformed <= MALFORMED_LOG_FIRST or self.malformed % MALFORMED_LOG_EVERY == 0:
                log.warning(
                    "downlink frame skipped: %s; first bytes %s (%d malformed on this stream)",
                    exc, data[:16].hex(" "), self.malformed,
                    extra={"problem": exc.problem, "frame_bytes": exc.size},
                )
            return None

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        """Synchronous close (idempotent): end the outgoing side, stop receiving."""
        if self.closed:
            return
        self.closed = True
        self._out.close()
        self._ordered.close()
        self._bootstrap.close()


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


async def aio_put(send: trio.MemorySendChannel[Any], item: Any) -> None:
    """asyncio-flavoured: put ``item`` into a Trio channel (fast path without a task switch)."""
    try:
        send.send_nowait(item)
    except trio.WouldBlock:
        await trio_asyncio.trio_as_aio(send.send)(item)


async def aio_get(recv: trio.MemoryReceiveChannel[Any]) -> Any:
    """asyncio-flavoured: take one item from a Trio channel (fast path without a task switch)."""
    try:
        return recv.receive_nowait()
    except trio.WouldBlock:
        return await trio_asyncio.trio_as_aio(recv.receive)()


@asynccontextmanager
async def unwrap_single_group() -> AsyncIterator[None]:
    """Re-raise a one-exception group from an inner nursery as that bare exception.

    The nursery around a yielded stream would otherwise wrap the *caller's* exception (e.g. the
    session's StreamClosed) in an ExceptionGroup; callers expect the plain exception.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        inner: BaseException = group
        while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
            inner = inner.exceptions[0]
        if inner is group:
            raise
        raise inner from None


def describe_error(exc: BaseException) -> str:
    """Short reason for a transport failure, e.g. ``grpc: UNAVAILABLE ...``."""
    if isinstance(exc, GRPCError):
        return f"grpc: {exc.status.name} {exc.message or ''}".strip()
    if isinstance(exc, StreamTerminatedError):
        return f"stream terminated: {exc}"
    if isinstance(exc, OSError):
        return f"connection error: {exc}"
    return f"{type(exc).__name__}: {exc}"


async def wait_first(*tasks: asyncio.Future[Any]) -> set[asyncio.Future[Any]]:
    """asyncio-flavoured: wait until one task is done; returns the done set."""
    done, _ = await asyncio.wait(set(tasks), return_when=asyncio.FIRST_COMPLETED)
    return done


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """asyncio-flavoured: cancel ``tasks`` and wait for them to finish (errors swallowed)."""
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# ---- client connector ------------------------------------------------------------------------


class GrpcConnector:
    """A :class:`~bigfleet_trio.shard.transport.Connector` over grpclib + trio-asyncio.

    Args:
        host: shard host name or address.
        port: shard port.
        tls: optional :class:`TLSFiles` (plaintext when None or empty); validated here.
        keepalive_time: seconds between HTTP/2 pings (None disables).
        keepalive_timeout: seconds to wait for a ping ACK before the connection is dropped.
        max_message_bytes: per-message limit both ways (256 MiB).
        connect_timeout: seconds to open the stream before :class:`StreamClosed`.
        uplink_buffer: frames handed over and not yet taken by the writer (each
            ``send`` still waits until its own frame is written to the transport).
        downlink_buffer: frames read off the connection and not yet taken by the session
            (read-ahead; when full, grpclib stops reading and HTTP/2 flow control holds the
            shard).
        bootstrap_buffer: the same for the BootstrapRequest lane.
        bootstrap_lane: False puts BootstrapRequests in the ordered lane too (a benchmark
            baseline: strict arrival order).

    Raises:
        TLSConfigError: inconsistent TLS settings (at construction).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: TLSFiles | None = None,
        keepalive_time: float | None = 60.0,
        keepalive_timeout: float = 20.0,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        connect_timeout: float = 10.0,
        uplink_buffer: int = 1,
        downlink_buffer: int = 65536,
        bootstrap_buffer: int = 1024,
        bootstrap_lane: bool = True,
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls or TLSFiles()
        self.tls.validate()
        self.keepalive_time = keepalive_time
        self.keepalive_timeout = keepalive_timeout
        self.max_message_bytes = max_message_bytes
        self.connect_timeout = connect_timeout
        self.uplink_buffer = uplink_buffer
        self.downlink_buffer = downlink_buffer
        self.bootstrap_buffer = bootstrap_buffer
        self.bootstrap_lane = bootstrap_lane

    def _config(self) -> Configuration:
        return Configuration(
            _keepalive_time=self.keepalive_time,
            _keepalive_timeout=self.keepalive_timeout,
            _keepalive_permit_without_calls=False,
            ssl_target_name_override=self.tls.server_name,
        )

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[OperatorBridge]:
        """Open one ``Shard.Session`` stream; close (RST_STREAM + channel close) on exit.

        Raises:
            StreamClosed: the stream could not be opened (refused, TLS failure, timeout, status).
            TLSConfigError: the TLS files cannot be loaded.
        """
        ssl_ctx = client_ssl_context(self.tls)
        async with open_loop():
            state = BridgeState()
            up_send, up_recv = trio.open_memory_channel[_Outgoing](self.uplink_buffer)
            ord_send, ord_recv = trio.open_memory_channel[bytes](self.downlink_buffer)
            boot_send, boot_recv = trio.open_memory_channel[bytes](self.bootstrap_buffer)
            end = OperatorBridge(up_send, ord_recv, boot_recv, state)
            failure: StreamClosed | None = None
            async with unwrap_single_group(), trio.open_nursery() as nursery:
                nursery.start_soon(
                    trio_asyncio.aio_as_trio(self._aio_call),
                    ssl_ctx, up_recv, ord_send, boot_send, state, end,
                )
                with trio.move_on_after(self.connect_timeout) as timeout:
                    await state.opened.wait()
                if timeout.cancelled_caught or state.open_error is not None:
                    nursery.cancel_scope.cancel()
                    end.close()
                    reason = (
                        f"connect timeout after {self.connect_timeout}s"
                        if state.open_error is None
                        else state.reason
                    )
                    failure = StreamClosed(f"{self.host}:{self.port}: {reason}")
                else:
                    log.debug("grpc stream open host=%s port=%d", self.host, self.port)
                    try:
                        yield end
                    finally:
                        end.close()
                        nursery.cancel_scope.cancel()
            if failure is not None:
                raise failure

    async def _aio_call(
        self,
        ssl_ctx: Any,
        up_recv: trio.MemoryReceiveChannel[_Outgoing],
        ord_send: trio.MemorySendChannel[bytes],
        boot_send: trio.MemorySendChannel[bytes],
        state: BridgeState,
        end: OperatorBridge,
    ) -> None:
        """asyncio-flavoured: the whole bidi call. Never raises except CancelledError."""
        channel = Channel(
            self.host,
            self.port,
            ssl=ssl_ctx,
            config=self._config(),
            codec=OperatorCodec(self.max_message_bytes),
        )
        try:
            async with channel.request(
                SESSION_METHOD, Cardinality.STREAM_STREAM, pb.OperatorMessage, pb.ShardMessage
            ) as stream:
                await stream.send_request()
                state.opened.set()

                async def send_loop() -> None:
                    while True:
                        try:
                            item = await aio_get(up_recv)
                        except (trio.EndOfChannel, trio.ClosedResourceError):
                            await stream.end()
                            return
                        try:
                            await stream.send_message(item.msg)
                            item.ok = True
                        finally:
                            item.written.set()

                async def recv_loop() -> None:
                    # Raw frames, sorted by their first byte: read-ahead costs no decoding.
                    lanes = self.bootstrap_lane
                    reader = _BulkReader(stream, self.max_message_bytes)
                    while True:
                        data = await reader.next()
                        if data is None:
                            return
                        lane = (
                            boot_send
                            if lanes and end.priority_consumer and is_bootstrap_frame(data)
                            else ord_send
                        )
                        try:
                            await aio_put(lane, data)
                        except (trio.BrokenResourceError, trio.ClosedResourceError):
                            return  # the Trio side closed its end

                sender = asyncio.ensure_future(send_loop())
                receiver = asyncio.ensure_future(recv_loop())
                try:
                    done = await wait_first(sender, receiver)
                    if sender in done and sender.exception() is None:
                        await receiver  # half-closed by us: keep reading until the shard ends
                        done = {sender, receiver}
                    for t in done:
                        t.result()
                    # The shard ended the RPC: end our side too so grpclib can read the status
                    # (a non-OK status raises GRPCError on leaving the request context).
                    await cancel_and_wait(sender)
                    try:
                        await stream.end()
                    except (ProtocolError, StreamTerminatedError):
                        pass  # already ended (we half-closed) or reset by the peer
                    state.reason = "peer closed"
                finally:
                    await cancel_and_wait(sender, receiver)
        except asyncio.CancelledError:
            state.reason = "closed locally"
            raise
        except (GRPCError, StreamTerminatedError, ProtocolError, OSError, MessageTooLarge) as exc:
            state.reason = describe_error(exc)
            log.info(
                "grpc stream ended host=%s port=%d reason=%s", self.host, self.port, state.reason
            )
        except Exception as exc:  # noqa: BLE001 - report, never crash the Trio side
            state.reason = describe_error(exc)
            log.exception("grpc stream failed host=%s port=%d", self.host, self.port)
        finally:
            if not state.opened.is_set():
                state.open_error = StreamClosed(state.reason)
                state.opened.set()
            ord_send.close()
            boot_send.close()
            # Frames handed over but never written: wake their senders (they raise StreamClosed).
            while True:
                try:
                    up_recv.receive_nowait().written.set()
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    break
            up_recv.close()
            channel.close()


def parse_address(addr: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` accepted) into (host, port).

    Raises:
        ValueError: no port, or a port that is not an integer in 1..65535.
    """
    host, sep, port_s = addr.rpartition(":")
    if not sep or not host:
        raise ValueError(f"shard address {addr!r} must be host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"shard address {addr!r}: port {port_s!r} is not a number") from None
    if not 0 < port < 65536:
        raise ValueError(f"shard address {addr!r}: port out of range")
    return host, port


__all__ = [
    "MAX_MESSAGE_BYTES",
    "SESSION_METHOD",
    "BridgeState",
    "BridgedStream",
    "GrpcConnector",
    "LimitedProtoCodec",
    "MessageTooLarge",
    "OperatorBridge",
    "OperatorCodec",
    "open_loop",
    "parse_address",
]
