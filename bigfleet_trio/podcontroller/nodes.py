"""The pod controller's Node cache: which Nodes BigFleet does not manage (:class:`NodeWatch`).

A Node informer whose cache holds one :class:`~.scope.NodeView` per Node (name and one bool:
a few hundred bytes a Node, never the Node itself). A Node coming, going, or flipping between
managed and unmanaged re-queues the Pods bound to it, found by one scan of the Pod cache per
batch of changed Nodes (no per-Node index of Pods: memory). A Node not in the cache counts as
managed, and a refused Node watch (403: RBAC without ``nodes``) is one ERROR line, every Node
then managed. The rule: docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.errors import Forbidden
from bigfleet_trio.kube.informer import Informer, Store
from bigfleet_trio.kube.resources import NODES
from bigfleet_trio.kube.workqueue import WorkQueue

from .keys import PodKey, QueueKey
from .scope import NodeView, PodScope, cached_node_name

__all__ = ["NODE_SYNC_GRACE", "SCAN_CHUNK", "NodeWatch"]

log = logging.getLogger(__name__)

NODE_SYNC_GRACE = 10.0
"""Seconds the controller waits, once the Pod and CR caches synced, for the Node cache before
it starts work anyway (every Node managed until it syncs)."""
SCAN_CHUNK = 1000
"""Pods a re-queue scan looks at between two yields to the event loop."""
ACCESS_POLL = 1.0
"""Seconds between two looks at the Node informer's last error before it synced."""


class NodeWatch:
    """The Node informer plus the re-queue of Pods bound to Nodes whose answer changed.

    Args:
        client: the controller's client.
        scope: the settings (its unmanaged-node selectors make the Node views).
        pods: the Pod cache (scanned by ``nodeName``) and ``queue``: where Pods are re-queued.
        freeze_heap, watch_list: as :class:`~bigfleet_trio.kube.informer.Informer`'s.

    Attributes:
        informer: the Node informer (``.store``: name -> :class:`~.scope.NodeView`).
        live: re-queue on Node changes (set by the controller once its caches synced; before
            that its first resync reconciles every Pod anyway).
    """

    def __init__(self, client: KubeClient, scope: PodScope, pods: Store,
                 queue: WorkQueue[QueueKey], *, freeze_heap: bool = False,
                 watch_list: bool = False) -> None:
        # node_view reads only the protobuf schema's fields (docs/kube-api.md#protobuf)
        self.informer = Informer(client, NODES, transform=scope.node_view,
                                 freeze_heap=freeze_heap, watch_list=watch_list, protobuf=True)
        self.informer.add_handler(self._on_add, self._on_update, self._on_delete)
        self.pods = pods
        self.queue = queue
        self.live = False
        self.refused = False
        self._changed: set[str] = set()
        self._wake = trio.Event()

    def unmanaged(self, pod: dict[str, Any]) -> bool:
        """The cached Pod is bound to a Node the cache has and says is unmanaged (a pending Pod,
        or one bound to a Node not cached yet, is managed)."""
        name = cached_node_name(pod)
        view = self.informer.store.get(name) if isinstance(name, str) else None
        return view is not None and bool(view.unmanaged)

    # -- informer handlers (sync) --------------------------------------------------------------

    def _on_add(self, view: NodeView) -> None:
        if view.unmanaged:  # a new managed Node changes nothing: unknown was managed already
            self._changed_node(view.name)

    def _on_update(self, old: NodeView, new: NodeView) -> None:
        if old.unmanaged != new.unmanaged:
            self._changed_node(new.name)

    def _on_delete(self, view: NodeView) -> None:
        if view.unmanaged:
            self._changed_node(view.name)

    def _changed_node(self, name: str) -> None:
        if self.live:
            self._changed.add(name)
            self._wake.set()

    # -- tasks ---------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the Node informer, and say once, at ERROR, if the apiserver refuses it (403)."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.informer.run)
            task_status.started()
            while not self.informer.synced:
                if isinstance(self.informer.last_error, Forbidden) and not self.refused:
                    self.refused = True
                    log.error(
                        "pod controller cannot watch Nodes (403 Forbidden): every Node counts "
                        "as managed, so Pods on unmanaged Nodes keep their CapacityRequests; "
                        "grant list and watch on nodes (config/rbac/pod-controller.yaml) or "
                        "pass --unmanaged-node-selector '' err=%s", self.informer.last_error)
                await trio.sleep(ACCESS_POLL)
            if self.refused:
                log.info("pod controller Node cache synced after all nodes=%d",
                         len(self.informer.store))

    async def wait_synced(self, seconds: float = NODE_SYNC_GRACE) -> bool:
        """Wait up to ``seconds`` for the Node cache; True when it synced."""
        with trio.move_on_after(seconds):
            await self.informer.wait_synced()
        return self.informer.synced

    async def requeue_loop(self) -> None:
        """(The leader's) re-queue the Pods bound to changed Nodes, one scan per batch."""
        self._changed.clear()  # the leader's first resync reconciles every Pod
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            names, self._changed = self._changed, set()
            if names:
                await self.requeue_bound(names)

    async def requeue_bound(self, names: set[str]) -> int:
        """Queue every cached Pod bound to one of ``names``; returns how many.

        Scans a snapshot of the Pod cache's keys, yielding every :data:`SCAN_CHUNK` Pods.
        """
        queued = 0
        for i, key in enumerate(self.pods.keys(), 1):
            pod = self.pods.get(key)
            if pod is not None and cached_node_name(pod) in names:
                self.queue.add(PodKey.parse(key))
                queued += 1
            if i % SCAN_CHUNK == 0:
                await trio.lowlevel.checkpoint()
        log.debug("pod controller nodes changed nodes=%d pods_queued=%d", len(names), queued)
        return queued
