"""The Trio <-> asyncio bridge under the grpclib transport, shared by client and server.

grpclib is asyncio-only: each stream runs as one asyncio-flavoured coroutine (via trio-asyncio)
that moves frames through Trio memory channels. This module holds the Trio end of such a stream
(:class:`BridgedStream`), the channel helpers both sides use (fast path without a task switch),
and :func:`open_loop`. The agent's own downlink end is :mod:`bigfleet_trio.shard.downlink`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import trio
import trio_asyncio  # type: ignore[import-untyped]
from grpclib.exceptions import GRPCError, StreamTerminatedError

from bigfleet_trio.shard.transport import StreamClosed

__all__ = [
    "BridgeState",
    "BridgedStream",
    "TrioEnd",
    "aio_get",
    "aio_put",
    "cancel_and_wait",
    "describe_error",
    "open_loop",
    "unwrap_single_group",
    "wait_first",
]

S = TypeVar("S")
R = TypeVar("R")
T = TypeVar("T")


@asynccontextmanager
async def open_loop() -> AsyncIterator[None]:
    """Make sure a trio-asyncio loop is open for the block (reuse the current one if any)."""
    if trio_asyncio.current_loop.get() is not None:
        yield
    else:
        # trio_asyncio wraps exceptions from the block in groups; callers expect them bare.
        async with unwrap_single_group(), trio_asyncio.open_loop():
            yield


@dataclass
class BridgeState:
    """Why the asyncio side ended (read by the Trio side to explain :class:`StreamClosed`)."""

    reason: str = "stream closed"
    open_error: BaseException | None = None
    opened: trio.Event = field(default_factory=trio.Event)
    grpc_status: str | None = None
    """The gRPC status name the peer ended the stream with, when it said one."""
    close_status: tuple[str, str] | None = None
    """(status name, message) the Trio side asked to end the RPC with (the shard's side)."""


class TrioEnd:
    """What every Trio end of a bridged stream shares: hand-over, receive errors, closing.

    Subclasses set ``_state`` and ``closed`` and list their channels in ``_channels``.
    """

    _state: BridgeState
    _channels: tuple[trio.MemorySendChannel[Any] | trio.MemoryReceiveChannel[Any], ...]
    closed: bool

    # Both directions take a fast path when the channel is ready: a cancel point but no
    # schedule point (like trio's own fast paths), bounded by the channel size, so a burst of
    # frames is consumed without a scheduler round trip per frame.

    async def _hand_over(self, out: trio.MemorySendChannel[T], item: T) -> None:
        """Put ``item`` into the outgoing channel; StreamClosed once the stream has ended."""
        if self.closed:
            raise StreamClosed("closed locally")
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                out.send_nowait(item)
            except trio.WouldBlock:
                await out.send(item)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise StreamClosed(self._state.reason, grpc_status=self._state.grpc_status) from exc

    @contextmanager
    def _receiving(self) -> Iterator[None]:
        """The end of an incoming channel as StreamClosed (the peer's reason, or ours)."""
        try:
            yield
        except trio.EndOfChannel as exc:
            raise StreamClosed(self._state.reason, grpc_status=self._state.grpc_status) from exc
        except trio.ClosedResourceError as exc:
            raise StreamClosed("closed locally") from exc

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    async def close_with_status(self, status: str, message: str) -> None:
        """Close; the server side ends the RPC with this gRPC status and message."""
        self._state.close_status = (status, message)
        await self.aclose()

    def close(self) -> None:
        """Synchronous close (idempotent): end the outgoing side, stop receiving."""
        if self.closed:
            return
        self.closed = True
        for channel in self._channels:
            channel.close()


class BridgedStream(TrioEnd, Generic[S, R]):
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
        self._channels = (out_send, in_recv)
        self.closed = False

    async def send(self, msg: S) -> None:
        await self._hand_over(self._out, msg)

    async def receive(self) -> R:
        with self._receiving():
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                return self._in.receive_nowait()
            except trio.WouldBlock:
                return await self._in.receive()


async def aio_put(send: trio.MemorySendChannel[Any], item: Any) -> None:
    """asyncio-flavoured: put ``item`` into a Trio channel (fast path without a task switch)."""
    try:
        send.send_nowait(item)
    except trio.WouldBlock:
        await _trio_call(send.send, item)


async def aio_get(recv: trio.MemoryReceiveChannel[Any]) -> Any:
    """asyncio-flavoured: take one item from a Trio channel (fast path without a task switch)."""
    try:
        return recv.receive_nowait()
    except trio.WouldBlock:
        return await _trio_call(recv.receive)


async def _trio_call(fn: Any, *args: Any) -> Any:
    """asyncio-flavoured: ``await fn(*args)`` run as a Trio task (trio-asyncio's future).

    trio-asyncio replaces the future's ``cancel`` with a closure over the task's handle, which
    holds the future: a reference cycle, with the call's result (a frame) inside. The downlink's
    wait for its next frame is nearly always pending, so a heap freeze nearly always caught one,
    and the frame it then got was never freed (docs/kube-api.md#garbage-collector). The
    replacement is dropped once the call is over.
    """
    loop: Any = asyncio.get_running_loop()  # trio-asyncio's loop (untyped)
    future = loop.trio_as_future(fn, *args)
    try:
        return await future
    finally:
        with suppress(AttributeError):  # another trio-asyncio may not replace it
            del future.cancel


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
