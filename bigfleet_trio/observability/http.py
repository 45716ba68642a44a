"""Diagnostics HTTP listener: /metrics, /healthz, /readyz and the /events WebSocket.

A Starlette app served by hypercorn's Trio worker on ``--metrics-addr`` (default
``127.0.0.1:8770``, loopback; ``:8770`` = all interfaces, ``"0"`` disables). With an
``auth`` (``--metrics-auth``), ``/metrics`` and ``/events`` answer only callers whose bearer
token passes TokenReview and SubjectAccessReview (``kube.authz``); the probes stay open. With a
``tls`` certificate (``.tls``; on by default with ``--metrics-auth``) the listener speaks only
HTTPS/WSS, so no token crosses the network in clear text.

Endpoints:

* ``GET /metrics``: ``prometheus_client.make_asgi_app`` over the given registry (default: the
  process-wide one), content negotiation included (text 0.0.4 or OpenMetrics).
* ``GET /healthz``: ``200 ok`` while the process serves.
* ``GET /readyz``: calls the injected ``readiness()``; ``(True, detail)`` → 200
  ``{"ready": true, "detail": …}``; ``(False, reasons)`` → 503 ``{"ready": false, "reasons": […]}``.
  ``readiness`` may be sync or async and may return a string or a list of strings as detail; an
  exception counts as not ready.
* ``GET /debug/tasks`` and ``GET /debug/pprof/profile?seconds=N`` (only with ``profiling``,
  ``--enable-profiling``; else 404): the live Trio task tree and an N-second CPU profile
  (:mod:`~bigfleet_trio.observability.profiling`; docs/operate.md#profiling).
* ``WS /events``: each event of the :class:`~bigfleet_trio.observability.events.EventFeed` as one
  JSON text message (``?kind=a,b`` filters kinds).
"""

from __future__ import annotations

import inspect
import json
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from prometheus_client import REGISTRY, CollectorRegistry, make_asgi_app
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from ..excgroups import find_in_group
from ..knobs import loopback_addr, split_host_port
from .authz import PROTECTED_PATHS, Authorizer
from .events import EventFeed
from .profiling import DEFAULT_SECONDS, MAX_SECONDS, MIN_SECONDS, Busy, Profiler, task_tree
from .tls import ServingCertificate

__all__ = ["build_app", "separate_probe_listener", "serve_observability", "Readiness",
           "ReadinessResult"]

log = logging.getLogger(__name__)

ReadinessResult = tuple[bool, "str | Sequence[str]"]
Readiness = Callable[[], "ReadinessResult | Awaitable[ReadinessResult]"]


class _AsgiEndpoint:
    """Wrap a raw ASGI callable so Starlette's Route passes it through (not as a view fn)."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


def _as_list(detail: Any) -> list[str]:
    if detail is None or detail == "":
        return []
    if isinstance(detail, str):
        return [detail]
    if isinstance(detail, (list, tuple, set, frozenset)):
        return [str(d) for d in detail]
    return [str(detail)]


async def _check_ready(readiness: Readiness | None) -> tuple[bool, list[str]]:
    if readiness is None:
        return True, []
    try:
        result = readiness()
        if inspect.isawaitable(result):
            result = await result
        ok, detail = result
    except Exception as exc:  # a broken probe means "not ready", never a 500
        log.warning("readiness check failed", extra={"error": repr(exc)})
        return False, [f"readiness check failed: {exc!r}"]
    return bool(ok), _as_list(detail)


class _Guard:
    """ASGI middleware: :data:`~.authz.PROTECTED_PATHS` only for an authorized caller.

    HTTP gets 401/403/500 with a one-line reason; a WebSocket is refused before the upgrade
    (with the same status where the server supports ``websocket.http.response``, else 403).
    """

    def __init__(self, app: ASGIApp, auth: Authorizer) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] not in PROTECTED_PATHS:
            await self.app(scope, receive, send)
            return
        header = next((v.decode("latin-1") for k, v in scope.get("headers", ())
                       if k == b"authorization"), None)
        decision = await self.auth.check(header, scope["path"])
        if decision.allowed:
            await self.app(scope, receive, send)
            return
        log.info("diagnostics request refused", extra={
            "path": scope["path"], "status": decision.status, "reason": decision.reason,
            "client": (scope.get("client") or ("?",))[0]})
        body = (decision.reason + "\n").encode()
        headers = [(b"content-type", b"text/plain; charset=utf-8")]
        if decision.status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="bigfleet-trio"'))
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": decision.status,
                        "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        if "websocket.http.response" in (scope.get("extensions") or {}):
            await send({"type": "websocket.http.response.start", "status": decision.status,
                        "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
            return
        await send({"type": "websocket.close", "code": 1008})


def build_app(
    *,
    readiness: Readiness | None = None,
    feed: EventFeed | None = None,
    registry: CollectorRegistry = REGISTRY,
    ws_buffer: int = 1024,
    auth: Authorizer | None = None,
    probes_only: bool = False,
    profiling: bool = False,
) -> ASGIApp:
    """Build the diagnostics ASGI app.

    Args:
        readiness: ``() -> (ok, detail)`` (sync or async); ``None`` means always ready.
        feed: event feed for ``/events``; ``None`` leaves ``/events`` unrouted (404/403).
        registry: Prometheus registry for ``/metrics``.
        ws_buffer: per-WebSocket subscription buffer (events) before drop-oldest.
        auth: when set, ``/metrics`` and ``/events`` need an authorized bearer token.
        probes_only: serve only ``/healthz``, ``/livez`` and ``/readyz`` (the
            ``--health-probe-addr`` listener: plain HTTP for the kubelet, nothing to protect).
        profiling: route ``/debug/tasks`` and ``/debug/pprof/profile`` (``--enable-profiling``;
            behind ``auth`` like ``/metrics``).

    Returns:
        An ASGI application (Starlette, behind the auth guard when ``auth`` is set).
    """

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def readyz(request: Request) -> Response:
        ok, detail = await _check_ready(readiness)
        if ok:
            return JSONResponse({"ready": True, "detail": detail})
        return JSONResponse({"ready": False, "reasons": detail}, status_code=503)

    routes: list[BaseRoute] = [
        Route("/healthz", healthz, methods=["GET", "HEAD"]),
        Route("/livez", healthz, methods=["GET", "HEAD"]),
        Route("/readyz", readyz, methods=["GET", "HEAD"]),
    ]
    if not probes_only:
        routes.append(Route("/metrics", _AsgiEndpoint(make_asgi_app(registry=registry))))

    if profiling and not probes_only:
        routes.extend(_profiling_routes())

    if feed is not None and not probes_only:
        event_feed = feed

        async def events(websocket: WebSocket) -> None:
            kinds_param = websocket.query_params.get("kind")
            kinds = [k for k in (kinds_param or "").split(",") if k] or None
            await websocket.accept()
            client = f"{websocket.client.host}:{websocket.client.port}" if websocket.client else "?"
            log.info("events follower connected", extra={"client": client})
            try:
                async with (
                    event_feed.subscribe(buffer_size=ws_buffer, kinds=kinds) as sub,
                    trio.open_nursery() as nursery,
                ):

                    async def watch_disconnect() -> None:
                        while True:
                            message = await websocket.receive()
                            if message["type"] == "websocket.disconnect":
                                nursery.cancel_scope.cancel()
                                return

                    nursery.start_soon(watch_disconnect)
                    try:
                        async for event in sub:
                            await websocket.send_text(json.dumps(event, separators=(",", ":")))
                    except trio.EndOfChannel:  # pragma: no cover - async for handles it
                        pass
                    nursery.cancel_scope.cancel()
            except Exception as exc:  # the client went away mid-send
                log.debug("events follower ended", extra={"client": client, "error": repr(exc)})
            else:
                if event_feed.closed:
                    try:
                        await websocket.close(code=1001)
                    except Exception:  # pragma: no cover - already gone
                        pass
            log.info("events follower disconnected", extra={"client": client})

        routes.append(WebSocketRoute("/events", events))

    app = Starlette(routes=routes)
    return _Guard(app, auth) if auth is not None else app


def _profiling_routes() -> list[BaseRoute]:
    profiler = Profiler()

    async def tasks(request: Request) -> Response:
        return PlainTextResponse(task_tree())

    async def profile(request: Request) -> Response:
        raw = request.query_params.get("seconds", str(DEFAULT_SECONDS))
        try:
            seconds = int(raw)
        except ValueError:
            seconds = 0
        if not MIN_SECONDS <= seconds <= MAX_SECONDS:
            return PlainTextResponse(
                f"seconds must be an integer {MIN_SECONDS}..{MAX_SECONDS}, got {raw!r}\n",
                status_code=400)
        try:
            return PlainTextResponse(await profiler.profile(seconds))
        except Busy as exc:
            return PlainTextResponse(f"{exc}\n", status_code=409)

    return [Route("/debug/tasks", tasks, methods=["GET"]),
            Route("/debug/pprof/profile", profile, methods=["GET"])]


def separate_probe_listener(probe: str | None, metrics_addr: str) -> bool:
    """True when ``--health-probe-addr`` needs its own listener (a port-0 address always does:
    two ``127.0.0.1:0`` are two ports)."""
    if not probe or not probe.strip() or probe.strip() == "0":
        return False
    if probe.strip() != metrics_addr.strip():
        return True
    return probe.strip().endswith(":0")


def _bind_for(addr: str) -> str:
    host, port = split_host_port(addr, flag="address")
    if not host:
        host = "0.0.0.0"
    if ":" in host:
        return f"[{host}]:{port}"
    return f"{host}:{port}"


async def serve_observability(
    addr: str,
    *,
    readiness: Readiness | None = None,
    feed: EventFeed | None = None,
    registry: CollectorRegistry = REGISTRY,
    auth: Authorizer | None = None,
    probes_only: bool = False,
    tls: ServingCertificate | None = None,
    profiling: bool = False,
    task_status: trio.TaskStatus[str | None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve :func:`build_app` on ``addr`` until cancelled.

    Start with ``bound = await nursery.start(partial(serve_observability, ":8770", ...))``.

    Args:
        addr: ``HOST:PORT``; ``":8770"`` listens on all interfaces, port 0 picks a free port,
            ``"0"`` disables (``task_status.started(None)`` and return at once).
        readiness: see :func:`build_app`.
        feed: see :func:`build_app`.
        registry: Prometheus registry for ``/metrics``.
        auth, probes_only, profiling: see :func:`build_app`.
        tls: serve HTTPS (and WSS) with this certificate, re-read while serving when it comes
            from files (docs/crds.md#diagnostics-tls); None: plain HTTP.
        task_status: receives the bound ``"host:port"`` once the socket listens.

    Raises:
        ConfigError: malformed ``addr``. OSError: the address cannot be bound.
    """
    if addr.strip() == "0":
        log.info("diagnostics listener disabled")
        task_status.started(None)
        return
    bind = _bind_for(addr)
    config = HypercornConfig() if tls is None else _TLSConfig(tls.context)
    config.bind = [bind]
    config.accesslog = None
    config.errorlog = logging.getLogger(__name__ + ".server")
    config.graceful_timeout = 1.0
    config.keep_alive_timeout = 30.0
    app = build_app(readiness=readiness, feed=feed, registry=registry, auth=auth,
                    probes_only=probes_only, profiling=profiling)
    if auth is None and not probes_only and not loopback_addr(bind):
        log.warning(
            "diagnostics listener on %s without authentication: anyone who can reach it reads "
            "/metrics and /events; set --metrics-auth=true or a loopback --metrics-addr "
            "(docs/crds.md#diagnostics-access)", addr.strip(), extra={"addr": addr.strip()})
    started = False

    def mark_started(bound: str | None) -> None:
        nonlocal started
        started = True
        task_status.started(bound)

    try:
        binds: list[str] = await _start_hypercorn(app, config, mark_started, tls)
    except BaseException as exc:
        # A bind failure surfaces as a bare "[Errno 98] Address already in use" from inside
        # hypercorn's task group; say which address, so the user knows which flag to change.
        err = find_in_group(exc, OSError)
        if started or not isinstance(err, OSError):
            raise
        failure = OSError(f"cannot listen on {addr.strip()}: {err.strerror or err}")
        failure.errno = err.errno
        raise failure from None
    del binds  # pragma: no cover - serve never returns before cancellation


class _TLSConfig(HypercornConfig):
    """Hypercorn's settings with our server context: hypercorn builds its own only from
    ``certfile``/``keyfile`` paths, which can be neither re-read nor held in memory."""

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__()
        self._context = context

    @property
    def ssl_enabled(self) -> bool:
        return True

    def create_ssl_context(self) -> ssl.SSLContext:
        return self._context


async def _start_hypercorn(
    app: ASGIApp, config: HypercornConfig, started: Callable[[str | None], None],
    tls: ServingCertificate | None = None,
) -> list[str]:
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(serve, app, config)
        bound = binds[0].split("://", 1)[-1] if binds else None
        if tls is None:
            log.info("diagnostics listening", extra={"addr": bound, "scheme": "http"})
        else:
            nursery.start_soon(tls.watch)
            source = ("a self-signed certificate generated at start (give --metrics-cert-path "
                      "for one your scraper can verify)" if tls.self_signed
                      else tls.plan.cert_file)
            log.info("diagnostics listening over TLS with %s", source,
                     extra={"addr": bound, "scheme": "https", "sha256": tls.fingerprint})
        started(bound)
    return binds
