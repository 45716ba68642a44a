"""The request connection pool under httpx: a stack of idle HTTP/1.1 keep-alive connections.

:class:`KeepAlivePool` is an ``httpx.AsyncBaseTransport`` for the client's non-streaming
requests (watches keep httpx's default transport). Each connection is an
``httpcore.AsyncHTTPConnection`` (httpcore does the HTTP/1.1 and TLS work); only the pool
differs from httpx's default one, whose bookkeeping walks every connection, several times and
with a readability syscall each, on every request.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterable
from typing import Any

import httpcore
import httpx
import trio

__all__ = ["KeepAlivePool"]

_ORIGIN_KEY = tuple[bytes, bytes, int | None]


def _httpx_error(exc: httpcore.TimeoutException | httpcore.NetworkError
                 | httpcore.ProtocolError | httpcore.UnsupportedProtocol) -> httpx.TransportError:
    """The httpx exception of the same name (httpx mirrors httpcore's tree)."""
    cls = getattr(httpx, type(exc).__name__, None)
    if not (isinstance(cls, type) and issubclass(cls, httpx.TransportError)):
        cls = httpx.TransportError
    return cls(str(exc))


_CORE_ERRORS = (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError,
                httpcore.UnsupportedProtocol)


class KeepAlivePool(httpx.AsyncBaseTransport):
    """HTTP/1.1 keep-alive pool: take the most recently used idle connection or open one.

    A request checks out one connection (LIFO, so the warmest; a connection the server
    closed or whose keep-alive expired is dropped on the way), runs on it, reads the whole
    body, and puts the connection back when it can be reused. No limit on concurrent
    connections (the callers' concurrency is the limit); at most ``max_idle`` are kept.

    Responses come back with their body read into memory (``await response.aread()`` decodes
    it; a watch's endless body needs httpx's default transport). httpcore errors are raised as
    the httpx errors of the same name.

    Args:
        ssl_context: for https origins (None: httpcore's default context).
        max_idle: idle connections kept per origin.
        keepalive_expiry: seconds an idle connection is reused for (None: no limit).
    """

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_idle: int = 32,
        keepalive_expiry: float | None = 60.0,
    ) -> None:
        self._ssl_context = ssl_context
        self._max_idle = max_idle
        self._keepalive_expiry = keepalive_expiry
        self._idle: dict[_ORIGIN_KEY, list[httpcore.AsyncHTTPConnection]] = {}
        self._origins: dict[_ORIGIN_KEY, httpcore.Origin] = {}
        self._closed = False
        self.opened = 0
        """Connections opened so far (for tests and benchmarks)."""

    async def _checkout(self, key: _ORIGIN_KEY) -> httpcore.AsyncHTTPConnection:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.is_available() and not conn.has_expired():
                return conn
            await self._close(conn)
        origin = self._origins.get(key)
        if origin is None:
            origin = self._origins[key] = httpcore.Origin(key[0], key[1], key[2] or (
                443 if key[0] == b"https" else 80))
        self.opened += 1
        return httpcore.AsyncHTTPConnection(
            origin, ssl_context=self._ssl_context, keepalive_expiry=self._keepalive_expiry,
            http1=True, http2=False,
        )

    async def _close(self, conn: httpcore.AsyncHTTPConnection) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            try:
                await conn.aclose()
            except _CORE_ERRORS:
                pass

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` on a pooled connection; the response body is read in full.

        Raises:
            httpx.TransportError (subclass named like httpcore's): no usable answer.
            RuntimeError: the pool is closed.
        """
        url = request.url
        status, headers, body, extensions = await self._exchange(
            (url.raw_scheme, url.raw_host, url.port),
            httpcore.Request(
                request.method,
                httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                             target=url.raw_path),
                headers=request.headers.raw,
                content=request.stream,
                extensions=request.extensions,
            ))
        # a stream, not content=: aread() then applies any Content-Encoding
        return httpx.Response(status, headers=headers, stream=httpx.ByteStream(body),
                              extensions=extensions, request=request)

    async def round_trip(
        self, method: bytes, url: httpx.URL, target: bytes,
        headers: list[tuple[bytes, bytes]], content: bytes | None,
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """One request without httpx's Request/Response objects (the client's hot path: they
        cost more CPU than the HTTP/1.1 exchange's own Python work).

        Args:
            method: e.g. ``b"POST"``.
            url: the server's base URL (scheme, host, port; its path is ignored).
            target: path and query, e.g. ``b"/api/v1/pods?limit=500"``.
            headers: request headers; ``Host`` and ``Content-Length`` are added here.
            content: the body (None: none).

        Returns:
            ``(status, headers, body)``; the body as sent (no Content-Encoding decoding: the
            caller sends no Accept-Encoding).

        Raises:
            httpx.TransportError (subclass named like httpcore's): no usable answer.
            RuntimeError: the pool is closed.
        """
        key = (url.raw_scheme, url.raw_host, url.port)
        all_headers = [(b"Host", url.netloc), *headers]  # netloc: IPv6 bracketed, port if any
        if content is not None:
            all_headers.append((b"Content-Length", b"%d" % len(content)))
        status, resp_headers, body, _ = await self._exchange(key, httpcore.Request(
            method,
            httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=target),
            headers=all_headers,
            content=content if content is not None else b"",
        ))
        return status, resp_headers, body

    async def _exchange(
        self, key: _ORIGIN_KEY, core: httpcore.Request
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes, dict[str, Any]]:
        """Run ``core`` on a pooled connection; the status, headers, whole body, extensions."""
        if self._closed:
            raise RuntimeError("KeepAlivePool is closed")
        conn = await self._checkout(key)
        try:
            resp = await conn.handle_async_request(core)
            try:
                stream = resp.stream
                assert isinstance(stream, AsyncIterable)
                body = b"".join([chunk async for chunk in stream])
            finally:
                await resp.aclose()
        except _CORE_ERRORS as exc:
            await self._close(conn)
            raise _httpx_error(exc) from exc
        except BaseException:
            await self._close(conn)  # cancelled mid-request: its state is unknown
            raise
        if conn.is_available() and not self._closed:
            idle = self._idle.setdefault(key, [])
            idle.append(conn)
            if len(idle) > self._max_idle:
                await self._close(idle.pop(0))
        else:
            await self._close(conn)
        return resp.status, resp.headers, body, dict(resp.extensions)

    async def aclose(self) -> None:
        """Close every idle connection; later requests raise RuntimeError."""
        self._closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                await self._close(conn)
