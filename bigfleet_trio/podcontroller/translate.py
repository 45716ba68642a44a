"""Pure translation Pod -> CapacityRequest, the way kube-scheduler sees the Pod.

Every non-terminal Pod gets exactly one CR (upstream ADR-0039), named from the Pod UID so two
racing reconciles cannot make two. The ownerReference sets ``controller: true`` but not
``blockOwnerDeletion`` (see :func:`build_capacity_request`).

Everything here is pure: no I/O, no clock. Pods are plain JSON dicts as the apiserver returns
them (already defaulted and admitted: ``spec.priority`` and ``spec.overhead`` are resolved;
:mod:`.expand` does that for manifests). The CR ``spec`` is JSON-ready and shaped like the Go
JSON encoding of ``CapacityRequestSpec``:

- ``priority`` (int32, always present; 0 when the Pod has none) and ``resources`` (map of
  canonical quantity strings, always present, ``{}`` when the Pod requests nothing);
- ``requirements``, ``topologySpread`` omitted when empty; ``coLocation`` omitted when none;
  ``interruptionPenalty`` / ``reclamationPenalty`` omitted when absent.

Resource rule (kube-scheduler's ``PodRequests``, component-helpers/resource/helpers.go):

1. containers: ``run = sum(containers[].resources.requests)``; limits are ignored.
2. init containers in order: a sidecar (``restartPolicy: Always``) adds its requests to ``run``
   and to ``sidecars`` and its stage is ``sidecars`` (itself included); a plain init container's
   stage is ``sidecars + its requests``. ``peak = max over stages``.
3. ``result = max(run, peak)`` per resource (union of keys; zero values kept).
4. Pod-level resources: when ``spec.resources.requests`` names a pod-level resource (``cpu``,
   ``memory``, ``hugepages-*``), each such value REPLACES the aggregate for that resource;
   every other resource (``ephemeral-storage``, GPUs, extended resources, and cpu/memory when
   the pod level does not name them) keeps the container aggregate. Other keys in
   ``spec.resources.requests`` are ignored, as kube-scheduler ignores them.
5. ``spec.overhead`` is added last (also on top of pod-level values).

Status-based resize accounting (``UseStatusResources``: max of spec, allocated and actuated
requests during an in-place resize) is not modelled: the spec is the Pod's desired size.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bigfleet_trio.kube.disruption import disruption_blocker
from bigfleet_trio.kube.names import is_dns1123_subdomain
from bigfleet_trio.quantity import Quantity, QuantityError, max_resources, sum_resources

from .defaults import PriorityClassDefaults

__all__ = [
    "CRD_REQUIREMENT_OPERATORS",
    "CR_API_VERSION",
    "CR_KIND",
    "INTERRUPTION_PENALTY_ANNOTATION",
    "OWNED_BY_POD_LABEL",
    "RECLAMATION_PENALTY_ANNOTATION",
    "SYNTHESISED_REQUIREMENT",
    "Translation",
    "TranslationError",
    "build_capacity_request",
    "cr_name_for_pod",
    "is_terminal",
    "pod_resource_requests",
    "translate_pod",
    "unsupported_requirements",
]

CR_API_VERSION = "bigfleet.lucy.sh/v1alpha1"
CR_KIND = "CapacityRequest"
OWNED_BY_POD_LABEL = "bigfleet.lucy.sh/owned-by-pod"
INTERRUPTION_PENALTY_ANNOTATION = "bigfleet.lucy.sh/interruption-penalty"
RECLAMATION_PENALTY_ANNOTATION = "bigfleet.lucy.sh/reclamation-penalty"
#: ``spec.requirements[].operator`` values a CapacityRequest carries: those of a core
#: NodeSelectorRequirement, Gt and Lt included (the CRD's field is a plain string, as upstream's;
#: the node-affinity operators are copied verbatim and the operator keeps Gt/Lt requests out of
#: the roll-up itself). Any other operator cannot come from a Pod a real apiserver admitted: the
#: controller reports it on the Pod instead of writing a CR that means nothing.
CRD_REQUIREMENT_OPERATORS: frozenset[str] = frozenset(
    {"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"}
)
#: What a Pod with no node constraints at all gets, so the matcher has something to bind to.
SYNTHESISED_REQUIREMENT: Mapping[str, str] = {
    "key": "node.kubernetes.io/instance-type",
    "operator": "Exists",
}

_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_POD_LEVEL_RESOURCES = frozenset({"cpu", "memory"})
_HUGEPAGES_PREFIX = "hugepages-"
_CR_NAME_PREFIX = "cr-"


class TranslationError(ValueError):
    """The Pod is malformed in a way the apiserver would have rejected (e.g. a bad quantity)."""


@dataclass(frozen=True)
class Translation:
    """The result of :func:`translate_pod`.

    Attributes:
        spec: the CapacityRequest ``spec`` (JSON-ready; see the module docstring).
        warnings: human-readable problems that did not stop the translation (e.g. an
            unparseable penalty annotation that fell through); the controller turns each into
            an Event and a log line.
    """

    spec: dict[str, Any]
    warnings: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------
# helpers


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    """``value`` as a mapping; None -> {}; anything else is a TranslationError."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TranslationError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TranslationError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _quantity(value: Any, where: str) -> Quantity:
    # YAML manifests may carry bare numbers (``example.com/dongle: 3``); the apiserver accepts
    # them for int-or-string quantities, so do we.
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TranslationError(f"{where}: {value!r} is not a quantity")
    text = value if isinstance(value, str) else str(value)
    try:
        return Quantity.parse(text)
    except QuantityError as exc:
        raise TranslationError(f"{where}: {value!r} is not a quantity: {exc}") from exc


def _resource_list(value: Any, where: str) -> dict[str, Quantity]:
    return {
        str(name): _quantity(q, f"{where}[{name}]") for name, q in _mapping(value, where).items()
    }


def _requests(container: Any, where: str) -> dict[str, Quantity]:
    c = _mapping(container, where)
    resources = _mapping(c.get("resources"), f"{where}.resources")
    return _resource_list(resources.get("requests"), f"{where}.resources.requests")


# --------------------------------------------------------------------------------------------
# the rules


def _requirements(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The first required node-affinity term's matchExpressions, then the nodeSelector."""
    out: list[dict[str, Any]] = []
    affinity = _mapping(spec.get("affinity"), "spec.affinity")
    node_affinity = _mapping(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
    required = node_affinity.get(_REQUIRED)
    has_required = required is not None
    if has_required:
        where = f"spec.affinity.nodeAffinity.{_REQUIRED}"
        terms = _list(_mapping(required, where).get("nodeSelectorTerms"), where)
        if terms:
            first = _mapping(terms[0], f"{where}.nodeSelectorTerms[0]")
            for i, expr in enumerate(_list(first.get("matchExpressions"), "matchExpressions")):
                e = _mapping(expr, f"matchExpressions[{i}]")
                key, op = e.get("key"), e.get("operator")
                if not isinstance(key, str) or not isinstance(op, str):
                    raise TranslationError(
                        f"matchExpressions[{i}]: key and operator must be strings, got {e!r}"
                    )
                # Operator copied verbatim, Gt/Lt included: the operator drops such CRs from
                # the roll-up visibly rather than us guessing a translation here.
                req: dict[str, Any] = {"key": key, "operator": op}
                values = _list(e.get("values"), f"matchExpressions[{i}].values")
                if values:
                    req["values"] = [str(v) for v in values]
                out.append(req)
    node_selector = _mapping(spec.get("nodeSelector"), "spec.nodeSelector")
    for key in sorted(node_selector):
        value = node_selector[key]
        if not isinstance(value, str):
            raise TranslationError(
                f"spec.nodeSelector[{key}]: value must be a string, got {value!r}"
            )
        out.append({"key": key, "operator": "In", "values": [value]})
    if out:
        return out
    if has_required:
        # A required block that selects nothing by label (no terms, empty expressions, or only
        # matchFields as on DaemonSet Pods): no requirements, and no synthesis either.
        return []
    return [dict(SYNTHESISED_REQUIREMENT)]


def _co_location(spec: Mapping[str, Any], warnings: list[str]) -> dict[str, Any] | None:
    """The first required podAffinity term only."""
    affinity = _mapping(spec.get("affinity"), "spec.affinity")
    pod_affinity = _mapping(affinity.get("podAffinity"), "spec.affinity.podAffinity")
    terms = _list(pod_affinity.get(_REQUIRED), f"spec.affinity.podAffinity.{_REQUIRED}")
    if not terms:
        return None
    term = _mapping(terms[0], f"spec.affinity.podAffinity.{_REQUIRED}[0]")
    topology_key = term.get("topologyKey")
    if not isinstance(topology_key, str) or not topology_key:
        warnings.append("required podAffinity term without a topologyKey ignored (no co-location)")
        return None
    out: dict[str, Any] = {}
    selector = term.get("labelSelector")
    if selector is not None:
        out["labelSelector"] = copy.deepcopy(selector)
    out["topologyKey"] = topology_key
    return out


def _topology_spread(spec: Mapping[str, Any], warnings: list[str]) -> list[dict[str, Any]]:
    """DoNotSchedule terms only (unset = DoNotSchedule)."""
    out: list[dict[str, Any]] = []
    where = "spec.topologySpreadConstraints"
    for i, raw in enumerate(_list(spec.get("topologySpreadConstraints"), where)):
        c = _mapping(raw, f"{where}[{i}]")
        when = c.get("whenUnsatisfiable") or "DoNotSchedule"
        if when == "ScheduleAnyway":
            continue
        if when != "DoNotSchedule":
            warnings.append(f"{where}[{i}]: unknown whenUnsatisfiable {when!r} ignored")
            continue
        max_skew, key = c.get("maxSkew"), c.get("topologyKey")
        if isinstance(max_skew, bool) or not isinstance(max_skew, int) or max_skew < 1:
            raise TranslationError(
                f"{where}[{i}].maxSkew: must be an integer >= 1, got {max_skew!r}"
            )
        if not isinstance(key, str) or not key:
            raise TranslationError(f"{where}[{i}].topologyKey: must be a non-empty string")
        out.append({"maxSkew": max_skew, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule"})
    return out


def pod_resource_requests(pod: Mapping[str, Any]) -> dict[str, Quantity]:
    """The Pod's effective resource request as kube-scheduler computes it.

    See the module docstring for the rule (containers, sidecars, init peak, pod-level
    resources, overhead). Zero-valued keys are kept.

    Args:
        pod: the Pod as JSON (only ``spec`` is read).

    Returns:
        resource name -> quantity.

    Raises:
        TranslationError: a request or overhead value is not a quantity, or the shape is wrong.
    """
    spec = _mapping(_mapping(pod, "pod").get("spec"), "spec")
    run: dict[str, Quantity] = {}
    for i, c in enumerate(_list(spec.get("containers"), "spec.containers")):
        run = sum_resources(run, _requests(c, f"spec.containers[{i}]"))
    sidecars: dict[str, Quantity] = {}
    peak: dict[str, Quantity] = {}
    for i, c in enumerate(_list(spec.get("initContainers"), "spec.initContainers")):
        where = f"spec.initContainers[{i}]"
        req = _requests(c, where)
        if _mapping(c, where).get("restartPolicy") == "Always":
            run = sum_resources(run, req)
            sidecars = sum_resources(sidecars, req)
            stage = sidecars
        else:
            stage = sum_resources(req, sidecars)
        peak = max_resources(peak, stage)
    result = max_resources(run, peak)

    pod_level = _mapping(spec.get("resources"), "spec.resources")
    pod_requests = _resource_list(pod_level.get("requests"), "spec.resources.requests")
    for name, q in pod_requests.items():
        if name in _POD_LEVEL_RESOURCES or name.startswith(_HUGEPAGES_PREFIX):
            result[name] = q

    overhead = _resource_list(spec.get("overhead"), "spec.overhead")
    return sum_resources(result, overhead)


def _priority(spec: Mapping[str, Any]) -> int:
    value = spec.get("priority")
    if value is None:
        return 0
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not (_INT32_MIN <= value <= _INT32_MAX)
    ):
        raise TranslationError(f"spec.priority: must be an int32, got {value!r}")
    return value


def _penalty(
    annotations: Mapping[str, Any],
    annotation: str,
    default: Quantity | None,
    warnings: list[str],
) -> Quantity | None:
    """Annotation -> PriorityClass default -> None; a bad annotation warns and falls through."""
    raw = annotations.get(annotation)
    if isinstance(raw, str) and raw != "":
        try:
            return Quantity.parse(raw)
        except QuantityError as exc:
            warnings.append(
                f"annotation {annotation}={raw!r} is not a quantity ({exc}); "
                "falling back to the PriorityClass default"
            )
    elif raw is not None and raw != "":
        warnings.append(
            f"annotation {annotation}={raw!r} is not a string; "
            "falling back to the PriorityClass default"
        )
    return default


PROTECTED_RECLAMATION_PENALTY = Quantity.parse("16777216")
"""2^24 US dollars: the highest reclamation penalty bucket (27), for a Pod whose disruption
annotations say it must not be disrupted (docs/rules.md#disruption-annotations)."""


def translate_pod(pod: Mapping[str, Any], defaults: PriorityClassDefaults | None, *,
                  disruption_annotations: bool = True) -> Translation:
    """Translate a Pod into its CapacityRequest ``spec``.

    The rules are in the module docstring and the private helpers. The penalties resolve
    independently:
    annotation ``bigfleet.lucy.sh/{interruption,reclamation}-penalty`` (a quantity; empty =
    not set; unparseable = warning and fall through) -> ``defaults`` entry for
    ``spec.priorityClassName`` -> absent. With ``disruption_annotations`` (the default), a Pod
    marked ``karpenter.sh/do-not-disrupt`` or ``cluster-autoscaler.kubernetes.io/safe-to-evict:
    "false"`` and no reclamation-penalty annotation of its own gets
    :data:`PROTECTED_RECLAMATION_PENALTY` instead of the PriorityClass default.

    Args:
        pod: the Pod as JSON (``metadata`` and ``spec`` are read, ``status`` is not).
        defaults: the PriorityClass penalty defaults, or None for none.

    Returns:
        The spec (JSON-ready) and any warnings.

    Raises:
        TranslationError: the Pod is malformed (not an object, a quantity that does not parse,
            a non-int priority, a topology spread term without maxSkew/topologyKey, ...).
    """
    p = _mapping(pod, "pod")
    spec = _mapping(p.get("spec"), "spec")
    metadata = _mapping(p.get("metadata"), "metadata")
    annotations = _mapping(metadata.get("annotations"), "metadata.annotations")
    warnings: list[str] = []

    out: dict[str, Any] = {
        "priority": _priority(spec),
        "resources": {k: str(v) for k, v in pod_resource_requests(p).items()},
    }
    requirements = _requirements(spec)
    if requirements:
        out["requirements"] = requirements
    co_location = _co_location(spec, warnings)
    if co_location is not None:
        out["coLocation"] = co_location
    spread = _topology_spread(spec, warnings)
    if spread:
        out["topologySpread"] = spread

    class_name = spec.get("priorityClassName")
    class_defaults = (
        defaults.get(class_name) if defaults is not None and isinstance(class_name, str) else None
    )
    interruption = _penalty(
        annotations,
        INTERRUPTION_PENALTY_ANNOTATION,
        class_defaults.interruption_penalty if class_defaults else None,
        warnings,
    )
    reclamation_default = class_defaults.reclamation_penalty if class_defaults else None
    # the Pod's own penalty annotation still wins: the per-Pod opt-out
    if disruption_annotations and disruption_blocker(annotations) is not None:
        reclamation_default = PROTECTED_RECLAMATION_PENALTY
    reclamation = _penalty(
        annotations, RECLAMATION_PENALTY_ANNOTATION, reclamation_default, warnings,
    )
    if interruption is not None:
        out["interruptionPenalty"] = str(interruption)
    if reclamation is not None:
        out["reclamationPenalty"] = str(reclamation)
    return Translation(spec=out, warnings=tuple(warnings))


def is_terminal(pod: Mapping[str, Any]) -> bool:
    """True when ``status.phase`` is Succeeded or Failed (never a CR for those)."""
    status = pod.get("status") if isinstance(pod, Mapping) else None
    return isinstance(status, Mapping) and status.get("phase") in _TERMINAL_PHASES


def cr_name_for_pod(uid: str) -> str:
    """The deterministic CapacityRequest name for the Pod with this UID.

    ``"cr-" + uid`` when that is a valid DNS-1123 subdomain of at most 253 characters (always
    the case for the apiserver's lowercase RFC 4122 UIDs: 39 characters). Any other UID
    (uppercase, odd characters, absurdly long) maps to ``"cr-" + sha256(uid).hexdigest()``
    (67 characters), which is valid by construction. Either way two reconciles of the same Pod
    compute the same name, so a racing second create gets AlreadyExists.

    Raises:
        TranslationError: ``uid`` is empty.
    """
    if not uid:
        raise TranslationError("pod has no metadata.uid")
    name = _CR_NAME_PREFIX + uid
    if is_dns1123_subdomain(name):
        return name
    return _CR_NAME_PREFIX + hashlib.sha256(uid.encode("utf-8")).hexdigest()


def build_capacity_request(pod: Mapping[str, Any], translation: Translation) -> dict[str, Any]:
    """The full CapacityRequest object (no status) for ``pod``.

    ``metadata``: name :func:`cr_name_for_pod`, the Pod's namespace, label
    ``bigfleet.lucy.sh/owned-by-pod=<uid>``, and an ownerReference to the Pod
    (``controller: true``) so deleting the Pod garbage-collects the CR (the demand is withdrawn
    implicitly). ``blockOwnerDeletion`` is deliberately not set, as in the Go reference: with
    the OwnerReferencesPermissionEnforcement admission plugin,
    setting it requires ``update`` on ``pods/finalizers``, which the pod controller's RBAC does
    not grant (and need not: nothing waits for the CR in a foreground deletion), so every create
    would be Forbidden. ``spec`` is a deep copy of ``translation.spec``.

    Raises:
        TranslationError: the Pod has no name, namespace or uid.
    """
    metadata = _mapping(_mapping(pod, "pod").get("metadata"), "metadata")
    name, namespace, uid = metadata.get("name"), metadata.get("namespace"), metadata.get("uid")
    for field_name, value in (("name", name), ("namespace", namespace), ("uid", uid)):
        if not isinstance(value, str) or not value:
            raise TranslationError(f"pod has no metadata.{field_name}")
    assert isinstance(uid, str)
    return {
        "apiVersion": CR_API_VERSION,
        "kind": CR_KIND,
        "metadata": {
            "name": cr_name_for_pod(uid),
            "namespace": namespace,
            "labels": {OWNED_BY_POD_LABEL: uid},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": name,
                    "uid": uid,
                    "controller": True,
                    # no blockOwnerDeletion: it needs pods/finalizers update (see docstring)
                }
            ],
        },
        "spec": copy.deepcopy(translation.spec),
    }


def unsupported_requirements(spec: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    """The entries of ``spec["requirements"]`` whose operator the CRD does not accept.

    Args:
        spec: a translated CR spec (:attr:`Translation.spec`).

    Returns:
        The offending requirement dicts (``{"key", "operator"[, "values"]}``) in spec order;
        ``()`` when every operator is in :data:`CRD_REQUIREMENT_OPERATORS`. Operators are
        compared case-sensitively, as the apiserver does.
    """
    requirements = spec.get("requirements")
    if not isinstance(requirements, list):
        return ()
    return tuple(
        r
        for r in requirements
        if isinstance(r, dict) and r.get("operator") not in CRD_REQUIREMENT_OPERATORS
    )
