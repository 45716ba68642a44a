"""The pod controller's reconciler: one queue key in, its plan applied (:class:`PodReconciler`).

controller-runtime's split: the controller (:mod:`.controller`: informers, queue, workers, event
handlers) decides *when* a key is reconciled; the reconciler decides *what* to do with it, reading
the informers' caches, planning purely (:func:`~.plan.plan_pod`) and writing through
:class:`~.apply.PlanApplier`. A new reconcile rule touches this class and the planner only.
"""

from __future__ import annotations

import logging
from typing import Any

from bigfleet_trio.kube.errors import NotFound
from bigfleet_trio.kube.informer import Store
from bigfleet_trio.kube.resources import PODS
from bigfleet_trio.kube.workqueue import WorkQueue

from . import projections as proj
from . import zonepin
from .apply import PlanApplier
from .defaults import PriorityClassDefaults
from .keys import OrphanKey, PodKey, QueueKey, RecreateKey, StampKey
from .nodes import NodeWatch
from .plan import plan_pod
from .scope import PodScope
from .zonegroups import GroupZones

__all__ = ["GONE_UIDS", "OWNER_POD_INDEX", "OWNER_UID_INDEX", "POD_UID_INDEX", "GoneUids",
           "PodReconciler"]

log = logging.getLogger(__name__)

OWNER_UID_INDEX = "owner-uid"
"""CR index: value of the ``bigfleet.lucy.sh/owned-by-pod`` label (the Pod UID)."""
OWNER_POD_INDEX = "owner-pod"
"""CR index: ``"ns/name"`` of the Pod named by the CR's Pod ownerReference."""
POD_UID_INDEX = "uid"
"""Pod index: ``metadata.uid``."""


GONE_UIDS = 20_000
"""Pod uids :class:`GoneUids` remembers (about 3 MB)."""


class GoneUids:
    """The uids of the Pods the Pod watch most recently reported deleted, at most ``limit``.

    A uid is never reused, so a DELETED from the watch is final: a CR naming one of these
    Pods is deleted without a GET of the Pod first (docs/rules.md#pod-translation-orphans).
    In the 5,000-machine soak those GETs were 7,925 requests, each answered 404. Older uids
    fall out; a CR naming one is confirmed by a GET, as before.
    """

    __slots__ = ("_uids", "limit")

    def __init__(self, limit: int = GONE_UIDS) -> None:
        self.limit = limit
        self._uids: dict[str, None] = {}

    def add(self, uid: str) -> None:
        """The Pod watch reported ``uid`` deleted (the newest)."""
        self._uids.pop(uid, None)
        self._uids[uid] = None
        if len(self._uids) > self.limit:
            del self._uids[next(iter(self._uids))]

    def clear(self) -> None:
        self._uids.clear()

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids

    def __len__(self) -> int:
        return len(self._uids)


class PodReconciler:
    """Reconciles one queue key at a time against the caches (docs/rules.md#pod-translation).

    Args:
        client: the KubeClient (live GETs that confirm a cache before a delete or re-create).
        pods, crs: the Pod and CapacityRequest caches (indexed by :data:`POD_UID_INDEX`,
            :data:`OWNER_UID_INDEX` and :data:`OWNER_POD_INDEX`).
        queue: the work queue (orphan checks are queued after ``orphan_grace`` seconds).
        applier: the write side.
        defaults: PriorityClass penalty defaults (None = none).
        orphan_grace: seconds a CR whose Pod vanished is left to the garbage collector.
        scope: the opt-out settings (None: no Pod is excluded).
        nodes: the Node cache (None: every Node is managed); with ``scope``, what makes a Pod
            get no CR (docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out).
    """

    def __init__(self, client: Any, pods: Store, crs: Store, queue: WorkQueue[QueueKey],
                 applier: PlanApplier, defaults: PriorityClassDefaults | None,
                 orphan_grace: float, *, scope: PodScope | None = None,
                 nodes: NodeWatch | None = None) -> None:
        self.client = client
        self.pods = pods
        self.crs = crs
        self.queue = queue
        self.applier = applier
        self.defaults = defaults
        self.orphan_grace = orphan_grace
        self.zone_groups = GroupZones(pods)
        """The zones each co-location group runs in (the Pod store tells it every change)."""
        self.scope = scope
        self.nodes = nodes
        self.gone_uids = GoneUids()
        """Pods the Pod watch reported deleted (the controller's delete handler adds them)."""

    async def reconcile(self, item: QueueKey) -> str | None:
        """Reconcile one queue key; returns the outcome label (None: nothing to count).

        Raises:
            ApiError, KubeTransportError: a write failed (the worker re-queues with backoff).
        """
        if isinstance(item, PodKey):
            return await self.reconcile_pod(item)
        if isinstance(item, OrphanKey):
            return await self.reconcile_orphan(item)
        if isinstance(item, StampKey):
            await self.applier.reconcile_stamp(item)
            return None
        if isinstance(item, RecreateKey):
            return await self.reconcile_recreate(item)
        log.error("pod controller unknown queue item item=%r", item)
        return None

    async def reconcile_pod(self, key: PodKey | str) -> str:
        """Reconcile the Pod ``key`` (``"ns/name"`` accepted): plan, then apply the plan."""
        key = PodKey.parse(key) if isinstance(key, str) else key
        skey = str(key)
        pod = self.pods.get(skey)
        if pod is None:
            # ownerReference GC removes its CR; CRs still naming the Pod are checked later
            for cr in self.crs.by_index(OWNER_POD_INDEX, skey):
                self.queue.add_after(OrphanKey.parse(proj.object_key(cr)), self.orphan_grace)
            log.debug("pod gone pod=%s", skey)
            return "pod_gone"
        uid = pod["metadata"].get("uid")
        owned = (
            self.crs.by_index(OWNER_UID_INDEX, uid) if isinstance(uid, str) and uid else []
        )
        plan = plan_pod(pod, owned, self.defaults, zones=self.zone_groups.zones(pod),
                        excluded=self.excluded(pod), node_unmanaged=self.on_unmanaged_node(pod),
                        disruption_annotations=self.scope is None
                        or self.scope.disruption_annotations)
        zonepin.report(plan.zone_pin, skey, plan.action)
        return await self.applier.apply(key, pod, owned, plan)

    def excluded(self, pod: dict[str, Any]) -> bool:
        """The cached Pod is opted out (``--exclude-namespace``/``--exclude-pod-selector``)."""
        return self.scope is not None and self.scope.pod_excluded(pod)

    def on_unmanaged_node(self, pod: dict[str, Any]) -> bool:
        """The cached Pod is bound to a Node the Node cache says is unmanaged."""
        return self.nodes is not None and self.nodes.unmanaged(pod)

    def wants_no_cr(self, pod: dict[str, Any]) -> bool:
        """The cached Pod gets no CR on purpose (excluded, or on an unmanaged Node)."""
        return self.excluded(pod) or self.on_unmanaged_node(pod)

    async def reconcile_recreate(self, key: RecreateKey) -> str:
        """Re-create a deleted CR only if its Pod is live at the apiserver (a GET), not just in
        the cache; otherwise leave it to the Pod watch, which will deliver the deletion.

        Raises:
            ApiError, KubeTransportError: the GET failed (the worker re-queues with backoff).
        """
        cached = self.pods.get(str(key))
        uid = (cached or {}).get("metadata", {}).get("uid")
        if not await self.applier.pod_is_live(PodKey(key.namespace, key.name), uid):
            log.debug("cr deleted with its pod; not re-created pod=%s", key)
            return "pod_gone"
        return await self.reconcile_pod(PodKey(key.namespace, key.name))

    async def reconcile_orphan(self, key: OrphanKey | str) -> str | None:
        """Delete the CR ``key`` if its owner Pod is really gone: the Pod watch reported its
        uid deleted (:class:`GoneUids`), or a live GET confirms it."""
        cr = self.crs.get(str(key))
        if cr is None or cr["metadata"].get("deletionTimestamp"):
            return None
        uid = proj.owner_uid(cr)
        if uid and self.pods.by_index(POD_UID_INDEX, uid):
            return None
        ns = cr["metadata"].get("namespace", "")
        owner = proj.owner_pod_name(cr)
        if owner and uid not in self.gone_uids:
            try:
                live = await self.client.get(PODS, owner, ns)
            except NotFound:
                live = None
            if live is not None and (live.get("metadata") or {}).get("uid") == uid:
                return None  # the Pod exists; our cache lags
        if await self.applier.delete_cr(cr, why="orphan"):
            return "orphan_deleted"
        return None
