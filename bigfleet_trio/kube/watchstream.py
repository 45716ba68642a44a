"""The event stream of one open watch response (:meth:`KubeClient.watch` yields it).

Lines are decoded with the sans-IO helpers of :mod:`.watch`; a silent connection is caught by an
inactivity timeout, since a half-open TCP connection would otherwise wait forever.
"""

from __future__ import annotations

import math

import httpx
import trio

from .errors import KubeTransportError, WatchInactivityTimeout
from .request import describe_cause
from .watch import WatchDecodeError, WatchEvent, decode_watch_line

__all__ = ["WatchStream"]


class WatchStream:
    """Async iterator of :class:`WatchEvent` over one open watch response.

    Blank keep-alive lines are skipped. Ends (``StopAsyncIteration``) when the server closes
    the stream cleanly.

    Raises (from ``__anext__``):
        WatchInactivityTimeout: no line within ``inactivity_timeout`` seconds.
        KubeTransportError: the connection broke or a line was undecodable.
    """

    def __init__(self, response: httpx.Response, inactivity_timeout: float | None):
        self._lines = response.aiter_lines()
        self._timeout = math.inf if inactivity_timeout is None else inactivity_timeout
        self._done = False

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> WatchEvent:
        while True:
            if self._done:
                raise StopAsyncIteration
            line: str | None = None
            with trio.move_on_after(self._timeout) as scope:
                try:
                    line = await self._lines.__anext__()
                except StopAsyncIteration:
                    self._done = True
                    raise
                except (httpx.TransportError, httpx.StreamError) as exc:
                    self._done = True
                    raise KubeTransportError(f"watch stream broke: {describe_cause(exc)}") from exc
            if scope.cancelled_caught or line is None:
                self._done = True
                raise WatchInactivityTimeout(
                    f"no watch event for {self._timeout:g}s (half-open connection?)"
                )
            try:
                event = decode_watch_line(line)
            except WatchDecodeError as exc:
                self._done = True
                raise KubeTransportError(str(exc)) from exc
            if event is not None:
                return event
