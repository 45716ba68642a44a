"""The simulated kube-scheduler and kubelet as a Kubernetes client (informers + HTTP), for a
fleet-sized cluster: binds pending Pods to the Nodes the sim shard registers, marks bound Pods
Running/Ready, finishes Job Pods after their run time, and deletes the Pods of a deleted Node.

Filters are :mod:`bigfleet_trio.sim.binder`'s (Ready and schedulable Node, nodeSelector, required
node affinity, NoSchedule/NoExecute taints tolerated, requests fit the room left). Placement is
incremental instead of a full re-plan per pass: the room used on each Node is kept up to date from
Pod events (and from the binder's own bindings at once, like kube-scheduler's assume cache), and
a pass places pending Pods in priority then creation order. Pods with the same scheduling
signature (requests, selector, affinity, tolerations) share one candidate list per pass: the
node classes (one machine shape: same labels but the hostname, taints, allocatable) that pass the
filters -- checked once per class -- fewest unrequested extended resources first, each class's
Nodes by allocation (descending) then name, with a first-fit cursor that only moves forward (a
Node full for a signature stays full within the pass): O(Pods + Nodes) per pass, bin-packing
like the small binder's most-allocated score. Pods naming a node are filtered Node by Node.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.errors import ApiError, KubeTransportError, NotFound
from bigfleet_trio.kube.informer import Informer, drop_managed_fields
from bigfleet_trio.kube.resources import NODES, PODS
from bigfleet_trio.sim.binder import (
    STANDARD_RESOURCES,
    ZERO,
    NodeView,
    PodAddresses,
    _quantities,
    is_bound,
    is_pending,
    is_terminal,
    node_affinity_matches,
    node_ready,
    node_schedulable,
    pod_requests,
    running_status,
    tolerates,
)

from .controllers import rfc3339_now
from .jobpods import RUN_SECONDS_ANNOTATION, JobPodFinisher

log = logging.getLogger(__name__)

__all__ = ["PodScheduler", "RUN_SECONDS_ANNOTATION"]  # the annotation re-exported



def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name')}"


def _signature(pod: Mapping[str, Any], req: Mapping[str, Decimal]) -> str:
    spec = pod.get("spec") or {}
    return json.dumps(
        [sorted((k, str(v)) for k, v in req.items()), spec.get("nodeSelector"),
         (spec.get("affinity") or {}).get("nodeAffinity"), spec.get("tolerations")],
        sort_keys=True, default=str,
    )


HOSTNAME = "kubernetes.io/hostname"


def _names_a_node(pod: Mapping[str, Any]) -> bool:
    """The Pod selects nodes by name: a hostname nodeSelector or required-affinity term, or
    ``matchFields`` (DaemonSet Pods)."""
    spec = pod.get("spec") or {}
    if HOSTNAME in (spec.get("nodeSelector") or {}):
        return True
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in required.get("nodeSelectorTerms") or []:
        if term.get("matchFields"):
            return True
        if any(e.get("key") == HOSTNAME for e in term.get("matchExpressions") or []):
            return True
    return False


_Pending = tuple[tuple[int, str, str], dict[str, Any], dict[str, Decimal] | None, str]


def _pending_entry(pod: dict[str, Any]) -> _Pending:
    req = pod_requests(pod)
    order = (-_priority(pod), str(pod["metadata"].get("creationTimestamp") or ""), _key(pod))
    return order, pod, req, _signature(pod, req) if req is not None else ""


def _priority(pod: Mapping[str, Any]) -> int:
    p = (pod.get("spec") or {}).get("priority")
    return p if isinstance(p, int) and not isinstance(p, bool) else 0


class PodScheduler:
    """Binds Pods and plays kubelet for them (see the module docstring).

    Args:
        client: a :class:`KubeClient` (owned by the caller).
        pods: a Pod :class:`Informer` to share (None: one is made and run here).
        interval: minimum seconds between placement passes.
        job_run_seconds: how long a Job's Pod runs (after it is Running) before it succeeds;
            a Pod (template) annotation ``sim.bigfleet.lucy.sh/run-seconds`` overrides it;
            ``None`` = Job Pods never finish.
        write_concurrency: bind/status writes in flight.
        on_event: optional ``(kind, fields)`` callback (``bound``, ``succeeded``), for benchmarks.

    Attributes:
        bound, gc_deleted, errors, passes: counters; ``jobs.succeeded``: Job Pods finished.
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        pods: Informer | None = None,
        interval: float = 0.2,
        job_run_seconds: float | None = 30.0,
        write_concurrency: int = 32,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.client = client
        self.interval = interval
        self.job_run_seconds = job_run_seconds
        self.write_concurrency = write_concurrency
        self.on_event = on_event
        self.pods = pods or Informer(client, PODS, transform=drop_managed_fields)
        self._own_pods = pods is None
        self.nodes = Informer(client, NODES, transform=drop_managed_fields)
        self._used: dict[str, dict[str, Decimal]] = {}
        self._charged: dict[str, tuple[str, dict[str, Decimal]]] = {}
        # pending Pods with what placing them needs, computed once per Pod event:
        # (sort key, Pod, requests or None when malformed, scheduling signature)
        self._pending: dict[str, _Pending] = {}
        self._assumed: dict[str, str] = {}
        self._alloc: dict[str, tuple[str, dict[str, Decimal]]] = {}
        self._classes: dict[str, tuple[str, str]] = {}
        self._to_start: dict[str, dict[str, Any]] = {}
        self._binding: set[str] = set()
        self._addresses = PodAddresses()
        self._wake = trio.Event()
        self._limiter = trio.CapacityLimiter(write_concurrency)
        self.bound = 0
        self.gc_deleted = 0
        self.errors = 0
        self.passes = 0
        self.jobs = JobPodFinisher(
            client, self.pods, job_run_seconds=job_run_seconds, limiter=self._limiter,
            on_succeeded=lambda ns, name: self._emit("succeeded", namespace=ns, name=name))
        self.pods.add_handler(on_add=self._pod_event, on_update=lambda _o, n: self._pod_event(n),
                              on_delete=self._pod_gone)
        self.nodes.add_handler(on_add=lambda _n: self._kick(),
                               on_update=lambda _o, _n: self._kick(),
                               on_delete=self._node_gone)

    # -- bookkeeping from events ---------------------------------------------------------------

    def _kick(self) -> None:
        self._wake.set()

    def _charge(self, key: str, node: str | None, req: dict[str, Decimal] | None) -> None:
        old = self._charged.pop(key, None)
        if old is not None:
            used = self._used.setdefault(old[0], {})
            for k, v in old[1].items():
                used[k] = used.get(k, ZERO) - v
            self._kick()  # room freed
        if node is not None and req is not None:
            used = self._used.setdefault(node, {})
            for k, v in req.items():
                used[k] = used.get(k, ZERO) + v
            self._charged[key] = (node, req)

    def _pod_event(self, pod: dict[str, Any]) -> None:
        key = _key(pod)
        if is_bound(pod) and not is_terminal(pod):
            self._assumed.pop(key, None)
            self._pending.pop(key, None)
            node = str(pod["spec"]["nodeName"])
            old = self._charged.get(key)
            if old is None or old[0] != node:
                self._charge(key, node, pod_requests(pod))
            phase = (pod.get("status") or {}).get("phase")
            if (phase not in ("Running", "Succeeded", "Failed") and key not in self._binding
                    and not pod["metadata"].get("deletionTimestamp")):
                self._to_start[key] = pod
                self._kick()
            return
        self._charge(key, None, None)
        if key in self._assumed:
            return
        if is_pending(pod):
            self._pending[key] = _pending_entry(pod)
            self._kick()
        else:
            self._pending.pop(key, None)

    def _pod_gone(self, pod: dict[str, Any]) -> None:
        key = _key(pod)
        self._charge(key, None, None)
        self._pending.pop(key, None)
        self._assumed.pop(key, None)
        self._to_start.pop(key, None)

    def _node_gone(self, node: dict[str, Any]) -> None:
        name = (node.get("metadata") or {}).get("name")
        self._used.pop(str(name), None)
        self._alloc.pop(str(name), None)
        self._classes.pop(str(name), None)
        doomed = [k for k, (n, _) in self._charged.items() if n == name]
        if doomed and self._nursery is not None:
            self._nursery.start_soon(self._gc_pods, str(name), doomed)

    # -- running -------------------------------------------------------------------------------

    _nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; ``started`` once Pods and Nodes are synced."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self._own_pods:
                await nursery.start(self.pods.run)
            await nursery.start(self.nodes.run)
            await self.pods.wait_synced()
            await self.nodes.wait_synced()
            nursery.start_soon(self._loop)
            await nursery.start(self.jobs.run)
            log.info("scheduler synced nodes=%d pods=%d", len(self.nodes.store),
                     len(self.pods.store))
            task_status.started()

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            try:
                await self.run_once()
            except Exception:
                self.errors += 1
                log.exception("scheduler pass failed")
            await trio.sleep(self.interval)

    async def run_once(self) -> int:
        """One pass: start bound Pods, place pending ones. Returns Pods bound."""
        self.passes += 1
        starts = list(self._to_start.values())
        self._to_start.clear()
        decisions = self.plan()
        async with trio.open_nursery() as nursery:
            for pod in starts:
                nursery.start_soon(self._start, pod)
            for pod, node in decisions:
                nursery.start_soon(self._bind, pod, node)
        return len(decisions)

    # -- placement (pure over the caches) ------------------------------------------------------

    def _node_alloc(self, node: Mapping[str, Any]) -> dict[str, Decimal]:
        meta = node.get("metadata") or {}
        rv = str(meta.get("resourceVersion") or "")
        name = str(meta.get("name"))
        hit = self._alloc.get(name)
        if hit is not None and hit[0] == rv:
            return hit[1]
        alloc = _quantities((node.get("status") or {}).get("allocatable"))
        self._alloc[name] = (rv, alloc)
        return alloc

    def _node_class(self, node: Mapping[str, Any]) -> str:
        """Nodes with the same labels (but the hostname), taints and allocatable -- one machine
        shape -- pass the filters alike for a Pod that does not name a node."""
        meta = node.get("metadata") or {}
        name, rv = str(meta.get("name")), str(meta.get("resourceVersion") or "")
        hit = self._classes.get(name)
        if hit is not None and hit[0] == rv:
            return hit[1]
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != HOSTNAME}
        key = json.dumps([labels, (node.get("spec") or {}).get("taints"),
                          (node.get("status") or {}).get("allocatable")], sort_keys=True)
        self._classes[name] = (rv, key)
        return key

    def plan(self) -> list[tuple[dict[str, Any], str]]:
        """Decide placements for the pending Pods; records them as assumed (charged at once).

        Candidates per scheduling signature: the node classes (:meth:`_node_class`) that pass
        the filters, fewest unrequested extended resources first, each class's Nodes by
        allocation (descending) then name; a Pod naming a node (hostname selector or
        ``matchFields``) is filtered Node by Node. A cursor per signature only moves forward.
        """
        views: list[NodeView] = []
        for node in self.nodes.store.list():
            if not node_ready(node) or not node_schedulable(node):
                continue
            name = str(node["metadata"]["name"])
            views.append(NodeView(name, node, self._node_alloc(node),
                                  dict(self._used.get(name, {}))))
        if not views or not self._pending:
            return []
        classes: dict[str, list[NodeView]] = {}
        for v in views:
            classes.setdefault(self._node_class(v.node), []).append(v)
        for lst in classes.values():
            lst.sort(key=lambda v: (-v.allocation_after({}), v.name))
        pending = sorted(self._pending.values(), key=lambda e: e[0])
        cands: dict[str, tuple[list[list[NodeView]], list[int]]] = {}
        out: list[tuple[dict[str, Any], str]] = []

        def passes(pod: Mapping[str, Any], v: NodeView) -> bool:
            tols = (pod.get("spec") or {}).get("tolerations") or []
            return node_affinity_matches(pod, v.node) and tolerates(
                tols, (v.node.get("spec") or {}).get("taints") or [])

        def unrequested(v: NodeView, req: Mapping[str, Decimal]) -> int:
            return sum(1 for k, q in v.allocatable.items()
                       if k not in STANDARD_RESOURCES and q > ZERO and req.get(k, ZERO) <= ZERO)

        for _order, pod, req, sig in pending:
            if req is None:
                continue
            entry = cands.get(sig)
            if entry is None:
                if _names_a_node(pod):
                    one = [v for v in views if passes(pod, v)]
                    one.sort(key=lambda v: (unrequested(v, req), -v.allocation_after({}),
                                            v.name))
                    groups = [one]
                else:
                    ok = sorted((unrequested(lst[0], req), ck) for ck, lst in classes.items()
                                if passes(pod, lst[0]))
                    groups = [classes[ck] for _, ck in ok]
                entry = cands[sig] = (groups, [0, 0])
            groups, cur = entry
            while cur[0] < len(groups):
                group = groups[cur[0]]
                while cur[1] < len(group) and not group[cur[1]].fits(req):
                    cur[1] += 1
                if cur[1] < len(group):
                    break
                cur[0], cur[1] = cur[0] + 1, 0
            if cur[0] >= len(groups):
                continue
            view = groups[cur[0]][cur[1]]
            view.add(req)
            key = _key(pod)
            self._pending.pop(key, None)
            self._assumed[key] = view.name
            self._charge(key, view.name, req)
            out.append((pod, view.name))
        return out

    # -- writes --------------------------------------------------------------------------------

    def _emit(self, kind: str, **fields: Any) -> None:
        if self.on_event is not None:
            self.on_event(kind, fields)

    def _running_status(self, pod: Mapping[str, Any], node: str | None = None) -> dict[str, Any]:
        containers = [(str(c.get("name", "")), str(c.get("image", "")))
                      for c in (pod.get("spec") or {}).get("containers") or []
                      if isinstance(c, Mapping)]
        host_ip, pod_ip = self._addresses.next(
            node or str((pod.get("spec") or {}).get("nodeName") or ""))
        return running_status(containers, host_ip, pod_ip, rfc3339_now())

    async def _bind(self, pod: dict[str, Any], node: str) -> None:
        meta = pod["metadata"]
        key = _key(pod)
        self._binding.add(key)
        try:
            async with self._limiter:
                await self.client.patch(PODS, meta["name"], {"spec": {"nodeName": node}},
                                        meta.get("namespace"))
                await self.client.patch(PODS, meta["name"],
                                        {"status": self._running_status(pod, node)},
                                        meta.get("namespace"), subresource="status")
        except NotFound:
            self._assumed.pop(key, None)
            self._charge(key, None, None)
            return
        except (ApiError, KubeTransportError) as exc:
            self.errors += 1
            log.info("bind failed pod=%s node=%s: %s", key, node, exc,
                     extra={"pod": key, "node": node})
            self._assumed.pop(key, None)
            self._charge(key, None, None)
            self._pending[key] = _pending_entry(pod)
            self._kick()
            return
        finally:
            self._binding.discard(key)
        self.bound += 1
        self._emit("bound", namespace=meta.get("namespace"), name=meta["name"], node=node)
        log.debug("bound pod=%s node=%s", key, node, extra={"pod": key, "node": node})

    async def _start(self, pod: dict[str, Any]) -> None:
        """Kubelet: a Pod bound by someone else reports Running."""
        meta = pod["metadata"]
        try:
            async with self._limiter:
                await self.client.patch(PODS, meta["name"], {"status": self._running_status(pod)},
                                        meta.get("namespace"), subresource="status")
        except (ApiError, KubeTransportError) as exc:
            log.info("pod start failed pod=%s: %s", _key(pod), exc)

    async def _gc_pods(self, node: str, keys: list[str]) -> None:
        """podgc: the Node is gone; its Pods are deleted (controllers recreate them)."""
        for key in keys:
            ns, name = key.split("/", 1)
            try:
                async with self._limiter:
                    await self.client.delete(PODS, name, ns, grace_period_seconds=0)
                self.gc_deleted += 1
                log.info("pod deleted, its node is gone pod=%s node=%s", key, node,
                         extra={"pod": key, "node": node})
            except NotFound:
                pass
            except (ApiError, KubeTransportError) as exc:
                log.info("pod gc failed pod=%s: %s", key, exc)
