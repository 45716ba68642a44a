"""What the pod controller does for one Pod, decided purely: :func:`plan_pod` -> :class:`PodPlan`.

The controller (:mod:`.controller`) looks the Pod and the CapacityRequests it owns up in its
caches, asks :func:`plan_pod`, and applies the plan (writes, Events, log lines). If the apiserver
then refuses the write as invalid, :func:`plan_rejected` says what to do instead. Nothing here
does I/O; the rules, in order, are :func:`plan_pod`'s docstring.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from bigfleet_trio.kube.mergepatch import merge_diff

from .defaults import PriorityClassDefaults
from .translate import (
    CRD_REQUIREMENT_OPERATORS,
    TranslationError,
    build_capacity_request,
    is_terminal,
    translate_pod,
    unsupported_requirements,
)
from .zonepin import ZonePin, pinned_spec, plan_zone_pin

__all__ = [
    "Action",
    "EventReport",
    "PodPlan",
    "REASON_FAILED",
    "REASON_REJECTED",
    "REASON_UNSUPPORTED",
    "REASON_WARNING",
    "REASONS",
    "NO_CR_OUTCOMES",
    "plan_pod",
    "plan_rejected",
]

REASON_FAILED = "CapacityRequestFailed"
"""Event reason: the Pod cannot be translated (no CR)."""
REASON_WARNING = "CapacityRequestWarning"
"""Event reason: translated with a warning (e.g. unparseable penalty annotation ignored)."""
REASON_UNSUPPORTED = "UnsupportedRequirement"
"""Event reason: a requirement operator the CRD does not accept; no CR."""
REASON_REJECTED = "CapacityRequestRejected"
"""Event reason: the apiserver rejected the CR create/patch with 422 Invalid; no CR."""
REASONS = (REASON_FAILED, REASON_WARNING, REASON_UNSUPPORTED, REASON_REJECTED)
NOT_SENT = "this Pod's demand is not sent to BigFleet"
NO_CR_OUTCOMES = ("excluded", "unmanaged_node")
"""Outcomes of a Pod that gets no CR on purpose, no Event either: opted out, or bound to a Node
BigFleet does not manage (docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out)."""

Action = Literal["create", "update", "delete", "report", "nothing"]


@dataclass(frozen=True)
class EventReport:
    """Warning Events to put on the Pod, one per message, once per distinct (messages, version).

    Attributes:
        reason: the Event reason (one of :data:`REASONS`).
        messages: the Event messages.
        version: what makes a repeat a new report (the translated spec, for a rejection).
    """

    reason: str
    messages: tuple[str, ...]
    version: str = ""


@dataclass(frozen=True)
class PodPlan:
    """The decision for one Pod.

    Attributes:
        action: ``create`` (POST ``body``), ``update`` (merge-patch ``patch`` onto ``target``),
            ``delete`` (delete the CRs in ``delete``, each by name), ``report`` (the Pod gets
            no CR: ``report`` Events, ``delete`` the CRs it has), ``nothing``.
        outcome: the reconcile outcome counted once the plan is applied (``cr_created``,
            ``cr_updated``, ``cr_exists``, ``pod_terminal``, ``invalid_pod``,
            ``unsupported_requirement``, ``cr_rejected``, ``excluded``, ``unmanaged_node``;
            ``cr_created`` may turn into
            ``cr_exists``/``cr_updated`` when the CR turns out to exist).
        uid: the Pod UID ("" for a Pod without one).
        body: the CR the Pod should have (``create``/``update``: ``update`` recreates it from
            this when the CR vanished under us).
        target: ``update``: the cached CR patched.
        patch: ``update``: the merge patch of ``{"spec": ...}``.
        delete: CRs to delete, with a reason for the log line (``duplicate``,
            ``unsupported_requirement``, ``rejected_update``, ``pod_terminal``, ``excluded``,
            ``unmanaged_node``), before the write.
        report: Events for the decision (``report``), or None.
        warnings: translation warnings (Events + log lines) reported on the way to a write.
        clear: Event reasons whose condition has cleared (forget they were reported).
        detail: what the log line names (the translation error, the unsupported requirements).
        phase: ``delete`` of a terminal Pod: its phase (for the log line).
        zone_pin: the co-location zone pin decided for the CR (steps 5-7), else None.
    """

    action: Action
    outcome: str
    uid: str = ""
    body: dict[str, Any] | None = None
    target: dict[str, Any] | None = None
    patch: dict[str, Any] | None = None
    delete: tuple[dict[str, Any], ...] = ()
    delete_reason: str = ""
    report: EventReport | None = None
    warnings: EventReport | None = None
    clear: tuple[str, ...] = ()
    detail: str = ""
    phase: str = ""
    zone_pin: ZonePin | None = None


def _describe_unsupported(unsupported: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(f"{r.get('key')!r} {r.get('operator')}" for r in unsupported)


def plan_pod(
    pod: Mapping[str, Any],
    owned_crs: Sequence[dict[str, Any]],
    defaults: PriorityClassDefaults | None,
    bound: Iterable[Mapping[str, Any]] = (),
    *,
    zones: Iterable[str] | None = None,
    excluded: bool = False,
    node_unmanaged: bool = False,
    disruption_annotations: bool = True,
) -> PodPlan:
    """Decide what one live Pod needs.

    Args:
        pod: the Pod as the controller caches it (:func:`~.controller.slim_pod`).
        owned_crs: the CapacityRequests labelled as owned by the Pod's UID (cache order).
        defaults: PriorityClass penalty defaults (None: none).
        bound: cached bound Pods the Pod may co-locate with (:mod:`.zonepin`); () for none.
        zones: instead of ``bound``, the zones its co-location group runs in
            (:class:`~.zonegroups.GroupZones`; None: read them from ``bound``).
        excluded: the Pod is opted out (``--exclude-namespace``, ``--exclude-pod-selector``).
        node_unmanaged: the Pod is bound to a Node the Node cache says BigFleet does not manage
            (False for a pending Pod and for a Node not in the cache).
        disruption_annotations: honour the Pod's disruption annotations in its reclamation
            penalty (:func:`~.translate.translate_pod`).

    Returns:
        The plan (see :class:`PodPlan`). The rules, in order:

        1. No UID: ``nothing``/``invalid_pod``.
        2. Terminal (Succeeded/Failed): ``delete`` of the collection labelled with its UID when
           it owns any CR, else ``nothing``; ``pod_terminal`` either way; never a create.
        3. ``excluded``, else ``node_unmanaged``: ``delete`` of every CR it owns (each by name),
           else ``nothing``; outcome and delete reason ``excluded`` / ``unmanaged_node``; no
           Event, and every reported Event reason cleared
           (docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out).
        4. Untranslatable: ``report`` :data:`REASON_FAILED` with the error, ``invalid_pod``; its
           CRs are left alone (the error may be ours).
        5. A requirement operator the CRD does not accept: ``report``
           :data:`REASON_UNSUPPORTED` naming key and operator, delete every CR it has (it would
           carry the demand with constraints the Pod no longer has), ``unsupported_requirement``.
        6. No CR: ``create`` (``cr_created``).
        7. CRs: keep the one with the deterministic name (else the first); delete the others
           (``duplicate``); ``update`` the kept one with a merge patch when its spec differs
           (``cr_updated``), else ``delete`` of the extras or ``nothing`` (``cr_exists``).

        Translation warnings ride along in ``warnings`` (steps 5-7). The CR's spec is the
        translation pinned to its co-location group's zone when the bound Pods in ``bound``
        (:func:`~.zonepin.candidates`) say so (:func:`~.zonepin.plan_zone_pin`,
        docs/rules.md#pod-translation-co-location-zone-pin).
    """
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    if not isinstance(uid, str) or not uid:
        return PodPlan("nothing", "invalid_pod")
    if is_terminal(pod):
        if owned_crs:
            # Each CR by name: a deletecollection by label (the reference's way) makes the
            # apiserver scan the namespace's CRs for every finished Pod; at 10,000 CRs on a
            # loaded kube-apiserver those ran past 30 s and held the workers every other Pod
            # waited on.
            return PodPlan("delete", "pod_terminal", uid, delete=tuple(owned_crs),
                           delete_reason="pod_terminal",
                           phase=str((pod.get("status") or {}).get("phase")))
        return PodPlan("nothing", "pod_terminal", uid)
    if excluded or node_unmanaged:
        why = "excluded" if excluded else "unmanaged_node"
        return PodPlan("delete" if owned_crs else "nothing", why, uid, delete=tuple(owned_crs),
                       delete_reason=why, clear=REASONS)
    try:
        translation = translate_pod(pod, defaults, disruption_annotations=disruption_annotations)
        pin = plan_zone_pin(pod, translation.spec, bound, zones=zones)
        if pin.zone is not None:
            translation = replace(translation, spec=pinned_spec(translation.spec, pin))
        body = build_capacity_request(pod, translation)
    except TranslationError as exc:
        return PodPlan("report", "invalid_pod", uid,
                       report=EventReport(REASON_FAILED, (str(exc),)), detail=str(exc))
    clear: list[str] = [REASON_FAILED]
    warnings = None
    if translation.warnings:
        warnings = EventReport(REASON_WARNING, tuple(translation.warnings))
    else:
        clear.append(REASON_WARNING)
    unsupported = unsupported_requirements(translation.spec)
    if unsupported:
        what = _describe_unsupported(unsupported)
        message = (
            f"node affinity requirement {what} cannot be expressed in a CapacityRequest (the "
            f"CRD accepts operators {', '.join(sorted(CRD_REQUIREMENT_OPERATORS))}); {NOT_SENT}"
        )
        clear.append(REASON_REJECTED)
        return PodPlan("report", "unsupported_requirement", uid, body=body,
                       delete=tuple(owned_crs), delete_reason="unsupported_requirement",
                       report=EventReport(REASON_UNSUPPORTED, (message,)),
                       warnings=warnings, clear=tuple(clear), detail=what, zone_pin=pin)
    clear.append(REASON_UNSUPPORTED)
    if not owned_crs:
        return PodPlan("create", "cr_created", uid, body=body, warnings=warnings,
                       clear=tuple(clear), zone_pin=pin)
    want = body["metadata"]["name"]
    keep = next((cr for cr in owned_crs if cr["metadata"].get("name") == want), owned_crs[0])
    extras = tuple(cr for cr in owned_crs if cr is not keep)
    spec = body["spec"]
    if keep.get("spec") != spec:
        patch = {"spec": merge_diff(keep.get("spec") or {}, spec)}
        return PodPlan("update", "cr_updated", uid, body=body, target=keep, patch=patch,
                       delete=extras, delete_reason="duplicate", warnings=warnings,
                       clear=tuple(clear), zone_pin=pin)
    return PodPlan("delete" if extras else "nothing", "cr_exists", uid, body=body, target=keep,
                   delete=extras, delete_reason="duplicate", warnings=warnings,
                   clear=tuple(clear), zone_pin=pin)


def plan_rejected(plan: PodPlan, owned_crs: Sequence[dict[str, Any]], message: str) -> PodPlan:
    """The apiserver refused ``plan``'s create or patch as invalid (422): permanent for this spec.

    Returns:
        ``report`` :data:`REASON_REJECTED` with the apiserver's ``message`` (once per translated
        spec version), delete every CR the Pod has (its spec is not the Pod's any more),
        ``cr_rejected``; no backoff retry (a Pod change or the resync tries again).
    """
    assert plan.body is not None
    version = json.dumps(plan.body["spec"], sort_keys=True, separators=(",", ":"))
    text = f"CapacityRequest rejected by the apiserver: {message}; {NOT_SENT}"
    return PodPlan("report", "cr_rejected", plan.uid, body=plan.body, delete=tuple(owned_crs),
                   delete_reason="rejected_update",
                   report=EventReport(REASON_REJECTED, (text,), version),
                   detail=message)
