"""grpclib transport for the ``Shard.Session`` stream, run from Trio through trio-asyncio.

The agent dials and holds one bidirectional stream (:class:`GrpcConnector`); dial options as the
Go agent's (256 MiB message limits both ways, optional mTLS, HTTP/2 keepalive). The Trio side
sees an :class:`~bigfleet_trio.shard.downlink.OperatorBridge`; the asyncio plumbing is in
:mod:`bigfleet_trio.shard.bridge`. Frame-level behaviour (decoding, malformed frames, the
bootstrap lane, what the send timeout bounds): docs/wire.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio_asyncio  # type: ignore[import-untyped]
from grpclib.client import Channel
from grpclib.config import Configuration
from grpclib.const import Cardinality, Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from h2.events import ConnectionTerminated

from bigfleet_trio.proto import pb
from bigfleet_trio.shard.bridge import (
    BridgeState,
    aio_get,
    cancel_and_wait,
    describe_error,
    open_loop,
    unwrap_single_group,
    wait_first,
)
from bigfleet_trio.shard.codec import EncodedFrame
from bigfleet_trio.shard.downlink import OperatorBridge, Outgoing, read_downlink
from bigfleet_trio.shard.tls import TLSFiles, client_ssl_context
from bigfleet_trio.shard.transport import StreamClosed

log = logging.getLogger(__name__)

SESSION_METHOD = "/bigfleet.v1alpha1.Shard/Session"
MAX_MESSAGE_BYTES = 256 * 1024 * 1024


class MessageTooLarge(ValueError):
    """An outbound message exceeds the configured limit."""


#: How a call ends short of a clean close: a status, a reset or GOAWAY, a protocol error, the
#: socket, an oversized message.
_STREAM_ENDS = (GRPCError, StreamTerminatedError, ProtocolError, OSError, MessageTooLarge)

#: Default seconds between keepalive pings: grpc-go's default enforcement MinTime (300 s) plus
#: a 10 % margin for timer and network jitter (docs/wire.md#keepalive-against-a-go-shard).
KEEPALIVE_TIME = 330.0

#: Seconds a failed write waits for the shard's status to arrive on the receive side.
STATUS_GRACE = 1.0


class LimitedProtoCodec(ProtoCodec):
    """grpclib's protobuf codec (works with betterproto messages) with a size limit both ways.

    grpclib has no message limit of its own; this one refuses to encode or decode a message
    above ``max_message_bytes`` (256 MiB default, as the Go agent's dial options).

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


# ---- client connector ------------------------------------------------------------------------


class GrpcConnector:
    """A :class:`~bigfleet_trio.shard.transport.Connector` over grpclib + trio-asyncio.

    grpclib is asyncio-only and ties cancellation and deadlines to the *current asyncio task*,
    and each ``aio_as_trio`` call runs in a fresh task. So one session = ONE asyncio-flavoured
    coroutine (:meth:`_aio_call`), entered once via ``trio_asyncio.aio_as_trio``: it creates the
    :class:`grpclib.client.Channel` inside the loop, opens the stream, runs a send loop (reads a
    Trio memory channel) and a receive loop (:func:`~bigfleet_trio.shard.downlink.read_downlink`,
    writes Trio memory channels) as asyncio tasks, and closes everything on the way out. The
    asyncio side calls the channels' ``send_nowait``/``receive_nowait`` directly (same thread,
    same Trio run) and only falls back to a ``trio_as_aio`` call when it would block; a full
    downlink lane therefore stops grpclib from reading, which back-pressures the shard through
    HTTP/2 flow control.

    Wrap the program (or the agent's ``run()``) in :func:`open_loop` (or
    ``trio_asyncio.open_loop()``); without an open loop :meth:`connect` opens one for the
    lifetime of that stream, which works but costs a loop per session.

    Args:
        host: shard host name or address.
        port: shard port.
        tls: optional :class:`TLSFiles` (plaintext when None or empty); validated here.
        keepalive_time: seconds between HTTP/2 pings while the stream is open (None disables);
            keep it at or above the shard's keepalive enforcement MinTime (grpc-go's default
            5 min; docs/wire.md#keepalive-against-a-go-shard).
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
        keepalive_time: float | None = KEEPALIVE_TIME,
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
        # HTTP/2 keepalive through grpclib's underscore fields. A Go shard's default enforcement
        # (MinTime 5 min, no pings without a stream) counts a strike for each ping sooner than
        # 5 min after the previous one, unless the shard sent DATA or HEADERS in between, and
        # answers the third strike with GOAWAY ENHANCE_YOUR_CALM "too_many_pings". The downlink
        # can be idle for hours (no Acks, no machines), so the default interval (330 s) stays
        # above MinTime on the shard's clock. grpclib also holds pings to one per
        # `_http2_min_sent_ping_interval_without_data` (300 s by default, whatever
        # `_keepalive_time` says); set it to the interval so the configured one is the real one.
        # Proven against grpc-go: tests/interop/test_goshard_keepalive.py.
        return Configuration(
            _keepalive_time=self.keepalive_time,
            _keepalive_timeout=self.keepalive_timeout,
            _keepalive_permit_without_calls=False,
            _http2_min_sent_ping_interval_without_data=self.keepalive_time or 300.0,
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
            up_send, up_recv = trio.open_memory_channel[Outgoing](self.uplink_buffer)
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
        up_recv: trio.MemoryReceiveChannel[Outgoing],
        ord_send: trio.MemorySendChannel[bytes],
        boot_send: trio.MemorySendChannel[bytes],
        state: BridgeState,
        end: OperatorBridge,
    ) -> None:
        """asyncio-flavoured: the whole bidi call. Never raises except CancelledError."""
        unsent: list[Outgoing] = []
        goaway: list[str] = []  # the shard's GOAWAY, as "GOAWAY <code> <debug data>"

        def why(exc: BaseException) -> str:
            # A GOAWAY names the real reason; grpclib reports the streams it ends as
            # "Connection lost" and drops the debug data (docs/wire.md#go-interop).
            reason = describe_error(exc)
            return f"{goaway[0]} ({reason})" if goaway else reason

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
                self._watch_goaway(channel, goaway)
                state.opened.set()
                await self._exchange(
                    stream, up_recv, ord_send, boot_send, state, end, unsent, why
                )
        except asyncio.CancelledError:
            state.reason = "closed locally"
            raise
        except _STREAM_ENDS as exc:
            state.reason = why(exc)
            if isinstance(exc, GRPCError):
                state.grpc_status = exc.status.name
            log.info(
                "grpc stream ended host=%s port=%d reason=%s", self.host, self.port, state.reason
            )
        except Exception as exc:  # noqa: BLE001 - report, never crash the Trio side
            state.reason = describe_error(exc)
            log.exception("grpc stream failed host=%s port=%d", self.host, self.port)
        finally:
            for item in unsent:
                item.written.set()
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

    async def _exchange(
        self,
        stream: Any,
        up_recv: trio.MemoryReceiveChannel[Outgoing],
        ord_send: trio.MemorySendChannel[bytes],
        boot_send: trio.MemorySendChannel[bytes],
        state: BridgeState,
        end: OperatorBridge,
        unsent: list[Outgoing],
        why: Callable[[BaseException], str],
    ) -> None:
        """asyncio-flavoured: pump frames both ways on an opened stream until either side ends.

        A frame whose write failed goes to ``unsent`` (its sender is woken by the caller once
        the reason is known); ``why`` names an error (a GOAWAY first).
        """

        async def send_loop() -> None:
            while True:
                try:
                    item = await aio_get(up_recv)
                except (trio.EndOfChannel, trio.ClosedResourceError):
                    await stream.end()
                    return
                try:
                    await stream.send_message(item.msg)
                except BaseException:
                    # Woken at the very end, once the reason is known: a failed write
                    # usually means the shard ended the call, and its status is still
                    # on its way to the receiver.
                    unsent.append(item)
                    raise
                item.ok = True
                item.written.set()

        sender = asyncio.ensure_future(send_loop())
        receiver = asyncio.ensure_future(
            read_downlink(
                stream,
                self.max_message_bytes,
                ord_send,
                boot_send if self.bootstrap_lane else None,
                end,
            )
        )
        try:
            done = await wait_first(sender, receiver)
            if sender in done and sender.exception() is None:
                await receiver  # half-closed by us: keep reading until the shard ends
                done = {sender, receiver}
            elif sender in done and not receiver.done():
                # A write failed: the shard's status (trailers) may be a moment behind;
                # it is the better reason, so give the receiver a little time for it.
                await asyncio.wait({receiver}, timeout=STATUS_GRACE)
            # The receiver's outcome first: it carries the shard's status.
            for t in (receiver, sender):
                if t.done():
                    t.result()
            # The shard ended the RPC: end our side too so grpclib can read the status
            # (a non-OK status raises GRPCError on leaving the request context).
            await cancel_and_wait(sender)
            try:
                await stream.end()
            except (ProtocolError, StreamTerminatedError):
                pass  # already ended (we half-closed) or reset by the peer
            state.reason = "peer closed"
        except _STREAM_ENDS as exc:
            # Record why before the sender is cancelled below: a send waiting on it
            # raises StreamClosed with this reason, and the session may tear the call
            # down before _aio_call's handler runs (a status the shard ended the
            # stream with must reach the log; docs/wire.md#go-interop).
            state.reason = why(exc)
            if isinstance(exc, GRPCError):
                state.grpc_status = exc.status.name
            raise
        finally:
            await cancel_and_wait(sender, receiver)

    def _watch_goaway(self, channel: Channel, goaway: list[str]) -> None:
        """Note the shard's GOAWAY in ``goaway``; on ``too_many_pings``, double the keepalive
        interval for the next connections (as grpc-go's own client does).

        Reaches into grpclib's event processor (``_protocol.processor.processors``); with
        another layout the reason stays grpclib's own.
        """
        protocol = getattr(channel, "_protocol", None)
        processors = getattr(getattr(protocol, "processor", None), "processors", None)
        if not isinstance(processors, dict) or ConnectionTerminated not in processors:
            return
        original = processors[ConnectionTerminated]

        def on_goaway(event: ConnectionTerminated) -> None:
            code = getattr(event.error_code, "name", event.error_code)
            debug = (event.additional_data or b"").decode("utf-8", "replace")
            goaway.append(f"GOAWAY {code} {debug}".strip())
            log.info("shard sent GOAWAY host=%s port=%d code=%s debug=%r", self.host, self.port,
                     code, debug)
            if debug == "too_many_pings" and self.keepalive_time:
                # The shard's enforcement is stricter than our interval: back off, so the
                # next connection does not earn the same GOAWAY.
                self.keepalive_time *= 2
                log.warning("shard refused our keepalive pings (GOAWAY too_many_pings): "
                            "interval doubled to %gs for the next connections host=%s port=%d",
                            self.keepalive_time, self.host, self.port)
            original(event)

        processors[ConnectionTerminated] = on_goaway


def parse_address(addr: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` and a ``grpc://`` prefix accepted) into (host, port).

    Raises:
        ValueError: no port, or a port that is not an integer in 1..65535.
    """
    from bigfleet_trio.knobs import strip_grpc_scheme

    addr = strip_grpc_scheme(addr)
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
    "KEEPALIVE_TIME",
    "MAX_MESSAGE_BYTES",
    "SESSION_METHOD",
    "GrpcConnector",
    "LimitedProtoCodec",
    "MessageTooLarge",
    "OperatorCodec",
    "parse_address",
]
