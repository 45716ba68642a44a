"""The ASGI application of the embedded apiserver: reads the request, routes it through the
tables in :mod:`.routes` (with faults and counters on resource requests), writes the response
or streams a watch (:mod:`.watchstream`).

A raw ASGI app (no framework) keeps per-request overhead low for scale benchmarks.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, unquote

import trio

from . import errors as E
from . import routes
from .errors import ApiError
from .httpio import Receive, Request, Response, Scope, Send, error_response, not_found
from .rbac import Attributes
from .watchstream import stream_watch

if TYPE_CHECKING:
    from .state import ApiState

log = logging.getLogger(__name__)

AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _read_request(scope: Scope, receive: Receive) -> Request | None:
    chunks = []
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            break
    headers: dict[str, str] = {}
    for k, v in scope.get("headers", []):
        key, value = k.decode("latin-1").lower(), v.decode("latin-1")
        # a repeated header is one comma-separated list (kubectl --as-group sends several)
        headers[key] = f"{headers[key]},{value}" if key in headers else value
    qs = scope.get("query_string", b"").decode("latin-1")
    query = {k: v[-1] for k, v in parse_qs(qs, keep_blank_values=True).items()}
    return Request(
        scope["method"].upper(), unquote(scope["path"]), query, headers, b"".join(chunks)
    )


async def handle(server: ApiState, req: Request) -> routes.Result:
    """Route one request: a non-resource path, discovery, or a resource verb.

    Raises:
        ApiError: any API failure (turned into a Status response by the caller).
    """
    parts = [p for p in req.path.split("/") if p]
    head = parts[0] if parts else ""
    access = server.access
    user = access.impersonate(access.authenticate(req.headers.get("authorization")), req.headers)
    if access.enforcing and (head not in ("api", "apis") or routes.is_discovery(req, parts)):
        access.check(Attributes(user, req.method.lower(), resource_request=False, path=req.path))
    non_resource = routes.NON_RESOURCE_ROUTES.get(head)
    if non_resource is not None:
        return non_resource(server, req, parts)
    if head not in ("api", "apis"):
        raise not_found()
    doc = routes.discovery(server, req, parts)
    if doc is not None:
        return doc
    call = routes.parse_resource_path(server, req, parts)
    handler = routes.route(call)
    call.user = user
    if access.enforcing:
        access.check(routes.attributes(call, user))
    resource = call.counter_resource
    server.counters.add(call.verb, resource)
    delay = server.faults.latency_for(call.verb, resource)
    if delay > 0:
        await trio.sleep(delay)
    fault = server.faults.take(call.verb, resource, call.name)
    if fault is not None:
        raise fault
    routes.prepare(call)
    return handler(server, call)


def make_app(server: ApiState) -> AsgiApp:
    """Build the ASGI callable serving ``server``."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        req = await _read_request(scope, receive)
        if req is None:
            return
        try:
            result = await handle(server, req)
        except ApiError as err:
            result = error_response(err)
        except Exception as exc:  # never crash the server
            log.exception("internal error handling %s %s", req.method, req.path)
            result = error_response(E.internal(repr(exc)))
        if isinstance(result, Response):
            hdrs = [
                (b"content-type", result.content_type),
                (b"content-length", str(len(result.body)).encode()),
                *result.headers,
            ]
            await send({"type": "http.response.start", "status": result.status, "headers": hdrs})
            await send({"type": "http.response.body", "body": result.body})
        else:
            await stream_watch(server, result, receive, send)

    return app
