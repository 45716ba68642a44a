"""Pure helpers over stored objects for the embedded apiserver's verbs: timestamps, change
detection, body checks, schema pruning/validation, Pod QoS and the list page shape.

Nothing here touches the store; :mod:`.state` applies the results.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable
from typing import Any

from bigfleet_trio.kube.labelselector import Requirement, match_labels

from . import errors as E
from .metadata import metadata_type_error, validate_name, validate_path_segment_name
from .resources import ResourceType
from .selectors import FieldRequirement

PROTECTED_NAMESPACES = ("default", "kube-system", "kube-public")
INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def now_rfc3339() -> str:
    """Current UTC time, second precision, ``Z`` suffix."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def content(obj: dict[str, Any]) -> dict[str, Any]:
    """The generation-relevant content: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal ignoring metadata.resourceVersion/managedFields (a no-op write keeps the RV)."""
    if a.keys() != b.keys():
        return False
    for k, v in a.items():
        if k == "metadata":
            ma, mb = v, b["metadata"]
            skip = ("resourceVersion", "managedFields")
            if {x: y for x, y in ma.items() if x not in skip} != {
                x: y for x, y in mb.items() if x not in skip
            }:
                return False
        elif v != b[k]:
            return False
    return True


def to_int(v: Any, default: int = 0) -> int:
    """int(v) for status fields that no schema guards; ``default`` when not a number."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def pod_qos(pod: dict[str, Any]) -> str:
    """The Pod's QoS class (BestEffort / Burstable / Guaranteed); BestEffort when malformed."""
    try:
        return _pod_qos_unchecked(pod)
    except (AttributeError, TypeError):
        return "BestEffort"


def _pod_qos_unchecked(pod: dict[str, Any]) -> str:
    containers = (pod.get("spec") or {}).get("containers") or []
    any_set = False
    guaranteed = bool(containers)
    for c in containers:
        r = c.get("resources") or {}
        req, lim = r.get("requests") or {}, r.get("limits") or {}
        if req or lim:
            any_set = True
        for k in ("cpu", "memory"):
            if k not in lim or (k in req and req[k] != lim[k]):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def validate_schema(
    res: ResourceType, obj: dict[str, Any], field_validation: str
) -> tuple[dict[str, Any], list[str]]:
    """Prune/default and validate a custom resource, check the quantities of a built-in Pod or
    Pod template (:func:`check_pod_quantities`); returns (object, warnings).

    Raises:
        ApiError: 400 unknown fields under ``Strict`` or an unparsable quantity; 422 schema
            violations or invalid quantities.
    """
    if res.validator is None:
        if not res.custom:
            check_pod_quantities(res, obj)
        return obj, []
    pruned, unknown = res.validator.prune(obj)
    name = obj["metadata"].get("name") or obj["metadata"].get("generateName", "")
    if unknown and field_validation == "Strict":
        msgs = ", ".join(f'unknown field "{u}"' for u in unknown)
        raise E.bad_request(f"strict decoding error: {msgs}")
    causes = res.validator.validate(pruned)
    if causes:
        raise E.invalid(res.kind, res.group, name, causes)
    warnings = [f'unknown field "{u}"' for u in unknown] if field_validation != "Ignore" else []
    return pruned, warnings


def check_pod_quantities(res: ResourceType, obj: dict[str, Any]) -> None:
    """Refuse the resource quantities kube-apiserver refuses in a Pod or a Pod template
    (:mod:`.podresources`, docs/deviations.md#pod-quantities).

    Raises:
        ApiError: 400 a quantity that does not parse (kube-apiserver's decoding error); 422
            one negative, fractional for an integer resource, or above its limit.
    """
    from .podresources import decode_problem, quantity_causes

    bad = decode_problem(obj, res.kind)
    if bad is not None:
        raise E.bad_request(f'{res.kind} in version "{res.version}" cannot be handled as a '
                            f"{res.kind}: {bad[1]}")
    causes = quantity_causes(obj, res.kind)
    if causes:
        name = obj["metadata"].get("name") or obj["metadata"].get("generateName", "")
        raise E.invalid(res.kind, res.group, name, causes)


def check_body_meta(res: ResourceType, namespace: str | None, body: Any) -> dict[str, Any]:
    """The body's ``metadata`` after shape checks (kind, apiVersion, namespace, field types).

    Raises:
        ApiError: 400 on any mismatch or wrongly typed field.
    """
    if not isinstance(body, dict):
        raise E.bad_request("the object provided is unrecognized (must be a JSON object)")
    meta = body.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise E.bad_request(
            "json: cannot unmarshal into Go struct field of type v1.ObjectMeta: "
            "metadata must be an object"
        )
    err = metadata_type_error(meta)
    if err:
        raise E.bad_request(err)
    kind = body.get("kind")
    if kind is not None and kind != res.kind:
        raise E.bad_request(
            f"the kind of the provided object ({kind}) does not match the resource ({res.kind})"
        )
    av = body.get("apiVersion")
    if av is not None and av != res.api_version:
        raise E.bad_request(
            f"the API version in the data ({av}) does not match the expected API version "
            f"({res.api_version})"
        )
    if not res.custom:
        for field in ("spec", "status"):
            v = body.get(field)
            if v is not None and not isinstance(v, dict):
                raise E.bad_request(
                    f"json: cannot unmarshal {type(v).__name__} into Go struct field "
                    f"{res.kind}.{field} of type object"
                )
    bns = meta.get("namespace")
    if res.namespaced and bns and namespace and bns != namespace:
        raise E.bad_request(
            "the namespace of the provided object does not match the namespace sent on the "
            "request"
        )
    return meta


_IMMUTABLE_META = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "generateName",
)


def merge_write(
    res: ResourceType,
    old: dict[str, Any],
    new: dict[str, Any],
    new_meta: dict[str, Any],
    subresource: str | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The object an update of ``old`` to ``new`` stores, and its (fresh) metadata dict.

    A ``/status`` write takes only ``status``; a main-resource write keeps the stored status
    (kinds with a status subresource) and the server-owned metadata fields; an object being
    deleted accepts no new finalizers.

    Raises:
        ApiError: 422 new finalizers on an object being deleted.
    """
    ometa = old["metadata"]
    if subresource == "status":
        obj = dict(old)
        if "status" in new:
            obj["status"] = new["status"]
        else:
            obj.pop("status", None)
        return obj, dict(ometa)
    obj = {"apiVersion": res.api_version, "kind": res.kind}
    obj.update((k, v) for k, v in new.items() if k not in ("apiVersion", "kind"))
    if res.status:
        if "status" in old:
            obj["status"] = old["status"]
        else:
            obj.pop("status", None)
    meta = dict(new_meta)
    for k in _IMMUTABLE_META:
        if k in ometa:
            meta[k] = ometa[k]
        else:
            meta.pop(k, None)
    if ometa.get("deletionTimestamp"):
        added = set(meta.get("finalizers") or ()) - set(ometa.get("finalizers") or ())
        if added:
            raise E.invalid(
                res.kind,
                res.group,
                ometa["name"],
                [
                    E.field_cause(
                        "FieldValueForbidden",
                        "metadata.finalizers",
                        "Forbidden: no new finalizers can be added if the object is "
                        "being deleted, found new finalizers " + str(sorted(added)),
                    )
                ],
            )
    return obj, meta


def create_defaults(res: ResourceType, obj: dict[str, Any]) -> None:
    """Fill what the apiserver sets on create (in place, on a fresh object): Pods start
    Pending with their QoS class; Namespaces Active with the name label and the kubernetes
    finalizer; Events their zero fields; other kinds with a status subresource drop a
    client-sent status (Nodes keep theirs: kubelets register with one)."""
    meta = obj["metadata"]
    if res.plural == "pods" and not res.group:
        obj["status"] = {"phase": "Pending", "qosClass": pod_qos(obj)}
    elif res.plural == "namespaces" and not res.group:
        meta["labels"] = dict(
            meta.get("labels") or {}, **{"kubernetes.io/metadata.name": meta["name"]}
        )
        obj["status"] = {"phase": "Active"}
        obj["spec"] = {"finalizers": ["kubernetes"]}
    elif res.plural == "events" and not res.group:
        # core/v1 Event fields without omitempty (zero times serialise as null)
        for key, zero in (("eventTime", None), ("firstTimestamp", None),
                          ("lastTimestamp", None), ("reportingComponent", ""),
                          ("reportingInstance", "")):
            obj.setdefault(key, zero)
    elif res.status and res.plural != "nodes":
        obj.pop("status", None)


def name_causes(res: ResourceType, name: Any) -> list[dict[str, str]]:
    """Why ``name`` is not a valid name for ``res`` (empty when valid): RBAC objects need only
    be a path segment (``system:discovery``), Namespaces a DNS label, others a DNS subdomain."""
    if res.group == "rbac.authorization.k8s.io":
        return validate_path_segment_name(name)
    return validate_name(name, label=res.plural == "namespaces")


def filter_objects(
    res: ResourceType,
    objs: Iterable[dict[str, Any]],
    labels: list[Requirement],
    fields: list[FieldRequirement],
) -> list[dict[str, Any]]:
    """The objects matching parsed label and field selectors, in order."""
    if not labels and not fields:
        return list(objs)
    out = []
    for o in objs:
        if labels and not match_labels(labels, o["metadata"].get("labels")):
            continue
        if fields and not all((op == "=") == (res.field_value(o, f) == v) for f, op, v in fields):
            continue
        out.append(o)
    return out


def requested_rv(resource_version: str | None, current: int) -> int | None:
    """The requested resourceVersion as an int (None for unset / "0").

    A version the server has not reached is refused rather than served: after a restore with
    empty state, a client resuming from its old version must relist, not wait for events that
    will never come (client-go relists on this error).

    Raises:
        ApiError: 400 not an integer; 504 newer than ``current``.
    """
    rv_s = resource_version or ""
    if rv_s in ("", "0"):
        return None
    try:
        requested = int(rv_s)
    except ValueError:
        raise E.bad_request(f"invalid resource version: {rv_s!r}") from None
    if requested > current:
        raise E.too_large_resource_version(requested, current)
    return requested


def check_delete(res: ResourceType, obj: dict[str, Any], options: dict[str, Any]) -> None:
    """Refuse a DELETE whose preconditions (uid, resourceVersion) do not hold, or of a
    namespace the system needs.

    Raises:
        ApiError: 409 failed precondition; 403 protected namespace.
    """
    pre = options.get("preconditions") or {}
    meta = obj["metadata"]
    name = meta["name"]
    # kube-apiserver names the Kind (Pod), not the resource, in a failed precondition
    if pre.get("uid") and pre["uid"] != meta.get("uid"):
        raise E.conflict(
            res.kind,
            res.group,
            name,
            f"Precondition failed: UID in precondition: {pre['uid']}, "
            f"UID in object meta: {meta.get('uid')}",
        )
    if pre.get("resourceVersion") and str(pre["resourceVersion"]) != meta["resourceVersion"]:
        raise E.conflict(
            res.kind,
            res.group,
            name,
            "Precondition failed: ResourceVersion in precondition: "
            f"{pre['resourceVersion']}, ResourceVersion in object meta: {meta['resourceVersion']}",
        )
    if res.plural == "namespaces" and not res.group and name in PROTECTED_NAMESPACES:
        raise E.ApiError(
            403,
            "Forbidden",
            f'namespaces "{name}" is forbidden: this namespace may not be deleted',
            {"name": name, "kind": "namespaces"},
        )


class ListResult:
    """One list page: items, the list resourceVersion, continue token and remaining count."""

    __slots__ = ("items", "rv", "cont", "remaining")

    def __init__(
        self, items: list[dict[str, Any]], rv: str, cont: str, remaining: int | None
    ) -> None:
        self.items = items
        self.rv = rv
        self.cont = cont
        self.remaining = remaining
