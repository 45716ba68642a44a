"""What the pod controller keeps in memory of Pods and CapacityRequests, and how it finds them.

:func:`slim_pod` and :func:`slim_cr` are the informers' transforms (only the fields the
translation and the controller read, so a cached Pod costs a fraction of the full object);
the ``index_*`` functions are the caches' indexers; the rest read owner and identity fields.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import orjson

from ..kube.disruption import DO_NOT_DISRUPT, SAFE_TO_EVICT
from .scope import EXCLUDED_KEY, NODE_NAME_KEY, PodScope
from .translate import (
    INTERRUPTION_PENALTY_ANNOTATION,
    OWNED_BY_POD_LABEL,
    RECLAMATION_PENALTY_ANNOTATION,
)
from .zonepin import PIN_ANNOTATION, ZONE_LABEL

__all__ = [
    "OWNED_BY_POD_KEY",
    "OWNER_POD_KEY",
    "index_owner_pod",
    "index_owner_uid",
    "index_pod_uid",
    "object_key",
    "owner_pod_name",
    "owner_uid",
    "pod_unchanged",
    "resource_version",
    "slim_cr",
    "slim_pod",
]

_ANNOTATIONS_KEPT = (INTERRUPTION_PENALTY_ANNOTATION, RECLAMATION_PENALTY_ANNOTATION,
                     PIN_ANNOTATION, DO_NOT_DISRUPT, SAFE_TO_EVICT)
# the Pod's owners are not read; generation tells a spec change apart (pod_unchanged)
_POD_META = ("name", "namespace", "uid", "generation", "deletionTimestamp")
_POD_SPEC = (
    "nodeSelector",
    "overhead",
    "resources",
    "priority",
    "priorityClassName",
    "topologySpreadConstraints",
)
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


# --------------------------------------------------------------------------------------------
# projections and pure helpers


def _slim_containers(value: Any, *, init: bool) -> Any:
    if not isinstance(value, list):
        return value  # malformed: keep it so translation reports it
    out = []
    for c in value:
        if not isinstance(c, Mapping):
            out.append(c)
            continue
        slim: dict[str, Any] = {}
        resources = c.get("resources")
        if isinstance(resources, Mapping):
            if "requests" in resources:
                slim["resources"] = {"requests": resources["requests"]}
        elif resources is not None:
            slim["resources"] = resources
        if init and "restartPolicy" in c:
            slim["restartPolicy"] = c["restartPolicy"]
        out.append(slim)
    return out


def slim_pod(obj: Mapping[str, Any], scope: PodScope | None = None) -> dict[str, Any]:
    """The Pod as the controller keeps it in memory (informer transform).

    Keeps ``metadata`` name/namespace/uid/deletionTimestamp, the two penalty annotations and
    the zone-pin opt-out, and the labels of a bound Pod that carries its Node's zone (what the
    co-location zone pin matches: :mod:`.zonepin`; shared between equal label sets); ``spec``
    fields :func:`~.translate.translate_pod` reads (container requests, init-container
    restartPolicy, required node/pod affinity, nodeSelector, overhead, pod-level resources,
    priority, priorityClassName, topologySpreadConstraints); ``status.phase``.
    Malformed shapes are kept as they are so translation reports them. ``apiVersion``/``kind``
    are always ``v1``/``Pod`` (Events need them).

    With a ``scope`` (docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out), two more
    ``metadata`` keys: ``nodeName`` (:data:`~.scope.NODE_NAME_KEY`, the interned
    ``spec.nodeName`` of a bound Pod, when some Node may be unmanaged; kept out of the shared
    ``spec``) and
    ``excluded`` (:data:`~.scope.EXCLUDED_KEY`, True when the Pod's labels match
    ``--exclude-pod-selector``: the labels themselves are not kept).
    """
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    spec = obj.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    status = obj.get("status")
    status = status if isinstance(status, Mapping) else {}
    out_meta = _slim_meta(meta, spec.get("nodeName"), scope)
    out_spec: dict[str, Any] = {k: spec[k] for k in _POD_SPEC if k in spec}
    if "containers" in spec:
        out_spec["containers"] = _slim_containers(spec["containers"], init=False)
    if "initContainers" in spec:
        out_spec["initContainers"] = _slim_containers(spec["initContainers"], init=True)
    affinity = spec.get("affinity")
    if isinstance(affinity, Mapping):
        slim_aff: dict[str, Any] = {}
        for part in ("nodeAffinity", "podAffinity"):
            section = affinity.get(part)
            if isinstance(section, Mapping):
                if _REQUIRED in section:
                    slim_aff[part] = {_REQUIRED: section[_REQUIRED]}
            elif section is not None:
                slim_aff[part] = section
        if slim_aff:
            out_spec["affinity"] = slim_aff
    elif affinity is not None:
        out_spec["affinity"] = affinity
    out: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": out_meta,
        "spec": _share(out_spec),
    }
    if "phase" in status:
        out["status"] = _share({"phase": status["phase"]})
    return out


def _slim_meta(meta: Mapping[str, Any], node: Any, scope: PodScope | None) -> dict[str, Any]:
    """:func:`slim_pod`'s ``metadata``, from the Pod's metadata and its ``spec.nodeName``: all
    it reads besides the spec and the phase (:func:`pod_unchanged` compares exactly this)."""
    out: dict[str, Any] = {k: meta[k] for k in _POD_META if k in meta}
    annotations = meta.get("annotations")
    if isinstance(annotations, Mapping):
        kept = {k: annotations[k] for k in _ANNOTATIONS_KEPT if k in annotations}
        if kept:
            out["annotations"] = kept
    elif annotations is not None:
        out["annotations"] = annotations
    labels = meta.get("labels")
    if node and isinstance(labels, Mapping) and labels.get(ZONE_LABEL):
        out["labels"] = _share(dict(labels))
    ns = out.get("namespace")
    if type(ns) is str:
        out["namespace"] = sys.intern(ns)
    if scope is not None:
        if scope.watches_nodes and isinstance(node, str) and node:
            out[NODE_NAME_KEY] = sys.intern(node)
        if scope.pod_labels_excluded(labels if isinstance(labels, Mapping) else None):
            out[EXCLUDED_KEY] = True
    return out


def pod_unchanged(old: Mapping[str, Any], new: Mapping[str, Any],
                  scope: PodScope | None = None) -> bool:
    """True when the MODIFIED Pod ``new`` would project (:func:`slim_pod`) to the cached ``old``
    unchanged, decided without projecting its spec: the informer then skips the event before the
    projection (docs/kube-api.md#unchanged-pod-events).

    kube-apiserver bumps a Pod's ``metadata.generation`` on every change of its spec but the
    binding's ``nodeName`` (which is read here), and never on a status write; so with the
    generation unchanged, what is left to compare is ``metadata`` (as :func:`_slim_meta` keeps
    it) and ``status.phase``. A Pod without a generation (an apiserver that does not set it)
    is never skipped.

    Args:
        old: the cached projection (:func:`slim_pod` with the same ``scope``).
        new: the incoming Pod, JSON-shaped: the whole object, or the head the protobuf decoder
            builds (metadata, ``spec.nodeName``, ``status.phase``: kube/protowire.py).
    """
    meta = new.get("metadata")
    old_meta = old.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(old_meta, Mapping):
        return False
    generation = meta.get("generation")
    if generation is None or generation != old_meta.get("generation"):
        return False
    status = new.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    old_status = old.get("status")
    if phase != (old_status.get("phase") if isinstance(old_status, Mapping) else None):
        return False
    spec = new.get("spec")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    return _slim_meta(meta, node, scope) == old_meta


_SHARED_MAX = 4096
_shared: dict[bytes, Any] = {}


def _share(value: Any) -> Any:
    """One object for equal projections: the Pods of one workload template have equal slim
    specs, so the cache holds one spec per template instead of one per Pod (cached objects are
    read-only by the informer's contract). At most ``_SHARED_MAX`` distinct values are
    remembered (oldest forgotten first); a value orjson cannot encode is not shared."""
    try:
        key = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return value
    hit = _shared.get(key)
    if hit is not None:
        return hit
    if len(_shared) >= _SHARED_MAX:
        del _shared[next(iter(_shared))]
    _shared[key] = value
    return value


OWNED_BY_POD_KEY = "ownedByPod"
"""Key in a cached CR's ``metadata`` (:func:`slim_cr`): the value of its
``bigfleet.lucy.sh/owned-by-pod`` label (its Pod's uid)."""
OWNER_POD_KEY = "ownerPod"
"""Key in a cached CR's ``metadata``: the name of its first ``ownerReference`` of kind Pod."""


def slim_cr(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The CapacityRequest as the controller keeps it: name, namespace, uid and
    deletionTimestamp; the owned-by-pod label's value (:data:`OWNED_BY_POD_KEY`) and the owner
    Pod's name (:data:`OWNER_POD_KEY`), the only parts of labels and ownerReferences anything
    reads, as two strings (a labels dict, a list and an ownerReference dict would cost about
    450 bytes more per CR); spec and status.phase (both shared between equal CRs: read-only).
    Read the owner through :func:`owner_uid` and :func:`owner_pod_name`, which take the full
    object too."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    out_meta: dict[str, Any] = {
        k: meta[k] for k in ("name", "namespace", "uid", "deletionTimestamp") if k in meta
    }
    ns = out_meta.get("namespace")
    if type(ns) is str:
        out_meta["namespace"] = sys.intern(ns)
    uid = owner_uid(obj)
    if uid:
        out_meta[OWNED_BY_POD_KEY] = uid
    owner = owner_pod_name(obj)
    if owner is not None:
        out_meta[OWNER_POD_KEY] = owner
    status = obj.get("status")
    out: dict[str, Any] = {"metadata": out_meta, "spec": _share(obj.get("spec"))}
    if isinstance(status, Mapping) and "phase" in status:
        out["status"] = _share({"phase": status["phase"]})
    return out


def owner_uid(cr: Mapping[str, Any]) -> str:
    """The uid of the Pod a CR belongs to, from a cached CR (:func:`slim_cr`) or the full
    object's owned-by-pod label ("" when absent or not a string)."""
    meta = cr.get("metadata")
    if not isinstance(meta, Mapping):
        return ""
    uid = meta.get(OWNED_BY_POD_KEY)
    if uid is None:
        labels = meta.get("labels")
        uid = labels.get(OWNED_BY_POD_LABEL) if isinstance(labels, Mapping) else None
    return uid if isinstance(uid, str) else ""


def owner_pod_name(cr: Mapping[str, Any]) -> str | None:
    """The name of a CR's owner Pod, from a cached CR (:func:`slim_cr`) or the full object's
    first ``ownerReference`` of kind Pod with a string name (None when there is none)."""
    meta = cr.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    name = meta.get(OWNER_POD_KEY)
    if isinstance(name, str):
        return name
    refs = meta.get("ownerReferences")
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if isinstance(ref, Mapping) and ref.get("kind") == "Pod":
            name = ref.get("name")
            if isinstance(name, str):
                return name
    return None


def resource_version(obj: Mapping[str, Any]) -> str | None:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return rv if isinstance(rv, str) and rv else None


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def index_owner_uid(cr: Mapping[str, Any]) -> list[str]:
    uid = owner_uid(cr)
    return [uid] if uid else []


def index_owner_pod(cr: Mapping[str, Any]) -> list[str]:
    name = owner_pod_name(cr)
    return [f"{cr.get('metadata', {}).get('namespace', '')}/{name}"] if name else []


def index_pod_uid(pod: Mapping[str, Any]) -> list[str]:
    uid = pod.get("metadata", {}).get("uid")
    return [uid] if isinstance(uid, str) and uid else []
