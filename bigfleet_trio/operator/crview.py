"""Slim informer projection of a CapacityRequest, the input of the roll-up.

The operator's CR informer caches every CR for the roll-up (docs/architecture.md#data-flow),
one object per Pod in the cluster (100K at scale). :func:`slim` is the informer
``transform``: it keeps only what the roll-up (``spec``) and the acknowledgement (identity +
``status.phase``) read:

    {"apiVersion", "kind",
     "metadata": {"name", "namespace", "uid", "resourceVersion",
                  "podName"},   # the controlling Pod's name, for its Events (one string)
     "spec": {requirements, resources, priority, topologySpread, coLocation,
              interruptionPenalty, reclamationPenalty},
     "status": {"phase", "conditions": [{"type", "status", "reason", "lastTransitionTime"}]}}

``conditions`` without their messages (the outcome pass rewrites them whole: :mod:`.outcomes`);
equal status objects are shared, as specs are.

The projection is **read-only** (shared between CRs): never mutate a cached CR in place.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["POD_NAME_KEY", "SPEC_FIELDS", "slim"]

SPEC_FIELDS: Final = (
    "requirements",
    "resources",
    "priority",
    "topologySpread",
    "coLocation",
    "interruptionPenalty",
    "reclamationPenalty",
)
_METADATA_FIELDS: Final = ("name", "namespace", "uid", "resourceVersion")
POD_NAME_KEY: Final = "podName"
"""``metadata`` key of the slim view holding the owner Pod's name (not a Kubernetes field)."""
# Memory: specs repeat massively (~hundreds of profiles for 100K Pods), so equal specs and equal
# status objects are shared through these bounded intern tables, and short strings are interned.
# Hence the read-only rule: a change is a patch to the apiserver, never an edit of the cache.
_INTERN_LIMIT: Final = 20_000
_specs: dict[str, dict[str, Any]] = {}
_statuses: dict[tuple[str, tuple[tuple[Any, ...], ...]], dict[str, Any]] = {}


def _intern(v: Any) -> Any:
    if isinstance(v, str):
        return sys.intern(v) if len(v) <= 256 else v
    if isinstance(v, Mapping):
        return {_intern(k): _intern(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_intern(x) for x in v]
    return v


def _shared_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    kept = {k: spec[k] for k in SPEC_FIELDS if k in spec}
    try:
        sig = json.dumps(kept, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return _intern(kept)  # type: ignore[no-any-return]
    hit = _specs.get(sig)
    if hit is not None:
        return hit
    out: dict[str, Any] = _intern(kept)
    if len(_specs) < _INTERN_LIMIT:
        _specs[sig] = out
    return out


def slim(cr: dict[str, Any]) -> dict[str, Any]:
    """Informer transform: the slim, read-only view of a CapacityRequest.

    Args:
        cr: the full object from list/watch.

    Returns:
        A new dict (shape in the module docstring). Missing parts are simply absent;
        a non-object spec is kept as-is so the roll-up can report it.
    """
    md = cr.get("metadata") or {}
    out: dict[str, Any] = {
        "apiVersion": _intern(cr.get("apiVersion", "")),
        "kind": _intern(cr.get("kind", "")),
        "metadata": {
            k: (sys.intern(md[k]) if k == "namespace" and isinstance(md[k], str) else md[k])
            for k in _METADATA_FIELDS
            if k in md
        },
    }
    spec = cr.get("spec")
    if isinstance(spec, Mapping):
        out["spec"] = _shared_spec(spec)
    elif spec is not None:
        out["spec"] = spec
    pod = _owner_pod(md.get("ownerReferences"))
    if pod is not None:
        out["metadata"][POD_NAME_KEY] = pod
    status = cr.get("status")
    if isinstance(status, Mapping) and "phase" in status:
        phase = status.get("phase")
        conds = _conditions(status.get("conditions"))
        key = (phase if isinstance(phase, str) else repr(phase), conds)
        shared = _statuses.get(key)
        if shared is None:
            shared = {"phase": phase}
            if conds:
                shared["conditions"] = [dict(zip(_CONDITION_FIELDS, c, strict=True))
                                        for c in conds]
            if len(_statuses) < _INTERN_LIMIT:
                _statuses[key] = shared
        out["status"] = shared
    return out


_CONDITION_FIELDS: Final = ("type", "status", "reason", "lastTransitionTime")


def _conditions(raw: object) -> tuple[tuple[Any, ...], ...]:
    if not isinstance(raw, list):
        return ()
    return tuple(
        tuple(_intern(c.get(f)) for f in _CONDITION_FIELDS)
        for c in raw
        if isinstance(c, Mapping) and isinstance(c.get("type"), str)
    )


def _owner_pod(refs: object) -> str | None:
    """The name of the Pod among the ownerReferences (its uid is in the CR's name: a string
    per CR is all the Events need, where the reference itself would cost ~500 bytes)."""
    for ref in refs if isinstance(refs, list) else ():
        if isinstance(ref, Mapping) and ref.get("kind") == "Pod" and isinstance(
                ref.get("name"), str):
            return ref["name"]  # type: ignore[no-any-return]
    return None
