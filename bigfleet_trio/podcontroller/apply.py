"""The pod controller's write side: carrying a :class:`~.plan.PodPlan` out against the apiserver.

:class:`PlanApplier`, a part of :class:`~.controller.PodController` (``ctl.applier``): creates,
spec patches, deletes (uid preconditions), the low-priority Pending stamp and the Warning Events
of a Pod that gets no CR, each remembered per (Pod UID, reason) so a condition is reported once.
The controller decides what to reconcile and when; this side only writes.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.errors import (
    AlreadyExists,
    ApiError,
    Conflict,
    Invalid,
    KubeTransportError,
    NotFound,
)
from bigfleet_trio.kube.informer import Store
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, PODS

from ..kube.mergepatch import merge_diff
from ..kube.workqueue import WorkQueue
from . import projections as proj
from .keys import PodKey, QueueKey, StampKey
from .plan import (
    NO_CR_OUTCOMES,
    REASON_REJECTED,
    REASON_UNSUPPORTED,
    EventReport,
    PodPlan,
    plan_rejected,
)

__all__ = ["PlanApplier"]

# The controller's logger name, as before this module was split out: log filters keep working.
log = logging.getLogger("bigfleet_trio.podcontroller.controller")


STAMP_BACKLOG = 10_000
"""Pending stamps that may wait in the work queue at once; CRs created past it are stamped by
:meth:`PlanApplier.sweep_stamps` (docs/rules.md#pod-translation-pending-stamp)."""


class PlanApplier:
    """Writes for one Pod's plan.

    Args:
        client: the controller's Kubernetes client.
        crs: the controller's CapacityRequest informer store (the stamp skips a CR whose cached
            phase is set).
        queue: the controller's work queue (the Pending stamp is queued there, low priority).
        component: Event source component.
    """

    def __init__(
        self, client: KubeClient, crs: Store, queue: WorkQueue[QueueKey], component: str
    ) -> None:
        self.client = client
        self.crs = crs
        self.queue = queue
        self.component = component
        # (pod uid, Event reason) -> (messages, version) last reported: each condition is
        # reported once while it persists and again after it cleared and came back
        self._reported: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {}
        # resourceVersion after our create; "" for a stamp the sweep queued (read the CR first)
        self.stamp_rv: dict[StampKey, str | None] = {}
        self.stamp_backlog = STAMP_BACKLOG
        self.stamps_overflowed = False
        """A CR was created while the stamp backlog was full: the next sweep looks for it."""
        self.stamps_swept = 0

    async def apply(
        self, key: PodKey, pod: dict[str, Any], owned: list[dict[str, Any]], plan: PodPlan
    ) -> str:
        """Carry ``plan`` out for the Pod ``key``; returns the outcome to count."""
        uid = plan.uid
        if not uid:
            log.warning("pod without uid skipped pod=%s", key)
            return plan.outcome
        if plan.outcome == "pod_terminal":
            if plan.delete:
                gone = [await self.delete_cr(cr, why="pod_terminal") for cr in plan.delete]
                log.info("crs deleted for terminal pod pod=%s uid=%s phase=%s crs=%d",
                         key, uid, plan.phase, sum(gone))
            return plan.outcome
        if plan.outcome in NO_CR_OUTCOMES:
            return await self._unwanted(key, plan)
        if plan.outcome == "invalid_pod":
            assert plan.report is not None
            # WARNING once per distinct error (with the Event); a resync repeating it is DEBUG
            if await self._report(pod, uid, plan.report):
                log.warning("pod cannot be translated pod=%s uid=%s err=%s", key, uid, plan.detail)
            else:
                log.debug("pod still cannot be translated pod=%s err=%s", key, plan.detail)
            return plan.outcome
        self.clear(uid, *plan.clear)
        if plan.warnings is not None:
            new = await self._report(pod, uid, plan.warnings)
            for w in plan.warnings.messages:
                log.log(logging.WARNING if new else logging.DEBUG,
                        "pod translation warning pod=%s uid=%s warning=%s", key, uid, w)
        if plan.action == "report":
            await self._no_cr(key, pod, plan)
            return plan.outcome
        try:
            outcome = await self._write(key, plan)
        except Invalid as exc:
            # permanent for this spec version: reported, no backoff retry (a Pod change or the
            # resync tries again)
            rejected = plan_rejected(plan, owned, exc.message)
            await self._no_cr(key, pod, rejected, err=exc)
            return rejected.outcome
        self.clear(uid, REASON_REJECTED)
        return outcome

    async def _no_cr(
        self, key: PodKey, pod: dict[str, Any], plan: PodPlan, *, err: Exception | None = None
    ) -> None:
        """The Pod gets no CR: Events + one log line, then delete the CRs it has.

        A CR left in place would carry the demand with constraints the Pod no longer has; the
        Event is what makes the missing demand visible (never silently lost demand).
        """
        assert plan.report is not None
        uid = plan.uid
        new = await self._report(pod, uid, plan.report)
        if plan.report.reason == REASON_UNSUPPORTED:
            if new:
                log.warning(
                    "pod demand not sent, unsupported requirement pod=%s uid=%s requirements=%s "
                    "stale_crs=%d", key, uid, plan.detail, len(plan.delete))
            else:
                log.debug("pod demand still not sent, unsupported requirement pod=%s", key)
        elif new:
            assert plan.body is not None
            log.warning("pod demand not sent, cr rejected pod=%s uid=%s cr=%s err=%s",
                        key, uid, plan.body["metadata"]["name"], err)
        else:
            log.debug("pod demand still not sent, cr rejected again pod=%s", key)
        for cr in plan.delete:
            await self.delete_cr(cr, why=plan.delete_reason)

    async def _unwanted(self, key: PodKey, plan: PodPlan) -> str:
        """The Pod gets no CR on purpose (excluded, or on an unmanaged Node): delete the CRs it
        has, one INFO line when any went, no Event
        (docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out)."""
        self.clear(plan.uid, *plan.clear)
        if plan.delete:
            gone = [await self.delete_cr(cr, why=plan.delete_reason) for cr in plan.delete]
            log.info("crs deleted, pod gets no cr pod=%s uid=%s reason=%s crs=%d",
                     key, plan.uid, plan.outcome, sum(gone))
        return plan.outcome

    async def _write(self, key: PodKey, plan: PodPlan) -> str:
        """Create the CR, or delete extras and bring the kept one in line (``plan.action``)."""
        assert plan.body is not None
        if plan.action == "create":
            return await self._create(key, plan.uid, plan.body)
        for extra in plan.delete:
            await self.delete_cr(extra, why=plan.delete_reason)
        if plan.action == "update":
            return await self._update_spec(key, plan)
        assert plan.target is not None
        log.debug("cr exists pod=%s cr=%s", key, plan.target["metadata"].get("name"))
        return plan.outcome

    async def _create(self, key: PodKey, uid: str, body: dict[str, Any]) -> str:
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
                    {"spec": merge_diff(live.get("spec") or {}, body["spec"])},
                    ns,
                )
                log.info("cr updated pod=%s cr=%s (found on create)", key, name)
                outcome = "cr_updated"
            if not (live.get("status") or {}).get("phase"):
                self._queue_stamp(ns, name, proj.resource_version(live))
            return outcome
        log.info("cr created pod=%s uid=%s cr=%s", key, uid, name)
        self._queue_stamp(ns, name, proj.resource_version(created))
        return "cr_created"

    def _queue_stamp(self, ns: str, name: str, resource_version: str | None) -> None:
        """Schedule the Pending stamp behind all Pod work (low priority in the queue).

        Under a burst, demand becomes visible (CRs created) first; the operator treats an
        empty phase as Pending anyway.
        """
        key = StampKey(ns, name)
        if key not in self.stamp_rv and len(self.stamp_rv) >= self.stamp_backlog:
            # A burst of creates must not hold a queued stamp per CR (at 150,000 Pods replaced
            # at once those were 44 MB): the sweep finds the CRs without a phase later.
            self.stamps_overflowed = True
            return
        self.stamp_rv[key] = resource_version
        self.queue.add(key, low=True)

    async def sweep_stamps(self, chunk: int = 1000) -> int:
        """After an overflow, queue a stamp for each cached CR with no phase (and not being
        deleted) while the backlog has room; returns how many. Stays overflowed if it filled
        up again. Yields to the event loop every ``chunk`` CRs. Such a stamp reads the CR before
        it writes (the cache keeps no resourceVersion), so it never overwrites a phase."""
        if not self.stamps_overflowed:
            return 0
        self.stamps_overflowed = False
        queued = 0
        for i, key in enumerate(self.crs.keys(), 1):
            cr = self.crs.get(key)
            if (cr is not None and not (cr.get("status") or {}).get("phase")
                    and not cr["metadata"].get("deletionTimestamp")):
                stamp = StampKey.parse(key)
                if stamp not in self.stamp_rv:
                    if len(self.stamp_rv) >= self.stamp_backlog:
                        self.stamps_overflowed = True
                        break
                    self.stamp_rv[stamp] = ""
                    self.queue.add(stamp, low=True)
                    queued += 1
            if i % chunk == 0:
                await trio.lowlevel.checkpoint()
        self.stamps_swept += queued
        if queued:
            log.info("cr Pending stamps queued by the sweep crs=%d more=%s", queued,
                     self.stamps_overflowed)
        return queued

    def forget_stamp(self, cr_key: str) -> None:
        """The CR ``"ns/name"`` was deleted: a stamp still queued for it sends nothing.

        A burst's stamps run behind all Pod work, so by then many of their CRs are gone (the
        Job finished, a churn replaced the Pod), and each PATCH would be a wasted write that
        comes back 404.
        """
        self.stamp_rv.pop(StampKey.parse(cr_key), None)

    async def reconcile_stamp(self, key: StampKey | str) -> None:
        """Status merge-patch ``{"status":{"phase":"Pending"}}`` on a CR we created.

        Guarded by the resourceVersion the create returned, so a phase the operator wrote in
        the meantime (Acknowledged) is never overwritten with Pending; on a Conflict the live CR
        is read and stamped only if it still has no phase. Every failure is logged, non-fatal:
        the stamp is cosmetic.
        """
        key = StampKey.parse(key) if isinstance(key, str) else key
        if key not in self.stamp_rv:
            return  # its CR was deleted after the stamp was queued (forget_stamp)
        rv = self.stamp_rv.pop(key)
        cr_key = str(key)
        cached = self.crs.get(cr_key)
        if cached is not None and (cached.get("status") or {}).get("phase"):
            return
        ns, name = key.namespace, key.name
        try:
            if rv == "":  # queued by the sweep: no resourceVersion of ours to guard with
                live = await self.client.get(CAPACITY_REQUESTS, name, ns)
                if (live.get("status") or {}).get("phase"):
                    return
                rv = proj.resource_version(live)
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
                    rv = proj.resource_version(live)
            log.warning("cr Pending stamp gave up after conflicts (non-fatal) cr=%s", cr_key)
        except NotFound:
            log.info("cr gone before Pending stamp cr=%s", cr_key)
        except (ApiError, KubeTransportError) as exc:
            log.warning("cr Pending stamp failed (non-fatal) cr=%s err=%s", cr_key, exc)

    async def _update_spec(self, key: PodKey, plan: PodPlan) -> str:
        assert plan.target is not None and plan.patch is not None and plan.body is not None
        meta = plan.target["metadata"]
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        try:
            await self.client.patch(CAPACITY_REQUESTS, name, plan.patch, ns)
        except NotFound:
            # Gone under us: deleted by hand (re-create it), or collected because its Pod was
            # deleted and our Pod cache has not seen that yet (do not: a CR for a deleted Pod is
            # phantom demand). Only a live GET tells them apart, as on the recreate path.
            if not await self.pod_is_live(key, plan.uid):
                log.info("cr vanished before update with its pod; not re-created pod=%s cr=%s",
                         key, name)
                return "pod_gone"
            log.info("cr vanished before update, recreating pod=%s cr=%s", key, name)
            return await self._create(key, plan.uid, plan.body)
        log.info("cr updated pod=%s cr=%s patch=%s", key, name, plan.patch)
        return plan.outcome

    async def pod_is_live(self, key: PodKey, uid: str | None) -> bool:
        """True if the apiserver (a live GET, not the cache) has Pod ``key`` with ``uid`` and
        not terminating.

        Raises:
            ApiError, KubeTransportError: the GET failed (the worker re-queues with backoff).
        """
        try:
            live = await self.client.get(PODS, key.name, key.namespace)
        except NotFound:
            return False
        meta = live.get("metadata") or {}
        return bool(uid) and meta.get("uid") == uid and not meta.get("deletionTimestamp")

    async def delete_cr(self, cr: dict[str, Any], *, why: str) -> bool:
        meta = cr["metadata"]
        ns, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid")
        try:
            await self.client.delete(
                CAPACITY_REQUESTS, name, ns, preconditions={"uid": uid} if uid else None
            )
        except (NotFound, Conflict):
            return False
        log.info("cr deleted reason=%s cr=%s/%s owner_uid=%s", why, ns, name, proj.owner_uid(cr))
        return True

    async def _report(self, pod: dict[str, Any], uid: str, report: EventReport) -> bool:
        """A Warning Event on the Pod per message, once per distinct (messages, version).

        Remembered per (Pod UID, reason) until :meth:`clear` or the Pod's deletion.

        Returns:
            True when Events were written, False when this was reported already.
        """
        seen = (report.messages, report.version)
        if self._reported.get((uid, report.reason)) == seen:
            return False
        self._reported[(uid, report.reason)] = seen
        for message in report.messages:
            await self.client.create_event(
                pod, reason=report.reason, message=message, type="Warning",
                component=self.component,
            )
        return True

    def no_cr_wanted(self, uid: str) -> bool:
        """The Pod's last reconcile left it without a CR on purpose (Event reported)."""
        return (uid, REASON_UNSUPPORTED) in self._reported or (
            uid, REASON_REJECTED) in self._reported

    def clear(self, uid: str, *reasons: str) -> None:
        """Forget that ``reasons`` were reported for ``uid`` (the condition cleared)."""
        for reason in reasons:
            self._reported.pop((uid, reason), None)
