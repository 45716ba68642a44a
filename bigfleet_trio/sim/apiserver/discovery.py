"""Discovery (legacy and aggregated v2) and server-side Table rendering, in the shapes
kubectl requests them.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from .resources import ResourceType

if TYPE_CHECKING:
    from .state import ApiState

AGG_CT = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
TABLE_CT = "application/json;as=Table;v=v1;g=meta.k8s.io"


def wants_aggregated(accept: str) -> bool:
    """True when the Accept header asks for aggregated discovery v2 first."""
    first = accept.split(",")[0].replace(" ", "")
    return "g=apidiscovery.k8s.io" in first and "v=v2" in first


def wants_table(accept: str) -> bool:
    """True when the Accept header asks for a meta.k8s.io/v1 Table."""
    return "as=Table" in accept.replace(" ", "")


def _groups(server: ApiState) -> dict[str, dict[str, list[ResourceType]]]:
    out: dict[str, dict[str, list[ResourceType]]] = defaultdict(lambda: defaultdict(list))
    for res in server.resources.values():
        out[res.group][res.version].append(res)
    return out


def _verbs(res: ResourceType) -> list[str]:
    return list(res.verbs)


def subresources(res: ResourceType) -> list[tuple[str, tuple[str, str, str], list[str]]]:
    """(name, (group, version, kind) of its body, verbs) of each subresource ``res`` serves."""
    out = []
    if res.status:
        out.append(("status", (res.group, res.version, res.kind), ["get", "patch", "update"]))
    if res.key == "namespaces":
        out.append(("finalize", (res.group, res.version, res.kind), ["update"]))
    if "scale" in res.extra_subresources:
        out.append(("scale", ("autoscaling", "v1", "Scale"), ["get", "patch", "update"]))
    if "eviction" in res.extra_subresources:
        out.append(("eviction", ("policy", "v1", "Eviction"), ["create"]))
    if "token" in res.extra_subresources:
        out.append(("token", ("authentication.k8s.io", "v1", "TokenRequest"), ["create"]))
    return out


def legacy_api(server: ApiState) -> dict[str, Any]:
    """``GET /api``."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
    }


def legacy_apis(server: ApiState) -> dict[str, Any]:
    """``GET /apis`` (APIGroupList)."""
    groups = []
    for g, versions in sorted(_groups(server).items()):
        if not g:
            continue
        vs = [{"groupVersion": f"{g}/{v}", "version": v} for v in sorted(versions)]
        groups.append({"name": g, "versions": vs, "preferredVersion": vs[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def legacy_group(server: ApiState, group: str) -> dict[str, Any] | None:
    """``GET /apis/<group>`` (APIGroup)."""
    versions = _groups(server).get(group)
    if not versions:
        return None
    vs = [{"groupVersion": f"{group}/{v}", "version": v} for v in sorted(versions)]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": vs,
        "preferredVersion": vs[0],
    }


def resource_list(server: ApiState, group: str, version: str) -> dict[str, Any] | None:
    """``GET /api/v1`` or ``/apis/<g>/<v>`` (APIResourceList) incl. subresources."""
    resources = _groups(server).get(group, {}).get(version)
    if not resources:
        return None
    out = []
    for res in sorted(resources, key=lambda r: r.plural):
        entry: dict[str, Any] = {
            "name": res.plural,
            "singularName": res.singular,
            "namespaced": res.namespaced,
            "kind": res.kind,
            "verbs": _verbs(res),
        }
        if res.short_names:
            entry["shortNames"] = list(res.short_names)
        if res.categories:
            entry["categories"] = list(res.categories)
        out.append(entry)
        for sub, (g, v, kind), verbs in subresources(res):
            out.append(
                {
                    "name": f"{res.plural}/{sub}",
                    "singularName": "",
                    "namespaced": res.namespaced,
                    **({"group": g, "version": v} if (g, v) != (res.group, res.version) else {}),
                    "kind": kind,
                    "verbs": verbs,
                }
            )
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out}


def aggregated(server: ApiState, core: bool) -> dict[str, Any]:
    """Aggregated discovery v2 for ``/api`` (core=True) or ``/apis``."""
    items = []
    for g, versions in sorted(_groups(server).items()):
        if (g == "") != core:
            continue
        vlist = []
        for v, resources in sorted(versions.items()):
            rlist = []
            for res in sorted(resources, key=lambda r: r.plural):
                entry: dict[str, Any] = {
                    "resource": res.plural,
                    "responseKind": {"group": res.group, "version": res.version, "kind": res.kind},
                    "scope": "Namespaced" if res.namespaced else "Cluster",
                    "singularResource": res.singular,
                    "verbs": _verbs(res),
                }
                if res.short_names:
                    entry["shortNames"] = list(res.short_names)
                if res.categories:
                    entry["categories"] = list(res.categories)
                subs = [
                    {
                        "subresource": sub,
                        "responseKind": {"group": g, "version": v, "kind": kind},
                        "verbs": verbs,
                    }
                    for sub, (g, v, kind), verbs in subresources(res)
                ]
                if subs:
                    entry["subresources"] = subs
                rlist.append(entry)
            vlist.append({"version": v, "resources": rlist, "freshness": "Current"})
        items.append({"metadata": {"name": g, "creationTimestamp": None}, "versions": vlist})
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    }


# ---- Tables ----------------------------------------------------------------------------------


def human_duration(seconds: float) -> str:
    """Kubernetes ``duration.HumanDuration`` (e.g. ``5s``, ``3m20s``, ``2d3h``)."""
    s = int(seconds)
    if s < 0:
        return "<invalid>"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = s // 3600
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if h < 24 * 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if h < 24 * 365 * 2:
        return f"{d}d"
    return f"{d // 365}y{d % 365}d" if d % 365 else f"{d // 365}y"


_FILTER = re.compile(
    r"""\?\(@((?:\.(?:\\.|[^.\s=!<>])+)+)\s*(==|!=)\s*"""
    r"""(?:"([^"]*)"|'([^']*)'|(\S+?))\)$"""
)


def _path_steps(path: str) -> list[tuple[str, str]]:
    """``.a.b\\.c[0][?(@.k=="v")]`` -> [("field", "a"), ("field", "b.c"), ("index", "0"),
    ("filter", '?(@.k=="v")')]: client-go's JSONPath syntax as CRD printer columns use it
    (``\\.`` escapes a dot inside a field name)."""
    steps: list[tuple[str, str]] = []
    i, n = 0, len(path)
    while i < n:
        c = path[i]
        if c == ".":
            i += 1
            name = []
            while i < n and path[i] not in ".[":
                if path[i] == "\\" and i + 1 < n:
                    name.append(path[i + 1])
                    i += 2
                    continue
                name.append(path[i])
                i += 1
            if name:
                steps.append(("field", "".join(name)))
        elif c == "[":
            depth, j = 0, i
            while j < n:
                if path[j] == "[":
                    depth += 1
                elif path[j] == "]":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            inner = path[i + 1:j]
            steps.append(("filter", inner) if inner.startswith("?") else ("index", inner))
            i = j + 1
        else:  # a leading name without a dot
            j = i
            while j < n and path[j] not in ".[":
                j += 1
            steps.append(("field", path[i:j]))
            i = j
    return steps


def jsonpath_get(obj: Any, path: str) -> Any:
    """Evaluate a printer-column JSONPath as kube-apiserver's table convertor does: fields
    (``\\.`` escapes a dot in a name, ``.spec.labels.node\\.kubernetes\\.io/zone``), indexes
    (``[0]``, ``[*]``) and ``[?(@.key=="v")]`` filters; the first result, None when absent."""
    current: list[Any] = [obj]
    for kind, arg in _path_steps(path.strip().lstrip("{").rstrip("}")):
        nxt: list[Any] = []
        for cur in current:
            if kind == "field":
                if isinstance(cur, dict) and cur.get(arg) is not None:
                    nxt.append(cur[arg])
            elif kind == "index":
                if not isinstance(cur, list):
                    continue
                if arg == "*":
                    nxt.extend(cur)
                elif arg.lstrip("-").isdigit() and -len(cur) <= int(arg) < len(cur):
                    nxt.append(cur[int(arg)])
            else:
                m = _FILTER.match(arg)
                if m is None or not isinstance(cur, list):
                    continue
                rel, op = m.group(1), m.group(2)
                want = next(g for g in (m.group(3), m.group(4), m.group(5), "") if g is not None)
                for item in cur:
                    got = jsonpath_get(item, rel)
                    if (str(got) == want if got is not None else False) == (op == "=="):
                        nxt.append(item)
        current = nxt
        if not current:
            return None
    return current[0] if current else None


def _cell(col: dict[str, Any], obj: dict[str, Any], now: _dt.datetime) -> Any:
    fn = col.get("fn")
    if fn is not None:
        return fn(obj)
    v = jsonpath_get(obj, col.get("jsonPath", ""))
    if v is None:
        return None
    if col["type"] == "date" and isinstance(v, str):
        try:
            t = _dt.datetime.strptime(v, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_dt.UTC)
            return human_duration((now - t).total_seconds())
        except ValueError:
            return v
    if isinstance(v, (dict, list)):
        import json

        return json.dumps(v, separators=(",", ":"))
    return v


def _safe_cell(col: dict[str, Any], obj: dict[str, Any], now: _dt.datetime) -> Any:
    try:
        return _cell(col, obj, now)
    except (AttributeError, TypeError, ValueError, KeyError):
        return None  # built-in objects are not schema-checked; a malformed field prints <none>


def column_definitions(res: ResourceType) -> list[dict[str, Any]]:
    cols = [
        {
            "name": "Name",
            "type": "string",
            "format": "name",
            "description": "Name must be unique within a namespace.",
            "priority": 0,
        }
    ]
    for c in res.columns:
        cols.append(
            {
                "name": c["name"],
                "type": c["type"],
                "format": c.get("format", ""),
                "description": c.get("description", ""),
                "priority": c.get("priority", 0),
            }
        )
    return cols


#: ``includeObject`` values of a Table request (meta.k8s.io/v1 TableOptions).
INCLUDE_OBJECT = ("None", "Metadata", "Object")


def include_object(value: str | None) -> str:
    """The ``includeObject`` query of a Table request: ``Metadata`` when absent or empty.

    Raises:
        ValueError: not one of :data:`INCLUDE_OBJECT` (kube-apiserver answers 400).
    """
    if not value:
        return "Metadata"
    if value not in INCLUDE_OBJECT:
        raise ValueError(f"unrecognized includeObject value: {value!r}".replace("'", '"'))
    return value


def _row_object(res: ResourceType, obj: dict[str, Any], include: str) -> dict[str, Any] | None:
    # As kube-apiserver: Object is the object as a GET serves it (kubectl asks for it to sort
    # or filter on a field, e.g. ``get events --sort-by=.lastTimestamp``), Metadata (the
    # default) a PartialObjectMetadata, None a null.
    if include == "None":
        return None
    if include == "Object":
        return {"kind": res.kind, "apiVersion": res.api_version, **obj}
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"]}


def table_row(
    res: ResourceType, obj: dict[str, Any], now: _dt.datetime | None = None,
    include: str = "Metadata",
) -> dict[str, Any]:
    """One Table row; its ``object`` as ``include`` (an :data:`INCLUDE_OBJECT` value) asks."""
    now = now or _dt.datetime.now(_dt.UTC)
    cells = [obj["metadata"].get("name")] + [_safe_cell(c, obj, now) for c in res.columns]
    return {"cells": cells, "object": _row_object(res, obj, include)}


def table(
    res: ResourceType,
    objs: list[dict[str, Any]],
    *,
    rv: str = "",
    cont: str = "",
    remaining: int | None = None,
    with_columns: bool = True,
    include: str = "Metadata",
) -> dict[str, Any]:
    """A meta.k8s.io/v1 Table for ``objs``, rows as :func:`table_row` with ``include``."""
    now = _dt.datetime.now(_dt.UTC)
    meta: dict[str, Any] = {}
    if rv:
        meta["resourceVersion"] = rv
    if cont:
        meta["continue"] = cont
    if remaining is not None:
        meta["remainingItemCount"] = remaining
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": column_definitions(res) if with_columns else [],
        "rows": [table_row(res, o, now, include) for o in objs],
    }
