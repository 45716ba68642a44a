"""The pod controller: one CapacityRequest per non-terminal Pod, kept in line with the Pod.

Two informers (Pods as :func:`slim_pod` projections, CapacityRequests labelled
``bigfleet.lucy.sh/owned-by-pod`` as :func:`slim_cr`, indexed by owner UID and owner Pod) feed a
de-duplicating :class:`~.workqueue.WorkQueue` of typed keys (:mod:`.keys`): a Pod to reconcile,
a CR to check as an orphan, a CR to stamp Pending. ``workers`` tasks take keys and hand each to
the reconciler (:mod:`.reconciler`: the caches, :func:`~.plan.plan_pod`, then :mod:`.apply`'s
writes, Warning Events, one log line per decision). A failed write re-queues the key with
per-key backoff (:mod:`.failures`); every ``resync_period`` all Pods are
re-enqueued and CRs without a live Pod re-checked. Nothing is written before both caches synced.
"""

from __future__ import annotations

import collections
import logging
import math
from functools import partial
from typing import Any

import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.errors import (
    ApiError,
    KubeTransportError,
)
from bigfleet_trio.kube.informer import Informer, SyncTimeout
from bigfleet_trio.kube.leader import LeaderElector
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, PODS
from bigfleet_trio.kube.startup import sync_or_refused

from ..kube.workqueue import WorkQueue
from ..observability import stdmetrics
from . import metrics, zonepin
from . import projections as proj
from .apply import PlanApplier
from .defaults import PriorityClassDefaults
from .failures import FailedReconciles
from .keys import OrphanKey, PodKey, QueueKey, RecreateKey
from .nodes import NodeWatch
from .plan import (
    REASONS,
)
from .projections import slim_cr, slim_pod
from .reconciler import OWNER_POD_INDEX, OWNER_UID_INDEX, POD_UID_INDEX, PodReconciler
from .scope import PodScope
from .translate import OWNED_BY_POD_LABEL, is_terminal

__all__ = ["CONTROLLER_NAME", "PodController"]

log = logging.getLogger(__name__)

CONTROLLER_NAME = "bigfleet-unschedulable-pod-controller"
RESYNC_CHUNK = 1000
"""Objects a resync enqueues between two yields to the event loop."""
STAMP_SWEEP_PERIOD = 5.0
"""Seconds between two looks for CRs whose Pending stamp did not fit the backlog."""


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
        freeze_heap: the informers keep their caches out of the garbage collector's full
            passes (``Informer(freeze_heap=True)``; the binary sets it, tests do not).
        watch_list: the informers fill their caches from streaming lists.
        scope: which Pods get no CR on purpose (:class:`~.scope.PodScope`; None: every Pod
            gets one). With unmanaged-node selectors a third informer caches Nodes
            (:class:`~.nodes.NodeWatch`; docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out).

    Usage::

        ctl = PodController(client, defaults)
        await nursery.start(ctl.run)          # returns once both informers synced
        # or, with leader election (informers run on standbys too, workers only on the leader):
        await nursery.start(partial(ctl.run, elector=elector))

    Attributes:
        pods, crs: the two informers (``.store`` for inspection).
        nodes: the Node cache (:class:`~.nodes.NodeWatch`), None without unmanaged-node
            selectors.
        queue: the work queue.
        applier: the write side (:class:`~.apply.PlanApplier`), given the client, the CR store
            and the queue.
        reconciler: what a key's reconcile does (:class:`~.reconciler.PodReconciler`).
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
        queue: WorkQueue[QueueKey] | None = None,
        namespace: str | None = None,
        component: str = CONTROLLER_NAME,
        freeze_heap: bool = False,
        watch_list: bool = False,
        scope: PodScope | None = None,
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
        self.queue: WorkQueue[QueueKey] = queue or WorkQueue(
            metrics=metrics.PrometheusQueueMetrics(component)
        )
        self.pods = Informer(
            client,
            PODS,
            namespace=namespace,
            transform=slim_pod if scope is None else partial(slim_pod, scope=scope),
            indexers={POD_UID_INDEX: proj.index_pod_uid,
                      zonepin.BOUND_ZONE_INDEX: zonepin.index_bound_zone,
                      zonepin.CO_LOCATED_INDEX: zonepin.index_co_located},
            freeze_heap=freeze_heap,
            watch_list=watch_list,
            protobuf=True,  # slim_pod reads only the schema's fields
            # a status heartbeat is dropped before the projection (_on_pod_update would
            # drop it after): docs/kube-api.md#unchanged-pod-events
            unchanged=partial(proj.pod_unchanged, scope=scope),
        )
        self.crs = Informer(
            client,
            CAPACITY_REQUESTS,
            namespace=namespace,
            label_selector=OWNED_BY_POD_LABEL,
            transform=slim_cr,
            indexers={OWNER_UID_INDEX: proj.index_owner_uid, OWNER_POD_INDEX: proj.index_owner_pod},
            freeze_heap=freeze_heap,
            watch_list=watch_list,
        )
        self.pods.add_handler(self._on_pod_add, self._on_pod_update, self._on_pod_delete)
        self.crs.add_handler(self._on_cr_add, self._on_cr_update, self._on_cr_delete)
        self.nodes = (NodeWatch(client, scope, self.pods.store, self.queue,
                                freeze_heap=freeze_heap, watch_list=watch_list)
                      if scope is not None and scope.watches_nodes else None)
        self.applier = PlanApplier(client, self.crs.store, self.queue, component)
        self.failures = FailedReconciles(self.queue, self.crs)
        self.reconciler = PodReconciler(client, self.pods.store, self.crs.store, self.queue,
                                        self.applier, defaults, orphan_grace, scope=scope,
                                        nodes=self.nodes)
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.synced = False
        self.leading = False

    # -- readiness ----------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, str | list[str]]:
        """``(True, detail)`` once both informers synced, else ``(False, reasons)``."""
        problems = [p for p in (inf.problem() for inf in (self.pods, self.crs)) if p]
        if problems:  # not synced yet, or a resource no longer served (a CRD deleted)
            return False, problems
        if not self.synced:
            return False, ["starting workers"]
        return True, "leader" if self.leading else "synced (standby)"

    # -- informer handlers (sync, never block) -------------------------------------------------

    # a bound group member coming, changing or going may pin or unpin its zone group's CRs
    # (docs/rules.md#pod-translation-co-location-zone-pin); before the sync, the resync does

    def _on_pod_add(self, pod: dict[str, Any]) -> None:
        self.queue.add(PodKey.parse(proj.object_key(pod)))
        self._zones_moved(None, pod)

    def _on_pod_update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        if old != new:  # the projection hides status churn that cannot change the CR
            self.queue.add(PodKey.parse(proj.object_key(new)))
            self._zones_moved(old, new)

    def _on_pod_delete(self, pod: dict[str, Any]) -> None:
        uid = pod.get("metadata", {}).get("uid")
        if isinstance(uid, str):
            self.applier.clear(uid, *REASONS)
            self.reconciler.gone_uids.add(uid)
        self.queue.add(PodKey.parse(proj.object_key(pod)))
        self._zones_moved(pod, None)

    def _zones_moved(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        """Once synced, queue the Pods of the zone groups whose set of zones this change moved
        (the store has told :class:`~.zonegroups.GroupZones` already)."""
        if self.reconciler.zone_groups.take_moved() and self.synced:
            zonepin.enqueue_groups(self.queue, self.pods.store, old, new)

    def _on_cr_add(self, cr: dict[str, Any]) -> None:
        """Enqueue whatever a CR change may require (its Pod, or an orphan check)."""
        if not self.synced:
            return  # the post-sync scan covers everything seen before
        owner = proj.owner_pod_name(cr)
        ns = cr.get("metadata", {}).get("namespace", "")
        pod = self.pods.store.get(f"{ns}/{owner}") if owner else None
        uid = proj.owner_uid(cr)
        if pod is None or pod.get("metadata", {}).get("uid") != uid:
            if not self.pods.store.by_index(POD_UID_INDEX, uid):
                self.queue.add_after(OrphanKey.parse(proj.object_key(cr)), self.orphan_grace)
            return
        if is_terminal(pod) and owner:
            self.queue.add(PodKey(ns, owner))

    def _on_cr_update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        if old.get("spec") != new.get("spec") and self.synced:
            owner = proj.owner_pod_name(new)
            if owner:  # someone edited the spec: put it back if it differs from the Pod's
                self.queue.add(PodKey(new.get("metadata", {}).get("namespace", ""), owner))
        self._on_cr_add(new)  # as for a new CR: its Pod, or an orphan check

    def _on_cr_delete(self, cr: dict[str, Any]) -> None:
        self.applier.forget_stamp(proj.object_key(cr))
        owner = proj.owner_pod_name(cr)
        if not owner or not self.synced:
            return
        key = f"{cr.get('metadata', {}).get('namespace', '')}/{owner}"
        pod = self.pods.store.get(key)
        uid = proj.owner_uid(cr)
        # recreate at once if that very Pod is still live (not for GC after a Pod deletion),
        # and not when we deleted it ourselves because that Pod cannot have a CR right now
        # (unsupported requirement / rejected by the apiserver / excluded / on an unmanaged
        # Node: a Pod or Node change re-checks it)
        # ... but the cache may lag: a CR deleted by GC after its Pod was deleted can arrive on
        # the CR watch before the Pod watch delivers the Pod's deletion, and re-creating then
        # loops (the new CR is collected again at once). So the Pod is confirmed live first.
        if (pod is not None and pod.get("metadata", {}).get("uid") == uid
                and not is_terminal(pod) and not self.applier.no_cr_wanted(uid)
                and not self.reconciler.wants_no_cr(pod)):
            self.queue.add(RecreateKey.parse(key))

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
            Unauthenticated: (a SyncTimeout) the apiserver answered 401 before they synced.
        """
        timed_out: SyncTimeout | None = None
        async with trio.open_nursery() as nursery:
            await nursery.start(self.pods.run)
            await nursery.start(self.crs.run)
            if self.nodes is not None:
                await nursery.start(self.nodes.run)
            timed_out = await self._wait_synced()
            if timed_out is None and self.nodes is not None:
                await self.nodes.wait_synced()  # a short grace; unknown Nodes count as managed
            if timed_out is None:
                await self._synced_run(elector, task_status)
            nursery.cancel_scope.cancel()
        if timed_out is not None:
            raise timed_out

    async def _wait_synced(self) -> SyncTimeout | None:
        """Both caches synced (None), or why not: the deadline passed, or a 401 came first."""
        return await sync_or_refused((self.pods, self.crs), self.sync_timeout, self.client)

    async def _synced_run(
        self, elector: LeaderElector | None, task_status: trio.TaskStatus[None]
    ) -> None:
        self.synced = True
        if self.nodes is not None:
            self.nodes.live = True
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
            await self.resync()
            log.info(
                "pod controller workers starting workers=%d queued=%d",
                self.workers,
                len(self.queue),
            )
            async with trio.open_nursery() as nursery:
                for i in range(self.workers):
                    nursery.start_soon(self._worker, i)
                nursery.start_soon(self._resync_loop)
                nursery.start_soon(self._stamp_sweep_loop)
                if self.nodes is not None:
                    nursery.start_soon(self.nodes.requeue_loop)
        finally:
            self.leading = False

    async def resync(self) -> None:
        """Enqueue every cached Pod and an orphan check for every CR without a live Pod.

        Yields to the event loop every ``RESYNC_CHUNK`` objects (150,000 Pods must not hold
        the loop: docs/kube-api.md#relist-apply); works on snapshots of the keys, so the caches
        may change in between.
        """
        for i, key in enumerate(self.pods.store.keys(), 1):
            self.queue.add(PodKey.parse(key))
            if i % RESYNC_CHUNK == 0:
                await trio.lowlevel.checkpoint()
        orphans = 0
        for i, key in enumerate(self.crs.store.keys(), 1):
            cr = self.crs.store.get(key)
            if cr is not None and not self.pods.store.index_keys(
                    POD_UID_INDEX, proj.owner_uid(cr)):
                self.queue.add(OrphanKey.parse(key))
                orphans += 1
            if i % RESYNC_CHUNK == 0:
                await trio.lowlevel.checkpoint()
        log.debug("pod controller resync pods=%d orphan_checks=%d", len(self.pods.store), orphans)

    async def _resync_loop(self) -> None:
        if not math.isfinite(self.resync_period) or self.resync_period <= 0:
            return
        while True:
            await trio.sleep(self.resync_period)
            await self.resync()

    async def _stamp_sweep_loop(self) -> None:
        """Every :data:`STAMP_SWEEP_PERIOD` seconds, once the stamp backlog overflowed and has
        half its room again, queue the stamps it could not hold
        (docs/rules.md#pod-translation-pending-stamp)."""
        applier = self.applier
        while True:
            await trio.sleep(STAMP_SWEEP_PERIOD)
            if applier.stamps_overflowed and len(applier.stamp_rv) <= applier.stamp_backlog // 2:
                await applier.sweep_stamps()

    async def _worker(self, index: int) -> None:
        while True:
            item = await self.queue.get()
            started = trio.current_time()
            result = "error"
            try:
                outcome = await self.reconciler.reconcile(item)
            except (ApiError, KubeTransportError) as exc:
                self._count("error")
                self.failures.failed(item, exc)
            except Exception:
                self._count("error")
                delay = self.queue.add_rate_limited(item)
                log.exception(
                    "pod controller reconcile crashed key=%s/%s retry_in=%.3fs",
                    item.kind,
                    item,
                    delay,
                )
            else:
                result = "success"
                self.queue.forget(item)
                if outcome is not None:
                    self._count(outcome)
            finally:
                # controller-runtime's reconcile_* beside our outcome counter
                stdmetrics.observe_reconcile(self.component, result,
                                             trio.current_time() - started)
                self.queue.done(item)

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] += 1
        metrics.count_reconcile(outcome)
