"""The kube client's connections under httpx: a keep-alive pool for requests, one for watches.

:class:`KeepAlivePool` is an ``httpx.AsyncBaseTransport`` for the client's non-streaming
requests, :class:`StreamingTransport` the one for watches (httpcore's pool, streamed bodies).
Both open their connections on a network backend of ours (:class:`_TrioBackend`), which sends
each request's head and body in one write and frees a closed TLS connection at once. Each
connection of the request pool is an ``httpcore.AsyncHTTPConnection`` (httpcore does the
HTTP/1.1 work, h11 the parsing, trio's SSLStream the TLS). The request pool differs from
httpx's default one, whose bookkeeping walks every connection, several times and with a
readability syscall each, on every request.
"""

from __future__ import annotations

import contextvars
import math
import ssl
from collections.abc import AsyncIterable, Iterable, Mapping
from typing import Any

import httpcore
import httpx
import trio

from ..observability import metrics

__all__ = ["KeepAlivePool", "StreamingTransport", "release_response", "replay_safe"]

_ORIGIN_KEY = tuple[bytes, bytes, int | None]

_FLUSH_AT = 64 * 1024
"""Bytes of request kept back before they go out anyway (a large body is not copied whole)."""


def _httpx_error(exc: httpcore.TimeoutException | httpcore.NetworkError
                 | httpcore.ProtocolError | httpcore.UnsupportedProtocol) -> httpx.TransportError:
    """The httpx exception of the same name (httpx mirrors httpcore's tree)."""
    cls = getattr(httpx, type(exc).__name__, None)
    if not (isinstance(cls, type) and issubclass(cls, httpx.TransportError)):
        cls = httpx.TransportError
    return cls(str(exc))


_RECEIVED: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "bigfleet_kube_received", default=None)
"""Bytes read from the server during the current exchange (httpcore reads in the caller's
task): zero after a failure means no answer byte arrived."""

_REVIEWS = ("/tokenreviews", "/subjectaccessreviews", "/selfsubjectaccessreviews",
            "/localsubjectaccessreviews", "/selfsubjectreviews")


def replay_safe(method: str, path: str, body: Any) -> bool:
    """Whether sending this request twice does no harm: the rule for replaying it on a fresh
    connection when a reused one failed before any answer byte (the server may have read it).

    Reads (GET, HEAD); reviews (a POST that only asks); a create of a fixed name (a second one
    answers 409 AlreadyExists, which the callers take as done; an eviction likewise); a PUT or
    PATCH carrying ``metadata.resourceVersion`` or a JSON-patch ``test`` op (a second one
    answers 409 Conflict); a DELETE with preconditions. Not: a create with ``generateName`` or
    no name, an unguarded update or patch, a body given as raw bytes (not inspected).
    docs/kube-api.md#connections.
    """
    if method in ("GET", "HEAD"):
        return True
    if not isinstance(body, (Mapping, list)):
        return False
    if isinstance(body, list):  # a JSON patch: guarded by a test op
        return method == "PATCH" and any(
            isinstance(op, Mapping) and op.get("op") == "test" for op in body)
    meta = body.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    if method == "POST":
        return path.endswith(_REVIEWS) or (bool(meta.get("name"))
                                           and not meta.get("generateName"))
    if method in ("PUT", "PATCH"):
        return bool(meta.get("resourceVersion"))
    if method == "DELETE":
        return bool(body.get("preconditions"))
    return False


_CORE_ERRORS = (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError,
                httpcore.UnsupportedProtocol)


def _release_tls(stream: trio.SSLStream[Any]) -> None:
    """Break the reference cycle of a closed ``trio.SSLStream`` so it is freed at once.

    An SSLStream keeps its handshake as a callable bound to itself (trio 0.35: ``_handshook``),
    a cycle: a closed stream, with its OpenSSL connection and its two memory BIOs (whose buffers
    keep the largest read ever, up to ~85 KB), waited for the cyclic garbage collector. The
    informers freeze the heap (``gc.freeze()``, docs/kube-api.md#garbage-collector), and a
    stream alive at a freeze was never collected after it closed: the operator grew by every
    connection it ever closed (a pool overflow, a keep-alive expiry, a watch's reconnect).
    Unknown attributes (another trio) are left alone; a test proves the stream is freed.
    """
    vars(stream).pop("_handshook", None)


def release_response(response: httpx.Response) -> None:
    """Let a closed streamed response be freed at once (call it after ``aclose()``).

    httpx's ``AsyncClient.send`` binds the body stream back to its response, a reference cycle
    that holds the connection too (and, over TLS, what :func:`_release_tls` frees). A watch's
    response lives for minutes, so a heap freeze always caught one, and it was never freed
    after (docs/kube-api.md#garbage-collector). The closed body is replaced by an empty one.
    """
    response.stream = httpx.ByteStream(b"")


class _TrioStream(httpcore.AsyncNetworkStream):
    """A Trio stream (TCP, or TLS over TCP) for httpcore that sends a request in one write.

    httpcore's HTTP/1.1 connection writes a request's head, body and end as separate
    ``write`` calls; over TLS each became its own record, its own ``SSLStream.send_all`` and
    its own ``send`` syscall (with a body, 2 of each per request: a third of a request's
    client CPU against kube-apiserver, docs/benchmarks/podcontroller-real.md). Here a ``write``
    is kept until the next ``read`` (the response), ``start_tls`` or ``aclose``, or until
    ``_FLUSH_AT`` bytes wait, and then goes out as one ``send_all``: the same bytes on the wire,
    in one record.

    A failed send is kept quiet and the read that follows reports the broken connection, as
    httpcore does with a write error (a server may answer, e.g. 413, and close before reading
    the whole request). Errors are httpcore's (ReadError, WriteError, the timeouts); a timeout
    argument of None means none (the caller's Trio deadline applies).
    """

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self._out: list[bytes] = []
        self._out_len = 0

    # the timeout parameters are httpcore's interface (seconds, None: none)
    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        if not buffer:
            return
        self._out.append(buffer)
        self._out_len += len(buffer)
        if self._out_len >= _FLUSH_AT:
            await self._send(timeout)

    async def _send(self, seconds: float | None) -> None:
        data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out.clear()
        self._out_len = 0
        try:
            if seconds is None:
                await self._stream.send_all(data)
            else:
                with trio.fail_after(seconds):
                    await self._stream.send_all(data)
        except trio.TooSlowError as exc:
            raise httpcore.WriteTimeout(str(exc)) from exc
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise httpcore.WriteError(str(exc)) from exc

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        if self._out:
            try:
                await self._send(timeout)
            except httpcore.WriteError:
                pass  # the read below reports it, or reads the server's early answer
        try:
            if timeout is None:
                data = bytes(await self._stream.receive_some(max_bytes))
            else:
                with trio.fail_after(timeout):
                    data = bytes(await self._stream.receive_some(max_bytes))
        except trio.TooSlowError as exc:
            raise httpcore.ReadTimeout(str(exc)) from exc
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise httpcore.ReadError(str(exc)) from exc
        received = _RECEIVED.get()
        if received is not None:
            received[0] += len(data)
        return data

    async def aclose(self) -> None:
        self._out.clear()  # a request cut short: its unsent rest is dropped with the connection
        self._out_len = 0
        try:
            await self._stream.aclose()
        finally:
            if isinstance(self._stream, trio.SSLStream):
                _release_tls(self._stream)

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> httpcore.AsyncNetworkStream:
        if self._out:
            await self._send(timeout)
        tls = trio.SSLStream(self._stream, ssl_context, server_hostname=server_hostname,
                             https_compatible=True)
        try:
            with trio.fail_after(math.inf if timeout is None else timeout):
                await tls.do_handshake()
        except BaseException as exc:
            await trio.aclose_forcefully(self._stream)
            _release_tls(tls)
            if isinstance(exc, trio.TooSlowError):
                raise httpcore.ConnectTimeout(str(exc)) from exc
            if isinstance(exc, trio.BrokenResourceError):
                raise httpcore.ConnectError(str(exc)) from exc
            raise
        return _TrioStream(tls)

    def get_extra_info(self, info: str) -> Any:
        stream = self._stream
        if info == "ssl_object":
            return stream._ssl_object if isinstance(stream, trio.SSLStream) else None
        while isinstance(stream, trio.SSLStream):
            stream = stream.transport_stream
        if not isinstance(stream, trio.SocketStream):
            return None
        if info == "socket":
            return stream.socket
        if info == "client_addr":
            return stream.socket.getsockname()
        if info == "server_addr":
            return stream.socket.getpeername()
        if info == "is_readable":
            return stream.socket.is_readable()
        return None


class _TrioBackend(httpcore.AsyncNetworkBackend):
    """httpcore's Trio network backend with :class:`_TrioStream` streams; counts the
    connections it opens for ``pool`` (``requests`` or ``watches``)."""

    def __init__(self, pool: str) -> None:
        self._opened = metrics.KUBE_CONNECTIONS_OPENED.labels(pool=pool)

    async def connect_tcp(
        self, host: str, port: int, timeout: float | None = None,  # noqa: ASYNC109
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            with trio.fail_after(math.inf if timeout is None else timeout):
                stream = await trio.open_tcp_stream(host, port, local_address=local_address)
        except trio.TooSlowError as exc:
            raise httpcore.ConnectTimeout(str(exc)) from exc
        except (trio.BrokenResourceError, OSError) as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        for option in socket_options or ():
            stream.setsockopt(*option)
        self._opened.inc()
        return _TrioStream(stream)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None,  # noqa: ASYNC109
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.UnsupportedProtocol("unix sockets are not used by the kube client")

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


class KeepAlivePool(httpx.AsyncBaseTransport):
    """HTTP/1.1 keep-alive pool: take the most recently used idle connection or open one.

    A request checks out one connection (LIFO, so the warmest; a connection the server closed
    or whose keep-alive expired is dropped on the way), runs on it, reads the whole body, and
    puts the connection back when it can be reused. Every ``sweep_interval`` seconds a check-in
    also closes the dead idle connections anywhere in the stack, so one the server dropped
    under a live one does not linger. At most ``max_connections`` requests run at once (so at
    most that many connections are open; more wait their turn) and at most ``max_idle`` are
    kept idle. A replay-safe request (:func:`replay_safe`) that fails on a reused connection
    before any answer byte arrived is sent once more on a fresh connection: the server closed
    the idle connection as the request went out (docs/kube-api.md#connections).

    Responses come back with their body read into memory (``await response.aread()`` decodes
    it; a watch's endless body needs httpx's default transport). httpcore errors are raised as
    the httpx errors of the same name.

    Args:
        ssl_context: for https origins (None: httpcore's default context).
        server_hostname: the TLS name the server's certificate is checked against (and sent as
            SNI) instead of the URL's host (a kubeconfig's ``tls-server-name``).
        max_idle: idle connections kept per origin.
        max_connections: requests (so connections) at once, over all origins.
        keepalive_expiry: seconds an idle connection is reused for (None: no limit).
        sweep_interval: seconds between sweeps of the idle connections (Trio time).
    """

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        max_idle: int = 32,
        max_connections: int = 256,
        keepalive_expiry: float | None = 60.0,
        sweep_interval: float = 5.0,
    ) -> None:
        self._ssl_context = ssl_context
        self._extensions = {"sni_hostname": server_hostname} if server_hostname else {}
        self._max_idle = max_idle
        self._slots = trio.CapacityLimiter(max_connections)
        self._keepalive_expiry = keepalive_expiry
        self._sweep_interval = sweep_interval
        self._next_sweep = -math.inf
        self._idle: dict[_ORIGIN_KEY, list[httpcore.AsyncHTTPConnection]] = {}
        self._origins: dict[_ORIGIN_KEY, httpcore.Origin] = {}
        self._closed = False
        self._backend = _TrioBackend("requests")
        self.opened = 0
        """Connections opened so far (for tests and benchmarks)."""

    async def _checkout(self, key: _ORIGIN_KEY) -> httpcore.AsyncHTTPConnection | None:
        """The warmest live idle connection for ``key``, or None (dead ones closed)."""
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.is_available() and not conn.has_expired():
                return conn
            await self._close(conn)
        return None

    def _open(self, key: _ORIGIN_KEY) -> httpcore.AsyncHTTPConnection:
        origin = self._origins.get(key)
        if origin is None:
            origin = self._origins[key] = httpcore.Origin(key[0], key[1], key[2] or (
                443 if key[0] == b"https" else 80))
        self.opened += 1
        return httpcore.AsyncHTTPConnection(
            origin, ssl_context=self._ssl_context, keepalive_expiry=self._keepalive_expiry,
            http1=True, http2=False, network_backend=self._backend,
        )

    async def _checkin(self, key: _ORIGIN_KEY, conn: httpcore.AsyncHTTPConnection) -> None:
        if not conn.is_available() or self._closed:
            await self._close(conn)
            return
        idle = self._idle.setdefault(key, [])
        idle.append(conn)
        if len(idle) > self._max_idle:
            await self._close(idle.pop(0))
        now = trio.current_time()
        if now >= self._next_sweep:
            self._next_sweep = now + self._sweep_interval
            await self._sweep()

    async def _sweep(self) -> None:
        """Close every idle connection that has expired or that the server closed (one
        readability check each: hence only every ``sweep_interval``)."""
        for key, idle in list(self._idle.items()):
            dead = [c for c in idle if not c.is_available() or c.has_expired()]
            if dead:
                self._idle[key] = [c for c in idle if c not in dead]
                for conn in dead:
                    await self._close(conn)

    async def _close(self, conn: httpcore.AsyncHTTPConnection) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            try:
                await conn.aclose()
            except _CORE_ERRORS:
                pass

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` on a pooled connection; the response body is read in full.
        Replayed on a stale connection only when a GET or HEAD.

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
                extensions={**self._extensions, **request.extensions},
            ), replayable=request.method in ("GET", "HEAD"))
        # a stream, not content=: aread() then applies any Content-Encoding
        return httpx.Response(status, headers=headers, stream=httpx.ByteStream(body),
                              extensions=extensions, request=request)

    async def round_trip(
        self, method: bytes, url: httpx.URL, target: bytes,
        headers: list[tuple[bytes, bytes]], content: bytes | None, *, replayable: bool = False,
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """One request without httpx's Request/Response objects (the client's hot path: they
        cost more CPU than the HTTP/1.1 exchange's own Python work).

        Args:
            method: e.g. ``b"POST"``.
            url: the server's base URL (scheme, host, port; its path is ignored).
            target: path and query, e.g. ``b"/api/v1/pods?limit=500"``.
            headers: request headers; ``Host`` and ``Content-Length`` are added here.
            content: the body (None: none).
            replayable: :func:`replay_safe` said yes: a failure on a reused connection before
                any answer byte is sent once more on a fresh one.

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
            extensions=self._extensions,
        ), replayable=replayable)
        return status, resp_headers, body

    async def _exchange(
        self, key: _ORIGIN_KEY, core: httpcore.Request, *, replayable: bool
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes, dict[str, Any]]:
        """Run ``core`` on a pooled connection (once more on a fresh one when a reused one
        failed before any answer byte and ``replayable``); status, headers, whole body,
        extensions."""
        if self._closed:
            raise RuntimeError("KeepAlivePool is closed")
        async with self._slots:
            conn = await self._checkout(key)
            if conn is not None:
                received = [0]
                token = _RECEIVED.set(received)
                try:
                    return await self._run(key, conn, core)
                except httpx.TransportError:
                    if not (replayable and received[0] == 0 and not self._closed):
                        raise
                finally:
                    _RECEIVED.reset(token)
                metrics.KUBE_STALE_REPLAYS.inc()
            return await self._run(key, self._open(key), core)

    async def _run(
        self, key: _ORIGIN_KEY, conn: httpcore.AsyncHTTPConnection, core: httpcore.Request
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes, dict[str, Any]]:
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
        await self._checkin(key, conn)
        return resp.status, resp.headers, body, dict(resp.extensions)

    async def aclose(self) -> None:
        """Close every idle connection; later requests raise RuntimeError."""
        self._closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                await self._close(conn)


class StreamingTransport(httpx.AsyncBaseTransport):
    """The watches' transport: httpcore's connection pool, on :class:`_TrioBackend`
    connections, with the response body streamed.

    httpx's default transport is the same pool on httpcore's own Trio backend; ours closes a
    TLS connection so that it is freed at once (:func:`_release_tls`): a watch reconnects every
    5 to 10 minutes, and on the default backend each closed connection waited for the garbage
    collector. httpcore errors are raised as the httpx errors of the same name, while the
    request is sent and while its body is read.

    Args:
        ssl_context: for https origins (None: httpcore's default context).
        max_idle: idle connections kept.
    """

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None, max_idle: int = 4) -> None:
        # no bound on connections: each open watch holds one for its life
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context, max_connections=None, max_keepalive_connections=max_idle,
            http1=True, http2=False, network_backend=_TrioBackend("watches"))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``; the response's body streams from the connection.

        Raises:
            httpx.TransportError (subclass named like httpcore's): no answer.
        """
        url = request.url
        assert isinstance(request.stream, httpx.AsyncByteStream)
        core = httpcore.Request(
            request.method,
            httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                         target=url.raw_path),
            headers=request.headers.raw, content=request.stream,
            extensions=request.extensions)
        try:
            resp = await self._pool.handle_async_request(core)
        except _CORE_ERRORS as exc:
            raise _httpx_error(exc) from exc
        stream = resp.stream
        assert isinstance(stream, AsyncIterable)
        return httpx.Response(resp.status, headers=resp.headers,
                              stream=_MappedBody(stream), extensions=resp.extensions)

    async def aclose(self) -> None:
        """Close the pool's connections."""
        await self._pool.aclose()


class _MappedBody(httpx.AsyncByteStream):
    """An httpcore response body whose errors come out as httpx's."""

    def __init__(self, stream: AsyncIterable[bytes]) -> None:
        self._stream = stream

    async def __aiter__(self) -> Any:
        try:
            async for part in self._stream:
                yield part
        except _CORE_ERRORS as exc:
            raise _httpx_error(exc) from exc

    async def aclose(self) -> None:
        close = getattr(self._stream, "aclose", None)
        if close is not None:
            await close()
