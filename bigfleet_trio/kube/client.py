"""Typed-enough Kubernetes REST client on ``httpx.AsyncClient`` under Trio.

Objects are plain ``dict``\\ s exactly as the apiserver returns them. Every request waits on the
client-side token bucket (:mod:`.ratelimit`), runs under a Trio deadline (``request_timeout``)
and maps error answers to :mod:`.errors`. Transient failures are repeated here and only here
(:class:`.retry.RetryPolicy`; which writes may be repeated: :func:`.retry.write_retry_on`).
Contract: docs/kube-api.md.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import math
import random
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote, urlencode

import httpx
import orjson
import trio

from .config import KubeConfig
from .errors import (
    ApiError,
    Expired,
    KubeTransportError,
    Unauthorized,
    WatchInactivityTimeout,
    error_from_status,
)
from .ratelimit import AsyncRateLimiter
from .resources import EVENTS, Resource
from .retry import TRANSIENT, RetryPolicy, write_retry_on
from .transport import KeepAlivePool
from .watch import WatchDecodeError, WatchEvent, decode_watch_line

__all__ = ["KubeClient", "ObjectList", "WatchStream", "PatchType"]

log = logging.getLogger(__name__)

PatchType = Literal["merge", "json", "strategic", "apply"]
_PATCH_CONTENT_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}

_READ_RETRY = TRANSIENT
_SAFE_WRITE_RETRY = write_retry_on(idempotent=True)
_WRITE_RETRY = write_retry_on(idempotent=False)
_IDEMPOTENT_PATCHES = frozenset(("merge", "apply"))


@dataclass
class ObjectList:
    """Result of :meth:`KubeClient.list`.

    Attributes:
        items: all objects across pages (``kind``/``apiVersion`` filled in from the resource).
        resource_version: collection resourceVersion of the (first page of the) list, the
            point a subsequent watch resumes from.
    """

    items: list[dict[str, Any]] = field(default_factory=list)
    resource_version: str = ""


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
                    raise KubeTransportError(f"watch stream broke: {_describe(exc)}") from exc
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


def rfc3339_micro(when: dt.datetime | None = None) -> str:
    """``2026-11-21T13:03:09.123456Z`` (Kubernetes MicroTime) for ``when`` (default: now, UTC)."""
    when = when or dt.datetime.now(dt.UTC)
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339(when: dt.datetime | None = None) -> str:
    """``2026-11-21T13:03:09Z`` (Kubernetes Time) for ``when`` (default: now, UTC)."""
    when = when or dt.datetime.now(dt.UTC)
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Auth(httpx.Auth):
    def __init__(self, config: KubeConfig):
        self._config = config

    def auth_flow(self, request: httpx.Request):  # type: ignore[no-untyped-def]
        token = self._config.bearer_token()
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        elif self._config.username is not None:
            request.headers["Authorization"] = httpx.BasicAuth(
                self._config.username, self._config.password or ""
            )._auth_header
        yield request



def _describe(exc: BaseException) -> str:
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


class KubeClient:
    """Async Kubernetes client (see docs/kube-api.md for the contract).

    Args:
        config: cluster settings from :func:`load_kubeconfig`.
        qps, burst: client-side token bucket (``qps <= 0`` disables it).
        transport: injected httpx transport (``httpx.MockTransport`` in tests).
        request_timeout: deadline in seconds for one non-watch request (Trio clock).
        max_attempts: attempts per retryable call (1 = no retries).
        max_retry_after: cap on a server-requested Retry-After wait (seconds).
        user_agent: User-Agent header.

    Use as ``async with KubeClient(cfg) as client:`` or call :meth:`aclose`.
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
    ):
        self.config = config
        self.request_timeout = request_timeout
        self.max_attempts = max(1, max_attempts)
        self.max_retry_after = max_retry_after
        self.retry = RetryPolicy(self.max_attempts, max_retry_after)
        self.unauthorized: Unauthorized | None = None
        """The first 401 answer this client got (None: never), see :meth:`wait_unauthorized`."""
        self._unauthorized_seen = trio.Event()
        self._limiter = AsyncRateLimiter(qps, burst)
        verify: Any = True
        if transport is None and config.is_https:
            verify = config.ssl_context()
        headers = {"User-Agent": user_agent, "Accept": "application/json"}
        if config.tls_server_name and transport is None:
            # httpx has no SNI override; the Host header is what certificate checks use.
            log.warning(
                "tls-server-name %s ignored (not supported by httpx)", config.tls_server_name
            )
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
        # minutes and stream, so they keep httpx's default transport in a client of their own.
        # An injected transport (tests) serves both.
        request_transport = transport or KeepAlivePool(
            ssl_context=verify if isinstance(verify, ssl.SSLContext) else None)
        self._http = http_client(20, request_transport)
        self._transport: httpx.AsyncBaseTransport = request_transport
        self._watch_http = self._http if transport is not None else http_client(4, None)
        self._base = config.server.rstrip("/")
        self._headers = {"User-Agent": user_agent, "Accept": "application/json"}
        self._user_agent = user_agent

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> KubeClient:
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

    def _auth_header(self) -> str | None:
        token = self.config.bearer_token()
        if token:
            return f"Bearer {token}"
        if self.config.username is not None:
            raw = f"{self.config.username}:{self.config.password or ''}".encode()
            return "Basic " + base64.b64encode(raw).decode()
        return None

    def _error(self, status: int, body: bytes, headers: Mapping[str, str]) -> ApiError:
        err = error_from_status(status, body, headers)
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
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        await self._limiter.acquire()
        headers = dict(self._headers)
        auth = self._auth_header()
        if auth:
            headers["Authorization"] = auth
        content: bytes | None = None
        if body is not None:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = content_type
        url = self._base + path
        cleaned = _clean(params)
        if cleaned:
            url = f"{url}?{urlencode(cleaned, quote_via=quote)}"
        # straight to the transport: AsyncClient.send's layers (auth flow, redirects, cookies,
        # URL merging) cost more than the request itself and none applies to the apiserver
        request = httpx.Request(method, url, headers=headers, content=content)
        response: httpx.Response | None = None
        data = b""
        with trio.move_on_after(self.request_timeout):
            try:
                response = await self._transport.handle_async_request(request)
                data = await response.aread()
            except httpx.TransportError as exc:
                raise KubeTransportError(f"{method} {path}: {_describe(exc)}") from exc
            finally:
                if response is not None:
                    await response.aclose()
        if response is None:
            raise KubeTransportError(f"{method} {path}: no answer within {self.request_timeout:g}s")
        if response.status_code >= 400:
            raise self._error(response.status_code, data, response.headers)
        if not data:
            return None
        try:
            return orjson.loads(data)
        except ValueError as exc:
            raise KubeTransportError(
                f"{method} {path}: invalid JSON in {response.status_code} answer"
            ) from exc

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        retry_on: tuple[type[BaseException], ...] = (),
    ) -> Any:
        """Send one request (rate-limited, mapped errors, optional retries).

        Args:
            method: HTTP method.
            path: absolute URL path, e.g. "/api/v1/pods".
            params: query parameters (None values dropped; bools as "true"/"false").
            body: JSON-serialisable body or raw bytes.
            content_type: body media type.
            retry_on: exception classes (ours) that trigger a retry; empty = no retry.

        Returns:
            Decoded JSON body, or None for an empty body.

        Raises:
            ApiError subclasses, KubeTransportError.
        """
        if not retry_on or self.max_attempts == 1:
            return await self._request_once(
                method, path, params=params, body=body, content_type=content_type
            )
        return await self.retry.call(
            lambda: self._request_once(
                method, path, params=params, body=body, content_type=content_type
            ),
            retry_on,
            f"{method} {path}",
        )

    async def _request_obj(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        """:meth:`request` for calls whose answer must be a JSON object."""
        out = await self.request(method, path, **kw)
        if not isinstance(out, dict):
            raise KubeTransportError(f"{method} {path}: expected a JSON object in the answer")
        return out

    # -- reads -------------------------------------------------------------------------------

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        """GET one object. Raises NotFound if absent."""
        path = res.object_path(name, namespace)
        return await self._request_obj("GET", path, retry_on=_READ_RETRY)

    async def list_paged(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        on_items: Callable[[list[dict[str, Any]]], None],
        on_restart: Callable[[], None] | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
        resource_version: str | None = None,
    ) -> str:
        """LIST following ``continue`` tokens, handing each page to ``on_items`` as it arrives.

        If a continue token has expired (410) the list restarts from the first page after
        calling ``on_restart`` (the consumer must drop what it collected), like client-go's pager
        with FullListIfExpired.

        Returns:
            The collection resourceVersion of the first page of the (last) complete pass.

        Raises:
            ApiError subclasses / KubeTransportError after retries are exhausted.
        """
        path = res.collection_path(namespace if res.namespaced else None)
        base = {
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
            "limit": limit if limit and limit > 0 else None,
            "resourceVersion": resource_version,
        }
        restarts = 0
        while True:
            token: str | None = None
            list_rv = ""
            first = True
            try:
                while True:
                    params = dict(base)
                    if token:
                        params["continue"] = token
                        params["resourceVersion"] = None
                    page = await self.request("GET", path, params=params, retry_on=_READ_RETRY)
                    if not isinstance(page, dict):
                        raise KubeTransportError(f"LIST {path}: answer is not an object")
                    meta = page.get("metadata") or {}
                    if first:
                        list_rv = str(meta.get("resourceVersion") or "")
                        first = False
                    items = page.get("items") or []
                    for item in items:
                        item.setdefault("kind", res.kind)
                        item.setdefault("apiVersion", res.api_version)
                    on_items(items)
                    token = meta.get("continue") or None
                    if not token:
                        return list_rv
            except Expired:
                if token is None or restarts >= 3:
                    raise
                restarts += 1
                log.info("kube list continue token expired, restarting full list path=%s", path)
                if on_restart is not None:
                    on_restart()

    async def list(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
        resource_version: str | None = None,
    ) -> ObjectList:
        """LIST all objects (all pages). See :meth:`list_paged` for semantics."""
        out = ObjectList()
        out.resource_version = await self.list_paged(
            res,
            namespace,
            on_items=out.items.extend,
            on_restart=out.items.clear,
            label_selector=label_selector,
            field_selector=field_selector,
            limit=limit,
            resource_version=resource_version,
        )
        return out

    @asynccontextmanager
    async def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        resource_version: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int | None = None,
        allow_bookmarks: bool = True,
        inactivity_timeout: float | None = None,
        retry: bool = True,
    ) -> AsyncIterator[WatchStream]:
        """Open a watch; yields a :class:`WatchStream` of events.

        Opening is retried like a read. ERROR events are yielded as-is (check
        :func:`bigfleet_trio.kube.watch.is_expired`); an HTTP 410 on open raises Expired.

        Args:
            inactivity_timeout: seconds without any line after which the stream raises
                WatchInactivityTimeout (None = wait forever).
            retry: retry opening like a read (False: one attempt; the informer runs its own
                backoff).
        """
        path = res.collection_path(namespace if res.namespaced else None)
        params = _clean(
            {  # never None: "watch" is always set
                "watch": "1",
                "resourceVersion": resource_version or None,
                "allowWatchBookmarks": "true" if allow_bookmarks else None,
                "timeoutSeconds": timeout_seconds,
                "labelSelector": label_selector,
                "fieldSelector": field_selector,
            }
        )
        assert params is not None
        if not retry or self.max_attempts == 1:
            response = await self._open_stream(path, params)
        else:
            response = await self.retry.call(
                lambda: self._open_stream(path, params), _READ_RETRY, f"WATCH {path}"
            )
        try:
            yield WatchStream(response, inactivity_timeout)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await response.aclose()

    async def _open_stream(self, path: str, params: dict[str, Any]) -> httpx.Response:
        await self._limiter.acquire()
        request = self._watch_http.build_request("GET", path, params=params)
        response: httpx.Response | None = None
        with trio.move_on_after(self.request_timeout):
            try:
                response = await self._watch_http.send(request, stream=True)
            except httpx.TransportError as exc:
                raise KubeTransportError(f"WATCH {path}: {_describe(exc)}") from exc
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
            raise self._error(response.status_code, body, response.headers)
        return response

    # -- writes ------------------------------------------------------------------------------

    async def create(
        self, res: Resource, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """POST a new object. ``namespace`` defaults to ``body.metadata.namespace``.

        Raises:
            AlreadyExists, Invalid, NotFound (namespace missing), ...
        """
        ns = namespace or _meta(body).get("namespace")
        body = _with_type(res, body)
        return await self._request_obj(
            "POST",
            res.collection_path(ns if res.namespaced else None),
            body=body,
            retry_on=_WRITE_RETRY,
        )

    async def update(
        self,
        res: Resource,
        body: dict[str, Any],
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """PUT a full object (or its ``status`` subresource).

        Raises:
            Conflict: ``metadata.resourceVersion`` is stale. NotFound: object absent.
        """
        meta = _meta(body)
        ns = namespace or meta.get("namespace")
        name = meta.get("name")
        if not name:
            raise ValueError("update: body has no metadata.name")
        retry = _SAFE_WRITE_RETRY if meta.get("resourceVersion") else _WRITE_RETRY
        return await self._request_obj(
            "PUT",
            res.object_path(name, ns, subresource),
            body=_with_type(res, body),
            retry_on=retry,
        )

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """PATCH an object: ``merge`` (RFC 7386), ``json`` (RFC 6902 list), ``strategic``
        (built-in kinds only), ``apply`` (server-side apply; body is the YAML/JSON text)."""
        try:
            ctype = _PATCH_CONTENT_TYPES[patch_type]
        except KeyError:
            raise ValueError(f"unknown patch_type {patch_type!r}") from None
        params = {"fieldManager": "bigfleet-trio"} if patch_type == "apply" else None
        return await self._request_obj(
            "PATCH",
            res.object_path(name, namespace, subresource),
            params=params,
            body=patch,
            content_type=ctype,
            retry_on=_SAFE_WRITE_RETRY if patch_type in _IDEMPOTENT_PATCHES else _WRITE_RETRY,
        )

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        propagation_policy: str | None = None,
        preconditions: Mapping[str, str] | None = None,
        grace_period_seconds: int | None = None,
    ) -> dict[str, Any] | None:
        """DELETE one object.

        Args:
            propagation_policy: "Foreground" | "Background" | "Orphan".
            preconditions: ``{"uid": ..., "resourceVersion": ...}``; mismatch → Conflict.

        Returns:
            The server's answer (last state or Status), None if empty.
        """
        opts: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation_policy:
            opts["propagationPolicy"] = propagation_policy
        if preconditions:
            opts["preconditions"] = dict(preconditions)
        if grace_period_seconds is not None:
            opts["gracePeriodSeconds"] = grace_period_seconds
        retry = _SAFE_WRITE_RETRY if preconditions else _WRITE_RETRY
        out = await self.request(
            "DELETE", res.object_path(name, namespace), body=opts, retry_on=retry
        )
        return out if isinstance(out, dict) else None

    async def delete_collection(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> None:
        """DELETE a collection (deletecollection verb) matching the selectors."""
        await self.request(
            "DELETE",
            res.collection_path(namespace if res.namespaced else None),
            params={"labelSelector": label_selector, "fieldSelector": field_selector},
            retry_on=_WRITE_RETRY,
        )

    async def evict(
        self, name: str, namespace: str, *, grace_period_seconds: int | None = None
    ) -> None:
        """POST a policy/v1 Eviction for a pod (never retried).

        Raises:
            TooManyRequests: a PodDisruptionBudget blocks it (retry later).
            NotFound: the pod is gone.
        """
        from .resources import PODS

        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if grace_period_seconds is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_period_seconds}
        await self.request("POST", PODS.object_path(name, namespace, "eviction"), body=body)

    async def create_event(
        self,
        involved: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        type: str = "Normal",
        component: str = "bigfleet-trio",
    ) -> bool:
        """Record a core/v1 Event about ``involved`` (best effort: errors logged, not raised).

        Returns:
            True when the apiserver stored it, False when it was dropped (logged).
        """
        meta = _meta(involved)
        ns = meta.get("namespace") or "default"
        now = rfc3339()
        name = f"{meta.get('name', 'unknown')}.{random.getrandbits(64):016x}"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {
                k: v
                for k, v in {
                    "apiVersion": involved.get("apiVersion"),
                    "kind": involved.get("kind"),
                    "name": meta.get("name"),
                    "namespace": meta.get("namespace"),
                    "uid": meta.get("uid"),
                    "resourceVersion": meta.get("resourceVersion"),
                }.items()
                if v
            },
            "reason": reason,
            "message": message[:1024],
            "type": type,
            "source": {"component": component},
            "reportingComponent": component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.request("POST", EVENTS.collection_path(ns), body=body)
        except (ApiError, KubeTransportError) as exc:
            log.warning(
                "kube event dropped reason=%s object=%s/%s err=%s",
                reason,
                ns,
                meta.get("name"),
                exc,
            )
            return False
        return True


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _with_type(res: Resource, body: dict[str, Any]) -> dict[str, Any]:
    if "kind" in body and "apiVersion" in body:
        return body
    return {"apiVersion": res.api_version, "kind": res.kind, **body}


def _clean(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not params:
        return None
    out: dict[str, Any] = {}
    for k, v in params.items():
        if v is None:
            continue
        out[k] = ("true" if v else "false") if isinstance(v, bool) else v
    return out or None
