"""The pod controller's reconcile loop: one CapacityRequest per non-terminal Pod.

Seed 000 "The unschedulable-pod controller: one CapacityRequest per Pod", seed 003 (ADR-0039),
reference-behavior.md §10 (Reconcile steps), with the §18 item 14 fixes: the CR name is derived
from the Pod UID (two racing reconciles cannot create duplicates; AlreadyExists is success), a
changed translation updates the CR, a CR deleted by hand is recreated at once (CR delete events
enqueue the owning Pod) and on every resync, and orphan CRs whose Pod is gone are removed.

Wiring:

* Two informers: Pods (slim projection, :func:`slim_pod`) and CapacityRequests carrying the
  ``bigfleet.lucy.sh/owned-by-pod`` label (:func:`slim_cr`, indexed by owner UID and by owner
  Pod key). Nothing is written before both have synced.
* A de-duplicating :class:`~.workqueue.WorkQueue` of keys ``("pod", "ns/name")``,
  ``("orphan", "ns/crname")`` and (low priority) ``("stamp", "ns/crname")``; ``workers``
  tasks take keys; errors re-queue the key with per-key exponential backoff.
* Every ``resync_period`` all Pods are re-enqueued and CRs without a live Pod are re-checked.

Reconcile of ``("pod", "ns/name")`` (outcome counted in
``bigfleet_unschedulable_pod_controller_reconciles_total``):

1. Pod not in the cache → ``pod_gone`` (ownerRef GC removes its CR; CRs still pointing at that
   name are re-checked as orphans after ``orphan_grace``).
2. Terminal (Succeeded/Failed) → deletecollection of CRs in the namespace labelled
   ``owned-by-pod=<uid>`` when the cache shows any → ``pod_terminal``; never a create.
3. Translate (:func:`~.translate.translate_pod`). TranslationError → Warning Event on the Pod +
   WARNING log line (both once per distinct error per Pod; a repeat, e.g. on resync, is a DEBUG
   line) → ``invalid_pod`` (no CR, no retry). Warnings (unparseable penalty annotation, ...) →
   Warning Event + WARNING log (once per distinct set of warnings per Pod) and carry on.
   Requirements whose operator the CRD does not accept (Gt/Lt from node affinity: the
   translation keeps them, :data:`~.translate.CRD_REQUIREMENT_OPERATORS` is what the CRD allows)
   → no write, ONE Warning Event ``UnsupportedRequirement`` on the Pod naming key and operator
   (once per distinct message while it persists), one warning log line, →
   ``unsupported_requirement``; no retry (a Pod change or the resync re-checks). A CR the Pod
   already has is deleted: it would carry the demand with constraints the Pod no longer has,
   and the Event is what makes the demand visible (reference §18.13: never silent lost demand).
4. No CR → create with the deterministic name; AlreadyExists → read it and treat it as existing
   → ``cr_created`` / ``cr_exists``. The status merge-patch ``{"status":{"phase":"Pending"}}``
   follows as a low-priority queue item ``("stamp", "ns/crname")``: it runs once no Pod work is
   waiting (under a burst, demand becomes visible first; the operator treats an empty phase as
   Pending anyway), carries the create's resourceVersion so it never overwrites a phase the
   operator wrote meanwhile, and any failure is logged, non-fatal.
5. A CR exists: extra CRs for the same UID (e.g. made by the Go controller's generateName) are
   deleted; if the kept CR's spec differs from the translation, a JSON merge patch (an RFC 7386
   diff: removed keys set to null, lists replaced wholesale) updates it → ``cr_updated``;
   otherwise ``cr_exists``.
6. The apiserver rejects the create or patch with 422 Invalid → a permanent outcome, not an
   error: Warning Event ``CapacityRequestRejected`` on the Pod with the apiserver's message
   (once per translated spec version), one log line, any CR the Pod has is deleted (its spec is
   not the Pod's any more, as in step 3), → ``cr_rejected``; no backoff retry (a Pod change or
   the periodic resync tries again).

Reconcile of ``("orphan", "ns/crname")``: the CR's owner (label UID) is not a live Pod in the cache
and a live GET of the owner Pod confirms it is gone (or has another UID) → delete the CR with a UID
precondition → ``orphan_deleted``.
"""

from __future__ import annotations

import collections
import json
import logging
import math
from collections.abc import Mapping
from typing import Any

import trio

from bigfleet_trio.kube import CAPACITY_REQUESTS, PODS, Informer, KubeClient, LeaderElector
from bigfleet_trio.kube.errors import (
    AlreadyExists,
    ApiError,
    Conflict,
    Invalid,
    KubeTransportError,
    NotFound,
)
from bigfleet_trio.kube.informer import SyncTimeout, wait_all_synced

from . import metrics
from .defaults import PriorityClassDefaults
from .translate import (
    CRD_REQUIREMENT_OPERATORS,
    INTERRUPTION_PENALTY_ANNOTATION,
    OWNED_BY_POD_LABEL,
    RECLAMATION_PENALTY_ANNOTATION,
    TranslationError,
    build_capacity_request,
    is_terminal,
    translate_pod,
    unsupported_requirements,
)
from .workqueue import WorkQueue

__all__ = [
    "CONTROLLER_NAME",
    "OWNER_POD_INDEX",
    "OWNER_UID_INDEX",
    "POD_UID_INDEX",
    "PodController",
    "REASON_FAILED",
    "REASON_REJECTED",
    "REASON_UNSUPPORTED",
    "REASON_WARNING",
    "SyncTimeout",
    "merge_patch_diff",
    "slim_cr",
    "slim_pod",
]

log = logging.getLogger(__name__)

CONTROLLER_NAME = "bigfleet-unschedulable-pod-controller"
OWNER_UID_INDEX = "owner-uid"
"""CR index: value of the ``bigfleet.lucy.sh/owned-by-pod`` label (the Pod UID)."""
OWNER_POD_INDEX = "owner-pod"
"""CR index: ``"ns/name"`` of the Pod named by the CR's Pod ownerReference."""
POD_UID_INDEX = "uid"
"""Pod index: ``metadata.uid``."""

REASON_FAILED = "CapacityRequestFailed"
"""Event reason: the Pod cannot be translated (no CR)."""
REASON_WARNING = "CapacityRequestWarning"
"""Event reason: translated with a warning (e.g. unparseable penalty annotation ignored)."""
REASON_UNSUPPORTED = "UnsupportedRequirement"
"""Event reason: a requirement operator the CRD does not accept (Gt/Lt); no CR."""
REASON_REJECTED = "CapacityRequestRejected"
"""Event reason: the apiserver rejected the CR create/patch with 422 Invalid; no CR."""
_REASONS = (REASON_FAILED, REASON_WARNING, REASON_UNSUPPORTED, REASON_REJECTED)
_NOT_SENT = "this Pod's demand is not sent to BigFleet"

PodKey = tuple[str, str]

_ANNOTATIONS_KEPT = (INTERRUPTION_PENALTY_ANNOTATION, RECLAMATION_PENALTY_ANNOTATION)
_POD_META = ("name", "namespace", "uid", "ownerReferences", "deletionTimestamp")
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


def slim_pod(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The Pod as the controller keeps it in memory (informer transform).

    Keeps ``metadata`` name/namespace/uid/ownerReferences/deletionTimestamp and the two penalty
    annotations; ``spec`` fields :func:`~.translate.translate_pod` reads (container requests,
    init-container restartPolicy, required node/pod affinity, nodeSelector, overhead, pod-level
    resources, priority, priorityClassName, topologySpreadConstraints); ``status.phase``.
    Malformed shapes are kept as they are so translation reports them. ``apiVersion``/``kind``
    are always ``v1``/``Pod`` (Events need them).
    """
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    spec = obj.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    status = obj.get("status")
    status = status if isinstance(status, Mapping) else {}
    out_meta: dict[str, Any] = {k: meta[k] for k in _POD_META if k in meta}
    annotations = meta.get("annotations")
    if isinstance(annotations, Mapping):
        kept = {k: annotations[k] for k in _ANNOTATIONS_KEPT if k in annotations}
        if kept:
            out_meta["annotations"] = kept
    elif annotations is not None:
        out_meta["annotations"] = annotations
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
        "spec": out_spec,
    }
    if "phase" in status:
        out["status"] = {"phase": status["phase"]}
    return out


def slim_cr(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The CapacityRequest as the controller keeps it: identity, owner, spec, status.phase."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    labels = meta.get("labels")
    labels = labels if isinstance(labels, Mapping) else {}
    out_meta: dict[str, Any] = {
        k: meta[k]
        for k in ("name", "namespace", "uid", "ownerReferences", "deletionTimestamp")
        if k in meta
    }
    if OWNED_BY_POD_LABEL in labels:
        out_meta["labels"] = {OWNED_BY_POD_LABEL: labels[OWNED_BY_POD_LABEL]}
    status = obj.get("status")
    out: dict[str, Any] = {"metadata": out_meta, "spec": obj.get("spec")}
    if isinstance(status, Mapping) and "phase" in status:
        out["status"] = {"phase": status["phase"]}
    return out


def _owner_uid(cr: Mapping[str, Any]) -> str:
    labels = cr.get("metadata", {}).get("labels") or {}
    uid = labels.get(OWNED_BY_POD_LABEL)
    return uid if isinstance(uid, str) else ""


def _owner_pod_name(cr: Mapping[str, Any]) -> str | None:
    refs = cr.get("metadata", {}).get("ownerReferences")
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if (
            isinstance(ref, Mapping)
            and ref.get("kind") == "Pod"
            and isinstance(ref.get("name"), str)
        ):
            return str(ref["name"])
    return None


def _rv(obj: Mapping[str, Any]) -> str | None:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return rv if isinstance(rv, str) and rv else None


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _index_owner_uid(cr: Mapping[str, Any]) -> list[str]:
    uid = _owner_uid(cr)
    return [uid] if uid else []


def _index_owner_pod(cr: Mapping[str, Any]) -> list[str]:
    name = _owner_pod_name(cr)
    return [f"{cr.get('metadata', {}).get('namespace', '')}/{name}"] if name else []


def _index_pod_uid(pod: Mapping[str, Any]) -> list[str]:
    uid = pod.get("metadata", {}).get("uid")
    return [uid] if isinstance(uid, str) and uid else []


def merge_patch_diff(old: Any, new: Any) -> Any:
    """The RFC 7386 JSON merge patch turning ``old`` into ``new``.

    Objects are diffed key by key (keys missing from ``new`` become ``null``, equal keys are left
    out); anything else (lists, scalars) is replaced wholesale, which is how merge patch treats
    lists in CRDs. ``new`` must not contain ``null`` values (they would mean "delete").

    Returns:
        A dict patch when both are objects (``{}`` when equal), else ``new``.
    """
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return new
    patch: dict[str, Any] = {}
    for k in old:
        if k not in new:
            patch[k] = None
    for k, v in new.items():
        if k not in old:
            patch[k] = v
        elif old[k] != v:
            if isinstance(old[k], Mapping) and isinstance(v, Mapping):
                patch[k] = merge_patch_diff(old[k], v)
            else:
                patch[k] = v
    return patch


# --------------------------------------------------------------------------------------------
# the controller


class PodController:
    """Informers + work queue + workers that keep one CapacityRequest per non-terminal Pod.

    Args:
        client: the :class:`~bigfleet_trio.kube.KubeClient` (its QPS/burst limit applies).
        defaults: PriorityClass penalty defaults (None = none).
        workers: concurrent reconciles (16, reference ``MaxConcurrentReconciles``).
        resync_period: seconds between full re-enqueues of every Pod (and orphan re-checks).
        orphan_grace: seconds a CR whose Pod vanished is left to the apiserver's garbage
            collector before we check it ourselves.
        sync_timeout: seconds :meth:`run` waits for both informers to sync before raising
            :class:`SyncTimeout` (reference: 10 min).
        queue: the work queue (default: a fresh one reporting Prometheus metrics).
        namespace: watch one namespace only (None = all).
        component: Event source component.

    Usage::

        ctl = PodController(client, defaults)
        await nursery.start(ctl.run)          # returns once both informers synced
        # or, with leader election (informers run on standbys too, workers only on the leader):
        await nursery.start(partial(ctl.run, elector=elector))

    Attributes:
        pods, crs: the two informers (``.store`` for inspection).
        queue: the work queue.
        outcomes: local ``collections.Counter`` of reconcile outcomes (tests, bench).
        synced: both caches synced. leading: workers are running.
    """

    def __init__(
        self,
        client: KubeClient,
        defaults: PriorityClassDefaults | None = None,
        *,
        workers: int = 16,
        resync_period: float = 300.0,
        orphan_grace: float = 30.0,
        sync_timeout: float = 600.0,
        queue: WorkQueue[tuple[str, str]] | None = None,
        namespace: str | None = None,
        component: str = CONTROLLER_NAME,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1 (got {workers})")
        self.client = client
        self.defaults = defaults
        self.workers = workers
        self.resync_period = resync_period
        self.orphan_grace = orphan_grace
        self.sync_timeout = sync_timeout
        self.component = component
        self.queue: WorkQueue[tuple[str, str]] = queue or WorkQueue(
            metrics=metrics.PrometheusQueueMetrics(component)
        )
        self.pods = Informer(
            client,
            PODS,
            namespace=namespace,
            transform=slim_pod,
            indexers={POD_UID_INDEX: _index_pod_uid},
        )
        self.crs = Informer(
            client,
            CAPACITY_REQUESTS,
            namespace=namespace,
            label_selector=OWNED_BY_POD_LABEL,
            transform=slim_cr,
            indexers={OWNER_UID_INDEX: _index_owner_uid, OWNER_POD_INDEX: _index_owner_pod},
        )
        self.pods.add_handler(self._on_pod_add, self._on_pod_update, self._on_pod_delete)
        self.crs.add_handler(self._on_cr_add, self._on_cr_update, self._on_cr_delete)
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.synced = False
        self.leading = False
        # (pod uid, Event reason) -> (messages, version) last reported: each condition is
        # reported once while it persists and again after it cleared and came back
        self._reported: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {}
        self._stamp_rv: dict[str, str | None] = {}  # CR key -> resourceVersion after create

    # -- readiness ----------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, str | list[str]]:
        """``(True, detail)`` once both informers synced, else ``(False, reasons)``."""
        if not self.synced:
            reasons = [
                f"{inf.res.plural} informer not synced"
                for inf in (self.pods, self.crs)
                if not inf.synced
            ]
            return False, reasons or ["starting workers"]
        return True, "leader" if self.leading else "synced (standby)"

    # -- informer handlers (sync, never block) -------------------------------------------------

    def _enqueue_pod(self, key: str) -> None:
        self.queue.add(("pod", key))

    def _on_pod_add(self, pod: dict[str, Any]) -> None:
        self._enqueue_pod(_key(pod))

    def _on_pod_update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        if old != new:  # the projection hides status churn that cannot change the CR
            self._enqueue_pod(_key(new))

    def _on_pod_delete(self, pod: dict[str, Any]) -> None:
        uid = pod.get("metadata", {}).get("uid")
        if isinstance(uid, str):
            self._clear(uid, *_REASONS)
        self._enqueue_pod(_key(pod))

    def _check_cr(self, cr: dict[str, Any]) -> None:
        """Enqueue whatever a CR change may require (its Pod, or an orphan check)."""
        if not self.synced:
            return  # the post-sync scan covers everything seen before
        owner = _owner_pod_name(cr)
        ns = cr.get("metadata", {}).get("namespace", "")
        pod = self.pods.store.get(f"{ns}/{owner}") if owner else None
        uid = _owner_uid(cr)
        if pod is None or pod.get("metadata", {}).get("uid") != uid:
            if not self.pods.store.by_index(POD_UID_INDEX, uid):
                self.queue.add_after(("orphan", _key(cr)), self.orphan_grace)
            return
        if is_terminal(pod):
            self._enqueue_pod(f"{ns}/{owner}")

    def _on_cr_add(self, cr: dict[str, Any]) -> None:
        self._check_cr(cr)

    def _on_cr_update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        if old.get("spec") != new.get("spec") and self.synced:
            owner = _owner_pod_name(new)
            if owner:  # someone edited the spec: put it back if it differs from the Pod's
                self._enqueue_pod(f"{new.get('metadata', {}).get('namespace', '')}/{owner}")
        self._check_cr(new)

    def _on_cr_delete(self, cr: dict[str, Any]) -> None:
        owner = _owner_pod_name(cr)
        if not owner or not self.synced:
            return
        key = f"{cr.get('metadata', {}).get('namespace', '')}/{owner}"
        pod = self.pods.store.get(key)
        uid = _owner_uid(cr)
        # recreate at once if that very Pod is still live (not for GC after a Pod deletion),
        # and not when we deleted it ourselves because that Pod cannot have a CR right now
        # (unsupported requirement / rejected by the apiserver: a Pod change re-checks it)
        if (pod is not None and pod.get("metadata", {}).get("uid") == uid
                and not is_terminal(pod) and not self._no_cr_wanted(uid)):
            self._enqueue_pod(key)

    # -- running ------------------------------------------------------------------------------

    async def run(
        self,
        *,
        elector: LeaderElector | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Start the informers, wait for sync, then run the workers until cancelled.

        ``task_status.started()`` is signalled once both caches synced. With ``elector`` the
        workers (the only writers) run only while this process holds the Lease; a lost Lease
        cancels them and the controller campaigns again, informers staying warm.

        Raises:
            SyncTimeout: the caches did not sync within ``sync_timeout``.
        """
        timed_out: SyncTimeout | None = None
        async with trio.open_nursery() as nursery:
            await nursery.start(self.pods.run)
            await nursery.start(self.crs.run)
            try:
                await wait_all_synced((self.pods, self.crs), self.sync_timeout)
            except SyncTimeout as exc:
                timed_out = exc
                nursery.cancel_scope.cancel()
            else:
                await self._synced_run(elector, task_status)
                nursery.cancel_scope.cancel()
        if timed_out is not None:
            raise timed_out

    async def _synced_run(
        self, elector: LeaderElector | None, task_status: trio.TaskStatus[None]
    ) -> None:
        self.synced = True
        log.info(
            "pod controller caches synced pods=%d crs=%d", len(self.pods.store), len(self.crs.store)
        )
        task_status.started()
        if elector is None:
            await self._work()
        else:
            await elector.run(self._work)

    async def _work(self) -> None:
        """The leader's part: initial enqueue + orphan scan, workers, periodic resync."""
        self.leading = True
        try:
            self.resync()
            log.info(
                "pod controller workers starting workers=%d queued=%d",
                self.workers,
                len(self.queue),
            )
            async with trio.open_nursery() as nursery:
                for i in range(self.workers):
                    nursery.start_soon(self._worker, i)
                nursery.start_soon(self._resync_loop)
        finally:
            self.leading = False

    def resync(self) -> None:
        """Enqueue every cached Pod and an orphan check for every CR without a live Pod."""
        for key in self.pods.store.keys():
            self._enqueue_pod(key)
        orphans = 0
        for key, cr in self.crs.store.items():
            if not self.pods.store.by_index(POD_UID_INDEX, _owner_uid(cr)):
                self.queue.add(("orphan", key))
                orphans += 1
        log.debug("pod controller resync pods=%d orphan_checks=%d", len(self.pods.store), orphans)

    async def _resync_loop(self) -> None:
        if not math.isfinite(self.resync_period) or self.resync_period <= 0:
            return
        while True:
            await trio.sleep(self.resync_period)
            self.resync()

    async def _worker(self, index: int) -> None:
        while True:
            item = await self.queue.get()
            try:
                outcome = await self.reconcile(item)
            except (ApiError, KubeTransportError) as exc:
                self._count("error")
                delay = self.queue.add_rate_limited(item)
                log.warning(
                    "pod controller reconcile failed key=%s/%s retry_in=%.3fs err=%s",
                    item[0],
                    item[1],
                    delay,
                    exc,
                )
            except Exception:
                self._count("error")
                delay = self.queue.add_rate_limited(item)
                log.exception(
                    "pod controller reconcile crashed key=%s/%s retry_in=%.3fs",
                    item[0],
                    item[1],
                    delay,
                )
            else:
                self.queue.forget(item)
                if outcome is not None:
                    self._count(outcome)
            finally:
                self.queue.done(item)

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] += 1
        metrics.count_reconcile(outcome)

    # -- reconcile ----------------------------------------------------------------------------

    async def reconcile(self, item: tuple[str, str]) -> str | None:
        """Reconcile one queue item; returns the outcome label (None: nothing to count).

        Raises:
            ApiError, KubeTransportError: a write failed (the worker re-queues with backoff).
        """
        kind, key = item
        if kind == "pod":
            return await self.reconcile_pod(key)
        if kind == "orphan":
            return await self.reconcile_orphan(key)
        if kind == "stamp":
            await self.reconcile_stamp(key)
            return None
        log.error("pod controller unknown queue item kind=%s key=%s", kind, key)
        return None

    async def reconcile_pod(self, key: str) -> str:
        """Reconcile the Pod ``"ns/name"`` (see the module docstring)."""
        pod = self.pods.store.get(key)
        if pod is None:
            for cr in self.crs.store.by_index(OWNER_POD_INDEX, key):
                self.queue.add_after(("orphan", _key(cr)), self.orphan_grace)
            log.debug("pod gone pod=%s", key)
            return "pod_gone"
        meta = pod["metadata"]
        ns = meta.get("namespace", "")
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid:
            log.warning("pod without uid skipped pod=%s", key)
            return "invalid_pod"
        owned = self.crs.store.by_index(OWNER_UID_INDEX, uid)
        if is_terminal(pod):
            if owned:
                await self.client.delete_collection(
                    CAPACITY_REQUESTS, ns, label_selector=f"{OWNED_BY_POD_LABEL}={uid}"
                )
                log.info(
                    "crs deleted for terminal pod pod=%s uid=%s phase=%s crs=%d",
                    key,
                    uid,
                    pod.get("status", {}).get("phase"),
                    len(owned),
                )
            return "pod_terminal"
        try:
            translation = translate_pod(pod, self.defaults)
            body = build_capacity_request(pod, translation)
        except TranslationError as exc:
            # WARNING once per distinct error (with the Event); a resync repeating it is DEBUG
            if await self._report(pod, uid, REASON_FAILED, (str(exc),)):
                log.warning("pod cannot be translated pod=%s uid=%s err=%s", key, uid, exc)
            else:
                log.debug("pod still cannot be translated pod=%s err=%s", key, exc)
            return "invalid_pod"
        self._clear(uid, REASON_FAILED)
        if translation.warnings:
            new = await self._report(pod, uid, REASON_WARNING, translation.warnings)
            for w in translation.warnings:
                log.log(logging.WARNING if new else logging.DEBUG,
                        "pod translation warning pod=%s uid=%s warning=%s", key, uid, w)
        else:
            self._clear(uid, REASON_WARNING)
        unsupported = unsupported_requirements(translation.spec)
        if unsupported:
            return await self._unsupported(key, pod, uid, unsupported, owned)
        self._clear(uid, REASON_UNSUPPORTED)
        try:
            outcome = await self._write(key, uid, body, owned)
        except Invalid as exc:
            return await self._rejected(key, pod, uid, body, exc, owned)
        self._clear(uid, REASON_REJECTED)
        return outcome

    async def _write(
        self, key: str, uid: str, body: dict[str, Any], owned: list[dict[str, Any]]
    ) -> str:
        """Steps 4-5: create the CR, or bring the existing one in line with ``body``."""
        spec = body["spec"]
        want = body["metadata"]["name"]
        if not owned:
            return await self._create(key, uid, body)
        keep = next((cr for cr in owned if cr["metadata"].get("name") == want), owned[0])
        for extra in owned:
            if extra is not keep:
                await self._delete_cr(extra, why="duplicate")
        if keep.get("spec") != spec:
            return await self._update_spec(key, keep, spec, body)
        log.debug("cr exists pod=%s cr=%s", key, keep["metadata"].get("name"))
        return "cr_exists"

    async def _unsupported(
        self,
        key: str,
        pod: dict[str, Any],
        uid: str,
        unsupported: tuple[dict[str, Any], ...],
        owned: list[dict[str, Any]],
    ) -> str:
        """Step 3b: requirements the CRD cannot carry: Event + log, no CR (stale one deleted)."""
        what = ", ".join(f"{r.get('key')!r} {r.get('operator')}" for r in unsupported)
        message = (
            f"node affinity requirement {what} cannot be expressed in a CapacityRequest (the "
            f"CRD accepts operators {', '.join(sorted(CRD_REQUIREMENT_OPERATORS))}); {_NOT_SENT}"
        )
        self._clear(uid, REASON_REJECTED)
        if await self._report(pod, uid, REASON_UNSUPPORTED, (message,)):
            log.warning(
                "pod demand not sent, unsupported requirement pod=%s uid=%s requirements=%s "
                "stale_crs=%d",
                key,
                uid,
                what,
                len(owned),
            )
        else:
            log.debug("pod demand still not sent, unsupported requirement pod=%s", key)
        for cr in owned:
            await self._delete_cr(cr, why="unsupported_requirement")
        return "unsupported_requirement"

    async def _rejected(
        self,
        key: str,
        pod: dict[str, Any],
        uid: str,
        body: dict[str, Any],
        exc: Invalid,
        owned: list[dict[str, Any]],
    ) -> str:
        """Step 6: 422 Invalid on create/patch: permanent for this spec version."""
        version = json.dumps(body["spec"], sort_keys=True, separators=(",", ":"))
        message = f"CapacityRequest rejected by the apiserver: {exc.message}; {_NOT_SENT}"
        if await self._report(pod, uid, REASON_REJECTED, (message,), version=version):
            log.warning(
                "pod demand not sent, cr rejected pod=%s uid=%s cr=%s err=%s",
                key,
                uid,
                body["metadata"]["name"],
                exc,
            )
        else:
            log.debug("pod demand still not sent, cr rejected again pod=%s", key)
        for cr in owned:
            await self._delete_cr(cr, why="rejected_update")
        return "cr_rejected"

    async def _create(self, key: str, uid: str, body: dict[str, Any]) -> str:
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            created = await self.client.create(CAPACITY_REQUESTS, body, ns)
        except AlreadyExists:
            # Cache lag or a racing reconcile: the CR is there; make sure it is right.
            live = await self.client.get(CAPACITY_REQUESTS, name, ns)
            outcome = "cr_exists"
            if live.get("spec") != body["spec"]:
                live = await self.client.patch(
                    CAPACITY_REQUESTS,
                    name,
                    {"spec": merge_patch_diff(live.get("spec") or {}, body["spec"])},
                    ns,
                )
                log.info("cr updated pod=%s cr=%s (found on create)", key, name)
                outcome = "cr_updated"
            if not (live.get("status") or {}).get("phase"):
                self._queue_stamp(ns, name, _rv(live))
            return outcome
        log.info("cr created pod=%s uid=%s cr=%s", key, uid, name)
        self._queue_stamp(ns, name, _rv(created))
        return "cr_created"

    def _queue_stamp(self, ns: str, name: str, resource_version: str | None) -> None:
        """Schedule the Pending stamp behind all Pod work (low priority in the queue)."""
        cr_key = f"{ns}/{name}"
        self._stamp_rv[cr_key] = resource_version
        self.queue.add(("stamp", cr_key), low=True)

    async def reconcile_stamp(self, cr_key: str) -> None:
        """Status merge-patch ``{"status":{"phase":"Pending"}}`` on a CR we created.

        Guarded by the resourceVersion the create returned, so a phase the operator wrote in
        the meantime (Acknowledged) is never overwritten with Pending; on a Conflict the live CR
        is read and stamped only if it still has no phase. Every failure is logged, non-fatal
        (reference §10 step 5).
        """
        rv = self._stamp_rv.pop(cr_key, None)
        cached = self.crs.store.get(cr_key)
        if cached is not None and (cached.get("status") or {}).get("phase"):
            return
        ns, _, name = cr_key.partition("/")
        try:
            for _attempt in range(3):
                patch: dict[str, Any] = {"status": {"phase": "Pending"}}
                if rv:
                    patch["metadata"] = {"resourceVersion": rv}
                try:
                    await self.client.patch(CAPACITY_REQUESTS, name, patch, ns,
                                            subresource="status")
                    log.debug("cr stamped Pending cr=%s", cr_key)
                    return
                except Conflict:
                    live = await self.client.get(CAPACITY_REQUESTS, name, ns)
                    phase = (live.get("status") or {}).get("phase")
                    if phase:
                        log.info("cr Pending stamp skipped, phase already set cr=%s phase=%s",
                                 cr_key, phase)
                        return
                    rv = _rv(live)
            log.warning("cr Pending stamp gave up after conflicts (non-fatal) cr=%s", cr_key)
        except NotFound:
            log.info("cr gone before Pending stamp cr=%s", cr_key)
        except (ApiError, KubeTransportError) as exc:
            log.warning("cr Pending stamp failed (non-fatal) cr=%s err=%s", cr_key, exc)

    async def _update_spec(
        self, key: str, cr: dict[str, Any], spec: dict[str, Any], body: dict[str, Any]
    ) -> str:
        meta = cr["metadata"]
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        patch = {"spec": merge_patch_diff(cr.get("spec") or {}, spec)}
        try:
            await self.client.patch(CAPACITY_REQUESTS, name, patch, ns)
        except NotFound:
            log.info("cr vanished before update, recreating pod=%s cr=%s", key, name)
            return await self._create(key, body["metadata"]["labels"][OWNED_BY_POD_LABEL], body)
        log.info("cr updated pod=%s cr=%s patch=%s", key, name, patch)
        return "cr_updated"

    async def _delete_cr(self, cr: dict[str, Any], *, why: str) -> bool:
        meta = cr["metadata"]
        ns, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid")
        try:
            await self.client.delete(
                CAPACITY_REQUESTS, name, ns, preconditions={"uid": uid} if uid else None
            )
        except (NotFound, Conflict):
            return False
        log.info("cr deleted reason=%s cr=%s/%s owner_uid=%s", why, ns, name, _owner_uid(cr))
        return True

    async def reconcile_orphan(self, key: str) -> str | None:
        """Delete the CR ``"ns/name"`` if its owner Pod is really gone (live GET confirms)."""
        cr = self.crs.store.get(key)
        if cr is None or cr["metadata"].get("deletionTimestamp"):
            return None
        uid = _owner_uid(cr)
        if uid and self.pods.store.by_index(POD_UID_INDEX, uid):
            return None
        ns = cr["metadata"].get("namespace", "")
        owner = _owner_pod_name(cr)
        if owner:
            try:
                live = await self.client.get(PODS, owner, ns)
            except NotFound:
                live = None
            if live is not None and (live.get("metadata") or {}).get("uid") == uid:
                return None  # the Pod exists; our cache lags
        if await self._delete_cr(cr, why="orphan"):
            return "orphan_deleted"
        return None

    async def _report(
        self,
        pod: dict[str, Any],
        uid: str,
        reason: str,
        messages: tuple[str, ...],
        *,
        version: str = "",
    ) -> bool:
        """A Warning Event on the Pod per message, once per distinct (messages, version).

        Remembered per (Pod UID, reason) until :meth:`_clear` or the Pod's deletion.

        Returns:
            True when Events were written, False when this was reported already.
        """
        if self._reported.get((uid, reason)) == (messages, version):
            return False
        self._reported[(uid, reason)] = (messages, version)
        for message in messages:
            await self.client.create_event(
                pod, reason=reason, message=message, type="Warning", component=self.component
            )
        return True

    def _no_cr_wanted(self, uid: str) -> bool:
        """The Pod's last reconcile left it without a CR on purpose (Event reported)."""
        return (uid, REASON_UNSUPPORTED) in self._reported or (
            uid, REASON_REJECTED) in self._reported

    def _clear(self, uid: str, *reasons: str) -> None:
        """Forget that ``reasons`` were reported for ``uid`` (the condition cleared)."""
        for reason in reasons:
            self._reported.pop((uid, reason), None)
