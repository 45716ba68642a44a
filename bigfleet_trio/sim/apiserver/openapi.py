"""OpenAPI v3 of the embedded apiserver (``/openapi/v3`` and ``/openapi/v3/<group-version>``):
component schemas for the served built-in kinds (the upstream v1.37 definitions, stored in
``builtin-schemas.json.gz`` by :mod:`.openapi_gen`) and for every CRD (its
``openAPIV3Schema`` with descriptions), so ``kubectl explain`` works; PATCH operations that
declare ``fieldValidation``, so kubectl leaves validation to the server.
"""

from __future__ import annotations

import copy
import functools
import gzip
import hashlib
import importlib.resources
import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .resources import ResourceType

if TYPE_CHECKING:
    from .state import ApiState

OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
SUBRESOURCE_KINDS = {
    "scale": ("autoscaling", "v1", "Scale"),
    "eviction": ("policy", "v1", "Eviction"),
    "token": ("authentication.k8s.io", "v1", "TokenRequest"),
}


@functools.lru_cache(maxsize=1)
def builtin_schemas() -> dict[str, Any]:
    """Component schemas of the built-in kinds, by upstream name (never mutate)."""
    data = importlib.resources.files(__package__).joinpath("builtin-schemas.json.gz").read_bytes()
    schemas: dict[str, Any] = json.loads(gzip.decompress(data))
    return schemas


@functools.lru_cache(maxsize=1)
def _by_gvk() -> dict[tuple[str, str, str], str]:
    return {
        (g["group"], g["version"], g["kind"]): name
        for name, s in builtin_schemas().items()
        for g in s.get("x-kubernetes-group-version-kind") or ()
    }


def collect_refs(node: Any, acc: set[str]) -> None:
    """Add the component names every ``$ref`` under ``node`` points at to ``acc``."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            acc.add(ref.rsplit("/", 1)[1])
        for v in node.values():
            collect_refs(v, acc)
    elif isinstance(node, list):
        for v in node:
            collect_refs(v, acc)


def ref_closure(names: Iterable[str], schema: Callable[[str], Any]) -> set[str]:
    """``names`` and every component name their schemas reference, transitively.

    Args:
        names: the roots.
        schema: a component name -> its schema (None: unknown, references nothing).
    """
    todo, seen = list(names), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        acc: set[str] = set()
        collect_refs(schema(name), acc)
        todo.extend(acc - seen)
    return seen


def _closure(names: Iterable[str], schemas: dict[str, Any]) -> dict[str, Any]:
    """``names`` and every built-in schema they reference, transitively."""
    builtin = builtin_schemas()
    seen = ref_closure(names, lambda name: schemas.get(name) or builtin.get(name))
    return {n: schemas.get(n) or builtin[n] for n in sorted(seen) if n in schemas or n in builtin}


def crd_schema_name(res: ResourceType) -> str:
    """The component name the apiserver gives a custom kind: reversed group, version, kind
    (``sh.lucy.bigfleet.v1alpha1.CapacityRequest``)."""
    return ".".join([*reversed(res.group.split(".")), res.version, res.kind])


def crd_schema(res: ResourceType) -> dict[str, Any]:
    """A CRD's ``openAPIV3Schema`` as a component: apiVersion/kind described as for every
    kind, metadata a reference to ObjectMeta, and the kind's group-version-kind."""
    raw = res.validator.schema if res.validator is not None else {"type": "object"}
    schema: dict[str, Any] = copy.deepcopy(raw)
    pod = builtin_schemas()[_by_gvk()[("", "v1", "Pod")]]["properties"]
    props = schema.setdefault("properties", {})
    props["apiVersion"] = dict(pod["apiVersion"])
    props["kind"] = dict(pod["kind"])
    props["metadata"] = dict(pod["metadata"])
    schema.setdefault("type", "object")
    schema["x-kubernetes-group-version-kind"] = [
        {"group": res.group, "kind": res.kind, "version": res.version}
    ]
    return schema


def _schema_names(res: ResourceType, own: dict[str, Any]) -> list[str]:
    names = []
    if res.custom:
        name = crd_schema_name(res)
        own[name] = crd_schema(res)
        names.append(name)
    else:
        name_or_none = _by_gvk().get((res.group, res.version, res.kind))
        if name_or_none is not None:
            names.append(name_or_none)
    for sub in res.extra_subresources:
        gvk = SUBRESOURCE_KINDS.get(sub)
        if gvk is not None and gvk in _by_gvk():
            names.append(_by_gvk()[gvk])
    return names


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def _served(server: ApiState) -> dict[tuple[str, str], list[ResourceType]]:
    out: dict[tuple[str, str], list[ResourceType]] = {}
    for res in server.resources.values():
        out.setdefault((res.group, res.version), []).append(res)
    return out


def openapi_root(server: ApiState) -> dict[str, Any]:
    """``GET /openapi/v3``: one entry per group-version; hashes change with the registry."""
    paths = {}
    for g, v in _served(server):
        p = _gv_path(g, v)
        h = hashlib.sha256(f"{p}:{server.discovery_epoch}".encode()).hexdigest()[:16].upper()
        paths[p] = {"serverRelativeURL": f"/openapi/v3/{p}?hash={h}"}
    return {"paths": paths}


def openapi_gv(server: ApiState, group: str, version: str) -> dict[str, Any] | None:
    """``GET /openapi/v3/<gv>``: component schemas and PATCH operations; None if not served."""
    resources = _served(server).get((group, version))
    if not resources:
        return None
    paths: dict[str, Any] = {}
    prefix = "/" + _gv_path(group, version)
    own: dict[str, Any] = {}
    names: list[str] = []
    for res in sorted(resources, key=lambda r: r.plural):
        names.extend(_schema_names(res, own))
        gvk = {"group": res.group, "version": res.version, "kind": res.kind}
        op = {
            "x-kubernetes-group-version-kind": gvk,
            "x-kubernetes-action": "patch",
            "parameters": [
                {
                    "name": "fieldValidation",
                    "in": "query",
                    "schema": {"type": "string", "uniqueItems": True},
                }
            ],
            "responses": {"200": {"description": "OK"}},
        }
        item = (
            f"{prefix}/namespaces/{{namespace}}/{res.plural}/{{name}}"
            if res.namespaced
            else f"{prefix}/{res.plural}/{{name}}"
        )
        paths[item] = {"patch": op}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.37.0"},
        "paths": paths,
        "components": {"schemas": _closure(names, own)},
    }
