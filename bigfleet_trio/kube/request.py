"""The request core of :class:`~bigfleet_trio.kube.client.KubeClient`: one HTTP exchange, safely.

Every request waits on the client-side token bucket (:mod:`.ratelimit`), carries the current
credentials, runs under a Trio deadline (``request_timeout``) and maps error answers to
:mod:`.errors`. Transient failures are repeated here and only here (:class:`.retry.RetryPolicy`,
for the retry classes the caller names; docs/kube-api.md#retries). The typed verbs are in
:mod:`.client`, the watch stream in :mod:`.watchstream`.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import time
from collections.abc import Mapping
from typing import Any, Self
from urllib.parse import quote, urlencode

import httpx
import orjson
import trio

from ..observability import metrics, stdmetrics
from . import protowire, reqtrace
from .config import KubeConfig
from .errors import (
    ApiError,
    KubeTransportError,
    TooManyRequests,
    Unauthorized,
    error_from_status,
)
from .ratelimit import AsyncRateLimiter
from .retry import RetryPolicy
from .transport import KeepAlivePool, StreamingTransport, release_response, replay_safe

__all__ = ["ProtobufBody", "RequestCore", "authorization", "clean_params", "describe_cause"]

log = logging.getLogger(__name__)


def authorization(config: KubeConfig) -> str | None:
    """The ``Authorization`` header for ``config``'s credentials, or None without any.

    Read at every request: a bearer token file is re-read when it changes (rotated tokens).
    """
    token = config.bearer_token()
    if token:
        return f"Bearer {token}"
    if config.username is not None:
        raw = f"{config.username}:{config.password or ''}".encode()
        return "Basic " + base64.b64encode(raw).decode()
    return None


class _Auth(httpx.Auth):
    """:func:`authorization` for requests sent through an ``httpx.AsyncClient`` (watches)."""

    def __init__(self, config: KubeConfig):
        self._config = config

    def auth_flow(self, request: httpx.Request):  # type: ignore[no-untyped-def]
        header = authorization(self._config)
        if header:
            request.headers["Authorization"] = header
        yield request


def describe_cause(exc: BaseException) -> str:
    """``repr`` of a transport error plus its root cause.

    httpx over Trio wraps the real reason in layers (``ConnectError('')`` <- ``ConnectError(
    BrokenResourceError())`` <- ``BrokenResourceError()`` <- ``SSLCertVerificationError(...
    CERTIFICATE_VERIFY_FAILED ...)``), so the log line names the innermost exception too, e.g.
    ``ConnectError('') (root cause: SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED]
    ...'))``. Follows ``__cause__``/``__context__`` for at most 16 links.
    """
    root, seen = exc, {id(exc)}
    for _ in range(16):
        nxt = root.__cause__ or root.__context__
        if nxt is None or id(nxt) in seen:
            break
        seen.add(id(nxt))
        root = nxt
    if root is exc:
        return repr(exc)
    return f"{exc!r} (root cause: {root!r})"


def encode_json(body: Any) -> bytes:
    """A request body as compact JSON (orjson, ~10x the stdlib's speed; dict keys that are not
    strings become strings as with :func:`json.dumps`; integers beyond 64 bits, which orjson
    refuses, go through the stdlib).

    Raises:
        TypeError: ``body`` holds something JSON cannot carry.
    """
    try:
        return orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:
        return json.dumps(body, separators=(",", ":")).encode()


def _target(base_path: bytes, path: str, query: str) -> bytes:
    """The request target: the server URL's own path, then ``path`` (percent-encoded where it
    is not plain ASCII, as httpx would), then ``query`` (encoded already)."""
    if not path.isascii() or " " in path:
        path = quote(path, safe="/%:@!$&'()*+,;=~")
    return base_path + (path + query).encode("ascii")


class ProtobufBody(bytes):
    """A 2xx answer in Kubernetes protobuf (:mod:`.protowire` decodes it), returned as is by
    :meth:`RequestCore.request` when the call accepted protobuf and the server chose it."""


_JSON = "application/json"


def _content_type(headers: Mapping[str, str] | list[tuple[bytes, bytes]]) -> str:
    """The Content-Type of an answer's headers ("" without one)."""
    if isinstance(headers, Mapping):
        return headers.get("content-type", "")
    for name, value in headers:
        if name.lower() == b"content-type":
            return value.decode("latin-1")
    return ""


class RequestCore:
    """Connection pools, credentials, rate limit, deadline, error mapping and retries.

    :class:`~bigfleet_trio.kube.client.KubeClient` is this plus the typed verbs; its docstring
    lists the constructor's arguments.
    """

    def __init__(
        self,
        config: KubeConfig,
        *,
        qps: float = 50,
        burst: int = 100,
        transport: httpx.AsyncBaseTransport | None = None,
        request_timeout: float = 30.0,
        max_attempts: int = 5,
        max_retry_after: float = 60.0,
        user_agent: str = "bigfleet-trio",
        protobuf: bool = True,
    ):
        self.config = config
        self.protobuf = protobuf
        """Reads that accept it ask for Kubernetes protobuf (Pods, Nodes;
        docs/kube-api.md#protobuf): the binaries' ``--kube-api-content-type``."""
        self.request_timeout = request_timeout
        self.max_attempts = max(1, max_attempts)
        self.max_retry_after = max_retry_after
        self.retry = RetryPolicy(self.max_attempts, max_retry_after)
        self.unauthorized: Unauthorized | None = None
        """The first 401 answer this client got (None: never), see :meth:`wait_unauthorized`."""
        self.last_transport_error: KubeTransportError | None = None
        """The last request that got no answer (connection refused, TLS, timeout), for
        start-up messages: a sync that times out names it (docs/kube-api.md#retries)."""
        self._unauthorized_seen = trio.Event()
        self._limiter = AsyncRateLimiter(qps, burst)
        verify: Any = True
        if transport is None and config.is_https:
            verify = config.ssl_context()
        headers = {"User-Agent": user_agent, "Accept": _JSON}
        # tls-server-name: the name the certificate is checked against and sent as SNI
        # (httpcore's sni_hostname request extension, on both transports)
        self._extensions = ({"sni_hostname": config.tls_server_name}
                            if config.tls_server_name else {})
        def http_client(
            keepalive: int, transport: httpx.AsyncBaseTransport | None
        ) -> httpx.AsyncClient:
            return httpx.AsyncClient(
                base_url=config.server,
                transport=transport,
                verify=verify,
                http1=True,
                http2=False,
                auth=_Auth(config),
                headers=headers,
                timeout=httpx.Timeout(None),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=keepalive),
                trust_env=False,
            )

        # Requests run on our keep-alive pool (kube.transport): httpx's default pool walks every
        # connection, with a syscall each, on every request. Watches hold a connection for
        # minutes and stream, so they have httpcore's pool in a client of their own (on our
        # network backend: kube.transport.StreamingTransport).
        # An injected transport (tests) serves both.
        tls = verify if isinstance(verify, ssl.SSLContext) else None
        request_transport = transport or KeepAlivePool(
            ssl_context=tls, server_hostname=config.tls_server_name)
        self._http = http_client(20, request_transport)
        self._transport: httpx.AsyncBaseTransport = request_transport
        self._pool = request_transport if isinstance(request_transport, KeepAlivePool) else None
        self._base_url = httpx.URL(config.server)
        self._base_path = self._base_url.raw_path.rstrip(b"/")
        self._raw_headers = [(b"User-Agent", user_agent.encode())]
        self._watch_http = self._http if transport is not None else http_client(
            4, StreamingTransport(ssl_context=tls))
        self._base = config.server.rstrip("/")
        self._host = httpx.URL(config.server).netloc.decode()
        self._headers = {"User-Agent": user_agent}
        self._user_agent = user_agent

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close pooled connections."""
        with trio.CancelScope(shield=True):
            await self._http.aclose()
            if self._watch_http is not self._http:
                await self._watch_http.aclose()

    # -- low level ---------------------------------------------------------------------------

    def _error(self, status: int, body: bytes, headers: Mapping[str, str]) -> ApiError:
        decoded: bytes | dict[str, Any] = body
        if protowire.is_protobuf(headers.get("content-type")):
            # an error answer to a read that accepted protobuf is a protobuf Status
            try:
                decoded = protowire.decode_status(body)
            except protowire.ProtobufDecodeError:
                decoded = b""
        err = error_from_status(status, decoded, headers)
        if isinstance(err, Unauthorized) and self.unauthorized is None:
            self.unauthorized = err
            self._unauthorized_seen.set()
        return err

    async def wait_unauthorized(self) -> Unauthorized:
        """Block until the apiserver answers any request of this client with 401 Unauthorized.

        A 401 does not heal by waiting (the token or certificate is wrong), so start-up code
        races this against its cache sync and fails at once with "401 Unauthorized" instead of
        retrying until its sync deadline.

        Returns:
            The first :class:`~.errors.Unauthorized` error seen.
        """
        await self._unauthorized_seen.wait()
        assert self.unauthorized is not None
        return self.unauthorized

    async def _request_once(
        self, method: str, path: str, params: Mapping[str, Any] | None, body: Any, ctype: str,
        accept: str = _JSON,
    ) -> Any:
        metrics.KUBE_LIMITER_WAIT.observe(await self._limiter.acquire())
        content: bytes | None = None
        if body is not None:
            content = body if isinstance(body, bytes) else encode_json(body)
        cleaned = clean_params(params)
        query = f"?{urlencode(cleaned, quote_via=quote)}" if cleaned else ""
        auth = authorization(self.config)
        status = 0
        data = b""
        headers: Mapping[str, str] | list[tuple[bytes, bytes]] = []
        started = time.time()
        try:
            with trio.move_on_after(self.request_timeout):
                status, headers, data = await self._exchange(
                    method, path, query, auth, content, ctype,
                    replayable=replay_safe(method, path, body), accept=accept)
        finally:
            # client-go's rest_client_request_duration_seconds, by verb and status class
            elapsed = time.time() - started
            metrics.KUBE_REQUEST_DURATION.labels(method, _status_class(status)).observe(elapsed)
            stdmetrics.observe_request(method, status, self._host, elapsed)
            if reqtrace.trace is not None:
                reqtrace.trace.record(started, method, path,
                                      reqtrace.object_name(method, path, body), status)
        if not status:
            self.last_transport_error = KubeTransportError(
                f"{method} {path}: no answer within {self.request_timeout:g}s")
            raise self.last_transport_error
        if status >= 400:
            # raised as returned, never from a local of this frame: the exception's traceback
            # holds this frame, so a local naming it would make a reference cycle (freed only by
            # the cycle collector, or never once frozen: docs/kube-api.md#garbage-collector)
            raise self._refusal(status, data, headers, path)
        if not data:
            return None
        if accept != _JSON and protowire.is_protobuf(_content_type(headers)):
            return ProtobufBody(data)
        try:
            return orjson.loads(data)
        except ValueError as exc:
            raise KubeTransportError(
                f"{method} {path}: invalid JSON in {status} answer"
            ) from exc

    def _refusal(self, status: int, data: bytes,
                 headers: Mapping[str, str] | list[tuple[bytes, bytes]], path: str) -> ApiError:
        """The exception for error answer ``status`` (:meth:`_error`); a 429 with Retry-After
        also holds the client's rate limiter."""
        err = self._error(status, data, headers if isinstance(headers, Mapping)
                          else httpx.Headers(headers))
        if (isinstance(err, TooManyRequests) and err.retry_after
                and not path.endswith("/eviction")):
            # API Priority and Fairness refused this client's flow, not just this request:
            # every request of the client waits out the Retry-After (the retry of this one
            # too), instead of each being refused in turn. An eviction's 429 is a
            # PodDisruptionBudget speaking about one Pod. docs/kube-api.md#retries
            self._limiter.hold_until(
                trio.current_time() + min(err.retry_after, self.max_retry_after))
            metrics.KUBE_THROTTLED.inc()
        return err

    async def _exchange(
        self, method: str, path: str, query: str, auth: str | None, content: bytes | None,
        ctype: str, *, replayable: bool = False, accept: str = _JSON,
    ) -> tuple[int, Mapping[str, str] | list[tuple[bytes, bytes]], bytes]:
        """One HTTP exchange on the pool (or an injected transport): status, headers, body.

        Raises:
            KubeTransportError: the connection failed (also kept as ``last_transport_error``).
        """
        try:
            if self._pool is not None:
                # our pool, no httpx objects: building an httpx Request and Response (URL
                # parsing, header models) cost more CPU than the HTTP/1.1 exchange itself
                raw = list(self._raw_headers)
                raw.append((b"Accept", accept.encode()))
                if auth:
                    raw.append((b"Authorization", auth.encode()))
                if content is not None:
                    raw.append((b"Content-Type", ctype.encode()))
                return await self._pool.round_trip(
                    method.encode(), self._base_url, _target(self._base_path, path, query),
                    raw, content, replayable=replayable)
            return await self._via_transport(method, path + query, auth, content, ctype, accept)
        except httpx.TransportError as exc:
            self.last_transport_error = KubeTransportError(
                f"{method} {path}: {describe_cause(exc)}")
            raise self.last_transport_error from exc

    async def _via_transport(
        self, method: str, path: str, auth: str | None, content: bytes | None, ctype: str,
        accept: str = _JSON,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One request through an injected httpx transport (tests): status, headers, body."""
        headers = dict(self._headers)
        headers["Accept"] = accept
        if auth:
            headers["Authorization"] = auth
        if content is not None:
            headers["Content-Type"] = ctype
        # straight to the transport: AsyncClient.send's layers (auth flow, redirects, cookies,
        # URL merging) cost more than the request itself and none applies to the apiserver
        request = httpx.Request(method, self._base + path, headers=headers, content=content)
        response = await self._transport.handle_async_request(request)
        try:
            data = await response.aread()
        finally:
            await response.aclose()
        return response.status_code, response.headers, data

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        retry_on: tuple[type[BaseException], ...] = (),
        accept: str = _JSON,
    ) -> Any:
        """Send one request (rate-limited, mapped errors, optional retries).

        Args:
            method: HTTP method.
            path: absolute URL path, e.g. "/api/v1/pods".
            params: query parameters (None values dropped; bools as "true"/"false").
            body: JSON-serialisable body or raw bytes.
            content_type: body media type.
            retry_on: exception classes (ours) that trigger a retry; empty = no retry.
            accept: the Accept header; with protobuf in it (:data:`.protowire.ACCEPT`) a
                protobuf answer comes back undecoded, as :class:`ProtobufBody`.

        Returns:
            Decoded JSON body, a :class:`ProtobufBody`, or None for an empty body.

        Raises:
            ApiError subclasses, KubeTransportError.
        """
        if not retry_on or self.max_attempts == 1:
            return await self._request_once(method, path, params, body, content_type, accept)
        return await self.retry.call(
            lambda: self._request_once(method, path, params, body, content_type, accept),
            retry_on,
            f"{method} {path}",
        )

    async def _request_obj(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        """:meth:`request` for calls whose answer must be a JSON object."""
        out = await self.request(method, path, **kw)
        if not isinstance(out, dict):
            raise KubeTransportError(f"{method} {path}: expected a JSON object in the answer")
        return out

    async def _open_stream(self, path: str, params: dict[str, Any],
                           accept: str = _JSON) -> httpx.Response:
        await self._limiter.acquire()
        # Uncompressed: kube-apiserver gzips a streaming list one gzip member per flush, and
        # httpx decodes only the first member (docs/kube-api.md#streaming-lists).
        request = self._watch_http.build_request(
            "GET", path, params=params, headers={"Accept-Encoding": "identity", "Accept": accept},
            extensions=self._extensions,
        )
        response: httpx.Response | None = None
        with trio.move_on_after(self.request_timeout):
            try:
                response = await self._watch_http.send(request, stream=True)
            except httpx.TransportError as exc:
                raise KubeTransportError(f"WATCH {path}: {describe_cause(exc)}") from exc
        if response is None:
            raise KubeTransportError(f"WATCH {path}: no answer within {self.request_timeout:g}s")
        if response.status_code >= 400:
            body = b""
            try:
                with trio.move_on_after(self.request_timeout):
                    body = await response.aread()
            except httpx.HTTPError:
                pass
            finally:
                await response.aclose()
                release_response(response)
            raise self._error(response.status_code, body, response.headers)
        return response


def _status_class(status: int) -> str:
    """``2xx``..``5xx``, or ``error`` for no answer (a transport failure or the deadline)."""
    return f"{status // 100}xx" if status else "error"


def clean_params(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not params:
        return None
    out: dict[str, Any] = {}
    for k, v in params.items():
        if v is None:
            continue
        out[k] = ("true" if v else "false") if isinstance(v, bool) else v
    return out or None
