"""Pure planning for the simulated workload controllers: what kube-controller-manager's
Deployment, ReplicaSet, StatefulSet and Job controllers would create, delete and write as status,
given a workload object and the Pods (or ReplicaSets) it owns. No I/O; :mod:`.controllers` applies.

Pods are "active" when not terminal and not being deleted; "ready" when Running with condition
Ready=True. Availability is readiness (``minReadySeconds`` is not modelled).
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "JobPlan",
    "ReplicaDiff",
    "StatefulSetPlan",
    "controller_ref",
    "deployment_replicasets",
    "deployment_status",
    "is_active",
    "is_ready",
    "job_plan",
    "owner_ref",
    "pod_from_template",
    "random_suffix",
    "replicaset_diff",
    "replicaset_status",
    "statefulset_plan",
    "statefulset_status",
    "template_hash",
]

#: Kubernetes' random-suffix alphabet (no vowels, no confusable digits).
ALPHANUMS = "bcdfghjklmnpqrstvwxz2456789"
POD_TEMPLATE_HASH = "pod-template-hash"
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def random_suffix(rng: random.Random, n: int = 5) -> str:
    """``n`` characters of the Kubernetes name-suffix alphabet."""
    return "".join(rng.choice(ALPHANUMS) for _ in range(n))


def template_hash(template: Mapping[str, Any] | None) -> str:
    """A stable 10-character hash of a Pod template (the ``pod-template-hash`` label value).

    Same template -> same hash across processes (canonical JSON, SHA-256); any change in the
    template -> a new hash, so a changed Deployment gets a new ReplicaSet.
    """
    digest = hashlib.sha256(
        json.dumps(template or {}, sort_keys=True, separators=(",", ":")).encode()
    ).digest()
    return "".join(ALPHANUMS[b % len(ALPHANUMS)] for b in digest[:10])


def _int(value: Any, default: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return default


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    st = obj.get("status")
    return st if isinstance(st, Mapping) else {}


def is_active(pod: Mapping[str, Any]) -> bool:
    """Not Succeeded/Failed and not being deleted."""
    return _status(pod).get("phase") not in ("Succeeded", "Failed") and not _meta(pod).get(
        "deletionTimestamp"
    )


def is_ready(pod: Mapping[str, Any]) -> bool:
    """Active, ``phase: Running`` and condition ``Ready=True``."""
    st = _status(pod)
    return (
        is_active(pod)
        and st.get("phase") == "Running"
        and any(
            isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
            for c in st.get("conditions") or ()
        )
    )


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference with ``controller: true``, or None."""
    for ref in _meta(obj).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller"):
            return ref
    return None


def owner_ref(owner: Mapping[str, Any], kind: str, api_version: str) -> dict[str, Any]:
    """The controller ownerReference a dependent of ``owner`` carries."""
    meta = _meta(owner)
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta.get("name", ""),
        "uid": meta.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pod_from_template(
    template: Mapping[str, Any] | None,
    *,
    name: str,
    namespace: str,
    owner: dict[str, Any],
    extra_labels: Mapping[str, str] | None = None,
    extra_annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Pod body as a workload controller POSTs it (no uid/status: the apiserver adds them)."""
    t = copy.deepcopy(dict(template or {}))
    tmeta: dict[str, Any] = t["metadata"] if isinstance(t.get("metadata"), dict) else {}
    spec: dict[str, Any] = t["spec"] if isinstance(t.get("spec"), dict) else {}
    labels = dict(tmeta.get("labels") or {})
    labels.update(extra_labels or {})
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": labels,
        "ownerReferences": [owner],
    }
    annotations = dict(tmeta.get("annotations") or {})
    annotations.update(extra_annotations or {})
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _generation(obj: Mapping[str, Any]) -> int:
    return _int(_meta(obj).get("generation"), 1)


# ------------------------------------------------------------------------------------------------
# ReplicaSet
# ------------------------------------------------------------------------------------------------


@dataclass
class ReplicaDiff:
    """Pods to create (a count) and to delete (names, in deletion order)."""

    create: int = 0
    delete: list[str] = field(default_factory=list)


def _deletion_rank(pod: Mapping[str, Any]) -> tuple[int, int, int, str, str]:
    """kube-controller-manager's order: unscheduled, then pending, then not ready, then the most
    recently created (newest first), then name."""
    st = _status(pod)
    bound = bool((pod.get("spec") or {}).get("nodeName"))
    created = str(_meta(pod).get("creationTimestamp") or "")
    # newest first: invert the timestamp ordering by sorting on its negated characters
    inverted = "".join(chr(0x10FFFF - ord(c)) for c in created)
    return (
        1 if bound else 0,
        0 if st.get("phase") in (None, "", "Pending") else 1,
        1 if is_ready(pod) else 0,
        inverted,
        str(_meta(pod).get("name") or ""),
    )


def replicaset_diff(rs: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> ReplicaDiff:
    """What the ReplicaSet controller does next.

    Args:
        rs: the ReplicaSet (``spec.replicas``, default 1).
        pods: the Pods it controls (any state; only active ones count).

    Returns:
        ``create`` when there are fewer active Pods than wanted; ``delete`` (names) when more,
        picking unscheduled, then pending, then not-ready, then the newest Pods first.
    """
    want = _int((rs.get("spec") or {}).get("replicas"), 1)
    active = [p for p in pods if is_active(p)]
    if len(active) < want:
        return ReplicaDiff(create=want - len(active))
    if len(active) > want:
        surplus = sorted(active, key=_deletion_rank)[: len(active) - want]
        return ReplicaDiff(delete=[str(_meta(p).get("name")) for p in surplus])
    return ReplicaDiff()


def replicaset_status(rs: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``status`` as the ReplicaSet controller writes it."""
    active = [p for p in pods if is_active(p)]
    ready = sum(1 for p in active if is_ready(p))
    return {
        "replicas": len(active),
        "fullyLabeledReplicas": len(active),
        "readyReplicas": ready,
        "availableReplicas": ready,
        "observedGeneration": _generation(rs),
    }


# ------------------------------------------------------------------------------------------------
# Deployment
# ------------------------------------------------------------------------------------------------


def deployment_replicasets(
    deploy: Mapping[str, Any], owned: Sequence[Mapping[str, Any]]
) -> tuple[dict[str, Any] | None, dict[str, int]]:
    """The Deployment controller's plan over its ReplicaSets (Recreate-style rollout).

    Returns:
        ``(new_rs, scales)``: ``new_rs`` is a ReplicaSet body to create when no owned ReplicaSet
        carries the current template's hash (else None); ``scales`` maps owned ReplicaSet names
        to the ``spec.replicas`` they must be patched to (the current one to the Deployment's
        replicas, every older one to 0; ones already right are left out).
    """
    meta = _meta(deploy)
    spec = deploy.get("spec") or {}
    want = _int(spec.get("replicas"), 1)
    template = spec.get("template") or {}
    h = template_hash(template)
    name = f"{meta.get('name')}-{h}"
    scales: dict[str, int] = {}
    current: Mapping[str, Any] | None = None
    for rs in owned:
        rs_meta = _meta(rs)
        is_current = (rs_meta.get("labels") or {}).get(POD_TEMPLATE_HASH) == h
        if is_current:
            current = rs
        target = want if is_current else 0
        if _int((rs.get("spec") or {}).get("replicas"), 1) != target:
            scales[str(rs_meta.get("name"))] = target
    if current is not None:
        return None, scales
    revisions = [
        _int(_int_text((_meta(rs).get("annotations") or {}).get(REVISION_ANNOTATION)), 0)
        for rs in owned
    ]
    tmeta = dict(template.get("metadata") or {})
    labels = dict(tmeta.get("labels") or {})
    labels[POD_TEMPLATE_HASH] = h
    tmeta["labels"] = labels
    selector = copy.deepcopy(spec.get("selector") or {"matchLabels": dict(labels)})
    match = dict(selector.get("matchLabels") or {})
    match[POD_TEMPLATE_HASH] = h
    selector["matchLabels"] = match
    new_rs = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": name,
            "namespace": meta.get("namespace") or "default",
            "labels": labels,
            "annotations": {REVISION_ANNOTATION: str(max(revisions, default=0) + 1)},
            "ownerReferences": [owner_ref(deploy, "Deployment", "apps/v1")],
        },
        "spec": {
            "replicas": want,
            "selector": selector,
            "template": {**copy.deepcopy(dict(template)), "metadata": tmeta},
        },
    }
    return new_rs, scales


def _int_text(value: Any) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def deployment_status(
    deploy: Mapping[str, Any],
    owned: Sequence[Mapping[str, Any]],
    *,
    now: str,
) -> dict[str, Any]:
    """``status`` as the Deployment controller writes it, from its ReplicaSets' statuses.

    ``updatedReplicas`` counts the current template's ReplicaSet; ``Available`` is True when
    available >= replicas; ``Progressing`` says ``NewReplicaSetAvailable`` once the rollout is
    complete (``kubectl rollout status`` reads these). ``now`` stamps changed conditions.
    """
    spec = deploy.get("spec") or {}
    want = _int(spec.get("replicas"), 1)
    h = template_hash(spec.get("template") or {})
    replicas = ready = available = updated = 0
    for rs in owned:
        st = _status(rs)
        replicas += _int(st.get("replicas"), 0)
        ready += _int(st.get("readyReplicas"), 0)
        available += _int(st.get("availableReplicas"), 0)
        if (_meta(rs).get("labels") or {}).get(POD_TEMPLATE_HASH) == h:
            updated += _int(st.get("replicas"), 0)
    complete = updated >= want and replicas == updated and available >= updated
    old = {c.get("type"): c for c in _status(deploy).get("conditions") or ()
           if isinstance(c, Mapping)}

    def cond(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
        status = "True" if ok else "False"
        prev = old.get(kind) or {}
        since = prev.get("lastTransitionTime") if prev.get("status") == status else now
        return {"type": kind, "status": status, "reason": reason, "message": message,
                "lastUpdateTime": now if prev.get("reason") != reason else
                prev.get("lastUpdateTime", now), "lastTransitionTime": since or now}

    name = f"{_meta(deploy).get('name')}-{h}"
    out: dict[str, Any] = {
        "observedGeneration": _generation(deploy),
        "replicas": replicas,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": available,
        "unavailableReplicas": max(0, want - available),
        "conditions": [
            cond("Available", available >= want,
                 "MinimumReplicasAvailable" if available >= want else "MinimumReplicasUnavailable",
                 "Deployment has minimum availability." if available >= want
                 else "Deployment does not have minimum availability."),
            cond("Progressing", True,
                 "NewReplicaSetAvailable" if complete else "ReplicaSetUpdated",
                 f'ReplicaSet "{name}" has successfully progressed.' if complete
                 else f'ReplicaSet "{name}" is progressing.'),
        ],
    }
    for key in ("readyReplicas", "availableReplicas", "updatedReplicas", "unavailableReplicas"):
        if out[key] == 0:
            del out[key]  # omitempty, as the real controller's JSON
    return out


# ------------------------------------------------------------------------------------------------
# StatefulSet
# ------------------------------------------------------------------------------------------------


def ordinal_of(sts_name: str, pod_name: str) -> int | None:
    """The ordinal of ``<sts>-<n>``, or None when the name is not one of the set's."""
    prefix = sts_name + "-"
    if not pod_name.startswith(prefix):
        return None
    tail = pod_name[len(prefix):]
    return int(tail) if tail.isdigit() and (tail == "0" or not tail.startswith("0")) else None


@dataclass
class StatefulSetPlan:
    """Ordinals to create and Pod names to delete, in order."""

    create: list[int] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)


def statefulset_plan(sts: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> StatefulSetPlan:
    """What the StatefulSet controller does next.

    ``OrderedReady`` (the default): create the lowest missing ordinal only when every lower one
    is Running and Ready, one at a time; scale down by deleting the highest ordinal first, one at
    a time. ``Parallel``: create every missing ordinal and delete every surplus one at once.
    A terminal (Succeeded/Failed) Pod is deleted so it can be recreated with the same name.
    """
    spec = sts.get("spec") or {}
    name = str(_meta(sts).get("name"))
    want = _int(spec.get("replicas"), 1)
    parallel = spec.get("podManagementPolicy") == "Parallel"
    by_ordinal: dict[int, Mapping[str, Any]] = {}
    plan = StatefulSetPlan()
    for p in pods:
        pname = str(_meta(p).get("name") or "")
        n = ordinal_of(name, pname)
        if n is None:
            continue
        if not _meta(p).get("deletionTimestamp") and not is_active(p):
            plan.delete.append(pname)  # terminal: recreate
            continue
        by_ordinal[n] = p
    surplus = sorted((n for n in by_ordinal if n >= want), reverse=True)
    if surplus:
        doomed = surplus if parallel else surplus[:1]
        plan.delete += [f"{name}-{n}" for n in doomed]
        if not parallel:
            return plan
    for n in range(want):
        pod = by_ordinal.get(n)
        if pod is None:
            plan.create.append(n)
            if not parallel:
                break
        elif not parallel and not is_ready(pod):
            break
    return plan


def statefulset_status(
    sts: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], revision: str
) -> dict[str, Any]:
    """``status`` as the StatefulSet controller writes it (one revision: current = update)."""
    name = str(_meta(sts).get("name"))
    mine = [p for p in pods if ordinal_of(name, str(_meta(p).get("name") or "")) is not None
            and is_active(p)]
    ready = sum(1 for p in mine if is_ready(p))
    return {
        "observedGeneration": _generation(sts),
        "replicas": len(mine),
        "readyReplicas": ready,
        "currentReplicas": len(mine),
        "updatedReplicas": len(mine),
        "availableReplicas": ready,
        "currentRevision": revision,
        "updateRevision": revision,
        "collisionCount": 0,
    }


# ------------------------------------------------------------------------------------------------
# Job
# ------------------------------------------------------------------------------------------------


@dataclass
class JobPlan:
    """Pods to create (completion indexes for Indexed Jobs, else ``count``), Pods to delete, and
    the status to write."""

    count: int = 0
    indexes: list[int] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)


def job_plan(job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], *, now: str) -> JobPlan:
    """What the Job controller does next, and the status it writes.

    ``completions`` None is a work queue: done once one Pod succeeded and none is active.
    Otherwise it keeps ``min(parallelism, completions - succeeded)`` Pods active until
    ``succeeded >= completions``, then writes ``completionTime`` and the ``SuccessCriteriaMet``
    and ``Complete`` conditions. ``suspend: true`` deletes the active Pods and creates none.
    ``now`` (RFC 3339) stamps ``startTime``, ``completionTime`` and new conditions.
    """
    spec = job.get("spec") or {}
    old = _status(job)
    parallelism = _int(spec.get("parallelism"), 1)
    completions_raw = spec.get("completions")
    completions = _int(completions_raw, 1) if completions_raw is not None else None
    indexed = spec.get("completionMode") == "Indexed" and completions is not None
    pods = list(pods)
    active = [p for p in pods if is_active(p)]
    succeeded_pods = [p for p in pods if _status(p).get("phase") == "Succeeded"]
    succeeded = max(len(succeeded_pods), _int(old.get("succeeded"), 0))
    failed = max(sum(1 for p in pods if _status(p).get("phase") == "Failed"),
                 _int(old.get("failed"), 0))
    conds = [c for c in old.get("conditions") or () if isinstance(c, Mapping)]
    already_done = any(c.get("type") == "Complete" and c.get("status") == "True" for c in conds)
    if completions is None:
        done = already_done or (succeeded > 0 and not active)
    else:
        done = already_done or succeeded >= completions
    plan = JobPlan()
    suspended = spec.get("suspend") is True
    if suspended:
        plan.delete = [str(_meta(p).get("name")) for p in active]
    elif not done:
        if completions is None:
            wanted = parallelism if succeeded == 0 else 0
        else:
            wanted = min(parallelism, completions - succeeded)
        missing = max(0, wanted - len(active))
        if indexed and completions is not None:
            taken = {_int_text((_meta(p).get("annotations") or {}).get(COMPLETION_INDEX))
                     for p in active + succeeded_pods}
            plan.indexes = [i for i in range(completions) if i not in taken][:missing]
        else:
            plan.count = missing
    status: dict[str, Any] = {}
    if not suspended:
        status["startTime"] = old.get("startTime") or now
    n_active = 0 if suspended else len(active)
    if n_active:
        status["active"] = n_active
    ready = sum(1 for p in active if is_ready(p))
    status["ready"] = 0 if suspended else ready
    if succeeded:
        status["succeeded"] = succeeded
    if failed:
        status["failed"] = failed
    status["terminating"] = 0
    new_conds = [dict(c) for c in conds]
    if done and not already_done:
        status["completionTime"] = now
        for kind in ("SuccessCriteriaMet", "Complete"):
            new_conds.append({"type": kind, "status": "True", "reason": "CompletionsReached",
                              "message": "Reached expected number of succeeded pods",
                              "lastProbeTime": now, "lastTransitionTime": now})
    elif old.get("completionTime"):
        status["completionTime"] = old["completionTime"]
    if new_conds:
        status["conditions"] = new_conds
    plan.status = status
    return plan


def job_finished_at(job: Mapping[str, Any]) -> str | None:
    """``status.completionTime`` of a Complete Job, else None."""
    st = _status(job)
    for c in st.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") in ("Complete", "Failed") and c.get(
            "status"
        ) == "True":
            return str(st.get("completionTime") or c.get("lastTransitionTime") or "")
    return None
