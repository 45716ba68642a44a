"""Resource quantities in Pods and Pod templates, checked as kube-apiserver checks them.

kube-apiserver refuses a quantity it cannot parse while decoding the body (400, before any
validation), then validates the parsed ones (422): none negative, an integer for extended
resources, requests at most the limits (equal for resources that cannot be overcommitted, which
also need a limit). The embedded apiserver runs both on every write of a Pod or of a workload's
Pod template (docs/deviations.md#pod-quantities), and ``demo --workloads`` runs them on each
manifest before anything starts. Pure functions over plain objects.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from bigfleet_trio.quantity import Quantity, QuantityError

from .errors import field_cause

__all__ = ["QUANTITY_FORMAT", "decode_problem", "pod_specs", "quantity_causes", "refusal"]

#: Go's ``resource.ErrFormatWrong``: what kube-apiserver says of an unparsable quantity.
QUANTITY_FORMAT = ("quantities must match the regular expression "
                   "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
_NUMERIC = "unable to parse numeric part of quantity"
_SUFFIX = "unable to parse quantity's suffix"

# Where each kind keeps its Pod spec (a CronJob's is one level deeper).
_TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "PodTemplate": ("template", "spec"),
    "ReplicationController": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
_INTEGER_NATIVE = frozenset({"pods", "services", "replicationcontrollers", "resourcequotas",
                             "secrets", "configmaps", "persistentvolumeclaims",
                             "services.nodeports", "services.loadbalancers"})


def pod_specs(obj: Mapping[str, Any], kind: str | None = None
              ) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``(dotted path, Pod spec)`` of the Pod spec an object of a built-in kind (``kind``, or
    the object's own) carries; none for other kinds or a spec that is not an object."""
    path = _TEMPLATE_PATHS.get(kind or str(obj.get("kind") or ""))
    cur: Any = obj
    for step in path or ():
        cur = cur.get(step) if isinstance(cur, Mapping) else None
    if path and isinstance(cur, Mapping):
        yield ".".join(path), cur


def _resource_maps(prefix: str, spec: Mapping[str, Any]
                   ) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """``(requirements path, section, {name: raw value})`` of every resource map in a spec."""
    for key in _CONTAINER_LISTS:
        containers = spec.get(key)
        for i, c in enumerate(containers if isinstance(containers, list) else []):
            res = c.get("resources") if isinstance(c, Mapping) else None
            if isinstance(res, Mapping):
                for section in ("limits", "requests"):
                    if isinstance(res.get(section), Mapping):
                        yield f"{prefix}.{key}[{i}].resources", section, res[section]
    res = spec.get("resources")  # Pod-level resources
    if isinstance(res, Mapping):
        for section in ("limits", "requests"):
            if isinstance(res.get(section), Mapping):
                yield f"{prefix}.resources", section, res[section]
    if isinstance(spec.get("overhead"), Mapping):
        yield prefix, "overhead", spec["overhead"]


def _parse(raw: Any) -> Quantity | str:
    """The quantity Go's ``Quantity.UnmarshalJSON`` makes of a JSON value, or its error."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        return QUANTITY_FORMAT  # true, [..], {..}: not a quantity's text
    try:
        return Quantity.parse(raw.strip() if isinstance(raw, str) else repr(raw))
    except QuantityError as exc:
        text = str(exc)
        if "unknown suffix" in text or "exponent" in text:
            return _SUFFIX
        return _NUMERIC if "numeric part" in text else QUANTITY_FORMAT


def decode_problem(obj: Mapping[str, Any], kind: str | None = None) -> tuple[str, str] | None:
    """The first quantity kube-apiserver could not decode: ``(field, Go's error text)``, or
    None. kube-apiserver answers 400 ``<Kind> in version "<v>" cannot be handled as a <Kind>:
    <error text>`` (it names no field; the demo does)."""
    for prefix, spec in pod_specs(obj, kind):
        for path, section, values in _resource_maps(prefix, spec):
            for name, raw in values.items():
                if raw is None:
                    continue  # null decodes as zero
                got = _parse(raw)
                if isinstance(got, str):
                    return f"{path}.{section}[{name}]", got
    return None


def _native(name: str) -> bool:
    return "/" not in name or "kubernetes.io/" in name


def _integer(name: str) -> bool:
    return name in _INTEGER_NATIVE or (not _native(name) and not name.startswith("requests."))


def _invalid(path: str, value: Quantity, message: str) -> dict[str, str]:
    return field_cause("FieldValueInvalid", path, f'Invalid value: "{value}": {message}')


def _requirement_causes(path: str, limits: dict[str, Quantity],
                        requests: dict[str, Quantity]) -> list[dict[str, str]]:
    causes: list[dict[str, str]] = []
    for section, values in (("limits", limits), ("requests", requests)):
        for name in sorted(values):
            q, where = values[name], f"{path}.{section}[{name}]"
            if q.sign() < 0:
                causes.append(_invalid(where, q, "must be greater than or equal to 0"))
            if _integer(name) and q.value != q.value.to_integral_value():
                causes.append(_invalid(where, q, "must be an integer"))
    for name in sorted(requests):
        q, limit = requests[name], limits.get(name)
        overcommit = _native(name) and not name.startswith("hugepages-")
        if limit is None:
            if not overcommit:
                causes.append(field_cause("FieldValueRequired", f"{path}.limits",
                                          "Required value: Limit must be set for non "
                                          "overcommitable resources"))
        elif not overcommit and q != limit:
            causes.append(_invalid(f"{path}.requests", q,
                                   f"must be equal to {name} limit of {limit}"))
        elif limit < q:
            causes.append(_invalid(f"{path}.requests", q,
                                   f"must be less than or equal to {name} limit of {limit}"))
    return causes


def quantity_causes(obj: Mapping[str, Any], kind: str | None = None) -> list[dict[str, str]]:
    """The 422 causes kube-apiserver's validation gives the resource quantities of an object
    that decoded (:func:`decode_problem` None): a list of ``{reason, message, field}``.

    Requests default to the limits first, as kube-apiserver defaults a container's missing
    requests before validating.
    """
    causes: list[dict[str, str]] = []
    for prefix, spec in pod_specs(obj, kind):
        parsed: dict[str, dict[str, dict[str, Quantity]]] = {}
        for path, section, values in _resource_maps(prefix, spec):
            parsed.setdefault(path, {})[section] = {
                str(k): q for k, v in values.items() if v is not None
                for q in [_parse(v)] if isinstance(q, Quantity)}
        for path, sections in parsed.items():
            if "overhead" in sections:
                causes += [_invalid(f"{path}.overhead[{k}]", q, "must be greater than or equal "
                                    "to 0") for k, q in sorted(sections.pop("overhead").items())
                           if q.sign() < 0]
            if not sections:
                continue
            limits = sections.get("limits", {})
            requests = {**limits, **sections.get("requests", {})}
            causes += _requirement_causes(path, limits, requests)
    return causes


def refusal(obj: Mapping[str, Any]) -> str | None:
    """Why kube-apiserver would refuse the quantities of a manifest, as one line naming the
    field (``<field>: <kube-apiserver's words> (400 BadRequest)``, or the first 422 cause with
    ``(422 Invalid)``), or None."""
    bad = decode_problem(obj)
    if bad is not None:
        return f"{bad[0]}: {bad[1]} (kube-apiserver refuses it: 400 BadRequest)"
    causes = quantity_causes(obj)
    if causes:
        more = f"; and {len(causes) - 1} more" if len(causes) > 1 else ""
        first = causes[0]
        return (f"{first['field']}: {first['message']}{more} (kube-apiserver refuses it: "
                "422 Invalid)")
    return None
