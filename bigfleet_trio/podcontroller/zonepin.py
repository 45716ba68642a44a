"""Co-location zone pinning: once Pods of a zone co-location group run in one zone, every CR of
the group asks for that zone (rule: docs/rules.md#pod-translation-co-location-zone-pin).

:func:`plan_zone_pin` decides purely, over the Pod and plain dicts of the bound Pods it could
co-locate with; :func:`pinned_spec` adds the requirement to a translated CR spec. The controller
finds the candidates with :func:`candidates` (its Pod cache's :data:`BOUND_ZONE_INDEX`) and the
Pods to reconcile again when a candidate comes or goes with :func:`group_keys`
(:data:`CO_LOCATED_INDEX`); :func:`report` counts and logs a decision.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from . import metrics
from .translate import is_terminal

log = logging.getLogger(__name__)

__all__ = [
    "BOUND_ZONE_INDEX",
    "CO_LOCATED_INDEX",
    "PIN_ANNOTATION",
    "ZONE_LABEL",
    "PinDecision",
    "ZonePin",
    "candidates",
    "enqueue_groups",
    "first_pair",
    "group_keys",
    "index_bound_zone",
    "index_co_located",
    "plan_zone_pin",
    "pinned_spec",
    "report",
    "selector_matches",
    "term_namespaces",
    "zone_term",
]

ZONE_LABEL = "topology.kubernetes.io/zone"
"""The Node label kube-apiserver's PodTopologyLabels admission copies onto a Pod at binding."""
PIN_ANNOTATION = "bigfleet.lucy.sh/co-location-zone-pin"
"""``"false"`` on a Pod: its CR is never pinned."""
BOUND_ZONE_INDEX = "bound-zone"
"""Pod index: the namespace of every Pod that carries its Node's zone (bound)."""
CO_LOCATED_INDEX = "co-located-zone"
"""Pod index: where a live Pod with a required zone pod-affinity term looks for its group
(:func:`index_co_located`)."""
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"

PinDecision = Literal["no_group", "opted_out", "own_zone", "namespace_selector", "not_running",
                      "several_zones", "pinned"]


@dataclass(frozen=True)
class ZonePin:
    """What :func:`plan_zone_pin` decided.

    Attributes:
        decision: ``pinned`` (``zone`` is set) or why not: ``no_group`` (no required pod-affinity
            term on the zone), ``opted_out`` (:data:`PIN_ANNOTATION` is ``"false"``),
            ``own_zone`` (the Pod constrains the zone itself), ``namespace_selector`` (the term
            selects namespaces by label: not evaluated), ``not_running`` (no bound Pod of the
            group carries a zone), ``several_zones`` (they run in more than one).
        zones: the zones the group's bound Pods run in (sorted).
    """

    decision: PinDecision
    zones: tuple[str, ...] = ()

    @property
    def zone(self) -> str | None:
        """The zone pinned to, or None."""
        return self.zones[0] if self.decision == "pinned" else None


def zone_term(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Pod's first required pod-affinity term when its topology key is the zone."""
    affinity = ((pod.get("spec") or {}).get("affinity") or {})
    terms = ((affinity.get("podAffinity") or {}) if isinstance(affinity, Mapping) else {})
    terms = terms.get(_REQUIRED) if isinstance(terms, Mapping) else None
    if not isinstance(terms, list) or not terms or not isinstance(terms[0], Mapping):
        return None
    return terms[0] if terms[0].get("topologyKey") == ZONE_LABEL else None


def term_namespaces(pod: Mapping[str, Any], term: Mapping[str, Any]) -> list[str]:
    """The namespaces the term selects Pods in: its ``namespaces``, else the Pod's own."""
    listed = term.get("namespaces")
    if isinstance(listed, list) and listed:
        return [str(ns) for ns in listed]
    return [str((pod.get("metadata") or {}).get("namespace", ""))]


def selector_matches(selector: Any, labels: Mapping[str, str]) -> bool:
    """A Kubernetes LabelSelector against ``labels``: every ``matchLabels`` pair and every
    ``matchExpressions`` item (In, NotIn, Exists, DoesNotExist) holds. None selects nothing
    and ``{}`` everything, as for pod affinity; a malformed selector selects nothing."""
    if not isinstance(selector, Mapping):
        return False
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not isinstance(match_labels, Mapping) or not isinstance(expressions, list):
        return False
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    return all(_expression_holds(expr, labels) for expr in expressions)


def _expression_holds(expr: Any, labels: Mapping[str, str]) -> bool:
    """One ``matchExpressions`` item; an unknown operator or a malformed item never holds."""
    if not isinstance(expr, Mapping) or not isinstance(expr.get("key"), str):
        return False
    key, op, values = expr["key"], expr.get("operator"), expr.get("values") or []
    value = labels.get(key)
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    return False


def _constrains_zone(spec: Mapping[str, Any]) -> bool:
    return any(isinstance(r, Mapping) and r.get("key") == ZONE_LABEL
               for r in spec.get("requirements") or ())


def plan_zone_pin(pod: Mapping[str, Any], spec: Mapping[str, Any],
                  bound: Iterable[Mapping[str, Any]] = (), *,
                  zones: Iterable[str] | None = None) -> ZonePin:
    """Whether the CR of ``pod`` (translated ``spec``) is pinned to its group's zone.

    Args:
        pod: the Pod (as cached: ``metadata.annotations``, ``spec.affinity``).
        spec: its translated CR spec (``requirements``).
        bound: Pods it might co-locate with: each with ``metadata.namespace``,
            ``metadata.labels`` carrying :data:`ZONE_LABEL` (the Pod is bound) and
            ``status.phase``; others are skipped. The Pod itself may be among them.
        zones: instead of ``bound``, the zones the group's bound Pods run in, as the controller
            keeps them (:class:`~.zonegroups.GroupZones`).

    Returns:
        A :class:`ZonePin`; the group is the bound, non-terminal Pods in the term's namespaces
        that its label selector matches (kube-scheduler's pod-affinity view).
    """
    term = zone_term(pod)
    if term is None:
        return ZonePin("no_group")
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if isinstance(annotations, Mapping) and annotations.get(PIN_ANNOTATION) == "false":
        return ZonePin("opted_out")
    if _constrains_zone(spec):
        return ZonePin("own_zone")
    if term.get("namespaceSelector") is not None:
        return ZonePin("namespace_selector")
    if zones is not None:
        return _decide(set(zones))
    namespaces = set(term_namespaces(pod, term))
    running: set[str] = set()
    for other in bound:
        meta = other.get("metadata") or {}
        labels = meta.get("labels") or {}
        zone = labels.get(ZONE_LABEL) if isinstance(labels, Mapping) else None
        if (isinstance(zone, str) and zone and meta.get("namespace") in namespaces
                and not is_terminal(other) and selector_matches(term.get("labelSelector"),
                                                                labels)):
            running.add(zone)
    return _decide(running)


def _decide(zones: set[str]) -> ZonePin:
    if not zones:
        return ZonePin("not_running")
    return ZonePin("pinned" if len(zones) == 1 else "several_zones", tuple(sorted(zones)))


def pinned_spec(spec: Mapping[str, Any], pin: ZonePin) -> dict[str, Any]:
    """``spec`` (a copy) with ``{key: zone, operator: In, values: [zone]}`` appended to its
    requirements when ``pin`` is ``pinned``; else an unchanged copy."""
    out = copy.deepcopy(dict(spec))
    if pin.zone is not None:
        out["requirements"] = [*out.get("requirements", []),
                               {"key": ZONE_LABEL, "operator": "In", "values": [pin.zone]}]
    return out


# ---- the controller's cache lookups ---------------------------------------------------------

def index_bound_zone(pod: Mapping[str, Any]) -> list[str]:
    """:data:`BOUND_ZONE_INDEX`: ``[namespace]`` of a Pod whose cached labels carry a zone."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    return [str(meta.get("namespace", ""))] if isinstance(labels, Mapping) and labels.get(
        ZONE_LABEL) else []


def index_co_located(pod: Mapping[str, Any]) -> list[str]:
    """:data:`CO_LOCATED_INDEX`: per namespace the Pod's zone co-location term looks in,
    ``"<ns>/<key>=<value>"`` of the first ``matchLabels`` pair of its selector, or ``"<ns>/"``
    when it has none (a bound Pod then finds its group among few: :func:`group_keys`)."""
    term = zone_term(pod)
    if term is None or is_terminal(pod):
        return []
    pair = first_pair(term.get("labelSelector"))
    return [f"{ns}/{pair}" for ns in term_namespaces(pod, term)]


def first_pair(selector: Any) -> str:
    """``"key=value"`` of a label selector's first ``matchLabels`` pair (by key), which every
    Pod it selects carries; ``""`` when it has none (or is malformed)."""
    match_labels = selector.get("matchLabels") if isinstance(selector, Mapping) else None
    if isinstance(match_labels, Mapping) and match_labels:
        key = min(match_labels)
        return f"{key}={match_labels[key]}"
    return ""


def candidates(store: Any, pod: Mapping[str, Any]) -> list[Any]:
    """The cached bound Pods (zone known) in the namespaces ``pod``'s zone term looks in;
    ``store`` is the Pod informer's store (:data:`BOUND_ZONE_INDEX` indexed)."""
    term = zone_term(pod)
    if term is None:
        return []
    return [p for ns in term_namespaces(pod, term) for p in store.by_index(BOUND_ZONE_INDEX, ns)]


def group_keys(store: Any, pod: Mapping[str, Any]) -> list[str]:
    """``"ns/name"`` of the cached Pods whose zone group ``pod`` (bound, zone known) belongs
    to: to reconcile again when it comes, goes or changes. [] for any other Pod.

    Cost: one index lookup per label of ``pod`` plus the selector check of each Pod found
    (the Pods whose selector's first pair ``pod`` carries)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if not index_bound_zone(pod):
        return []
    ns = str(meta.get("namespace", ""))
    found: dict[str, None] = {}
    for index_value in [f"{ns}/", *(f"{ns}/{k}={v}" for k, v in labels.items())]:
        for other in store.by_index(CO_LOCATED_INDEX, index_value):
            term = zone_term(other)
            if term is not None and selector_matches(term.get("labelSelector"), labels):
                o = other.get("metadata") or {}
                found[f"{o.get('namespace', '')}/{o.get('name', '')}"] = None
    return list(found)


def enqueue_groups(queue: Any, store: Any, *pods: Mapping[str, Any] | None) -> None:
    """Add to ``queue`` (as :class:`~.keys.PodKey`) the Pods of the zone groups ``pods``
    belong to (:func:`group_keys`): a group member bound, changed or gone may pin or unpin
    the group's CRs. They wait behind every Pod with a change of its own (``low``): a group
    starting to run patches each of its CRs once, hundreds of writes that must not hold back
    the creates of new Pods' CRs (a Pod with no CR is not counted at all; an unpinned CR is
    still counted). A Pod of the group that changes meanwhile moves up."""
    from .keys import PodKey

    for pod in pods:
        if pod is not None:
            for key in group_keys(store, pod):
                queue.add(PodKey.parse(key), low=True)


def report(pin: ZonePin | None, key: str, action: str) -> None:
    """Count the decision for Pod ``key`` (``no_group`` and None are not counted) and, when
    the CR is written (``action`` create/update), log it: a group in several zones at INFO
    (nothing is pinned: kube-scheduler accepts any of them), a pin at DEBUG."""
    if pin is None or pin.decision == "no_group":
        return
    metrics.count_zone_pin(pin.decision)
    if action not in ("create", "update"):
        return
    if pin.decision == "several_zones":
        log.info("co-location group runs in several zones, CR not pinned pod=%s zones=%s", key,
                 ",".join(pin.zones))
    elif pin.decision == "pinned":
        log.debug("co-location group zone pinned pod=%s zone=%s", key, pin.zone)
