"""The ``/scale`` subresource (``autoscaling/v1`` Scale) of Deployments, ReplicaSets and
StatefulSets: the Scale view of a workload and the workload a Scale write produces (pure;
:meth:`.state.ApiState.write_scale` stores it). ``kubectl scale`` PATCHes this view.
"""

from __future__ import annotations

from typing import Any

from . import errors as E
from .resources import ResourceType

SCALE_API_VERSION = "autoscaling/v1"

# Scale as a resource type, so patches and errors name it as the apiserver does.
SCALE = ResourceType("autoscaling", "v1", "scale", "Scale", True)


def _selector_string(sel: Any) -> str:
    """A metav1.LabelSelector in its string form (requirements sorted by key, as the
    apiserver prints ``status.selector``); "" for a missing or malformed selector."""
    if not isinstance(sel, dict):
        return ""
    parts: list[tuple[str, str]] = []
    labels = sel.get("matchLabels") or {}
    if isinstance(labels, dict):
        parts.extend((str(k), f"{k}={v}") for k, v in labels.items())
    for expr in sel.get("matchExpressions") or ():
        if not isinstance(expr, dict):
            continue
        key, op = str(expr.get("key", "")), expr.get("operator")
        values = ",".join(sorted(str(v) for v in expr.get("values") or ()))
        text = {
            "In": f"{key} in ({values})",
            "NotIn": f"{key} notin ({values})",
            "Exists": key,
            "DoesNotExist": f"!{key}",
        }.get(str(op))
        if text is not None:
            parts.append((key, text))
    return ",".join(t for _, t in sorted(parts))


def scale_of(obj: dict[str, Any]) -> dict[str, Any]:
    """The ``autoscaling/v1`` Scale of a workload object (spec.replicas defaults to 1)."""
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    replicas = spec.get("replicas", 1)
    return {
        "kind": "Scale",
        "apiVersion": SCALE_API_VERSION,
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if k in meta
        },
        # omitempty, as the apiserver encodes it: zero replicas is an empty spec
        "spec": {"replicas": replicas} if replicas else {},
        "status": {
            "replicas": status.get("replicas", 0),
            "selector": _selector_string(spec.get("selector")),
        },
    }


def scaled(res: ResourceType, obj: dict[str, Any], scale: Any) -> dict[str, Any]:
    """The workload ``obj`` with the replicas a Scale write asks for.

    Raises:
        ApiError: 400 a Scale that is not an object or names another object; 409 a stale
            ``metadata.resourceVersion``; 422 replicas missing, not an integer or negative.
    """
    name = obj["metadata"]["name"]
    if not isinstance(scale, dict):
        raise E.bad_request("the object provided is unrecognized (must be a JSON object)")
    meta = scale.get("metadata") or {}
    if not isinstance(meta, dict):
        raise E.bad_request("metadata must be an object")
    if meta.get("name") not in (None, "", name):
        raise E.bad_request(
            f"the name of the object ({meta.get('name')}) does not match the name on the URL "
            f"({name})"
        )
    want_rv = meta.get("resourceVersion")
    if want_rv not in (None, "") and str(want_rv) != obj["metadata"]["resourceVersion"]:
        raise E.conflict(res.plural, res.group, name)
    spec = scale.get("spec") or {}
    # Scale's replicas is omitempty: 0 travels as an absent (or null) field.
    replicas = spec.get("replicas") if isinstance(spec, dict) else None
    if replicas is None:
        replicas = 0
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise E.invalid(
            "Scale",
            "autoscaling",
            name,
            [
                E.field_cause(
                    "FieldValueInvalid",
                    "spec.replicas",
                    f"Invalid value: {replicas!r}: must be greater than or equal to 0",
                )
            ],
        )
    new = dict(obj)
    new["spec"] = dict(obj.get("spec") or {}, replicas=replicas)
    new["metadata"] = dict(obj["metadata"])
    return new
