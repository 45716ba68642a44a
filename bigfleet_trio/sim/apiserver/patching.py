"""Patch application: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and a strategic
merge patch subset for built-in kinds.

All functions are pure and never mutate their inputs; unchanged subtrees are shared with the
original (the store never mutates stored objects, so sharing is safe).
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import jsonpointer

from . import errors as E
from .errors import ApiError, bad_request
from .resources import ResourceType


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 merge patch; returns a new value (inputs untouched).

    Maps merge recursively, ``null`` deletes a key, anything else (lists included) replaces.
    """
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            out[key] = merge_patch(out.get(key), value)
        else:
            out[key] = value
    return out


def json_patch(target: dict[str, Any], ops: Any) -> dict[str, Any]:
    """Apply an RFC 6902 JSON patch.

    Raises:
        ApiError: 400 for a malformed patch document; 422-style failures (failed ``test``,
            missing path) are raised as ApiError(422, "Invalid") by the caller's wrapper — here
            they surface as :class:`JsonPatchFailed`.
    """
    if not isinstance(ops, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    try:
        patch = jsonpatch.JsonPatch(ops)
        result = patch.apply(copy.deepcopy(target), in_place=True)
    except jsonpatch.JsonPatchTestFailed as exc:
        raise JsonPatchFailed(
            f"the server rejected our request due to an error in our request: {exc}"
        ) from None
    except (jsonpatch.JsonPatchConflict, jsonpointer.JsonPointerException) as exc:
        raise JsonPatchFailed(str(exc)) from None
    except (jsonpatch.InvalidJsonPatch, TypeError, KeyError, ValueError) as exc:
        raise bad_request(f"invalid JSON patch: {exc}") from None
    if not isinstance(result, dict):
        raise bad_request("JSON patch result is not an object")
    return result


class JsonPatchFailed(Exception):
    """A well-formed JSON patch that cannot be applied (failed test, missing path)."""


# Strategic merge patch: list merge keys per field name (the subset kubectl and the agent use).
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "ownerReferences": "uid",
    "conditions": "type",
    "taints": "key",
    "tolerations": "key",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
    "addresses": "type",
}
# Lists of primitives merged as sets.
SET_LISTS = {"finalizers"}


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Apply the strategic-merge-patch subset used for built-in kinds.

    Supports merge keys (:data:`MERGE_KEYS`), set semantics for ``finalizers``, and the
    directives ``$patch`` (replace/delete/merge), ``$setElementOrder/<list>``,
    ``$retainKeys`` and ``$deleteFromPrimitiveList/<list>``. Other lists are replaced.

    Raises:
        ApiError: 400 on a malformed directive.
    """
    if not isinstance(patch, dict):
        return patch
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    out = dict(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys"):
            continue
        if key.startswith("$setElementOrder/"):
            orders[key.split("/", 1)[1]] = value if isinstance(value, list) else []
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if not isinstance(value, list):
                raise bad_request(f"invalid $deleteFromPrimitiveList for {field}")
            cur = out.get(field)
            if isinstance(cur, list):
                out[field] = [x for x in cur if x not in value]
            continue
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            out[key] = strategic_merge_patch(out.get(key), value)
            if out[key] is None:
                out.pop(key)
        elif isinstance(value, list):
            out[key] = _merge_list(key, out.get(key), value)
        else:
            out[key] = value
    for field, order in orders.items():
        cur = out.get(field)
        if isinstance(cur, list):
            out[field] = _apply_order(field, cur, order)
    if isinstance(retain, list):
        keep = set(retain)
        out = {k: v for k, v in out.items() if k in keep or k not in _retainable(target, patch)}
    return out


def _retainable(target: Any, patch: dict[str, Any]) -> set[str]:
    keys = set(target.keys()) if isinstance(target, dict) else set()
    return keys | {k for k in patch if not k.startswith("$")}


def _merge_list(field: str, cur: Any, patch_list: list[Any]) -> list[Any]:
    cur_list = list(cur) if isinstance(cur, list) else []
    if field in SET_LISTS:
        out = list(cur_list)
        for item in patch_list:
            if item not in out:
                out.append(item)
        return out
    key = MERGE_KEYS.get(field)
    if key is None or not all(isinstance(x, dict) for x in patch_list):
        # A "$patch: replace" marker element replaces the whole list.
        return [x for x in patch_list if not (isinstance(x, dict) and x.get("$patch") == "replace")]
    if any(isinstance(x, dict) and x.get("$patch") == "replace" for x in patch_list):
        return [x for x in patch_list if x.get("$patch") != "replace"]
    out = list(cur_list)
    for item in patch_list:
        k = item.get(key)
        idx = next((i for i, x in enumerate(out) if isinstance(x, dict) and x.get(key) == k), None)
        if item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
            continue
        if idx is None:
            out.append({kk: vv for kk, vv in item.items() if kk != "$patch"})
        else:
            out[idx] = strategic_merge_patch(out[idx], item)
    return out


def _apply_order(field: str, cur: list[Any], order: list[Any]) -> list[Any]:
    key = MERGE_KEYS.get(field)

    def ident(x: Any) -> Any:
        if key is not None and isinstance(x, dict):
            return x.get(key)
        return x

    wanted = [ident(o) for o in order]
    pos = {w: i for i, w in enumerate(wanted) if isinstance(w, (str, int, float, bool))}
    ordered = sorted(
        enumerate(cur),
        key=lambda p: (
            pos.get(ident(p[1]), len(pos) + p[0])
            if isinstance(ident(p[1]), (str, int, float, bool))
            else len(pos) + p[0]
        ),
    )
    return [x for _, x in ordered]


__all__ = [
    "ApiError",
    "apply_patch",
    "merge_patch",
    "json_patch",
    "JsonPatchFailed",
    "strategic_merge_patch",
]


def apply_patch(res: ResourceType, old: dict[str, Any], patch: Any, ct: str) -> dict[str, Any]:
    """``old`` with ``patch`` of media type ``ct`` applied (pure; ``old`` is not mutated).

    Server-side apply is approximated: merge (custom resources) or strategic merge
    (built-ins), with no field ownership.

    Raises:
        ApiError: 400 a patch of the wrong JSON shape; 415 unknown media type; 422 a failed
            JSON-patch operation or a result without metadata.
    """
    name = old["metadata"]["name"]
    if ct == "application/merge-patch+json":
        if not isinstance(patch, dict):
            raise bad_request(
                "json: cannot unmarshal into object: merge patch must be a JSON object"
            )
        new = merge_patch(old, patch)
    elif ct == "application/json-patch+json":
        try:
            new = json_patch(old, patch)
        except JsonPatchFailed as exc:
            raise E.invalid(
                res.kind, res.group, name, [E.field_cause("FieldValueInvalid", "", str(exc))]
            ) from None
    elif ct == "application/strategic-merge-patch+json":
        if not isinstance(patch, dict):
            raise bad_request("strategic merge patch must be a JSON object")
        new = strategic_merge_patch(old, patch)
    elif ct == "application/apply-patch+yaml":
        if not isinstance(patch, dict):
            raise bad_request("apply patch must be an object")
        new = merge_patch(old, patch) if res.custom else strategic_merge_patch(old, patch)
    else:
        raise E.unsupported_media_type(ct)
    if not isinstance(new, dict) or not isinstance(new.get("metadata"), dict):
        raise E.invalid(
            res.kind,
            res.group,
            name,
            [E.field_cause("FieldValueRequired", "metadata", "Required value")],
        )
    return new
