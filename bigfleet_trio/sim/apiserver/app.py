"""The ASGI application: URL routing, body decoding, responses, watch streaming, faults and
counters (issue 3 "Build"; kube-testserver notes §1-2).

A raw ASGI app (no framework) keeps per-request overhead low for scale benchmarks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote

import trio
import yaml

from . import discovery as D
from . import errors as E
from .errors import ApiError
from .resources import ResourceType
from .store import dumps

if TYPE_CHECKING:
    from .state import ApiServer

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON_CT = b"application/json"


class Response:
    __slots__ = ("status", "body", "content_type", "headers")

    def __init__(
        self,
        status: int,
        body: bytes,
        content_type: bytes = JSON_CT,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers or []


def _json(
    status: int, obj: Any, ct: bytes = JSON_CT, warnings: list[str] | None = None
) -> Response:
    headers = [(b"warning", f'299 - "{w}"'.encode()) for w in warnings or ()]
    return Response(status, dumps(obj), ct, headers)


def _error(err: ApiError) -> Response:
    headers = [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    return Response(err.code, dumps(err.status()), JSON_CT, headers)


class _Request:
    __slots__ = ("method", "path", "query", "headers", "body")

    def __init__(
        self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: bytes
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body

    def q(self, name: str, default: str | None = None) -> str | None:
        return self.query.get(name, default)

    def flag(self, name: str) -> bool:
        return (self.query.get(name) or "").lower() in ("true", "1")

    def decode(self, *, allow_yaml: bool = True) -> Any:
        """Decode a JSON (or YAML) body; 400 on malformed input, 415 on unknown types."""
        ct = self.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if not self.body:
            raise E.bad_request("the request body is empty")
        if "protobuf" in ct:
            from .protobuf import ProtobufError, decode

            try:
                return decode(self.body)
            except (ProtobufError, UnicodeDecodeError) as exc:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types "
                    f"include: application/json, application/yaml ({exc})",
                ) from None
        if "cbor" in ct:
            raise E.unsupported_media_type(ct)
        if allow_yaml and ("yaml" in ct):
            try:
                return yaml.safe_load(self.body)
            except yaml.YAMLError as exc:
                raise E.bad_request(f"error converting YAML to JSON: {exc}") from None
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise E.bad_request(f"couldn't get version/kind; json parse error: {exc}") from None


def make_app(server: ApiServer) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """Build the ASGI callable for ``server``."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])
        }
        qs = scope.get("query_string", b"").decode("latin-1")
        query = {k: v[-1] for k, v in parse_qs(qs, keep_blank_values=True).items()}
        req = _Request(
            scope["method"].upper(), unquote(scope["path"]), query, headers, b"".join(chunks)
        )
        try:
            result = await _handle(server, req)
        except ApiError as err:
            result = _error(err)
        except Exception as exc:  # never crash the server
            log.exception("internal error handling %s %s", req.method, req.path)
            result = _error(E.internal(repr(exc)))
        if isinstance(result, Response):
            hdrs = [
                (b"content-type", result.content_type),
                (b"content-length", str(len(result.body)).encode()),
                *result.headers,
            ]
            await send({"type": "http.response.start", "status": result.status, "headers": hdrs})
            await send({"type": "http.response.body", "body": result.body})
        else:
            await _stream_watch(server, result, receive, send)

    return app


PARTIAL_CT = b"application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


def _partial(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj["metadata"],
    }


class _WatchPlan:
    __slots__ = ("res", "initial", "watcher", "timeout", "bookmarks", "as_table", "partial")

    def __init__(
        self,
        res: ResourceType,
        initial: list[Any],
        watcher: Any,
        timeout: float | None,
        bookmarks: bool,
        as_table: bool,
    ) -> None:
        self.res = res
        self.initial = initial
        self.watcher = watcher
        self.timeout = timeout
        self.bookmarks = bookmarks
        self.as_table = as_table
        self.partial = False


def _verb_of(method: str, name: str | None, sub: str | None, watch: bool) -> str:
    if method == "GET":
        return "watch" if watch else ("get" if name else "list")
    if method == "POST":
        return "create"
    if method == "PUT":
        return "update"
    if method == "PATCH":
        return "patch"
    if method == "DELETE":
        return "delete" if name else "deletecollection"
    return method.lower()


async def _handle(server: ApiServer, req: _Request) -> Response | _WatchPlan:
    path = req.path
    parts = [p for p in path.split("/") if p]
    accept = req.headers.get("accept", "")
    if not parts:
        return _json(
            200, {"paths": ["/api", "/api/v1", "/apis", "/openapi/v3", "/version", "/healthz"]}
        )
    head = parts[0]
    if head in ("healthz", "readyz", "livez"):
        return Response(200, b"ok", b"text/plain")
    if head == "version":
        return _json(
            200,
            {
                "major": "1",
                "minor": "37",
                "gitVersion": "v1.37.0-bigfleet-sim",
                "platform": "linux/amd64",
            },
        )
    if head == "openapi":
        if len(parts) >= 2 and parts[1] == "v3":
            if len(parts) == 2:
                return _json(200, D.openapi_root(server))
            rest = parts[2:]
            if rest[0] == "api" and len(rest) == 2:
                doc = D.openapi_gv(server, "", rest[1])
            elif rest[0] == "apis" and len(rest) == 3:
                doc = D.openapi_gv(server, rest[1], rest[2])
            else:
                doc = None
            if doc is not None:
                return _json(200, doc)
        raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
    if head not in ("api", "apis"):
        raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
    if req.method == "GET":
        if head == "api" and len(parts) == 1:
            if D.wants_aggregated(accept):
                return _json(200, D.aggregated(server, core=True), D.AGG_CT.encode())
            return _json(200, D.legacy_api(server))
        if head == "apis" and len(parts) == 1:
            if D.wants_aggregated(accept):
                return _json(200, D.aggregated(server, core=False), D.AGG_CT.encode())
            return _json(200, D.legacy_apis(server))
        if head == "apis" and len(parts) == 2:
            doc = D.legacy_group(server, parts[1])
            if doc is None:
                raise ApiError(
                    404, "NotFound", "the server could not find the requested resource", {}
                )
            return _json(200, doc)
        if (head == "api" and len(parts) == 2) or (head == "apis" and len(parts) == 3):
            group, version = ("", parts[1]) if head == "api" else (parts[1], parts[2])
            doc = D.resource_list(server, group, version)
            if doc is None:
                raise ApiError(
                    404, "NotFound", "the server could not find the requested resource", {}
                )
            return _json(200, doc)
    if head == "api":
        if len(parts) < 3:
            raise E.method_not_allowed()
        group, version, rest = "", parts[1], parts[2:]
    else:
        if len(parts) < 4:
            raise E.method_not_allowed()
        group, version, rest = parts[1], parts[2], parts[3:]
    namespace: str | None = None
    if (
        rest[0] == "namespaces"
        and len(rest) >= 3
        and not (len(rest) == 3 and rest[2] in ("status", "finalize"))
    ):
        namespace = rest[1]
        rest = rest[2:]
    if len(rest) > 3:
        raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    res = server.resource(group, version, plural)
    if (
        (namespace is not None and not res.namespaced)
        or (sub is not None and sub not in ("status", "finalize", *res.extra_subresources))
        or (sub == "status" and not res.status)
    ):
        raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
    if res.namespaced and namespace is None and (name is not None or req.method not in ("GET",)):
        raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
    watch = req.method == "GET" and name is None and req.flag("watch")
    verb = _verb_of(req.method, name, sub, watch)
    if sub == "eviction" and req.method != "POST":
        raise E.method_not_allowed()
    counter_res = f"{plural}/{sub}" if sub else plural
    server.counters.add(verb, counter_res)
    delay = server.faults.latency_for(verb, counter_res)
    if delay > 0:
        await trio.sleep(delay)
    fault = server.faults.take(verb, counter_res)
    if fault is not None:
        raise fault
    as_table = D.wants_table(accept)
    partial = not as_table and "as=PartialObjectMetadata" in accept.replace(" ", "")
    field_validation = req.q("fieldValidation") or "Warn"
    if field_validation not in ("Strict", "Warn", "Ignore"):
        raise E.bad_request(
            f"fieldValidation must be one of Strict, Warn, Ignore (got {field_validation!r})"
        )
    dry_run = bool(req.q("dryRun"))
    warnings: list[str] = []

    if req.method == "GET":
        if name is not None:
            if sub not in (None, "status"):
                raise E.method_not_allowed()
            obj = server.get(res, namespace, name)
            if as_table and sub is None:
                return _json(200, D.table(res, [obj]), D.TABLE_CT.encode())
            if partial and sub is None:
                return _json(200, _partial(obj), PARTIAL_CT)
            return _json(200, obj)
        if watch:
            try:
                plan = _plan_watch(server, res, namespace, req, as_table)
                plan.partial = partial
                return plan
            except ApiError as err:
                if err.code != 410:
                    raise
                # Like the watch cache: HTTP 200 with a single ERROR event, then close.
                return Response(200, dumps({"type": "ERROR", "object": err.status()}) + b"\n")
        limit_s = req.q("limit")
        try:
            limit = int(limit_s) if limit_s else None
        except ValueError:
            raise E.bad_request(f"invalid limit: {limit_s!r}") from None
        lst = server.list(
            res,
            namespace,
            label_selector=req.q("labelSelector"),
            field_selector=req.q("fieldSelector"),
            limit=limit,
            continue_=req.q("continue"),
        )
        if as_table:
            return _json(
                200,
                D.table(res, lst.items, rv=lst.rv, cont=lst.cont, remaining=lst.remaining),
                D.TABLE_CT.encode(),
            )
        if partial:
            meta: dict[str, Any] = {"resourceVersion": lst.rv}
            if lst.cont:
                meta["continue"] = lst.cont
            if lst.remaining is not None:
                meta["remainingItemCount"] = lst.remaining
            return _json(
                200,
                {
                    "kind": "PartialObjectMetadataList",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": meta,
                    "items": [_partial(o) for o in lst.items],
                },
                PARTIAL_CT,
            )
        return _list_response(res, lst.items, lst.rv, lst.cont, lst.remaining)
    if req.method == "POST":
        if name is None:
            body = req.decode()
            obj = server.create(
                res,
                namespace,
                body,
                field_validation=field_validation,
                dry_run=dry_run,
                warnings=warnings,
            )
            return _json(201, obj, warnings=warnings)
        if sub == "eviction" and namespace is not None:
            body = req.decode() if req.body else None
            server.evict(namespace, name, body)
            return _json(
                201,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "code": 201,
                },
            )
        raise E.method_not_allowed()
    if req.method == "PUT" and name is not None:
        body = req.decode()
        obj = server.update(
            res,
            namespace,
            name,
            body,
            subresource=sub,
            field_validation=field_validation,
            dry_run=dry_run,
            warnings=warnings,
        )
        return _json(200, obj, warnings=warnings)
    if req.method == "PATCH" and name is not None:
        ct = req.headers.get("content-type", "")
        ctype = ct.split(";")[0].strip().lower()
        if ctype not in (
            "application/merge-patch+json",
            "application/json-patch+json",
            "application/strategic-merge-patch+json",
            "application/apply-patch+yaml",
        ):
            raise E.unsupported_media_type(ctype or "(none)")
        body = req.decode(allow_yaml=ctype.endswith("yaml"))
        obj = server.patch(
            res,
            namespace,
            name,
            body,
            ctype,
            subresource=sub,
            field_validation=field_validation,
            dry_run=dry_run,
            warnings=warnings,
        )
        return _json(200, obj, warnings=warnings)
    if req.method == "DELETE":
        options: dict[str, Any] = {}
        if req.body:
            try:
                parsed = json.loads(req.body)
                if isinstance(parsed, dict):
                    options = parsed
            except (ValueError, UnicodeDecodeError):
                options = {}  # protobuf DeleteOptions from kubectl --disable-eviction: ignored
        for k in ("propagationPolicy", "gracePeriodSeconds"):
            if req.q(k) is not None:
                options[k] = req.q(k)
        if name is not None:
            obj = server.delete(res, namespace, name, options, dry_run=dry_run)
            return _json(200, obj)
        items = server.delete_collection(
            res,
            namespace,
            label_selector=req.q("labelSelector"),
            field_selector=req.q("fieldSelector"),
            options=options,
        )
        return _list_response(res, items, str(server.store.rv), "", None)
    raise E.method_not_allowed()


def _list_response(
    res: ResourceType, items: list[dict[str, Any]], rv: str, cont: str, remaining: int | None
) -> Response:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if cont:
        meta["continue"] = cont
    if remaining is not None:
        meta["remainingItemCount"] = remaining
    head = dumps({"kind": res.list_kind, "apiVersion": res.api_version, "metadata": meta})
    body = head[:-1] + b',"items":' + dumps(items) + b"}"
    return Response(200, body)


def _plan_watch(
    server: ApiServer, res: ResourceType, namespace: str | None, req: _Request, as_table: bool
) -> _WatchPlan:
    send_initial = req.flag("sendInitialEvents")
    bookmarks = req.flag("allowWatchBookmarks")
    if send_initial:
        if req.q("resourceVersionMatch") != "NotOlderThan" or not bookmarks:
            raise E.invalid(
                res.kind,
                res.group,
                "",
                [
                    E.field_cause(
                        "FieldValueForbidden",
                        "sendInitialEvents",
                        "Forbidden: sendInitialEvents requires setting resourceVersionMatch to "
                        "NotOlderThan and allowWatchBookmarks=true",
                    )
                ],
            )
    timeout_s = req.q("timeoutSeconds")
    try:
        timeout = float(timeout_s) if timeout_s else None
    except ValueError:
        raise E.bad_request(f"invalid timeoutSeconds: {timeout_s!r}") from None
    initial, watcher = server.open_watch(
        res,
        namespace,
        resource_version=req.q("resourceVersion"),
        label_selector=req.q("labelSelector"),
        field_selector=req.q("fieldSelector"),
        send_initial_events=send_initial,
    )
    return _WatchPlan(res, initial, watcher, timeout, bookmarks, as_table)


def _encode_item(
    res: ResourceType,
    item: tuple[str, Any, bytes | None],
    table_state: list[bool] | None,
    partial: bool = False,
) -> bytes:
    typ, obj, cached = item
    if typ == "BOOKMARK":
        meta: dict[str, Any] = {"resourceVersion": obj}
        if cached == b"initial-events-end":
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return (
            dumps(
                {
                    "type": "BOOKMARK",
                    "object": {"kind": res.kind, "apiVersion": res.api_version, "metadata": meta},
                }
            )
            + b"\n"
        )
    if table_state is not None:
        first = not table_state[0]
        table_state[0] = True
        t = D.table(res, [obj], rv=obj["metadata"].get("resourceVersion", ""), with_columns=first)
        return dumps({"type": typ, "object": t}) + b"\n"
    if partial:
        return dumps({"type": typ, "object": _partial(obj)}) + b"\n"
    if cached is not None:
        return cached
    return dumps({"type": typ, "object": obj}) + b"\n"


async def _stream_watch(server: ApiServer, plan: _WatchPlan, receive: Receive, send: Send) -> None:
    watcher = plan.watcher
    res = plan.res
    table_state = [False] if plan.as_table else None
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", JSON_CT), (b"cache-control", b"no-cache, private")],
        }
    )
    try:
        async with trio.open_nursery() as nursery:

            async def wait_disconnect() -> None:
                while True:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        nursery.cancel_scope.cancel()
                        return

            async def bookmarks() -> None:
                while True:
                    await trio.sleep(server.bookmark_interval)
                    watcher.push(("BOOKMARK", str(server.store.rv), None))

            nursery.start_soon(wait_disconnect)
            if plan.bookmarks:
                nursery.start_soon(bookmarks)
            with trio.move_on_after(plan.timeout if plan.timeout is not None else float("inf")):
                if plan.initial:
                    buf = [_encode_item(res, it, table_state, plan.partial) for it in plan.initial]
                    for i in range(0, len(buf), 1000):
                        await send(
                            {
                                "type": "http.response.body",
                                "body": b"".join(buf[i : i + 1000]),
                                "more_body": True,
                            }
                        )
                else:
                    await send({"type": "http.response.body", "body": b"", "more_body": True})
                recv = watcher.receive
                while True:
                    try:
                        item = await recv.receive()
                    except trio.EndOfChannel:
                        break
                    out = [_encode_item(res, item, table_state, plan.partial)]
                    while len(out) < 1000:
                        try:
                            out.append(
                                _encode_item(res, recv.receive_nowait(), table_state, plan.partial)
                            )
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    await send(
                        {"type": "http.response.body", "body": b"".join(out), "more_body": True}
                    )
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            nursery.cancel_scope.cancel()
    except* OSError:
        # the client went away mid-stream (raised by ``send`` in the nursery body, so it
        # arrives wrapped in the nursery's exception group): the watch simply ends
        pass
    finally:
        watcher.close("ended")
