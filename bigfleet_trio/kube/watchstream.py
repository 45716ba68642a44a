"""The event stream of one open watch response (:meth:`KubeClient.watch` yields it).

Lines are split from the body's bytes here and decoded with the sans-IO helpers of :mod:`.watch`;
a silent connection is caught by an inactivity timeout, since a half-open TCP connection would
otherwise wait forever.
"""

from __future__ import annotations

import math
from collections import deque

import httpx
import trio

from .errors import KubeTransportError, WatchInactivityTimeout
from .request import describe_cause
from .watch import WatchDecodeError, WatchEvent, decode_watch_line

__all__ = ["WatchStream"]


class WatchStream:
    """Async iterator of :class:`WatchEvent` over one open watch response.

    One event per ``\\n``-terminated line (a last line without one counts at the end of the
    body); blank keep-alive lines are skipped. Ends (``StopAsyncIteration``) when the server
    closes the stream cleanly.

    Raises (from ``__anext__``):
        WatchInactivityTimeout: no complete line within ``inactivity_timeout`` seconds.
        KubeTransportError: the connection broke or a line was undecodable.
    """

    def __init__(self, response: httpx.Response, inactivity_timeout: float | None):
        # The body's decoded bytes (Content-Encoding undone), split into lines here: httpx's
        # aiter_lines decodes every chunk to str and splits it in Python layers of its own,
        # which cost more than the JSON decoding of the events (orjson reads the bytes).
        self._chunks = response.aiter_bytes()
        self._lines: deque[bytes] = deque()
        self._partial = b""
        self._timeout = math.inf if inactivity_timeout is None else inactivity_timeout
        self._done = False

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> WatchEvent:
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

    async def _read_line(self) -> None:
        """Read chunks until at least one complete line is buffered, or the body ends."""
        with trio.move_on_after(self._timeout) as scope:
            while not self._lines:
                try:
                    chunk = await self._chunks.__anext__()
                except StopAsyncIteration:
                    self._done = True
                    if self._partial:
                        self._lines.append(self._partial)
                        self._partial = b""
                    return
                except (httpx.TransportError, httpx.StreamError) as exc:
                    self._done = True
                    raise KubeTransportError(f"watch stream broke: {describe_cause(exc)}") from exc
                if b"\n" not in chunk:
                    self._partial += chunk
                    continue
                lines = (self._partial + chunk).split(b"\n")
                self._partial = lines.pop()
                self._lines.extend(lines)
        if scope.cancelled_caught:
            self._done = True
            raise WatchInactivityTimeout(
                f"no watch event for {self._timeout:g}s (half-open connection?)"
            )
