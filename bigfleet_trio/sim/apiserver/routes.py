"""URL routing of the embedded apiserver as tables: non-resource paths by their first segment,
and resource requests by (verb, subresource) to one handler each.

A resource URL is ``/api/v1[/namespaces/NS]/PLURAL[/NAME[/SUB]]`` or the same under
``/apis/GROUP/VERSION``; :func:`parse_resource_path` turns it into a :class:`Call`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import discovery as D
from . import errors as E
from . import openapi as O
from .httpio import Request, Response, json_response, not_found
from .objects import now_rfc3339
from .patching import apply_patch
from .rbac import ADMIN, Attributes, User
from .resources import ResourceType
from .scale import SCALE, scale_of
from .store import dumps
from .watchstream import PARTIAL_CT, WatchPlan, partial_object, plan_watch

if TYPE_CHECKING:
    from .state import ApiState

Result = Response | WatchPlan

VERSION = {
    "major": "1",
    "minor": "37",
    "gitVersion": "v1.37.0-bigfleet-sim",
    "platform": "linux/amd64",
}
ROOT_PATHS = ["/api", "/api/v1", "/apis", "/openapi/v3", "/version", "/healthz"]
SUCCESS_201 = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Success",
    "code": 201,
}
PATCH_TYPES = (
    "application/merge-patch+json",
    "application/json-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
)


@dataclass(slots=True)
class Call:
    """A request on a resource: what it names and the options every verb shares."""

    req: Request
    res: ResourceType
    namespace: str | None
    name: str | None
    sub: str | None
    verb: str
    as_table: bool = False
    include_object: str = "Metadata"
    partial: bool = False
    field_validation: str = "Warn"
    dry_run: bool = False
    warnings: list[str] = field(default_factory=list)
    user: User = ADMIN

    @property
    def counter_resource(self) -> str:
        """``plural`` or ``plural/sub`` (the key of faults, counters and RBAC resources)."""
        return f"{self.res.plural}/{self.sub}" if self.sub else self.res.plural


# ---- non-resource paths --------------------------------------------------------------------


def _root(server: ApiState, req: Request, parts: list[str]) -> Response:
    return json_response(200, {"paths": ROOT_PATHS})


def _health(server: ApiState, req: Request, parts: list[str]) -> Response:
    return Response(200, b"ok", b"text/plain")


def _version(server: ApiState, req: Request, parts: list[str]) -> Response:
    return json_response(200, VERSION)


def _openapi(server: ApiState, req: Request, parts: list[str]) -> Response:
    if len(parts) >= 2 and parts[1] == "v3":
        if len(parts) == 2:
            return json_response(200, O.openapi_root(server))
        rest = parts[2:]
        doc = None
        if rest[0] == "api" and len(rest) == 2:
            doc = O.openapi_gv(server, "", rest[1])
        elif rest[0] == "apis" and len(rest) == 3:
            doc = O.openapi_gv(server, rest[1], rest[2])
        if doc is not None:
            return json_response(200, doc)
    raise not_found()


def is_discovery(req: Request, parts: list[str]) -> bool:
    """True for the discovery paths (non-resource URLs for authorization)."""
    if req.method != "GET" or not parts:
        return False
    n = len(parts)
    return n == 1 or n == 2 or (parts[0] == "apis" and n == 3)


def discovery(server: ApiState, req: Request, parts: list[str]) -> Response | None:
    """``GET /api``, ``/apis``, ``/apis/G``, ``/api/v1``, ``/apis/G/V``; None for other paths."""
    if req.method != "GET":
        return None
    head, n = parts[0], len(parts)
    accept = req.headers.get("accept", "")
    if n == 1:
        if D.wants_aggregated(accept):
            return json_response(
                200, D.aggregated(server, core=head == "api"), D.AGG_CT.encode()
            )
        return json_response(200, D.legacy_api(server) if head == "api" else D.legacy_apis(server))
    doc = None
    if head == "apis" and n == 2:
        doc = D.legacy_group(server, parts[1])
    elif (head == "api" and n == 2) or (head == "apis" and n == 3):
        group, version = ("", parts[1]) if head == "api" else (parts[1], parts[2])
        doc = D.resource_list(server, group, version)
    else:
        return None
    if doc is None:
        raise not_found()
    return json_response(200, doc)


NonResourceHandler = Callable[["ApiState", Request, list[str]], Response]

NON_RESOURCE_ROUTES: dict[str, NonResourceHandler] = {
    "": _root,
    "healthz": _health,
    "readyz": _health,
    "livez": _health,
    "version": _version,
    "openapi": _openapi,
}


# ---- resource paths ------------------------------------------------------------------------


_WRITE_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def verb_of(method: str, name: str | None, watch: bool) -> str:
    """The Kubernetes verb of an HTTP method on a collection (name None) or an object."""
    if method == "GET":
        return "watch" if watch else ("get" if name else "list")
    if method == "DELETE":
        return "delete" if name else "deletecollection"
    return _WRITE_VERBS.get(method) or method.lower()


def parse_resource_path(server: ApiState, req: Request, parts: list[str]) -> Call:
    """Resolve a resource URL (``parts`` = path segments) to a :class:`Call`.

    Raises:
        ApiError: 404 unknown resource, scope or subresource; 405 too short a path.
    """
    if parts[0] == "api":
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
        raise not_found()
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    res = server.resource(group, version, rest[0])
    if (
        (namespace is not None and not res.namespaced)
        or (sub is not None and sub not in ("status", "finalize", *res.extra_subresources))
        or (sub == "status" and not res.status)
    ):
        raise not_found()
    if res.namespaced and namespace is None and (name is not None or req.method != "GET"):
        raise not_found()
    watch = req.method == "GET" and name is None and req.flag("watch")
    return Call(req, res, namespace, name, sub, verb_of(req.method, name, watch))


def attributes(call: Call, user: User) -> Attributes:
    """The authorization attributes of a resource request, as the apiserver's request info
    derives them: a namespace object is in its own namespace, and a list or watch narrowed to
    one name (``fieldSelector=metadata.name=X``) is about that name."""
    name = call.name or ""
    namespace = call.namespace or ""
    if call.res.plural == "namespaces" and call.res.group == "" and name:
        namespace = name
    if call.verb in ("list", "watch"):
        fs = (call.req.q("fieldSelector") or "").replace("==", "=")
        if fs.startswith("metadata.name=") and "," not in fs:
            name = fs.split("=", 1)[1]
    return Attributes(
        user=user,
        verb=call.verb,
        api_group=call.res.group,
        resource=call.res.plural,
        subresource=call.sub or "",
        name=name,
        namespace=namespace,
        path=call.req.path,
    )


def prepare(call: Call) -> None:
    """Fill the options every verb shares (Accept, fieldValidation, dryRun).

    Raises:
        ApiError: 400 an unknown fieldValidation value.
    """
    req = call.req
    accept = req.headers.get("accept", "")
    call.as_table = D.wants_table(accept)
    call.partial = not call.as_table and "as=PartialObjectMetadata" in accept.replace(" ", "")
    if call.as_table:
        try:
            call.include_object = D.include_object(req.q("includeObject"))
        except ValueError as exc:
            raise E.bad_request(str(exc)) from None
    fv = req.q("fieldValidation") or "Warn"
    if fv not in ("Strict", "Warn", "Ignore"):
        raise E.bad_request(f"fieldValidation must be one of Strict, Warn, Ignore (got {fv!r})")
    call.field_validation = fv
    call.dry_run = bool(req.q("dryRun"))


def list_response(
    res: ResourceType, items: list[dict[str, Any]], rv: str, cont: str, remaining: int | None
) -> Response:
    """A ``<Kind>List`` body (items encoded once, without re-wrapping)."""
    meta: dict[str, Any] = {"resourceVersion": rv}
    if cont or res.custom:  # kube-apiserver writes an empty continue in custom-resource lists
        meta["continue"] = cont
    if remaining is not None:
        meta["remainingItemCount"] = remaining
    head = dumps({"kind": res.list_kind, "apiVersion": res.api_version, "metadata": meta})
    body = head[:-1] + b',"items":' + dumps(items) + b"}"
    return Response(200, body)


def _get(server: ApiState, c: Call) -> Result:
    assert c.name is not None
    obj = server.get(c.res, c.namespace, c.name)
    if c.as_table and c.sub is None:
        return json_response(200, D.table(c.res, [obj], include=c.include_object),
                             D.TABLE_CT.encode())
    if c.partial and c.sub is None:
        return json_response(200, partial_object(obj), PARTIAL_CT)
    return json_response(200, obj)


def _list(server: ApiState, c: Call) -> Result:
    req = c.req
    limit_s = req.q("limit")
    try:
        limit = int(limit_s) if limit_s else None
    except ValueError:
        raise E.bad_request(f"invalid limit: {limit_s!r}") from None
    lst = server.list(
        c.res,
        c.namespace,
        label_selector=req.q("labelSelector"),
        field_selector=req.q("fieldSelector"),
        limit=limit,
        continue_=req.q("continue"),
        resource_version=req.q("resourceVersion"),
    )
    if c.as_table:
        return json_response(
            200,
            D.table(c.res, lst.items, rv=lst.rv, cont=lst.cont, remaining=lst.remaining,
                    include=c.include_object),
            D.TABLE_CT.encode(),
        )
    if c.partial:
        meta: dict[str, Any] = {"resourceVersion": lst.rv}
        if lst.cont:
            meta["continue"] = lst.cont
        if lst.remaining is not None:
            meta["remainingItemCount"] = lst.remaining
        return json_response(
            200,
            {
                "kind": "PartialObjectMetadataList",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": meta,
                "items": [partial_object(o) for o in lst.items],
            },
            PARTIAL_CT,
        )
    return list_response(c.res, lst.items, lst.rv, lst.cont, lst.remaining)


def _watch(server: ApiState, c: Call) -> Result:
    try:
        plan = plan_watch(server, c.res, c.namespace, c.req, c.as_table)
    except E.ApiError as err:
        if err.code != 410:
            raise
        # Like the watch cache: HTTP 200 with a single ERROR event, then close.
        return Response(200, dumps({"type": "ERROR", "object": err.status()}) + b"\n")
    plan.partial = c.partial
    plan.include_object = c.include_object
    return plan


def _create(server: ApiState, c: Call) -> Result:
    if c.name is not None:
        raise E.method_not_allowed()
    if c.res.group == "authorization.k8s.io":  # access reviews: answered, never stored
        subject = c.res.plural == "subjectaccessreviews"
        return json_response(201, server.access.review(c.user, c.req.decode(), subject=subject))
    if c.res.group == "authentication.k8s.io":  # TokenReview: answered, never stored
        return json_response(201, server.access.token_review(c.req.decode()))
    obj = server.create(
        c.res,
        c.namespace,
        c.req.decode(),
        field_validation=c.field_validation,
        dry_run=c.dry_run,
        warnings=c.warnings,
    )
    return json_response(201, obj, warnings=c.warnings)


def _evict(server: ApiState, c: Call) -> Result:
    if c.name is None or c.namespace is None:
        raise E.method_not_allowed()
    server.evict(c.namespace, c.name, c.req.decode() if c.req.body else None)
    return json_response(201, SUCCESS_201)


def _update(server: ApiState, c: Call) -> Result:
    assert c.name is not None
    obj = server.update(
        c.res,
        c.namespace,
        c.name,
        c.req.decode(),
        subresource=c.sub,
        field_validation=c.field_validation,
        dry_run=c.dry_run,
        warnings=c.warnings,
    )
    return json_response(200, obj, warnings=c.warnings)


def _patch(server: ApiState, c: Call) -> Result:
    assert c.name is not None
    ctype = c.req.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype not in PATCH_TYPES:
        raise E.unsupported_media_type(ctype or "(none)")
    # server-side apply of an absent object creates it: 201, as kube-apiserver answers
    creates = (ctype == "application/apply-patch+yaml" and c.sub is None
               and server.store.get(c.res, c.namespace, c.name) is None)
    obj = server.patch(
        c.res,
        c.namespace,
        c.name,
        c.req.decode(allow_yaml=ctype.endswith("yaml")),
        ctype,
        subresource=c.sub,
        field_validation=c.field_validation,
        dry_run=c.dry_run,
        warnings=c.warnings,
    )
    return json_response(201 if creates else 200, obj, warnings=c.warnings)


def _delete_options(req: Request) -> dict[str, Any]:
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
    return options


# Kinds whose kube-apiserver storage answers a DELETE with the deleted object
# (``ReturnDeletedObject``); every other kind answers with a Status once the object is gone.
RETURNS_DELETED_OBJECT = frozenset(
    {"pods", "namespaces", "serviceaccounts", "services", "podtemplates", "resourcequotas",
     "persistentvolumes", "persistentvolumeclaims"}
)


def _delete(server: ApiState, c: Call) -> Result:
    assert c.name is not None
    obj = server.delete(c.res, c.namespace, c.name, _delete_options(c.req), dry_run=c.dry_run)
    return json_response(200, delete_answer(c.res, obj, gone=not c.dry_run and server.store.get(
        c.res, c.namespace, c.name) is None))


def delete_answer(res: ResourceType, obj: dict[str, Any], *, gone: bool) -> dict[str, Any]:
    """What a DELETE answers, as kube-apiserver: the object while something (finalizers) holds
    it or for :data:`RETURNS_DELETED_OBJECT` kinds, else a Success Status naming it; a
    Namespace answers Terminating (kube-apiserver's namespace controller empties it after)."""
    if res.group == "" and res.plural == "namespaces" and gone:
        meta = {**obj["metadata"]}
        meta.setdefault("deletionTimestamp", now_rfc3339())
        return {**obj, "metadata": meta, "status": {**(obj.get("status") or {}),
                                                    "phase": "Terminating"}}
    if gone and res.group == "" and res.plural == "pods":
        # removed at once (no kubelet): kube-apiserver's answer to a zero-grace deletion
        meta = {**obj["metadata"], "deletionGracePeriodSeconds": 0}
        meta.setdefault("deletionTimestamp", now_rfc3339())
        return {**obj, "metadata": meta}
    if not gone or (res.group == "" and res.plural in RETURNS_DELETED_OBJECT):
        return obj
    meta = obj.get("metadata") or {}
    details = {"name": meta.get("name"), "group": res.group, "kind": res.plural,
               "uid": meta.get("uid")}
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {k: v for k, v in details.items() if v}}


def _delete_collection(server: ApiState, c: Call) -> Result:
    items = server.delete_collection(
        c.res,
        c.namespace,
        label_selector=c.req.q("labelSelector"),
        field_selector=c.req.q("fieldSelector"),
        options=_delete_options(c.req),
    )
    return list_response(c.res, items, str(server.store.rv), "", None)


def _get_scale(server: ApiState, c: Call) -> Result:
    assert c.name is not None
    return json_response(200, scale_of(server.get(c.res, c.namespace, c.name)))


def _update_scale(server: ApiState, c: Call) -> Result:
    assert c.name is not None
    scale = server.write_scale(
        c.res, c.namespace, c.name, c.req.decode(), dry_run=c.dry_run
    )
    return json_response(200, scale)


def _patch_scale(server: ApiState, c: Call) -> Result:
    assert c.name is not None
    ctype = c.req.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype not in PATCH_TYPES:
        raise E.unsupported_media_type(ctype or "(none)")
    current = scale_of(server.get(c.res, c.namespace, c.name))
    wanted = apply_patch(SCALE, current, c.req.decode(allow_yaml=ctype.endswith("yaml")), ctype)
    return json_response(
        200, server.write_scale(c.res, c.namespace, c.name, wanted, dry_run=c.dry_run)
    )


def _token(server: ApiState, c: Call) -> Result:
    if c.name is None or c.namespace is None:
        raise E.method_not_allowed()
    body = c.req.decode() if c.req.body else None
    return json_response(201, server.issue_token(c.namespace, c.name, body))


ResourceHandler = Callable[["ApiState", Call], Result]

# (verb, subresource) -> handler; a pair not listed answers 405 MethodNotAllowed.
RESOURCE_ROUTES: dict[tuple[str, str | None], ResourceHandler] = {
    ("get", None): _get,
    ("get", "status"): _get,
    ("list", None): _list,
    ("watch", None): _watch,
    ("create", None): _create,
    ("create", "eviction"): _evict,
    ("update", None): _update,
    ("update", "status"): _update,
    ("update", "finalize"): _update,
    ("patch", None): _patch,
    ("patch", "status"): _patch,
    ("patch", "finalize"): _patch,
    ("delete", None): _delete,
    ("deletecollection", None): _delete_collection,
    ("get", "scale"): _get_scale,
    ("update", "scale"): _update_scale,
    ("patch", "scale"): _patch_scale,
    ("create", "token"): _token,
}


def route(call: Call) -> ResourceHandler:
    """The handler for ``call``.

    Raises:
        ApiError: 405 when the verb is not served on that (sub)resource.
    """
    handler = RESOURCE_ROUTES.get((call.verb, call.sub))
    if handler is None or (call.sub is None and call.verb not in call.res.verbs):
        raise E.method_not_allowed()
    if call.name is None and call.verb in ("update", "patch"):
        # PUT/PATCH of a collection URL: kube-apiserver serves neither (405, not a 500)
        raise E.method_not_allowed()
    return handler
