"""The event stream of one open watch response (:meth:`KubeClient.watch` yields it).

JSON lines, or length-prefixed protobuf frames, are split from the body's bytes here and decoded
with the sans-IO helpers of :mod:`.watch` and :mod:`.protowire`; a silent connection is caught by
an inactivity timeout, since a half-open TCP connection would otherwise wait forever.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import httpx
import trio

from . import protowire
from .errors import KubeTransportError, WatchInactivityTimeout
from .request import describe_cause
from .watch import TYPES, WatchDecodeError, WatchEvent, decode_watch_line

__all__ = ["WatchStream"]


class WatchStream:
    """Async iterator of :class:`WatchEvent` over one open watch response.

    One event per ``\\n``-terminated line (a last line without one counts at the end of the
    body); blank keep-alive lines are skipped. With ``protobuf`` (the answer's Content-Type
    was Kubernetes protobuf) one event per length-prefixed frame instead
    (docs/kube-api.md#protobuf); a partial frame at the end of the body is a broken stream.
    Ends (``StopAsyncIteration``) when the server closes the stream cleanly.

    Raises (from ``__anext__``):
        WatchInactivityTimeout: no complete line within ``inactivity_timeout`` seconds.
        KubeTransportError: the connection broke or a line was undecodable.
    """

    def __init__(self, response: httpx.Response, inactivity_timeout: float | None, *,
                 protobuf: bool = False):
        # The body's decoded bytes (Content-Encoding undone), split into lines here: httpx's
        # aiter_lines decodes every chunk to str and splits it in Python layers of its own,
        # which cost more than the JSON decoding of the events (orjson reads the bytes).
        self._chunks = response.aiter_bytes()
        self._lines: deque[bytes] = deque()
        self._partial = b""
        self._timeout = math.inf if inactivity_timeout is None else inactivity_timeout
        self._done = False
        self._frames: bytearray | None = bytearray() if protobuf else None
        self.unchanged: Callable[[dict[str, Any]], bool] | None = None
        """Asked about a MODIFIED Pod's head before the whole Pod is converted (a protobuf
        stream only; the informer sets it: docs/kube-api.md#unchanged-pod-events)."""

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> WatchEvent:
        if self._frames is not None:
            return await self._next_frame()
        while True:
            if not self._lines:
                if self._done:
                    raise StopAsyncIteration
                await self._read_line()
                continue
            try:
                event = decode_watch_line(self._lines.popleft())
            except WatchDecodeError as exc:
                self._done = True
                self._lines.clear()
                raise KubeTransportError(str(exc)) from exc
            if event is not None:
                return event

    async def _next_frame(self) -> WatchEvent:
        """The next protobuf frame's event (:meth:`__anext__` for a protobuf stream)."""
        while not self._lines:
            if self._done:
                raise StopAsyncIteration
            await self._read(self._split_frames)
        try:
            etype, obj, verdict = protowire.decode_watch_frame_unless(
                self._lines.popleft(), self.unchanged)
            if etype not in TYPES:
                raise protowire.ProtobufDecodeError(f"unknown watch event type {etype!r}")
        except protowire.ProtobufDecodeError as exc:
            self._done = True
            self._lines.clear()
            raise KubeTransportError(f"watch frame undecodable: {exc}") from exc
        return WatchEvent(etype, obj, verdict)  # type: ignore[arg-type]  # checked: TYPES

    def _split_frames(self, chunk: bytes | None) -> None:
        """Buffer a chunk (None: the body ended) and queue its complete frames."""
        frames = self._frames
        assert frames is not None
        if chunk is None:
            if frames:
                raise KubeTransportError(
                    f"watch stream ended inside a frame ({len(frames)} bytes left)")
            return
        frames += chunk
        try:
            self._lines.extend(protowire.split_frames(frames))
        except protowire.ProtobufDecodeError as exc:
            self._done = True
            raise KubeTransportError(f"watch stream broke: {exc}") from exc

    async def _read_line(self) -> None:
        await self._read(self._split_lines)

    def _split_lines(self, chunk: bytes | None) -> None:
        """Queue a chunk's complete lines (None: the body ended, its last line counts)."""
        if chunk is None:
            if self._partial:
                self._lines.append(self._partial)
                self._partial = b""
            return
        if b"\n" not in chunk:
            self._partial += chunk
            return
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        self._lines.extend(lines)

    async def _read(self, split: Callable[[bytes | None], None]) -> None:
        """Read chunks into ``split`` until at least one complete line (frame) is queued, or the
        body ends."""
        with trio.move_on_after(self._timeout) as scope:
            while not self._lines:
                try:
                    chunk = await self._chunks.__anext__()
                except StopAsyncIteration:
                    self._done = True
                    split(None)
                    return
                except (httpx.TransportError, httpx.StreamError) as exc:
                    self._done = True
                    raise KubeTransportError(f"watch stream broke: {describe_cause(exc)}") from exc
                split(chunk)
        if scope.cancelled_caught:
            self._done = True
            raise WatchInactivityTimeout(
                f"no watch event for {self._timeout:g}s (half-open connection?)"
            )
