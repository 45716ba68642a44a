"""A minimal kube-scheduler stand-in for the simulation: places pending Pods on Ready Nodes with
room (the demo's polling binder; :mod:`bigfleet_trio.sim.cluster.scheduler` is the informer-based
one for fleet sizes, with these same filters).

It is not a scheduler: no preemption, no inter-pod (anti-)affinity, no topology spread, no
volume binding. It only does what the demo needs to show Pods landing on the Nodes the shard
registered, with the filters that would otherwise make the story misleading:

Filters (a Node is *feasible* for a Pod when all hold):

- the Node is Ready (condition ``Ready=True``) and schedulable (``spec.unschedulable`` not
  true: a cordoned node takes nothing new, which is what makes a reclaim drain converge);
- ``spec.nodeSelector`` labels all match;
- required node affinity: ``nodeSelectorTerms`` are ORed; in a term, every ``matchExpressions``
  item (In / NotIn / Exists / DoesNotExist / Gt / Lt) and every ``matchFields`` item
  (``metadata.name`` In / NotIn, as DaemonSet Pods carry) must hold; an empty term matches
  nothing (Kubernetes semantics);
- every ``NoSchedule`` / ``NoExecute`` taint is tolerated (``PreferNoSchedule`` is ignored);
- the Pod's effective request (kube-scheduler arithmetic, :func:`pod_resource_requests`, incl.
  sidecars, init peak and overhead) fits the Node's allocatable minus the requests of the
  non-terminal Pods already bound there, in every resource the Pod asks for, plus one ``pods``
  slot.

Order and scoring: pending Pods by priority (high first), then creation order and name; for each
Pod the feasible Node with, first, the fewest extended resources the Pod does not ask for (keep
GPU nodes for GPU Pods), then the highest allocation after placement (bin-packing: the shard
plans capacity in aggregate, packing tightly keeps the whole demand placeable), then the name.

Binding: the embedded apiserver has no ``pods/binding`` subresource, so a Pod is bound with a
JSON merge-patch of ``spec.nodeName`` followed by a status patch (``PodScheduled=True``,
``phase: Running``), which is what a kubelet would report next.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import trio

from bigfleet_trio.podcontroller.translate import TranslationError, pod_resource_requests
from bigfleet_trio.quantity import Quantity, QuantityError

log = logging.getLogger(__name__)

__all__ = [
    "Binder",
    "BindDecision",
    "NodeView",
    "PodAddresses",
    "running_status",
    "is_bound",
    "is_pending",
    "is_terminal",
    "node_affinity_matches",
    "node_ready",
    "node_schedulable",
    "plan_bindings",
    "tolerates",
]

ZERO = Decimal(0)
STANDARD_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage", "pods"})


# ------------------------------------------------------------------------------------------------
# Pod / Node predicates (pure)
# ------------------------------------------------------------------------------------------------


def is_terminal(pod: Mapping[str, Any]) -> bool:
    """``status.phase`` is Succeeded or Failed."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def is_bound(pod: Mapping[str, Any]) -> bool:
    """``spec.nodeName`` is set."""
    return bool((pod.get("spec") or {}).get("nodeName"))


def is_pending(pod: Mapping[str, Any]) -> bool:
    """Not bound, not terminal, not being deleted: a Pod the binder should place."""
    meta = pod.get("metadata") or {}
    return not is_bound(pod) and not is_terminal(pod) and not meta.get("deletionTimestamp")


def node_ready(node: Mapping[str, Any]) -> bool:
    """The Node has condition ``Ready`` with status ``"True"``."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def node_schedulable(node: Mapping[str, Any]) -> bool:
    """Not cordoned (``spec.unschedulable`` is not true)."""
    return not (node.get("spec") or {}).get("unschedulable")


def _expr_matches(expr: Mapping[str, Any], value: str | None) -> bool:
    op = expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        if value is None or len(values) != 1:
            return False
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def node_affinity_matches(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """``spec.nodeSelector`` and required node affinity of ``pod`` hold for ``node``."""
    spec = pod.get("spec") or {}
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    for key, want in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != str(want):
            return False
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    if required is None:
        return True
    fields = {"metadata.name": meta.get("name")}
    for term in required.get("nodeSelectorTerms") or []:
        exprs = term.get("matchExpressions") or []
        mfields = term.get("matchFields") or []
        if not exprs and not mfields:
            continue  # an empty term matches no objects
        if all(_expr_matches(e, labels.get(e.get("key", ""))) for e in exprs) and all(
            _expr_matches(f, fields.get(f.get("key", ""))) for f in mfields
        ):
            return True
    return False


def _toleration_matches(tol: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect = tol.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = tol.get("key") or ""
    op = tol.get("operator") or "Equal"
    if not key:
        return op == "Exists"  # empty key + Exists tolerates everything
    if key != taint.get("key"):
        return False
    if op == "Exists":
        return True
    return str(tol.get("value") or "") == str(taint.get("value") or "")


def tolerates(tolerations: Iterable[Mapping[str, Any]],
              taints: Iterable[Mapping[str, Any]]) -> bool:
    """Every NoSchedule/NoExecute taint is tolerated by at least one toleration."""
    tols = list(tolerations)
    for taint in taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_toleration_matches(t, taint) for t in tols):
            return False
    return True


def _quantities(raw: Mapping[str, Any] | None) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for name, text in (raw or {}).items():
        try:
            out[str(name)] = Quantity.parse(text).value
        except (QuantityError, TypeError, ValueError):
            log.warning("binder: ignoring unparseable quantity %s=%r", name, text)
    return out


def pod_requests(pod: Mapping[str, Any],
                 skipped: dict[str, str] | None = None) -> dict[str, Decimal] | None:
    """Effective requests as Decimals (``pods: 1`` added); None when the Pod is malformed.

    Args:
        skipped: where to record ``{"namespace/name": why}`` for a malformed Pod instead of
            logging it (the :class:`Binder` logs each once while it stays so).
    """
    try:
        req = {k: q.value for k, q in pod_resource_requests(pod).items()}
    except TranslationError as exc:
        meta = pod.get("metadata") or {}
        if skipped is None:
            log.warning("binder: skipping pod=%s: %s", meta.get("name"), exc)
        else:
            skipped[f"{meta.get('namespace') or 'default'}/{meta.get('name')}"] = str(exc)
        return None
    req["pods"] = req.get("pods", ZERO) + 1
    return req


# ------------------------------------------------------------------------------------------------
# Planning (pure)
# ------------------------------------------------------------------------------------------------


@dataclass
class NodeView:
    """A Node with its remaining room (allocatable minus bound, non-terminal Pods' requests)."""

    name: str
    node: Mapping[str, Any]
    allocatable: dict[str, Decimal]
    used: dict[str, Decimal] = field(default_factory=dict)

    def free(self, resource: str) -> Decimal:
        """Allocatable minus used (a resource the Node does not list has zero room)."""
        return self.allocatable.get(resource, ZERO) - self.used.get(resource, ZERO)

    def fits(self, req: Mapping[str, Decimal]) -> bool:
        """Every positive request fits in the free room."""
        return all(v <= ZERO or v <= self.free(k) for k, v in req.items())

    def add(self, req: Mapping[str, Decimal]) -> None:
        """Account a Pod's requests on this Node."""
        for k, v in req.items():
            self.used[k] = self.used.get(k, ZERO) + v

    def allocation_after(self, req: Mapping[str, Decimal]) -> Decimal:
        """Mean used/allocatable over cpu and memory after adding ``req`` (0..1)."""
        parts = []
        for k in ("cpu", "memory"):
            alloc = self.allocatable.get(k, ZERO)
            if alloc > ZERO:
                parts.append((self.used.get(k, ZERO) + req.get(k, ZERO)) / alloc)
        return sum(parts, ZERO) / len(parts) if parts else ZERO


@dataclass(frozen=True)
class BindDecision:
    """Bind Pod ``namespace/name`` to ``node``."""

    namespace: str
    name: str
    node: str
    containers: tuple[tuple[str, str], ...] = field(default=(), compare=False)  # (name, image)


def _pod_sort_key(pod: Mapping[str, Any]) -> tuple[int, str, str, str]:
    meta = pod.get("metadata") or {}
    prio = (pod.get("spec") or {}).get("priority")
    prio = prio if isinstance(prio, int) and not isinstance(prio, bool) else 0
    return (-prio, str(meta.get("creationTimestamp") or ""), str(meta.get("namespace") or ""),
            str(meta.get("name") or ""))


def build_node_views(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                     skipped: dict[str, str] | None = None) -> dict[str, NodeView]:
    """Views of every Ready, schedulable Node with the room left by the Pods bound to it."""
    views: dict[str, NodeView] = {}
    for node in nodes:
        name = (node.get("metadata") or {}).get("name")
        if not name or not node_ready(node) or not node_schedulable(node):
            continue
        alloc = _quantities((node.get("status") or {}).get("allocatable"))
        views[name] = NodeView(name, node, alloc)
    for pod in pods:
        if not is_bound(pod) or is_terminal(pod):
            continue
        view = views.get(pod["spec"]["nodeName"])
        if view is None:
            continue
        req = pod_requests(pod, skipped)
        if req is not None:
            view.add(req)
    return views


def plan_bindings(pods: Sequence[Mapping[str, Any]], nodes: Sequence[Mapping[str, Any]],
                  skipped: dict[str, str] | None = None) -> list[BindDecision]:
    """Decide where pending Pods go (see the module docstring for filters and scoring).

    Args:
        pods: every Pod (bound ones are used to account for used room).
        nodes: every Node.
        skipped: filled with ``{"namespace/name": why}`` of malformed Pods (None: logged).

    Returns:
        One decision per Pod that can be placed now, in placement order. Pods with no feasible
        Node are left out (they stay pending; a later pass retries).
    """
    views = build_node_views(nodes, pods, skipped)
    out: list[BindDecision] = []
    for pod in sorted((p for p in pods if is_pending(p)), key=_pod_sort_key):
        req = pod_requests(pod, skipped)
        if req is None:
            continue
        spec = pod.get("spec") or {}
        tols = spec.get("tolerations") or []
        best: tuple[Any, ...] | None = None
        best_view: NodeView | None = None
        for view in views.values():
            taints = (view.node.get("spec") or {}).get("taints") or []
            if not view.fits(req) or not node_affinity_matches(pod, view.node):
                continue
            if not tolerates(tols, taints):
                continue
            unused_extended = sum(
                1 for k, v in view.allocatable.items()
                if k not in STANDARD_RESOURCES and v > ZERO and req.get(k, ZERO) <= ZERO
            )
            score = (unused_extended, -view.allocation_after(req), view.name)
            if best is None or score < best:
                best, best_view = score, view
        if best_view is None:
            continue
        best_view.add(req)
        meta = pod.get("metadata") or {}
        containers = tuple((str(c.get("name", "")), str(c.get("image", "")))
                           for c in (pod.get("spec") or {}).get("containers") or []
                           if isinstance(c, Mapping))
        out.append(BindDecision(str(meta.get("namespace") or "default"), str(meta["name"]),
                                best_view.name, containers))
    return out


# ------------------------------------------------------------------------------------------------
# The Trio task
# ------------------------------------------------------------------------------------------------


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodAddresses:
    """Host and Pod IPs as a kubelet with a per-node Pod CIDR hands them out: node n is host
    10.0.x.y, its Pods 10.244+.n.2..254 (an address is reused only after 253 Pods on a node)."""

    def __init__(self) -> None:
        self._ips: dict[str, list[int]] = {}  # node -> [node index, last pod host number]

    def next(self, node: str) -> tuple[str, str]:
        """``(hostIP, a fresh podIP)`` on ``node``."""
        slot = self._ips.setdefault(node, [len(self._ips), 1])
        n = slot[0]
        slot[1] = slot[1] % 253 + 1
        return (f"10.0.{n // 250}.{n % 250 + 1}",
                f"10.{244 + n // 256}.{n % 256}.{slot[1] + 1}")


def running_status(containers: Iterable[tuple[str, str]], host_ip: str, pod_ip: str,
                   stamp: str) -> dict[str, Any]:
    """A Running Pod's status as a kubelet reports it: conditions, one ready container status
    per ``(name, image)``, host and Pod IPs (``kubectl get pods`` shows READY 1/1 and an IP)."""
    return {
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp},
            {"type": "Initialized", "status": "True", "lastTransitionTime": stamp},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": stamp},
            {"type": "Ready", "status": "True", "lastTransitionTime": stamp},
        ],
        "containerStatuses": [
            {"name": name, "image": image, "ready": True, "started": True, "restartCount": 0,
             "state": {"running": {"startedAt": stamp}}}
            for name, image in containers
        ],
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": stamp,
    }


class Binder:
    """Polls Pods and Nodes and binds pending Pods (see the module docstring).

    Args:
        client: a :class:`bigfleet_trio.kube.KubeClient` (owned by the caller).
        interval: seconds between passes (a pass also runs after :meth:`kick`).

    Attributes:
        bound: Pods this binder bound so far.
        errors: failed bind requests (logged; the next pass retries).
        unplaceable: ``{"namespace/name": why}`` of the malformed Pods the last pass skipped.
    """

    def __init__(self, client: Any, *, interval: float = 0.25) -> None:
        self.client = client
        self.interval = interval
        self.bound = 0
        self.errors = 0
        self.unplaceable: dict[str, str] = {}
        self._kick = trio.Event()
        self._addresses = PodAddresses()

    def kick(self) -> None:
        """Run a pass now."""
        self._kick.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind until cancelled."""
        task_status.started()
        while True:
            try:
                await self.run_once()
            except Exception as exc:  # an apiserver hiccup: log and retry next pass
                self.errors += 1
                log.warning("binder pass failed: %s", exc)
            with trio.move_on_after(self.interval):
                await self._kick.wait()
            self._kick = trio.Event()

    async def run_once(self) -> int:
        """One pass: list, plan, bind. Returns how many Pods were bound."""
        from bigfleet_trio.kube.errors import KubeError
        from bigfleet_trio.kube.resources import NODES, PODS

        pods = (await self.client.list(PODS)).items
        nodes = (await self.client.list(NODES)).items
        skipped: dict[str, str] = {}
        decisions = plan_bindings(pods, nodes, skipped)
        for key, why in sorted(skipped.items()):
            # once while the Pod stays so: a pass every 0.2 s repeated it ~440 times in a demo
            if self.unplaceable.get(key) != why:
                log.warning("binder: skipping pod=%s: %s", key, why)
        self.unplaceable = skipped
        done = 0
        for d in decisions:
            try:
                await self.bind(d)
            except KubeError as exc:
                self.errors += 1
                log.info("bind failed pod=%s/%s node=%s: %s", d.namespace, d.name, d.node, exc)
                continue
            done += 1
        return done

    async def bind(self, d: BindDecision) -> None:
        """Bind one Pod: ``spec.nodeName`` then a Running status, as kubelet would report."""
        from bigfleet_trio.kube.resources import PODS

        await self.client.patch(PODS, d.name, {"spec": {"nodeName": d.node}}, d.namespace)
        status = {"status": running_status(d.containers, *self._addresses.next(d.node), _now())}
        await self.client.patch(PODS, d.name, status, d.namespace, subresource="status")
        self.bound += 1
        log.info("bound pod=%s/%s node=%s", d.namespace, d.name, d.node)
