"""A generic grpclib ``Shard.Session`` server that hands each session to a Trio callback.

The shard side of the one RPC (docs/wire.md#shardsession-and-its-messages); used by the simulated
shard and by the transport tests. The same bridge as :mod:`bigfleet_trio.shard.grpc`, mirrored:
grpclib runs each request handler in its own asyncio task; that task pumps frames between the
grpclib stream and two Trio memory channels and runs the Trio ``handler(shard_stream)`` as a
Trio task (``loop.trio_as_future``). The RPC ends (status OK) when the handler returns; if the
client goes away, grpclib cancels the asyncio task and with it the Trio handler.

Usage::

    async with trio_asyncio.open_loop():          # or bigfleet_trio.shard.grpc.open_loop()
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve_shard, handler, host="127.0.0.1", port=0))
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl as _ssl
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import grpclib.const
import grpclib.server
import trio
import trio_asyncio  # type: ignore[import-untyped]
from grpclib.config import Configuration
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError

from bigfleet_trio.proto import pb
from bigfleet_trio.shard.bridge import (
    BridgedStream,
    BridgeState,
    aio_get,
    aio_put,
    cancel_and_wait,
    describe_error,
    open_loop,
    wait_first,
)
from bigfleet_trio.shard.grpc import MAX_MESSAGE_BYTES, SESSION_METHOD, LimitedProtoCodec
from bigfleet_trio.shard.transport import ShardStream

log = logging.getLogger(__name__)

SessionHandler = Callable[[ShardStream], Awaitable[None]]


class _ShardService:
    """grpclib service object exposing only ``Shard.Session``."""

    def __init__(self, handler: SessionHandler, buffer: int) -> None:
        self._handler = handler
        self._buffer = buffer

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            SESSION_METHOD: grpclib.const.Handler(
                self._session, Cardinality.STREAM_STREAM, pb.OperatorMessage, pb.ShardMessage
            )
        }

    async def _run_handler(self, end: BridgedStream[pb.ShardMessage, pb.OperatorMessage]) -> None:
        """Trio-flavoured: run the user's handler; always close its end afterwards."""
        try:
            await self._handler(end)
        finally:
            end.close()

    async def _session(self, stream: grpclib.server.Stream[Any, Any]) -> None:
        """asyncio-flavoured: one RPC, in grpclib's task for it."""
        state = BridgeState()
        in_send, in_recv = trio.open_memory_channel[pb.OperatorMessage](self._buffer)
        out_send, out_recv = trio.open_memory_channel[pb.ShardMessage](self._buffer)
        end: BridgedStream[pb.ShardMessage, pb.OperatorMessage] = BridgedStream(
            out_send, in_recv, state
        )
        loop = trio_asyncio.current_loop.get()

        async def recv_loop() -> None:
            while True:
                msg = await stream.recv_message()
                if msg is None:
                    state.reason = "peer closed"
                    in_send.close()
                    return
                try:
                    await aio_put(in_send, msg)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return

        async def send_loop() -> None:
            while True:
                try:
                    msg = await aio_get(out_recv)
                except (trio.EndOfChannel, trio.ClosedResourceError):
                    return
                await stream.send_message(msg)

        handler_fut: asyncio.Future[None] = loop.trio_as_future(self._run_handler, end)
        receiver = asyncio.ensure_future(recv_loop())
        sender = asyncio.ensure_future(send_loop())
        try:
            pending = {handler_fut, receiver, sender}
            while True:
                done = await wait_first(*pending)
                pending -= done
                if receiver in done and receiver.exception() is not None:
                    receiver.result()
                if sender in done:
                    sender.result()  # raises on a send failure
                    if state.close_status is not None:  # the handler ended it with a status
                        name, message = state.close_status
                        raise GRPCError(Status[name], message)
                    break  # the handler closed its end and every frame was written
                if handler_fut in done and handler_fut.exception() is not None:
                    log.error("shard session handler failed: %r", handler_fut.exception())
                    raise GRPCError(Status.INTERNAL, "shard session handler failed")
        except asyncio.CancelledError:
            state.reason = "client went away"
            raise
        except GRPCError:
            raise
        except Exception as exc:
            state.reason = describe_error(exc)
            log.info("shard session stream ended: %s", state.reason)
        finally:
            end.close()
            in_send.close()
            # Request every cancellation synchronously first: grpclib may cancel this task again
            # while we wait below, and the Trio handler must be cancelled regardless.
            handler_fut.cancel()
            await cancel_and_wait(receiver, sender, handler_fut)


async def serve_shard(
    handler: SessionHandler,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    ssl: _ssl.SSLContext | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    buffer: int = 256,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve ``Shard.Session`` until cancelled; each accepted session runs ``handler(stream)``.

    Use with ``port = await nursery.start(serve_shard, handler, ...)``-style calls (wrap keyword
    arguments with ``functools.partial``). Needs a trio-asyncio loop; opens one when none is open.

    Args:
        handler: Trio async callback given a :class:`ShardStream`; the RPC ends when it returns.
        host: bind address.
        port: bind port (0 picks a free one).
        ssl: server SSLContext (see :func:`bigfleet_trio.shard.tls.server_ssl_context`).
        max_message_bytes: per-message limit both ways.
        buffer: Trio channel size per direction per session.
        task_status: receives the bound port.

    Raises:
        OSError: the address cannot be bound.
    """
    async with open_loop():
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        bound_port: int = sock.getsockname()[1]
        server = grpclib.server.Server(
            [_ShardService(handler, buffer)],
            codec=LimitedProtoCodec(max_message_bytes),
            config=Configuration(),
        )
        await trio_asyncio.aio_as_trio(server.start)(sock=sock, ssl=ssl)
        log.info("shard server listening host=%s port=%d tls=%s", host, bound_port, bool(ssl))
        try:
            task_status.started(bound_port)
            await trio.sleep_forever()
        finally:
            server.close()
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await trio_asyncio.aio_as_trio(server.wait_closed)()
            sock.close()
