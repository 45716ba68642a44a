"""The demo's world: its inventory, timing and summary, the manifests, and the convergence checks.

Plain data and pure functions the ``bigfleet-trio demo`` scenario (:mod:`.demo_scenario`) works
over: :func:`demo_catalog`, :class:`DemoTiming`, :class:`DemoSummary`, manifest helpers
(tolerations, owning workload, which one to scale down), :class:`World` (one read of the
apiserver and the shard) and :func:`converged_up` / :func:`converged_down` (why a phase is not
done yet). Re-exported by :mod:`bigfleet_trio.sim.demo`.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, NODES, PODS, UPCOMING_NODES
from bigfleet_trio.sim.shard.catalog import LABEL_SPOT, Catalog, MachineShape, ShapeTaint, offer
from bigfleet_trio.sim.shard.engine import EngineConfig, ReclaimRecord, ShardEngine
from bigfleet_trio.sim.shard.session import SimShard

from .binder import is_terminal

__all__ = [
    "BURST_REPLICAS", "CLUSTER_ID", "FLEET_NAMESPACE", "FLEET_POOL", "IDLE_WORKLOAD",
    "WEB_WORKLOAD", "ClusterView", "burst_cluster", "cluster_row", "converged_fleet",
    "move_row", "cluster_names", "fleet_manifests",
    "fleet_shapes", "with_fleet_shapes", "GPU", "GPU_TAINT", "OWNED_BY_POD", "DemoSummary",
    "DemoTiming", "World",
    "add_extended_resource_tolerations", "bound_machines", "bundled_workloads_dir",
    "converged_down", "converged_up", "demo_catalog", "hourly_cost", "manifest_paths",
    "pick_scale_down", "pod_body", "read_world", "reclaimed_binding_left", "reclaims_pending",
    "rollup_matches_crs", "workload_of",
]

CLUSTER_ID = "demo-cluster"
OWNED_BY_POD = "bigfleet.lucy.sh/owned-by-pod"
GPU = "nvidia.com/gpu"
GPU_TAINT = ShapeTaint(GPU, "present", "NoSchedule")


def bundled_workloads_dir() -> Path:
    """Directory of the real manifests shipped with the package."""
    return Path(__file__).resolve().parent / "workloads"


def cluster_names(n: int) -> list[str]:
    """The demo's cluster IDs: ``demo-cluster`` (the one the bundled workloads go to, the ID a
    one-cluster demo always had), then ``demo-cluster-2`` ... ``demo-cluster-<n>``."""
    return [CLUSTER_ID] + [f"{CLUSTER_ID}-{i}" for i in range(2, n + 1)]


#: Label and taint key of the fleet pool: the machines the clusters' fleet workloads share and
#: move between (tainted, so the bundled workloads never land there).
FLEET_POOL = "demo.bigfleet.io/pool"
FLEET_TAINT = ShapeTaint(FLEET_POOL, "fleet", "NoSchedule")


def fleet_shapes(clusters: int) -> list[MachineShape]:
    """The fleet pool for ``clusters`` clusters (none for one): on-demand ``fleet-od-4`` machines,
    one per cluster's fleet workload at the start (so the pool is empty then: scarcity), and two
    cheaper ``fleet-spot-4`` spot machines (``bigfleet.io/spot: "true"``), all warm, one zone,
    labelled and tainted :data:`FLEET_POOL`."""
    if clusters < 2:
        return []
    labels = {FLEET_POOL: "fleet"}
    # c1 idle work, c2 reports, one web per cluster from the third (c1's for two clusters)
    on_demand = 2 + max(1, clusters - 2)
    return [
        MachineShape("fleet-od-4", "sim-zone-a", {"cpu": "4", "memory": "16Gi", "pods": "110"},
                     0.20, count=on_demand, warm=on_demand, extra_labels=labels,
                     taints=(FLEET_TAINT,)),
        MachineShape("fleet-spot-4", "sim-zone-a", {"cpu": "4", "memory": "16Gi", "pods": "110"},
                     0.06, count=2, warm=2, extra_labels={**labels, LABEL_SPOT: "true"},
                     taints=(FLEET_TAINT,)),
    ]


def with_fleet_shapes(catalog: Catalog, clusters: int) -> Catalog:
    """``catalog`` plus the :func:`fleet_shapes` it does not have yet (by shape key)."""
    have = {s.key for s in catalog}
    return Catalog([*catalog, *(s for s in fleet_shapes(clusters) if s.key not in have)])


def _fleet_deployment(name: str, replicas: int, priority_class: str,
                      interruption_penalty: str | None = None) -> dict[str, Any]:
    """A fleet Deployment: 3-cpu Pods on the fleet pool. Without an interruption penalty the
    Pods keep off spot Nodes (required node affinity ``bigfleet.io/spot`` DoesNotExist, as
    interruption-sensitive work does); with one (``"0"``: $0) they select spot Nodes, which the
    shard gives only to demand with a low interruption penalty (docs/rules.md#simulated-fleet).
    Either way the scheduler puts each Pod where the shard bound a machine for its need."""
    annotations = ({"bigfleet.lucy.sh/interruption-penalty": interruption_penalty}
                   if interruption_penalty is not None else {})
    selector = {FLEET_POOL: "fleet"}
    if interruption_penalty is not None:
        selector[LABEL_SPOT] = "true"
    affinity = {} if interruption_penalty is not None else {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": LABEL_SPOT, "operator": "DoesNotExist"}]}]}}}}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "fleet"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations},
                "spec": {
                    "priorityClassName": priority_class,
                    **affinity,
                    "nodeSelector": selector,
                    "tolerations": [{"key": FLEET_POOL, "operator": "Equal", "value": "fleet",
                                     "effect": "NoSchedule"}],
                    "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"requests": {"cpu": "3", "memory": "4Gi"}}}],
                },
            },
        },
    }


FLEET_CLASSES = [
    {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
     "metadata": {"name": "fleet-low"}, "value": 10,
     "description": "batch and reports: yields to the fleet's web tier under scarcity"},
    {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
     "metadata": {"name": "fleet-high"}, "value": 1000,
     "description": "the web tier: preempts lower-priority work in other clusters"},
]

#: The fleet workload of each role: ``idle`` (scaled down: its machine moves), ``batch``
#: (interruption-tolerant: spot), ``reports`` (low priority on-demand: preempted), ``web``
#: (high priority: bursts).
BURST_REPLICAS = 3
FLEET_NAMESPACE = "fleet"
IDLE_WORKLOAD = "Deployment/fleet-idle"
WEB_WORKLOAD = "Deployment/fleet-web"


def fleet_manifests(index: int, clusters: int) -> list[dict[str, Any]]:
    """The fleet workloads of cluster ``index`` (0-based) of ``clusters`` (none for one):
    the first runs ``fleet-idle`` (scaled to 0 later), the second ``fleet-batch`` (2 replicas,
    interruption penalty $0: spot) and ``fleet-reports`` (low priority), every one from the
    third ``fleet-web`` (high priority; the third's bursts to :data:`BURST_REPLICAS`). With two
    clusters the first also runs ``fleet-web``. PriorityClasses come first."""
    if clusters < 2:
        return []
    out: list[dict[str, Any]] = [dict(c) for c in FLEET_CLASSES]
    if index == 0:
        out.append(_fleet_deployment("fleet-idle", 1, "fleet-low"))
    if index == 1:
        out.append(_fleet_deployment("fleet-batch", 2, "fleet-low", interruption_penalty="0"))
        out.append(_fleet_deployment("fleet-reports", 1, "fleet-low"))
    if index >= 2 or (clusters == 2 and index == 0):
        out.append(_fleet_deployment("fleet-web", 1, "fleet-high"))
    return out


def burst_cluster(clusters: int) -> int:
    """Index of the cluster whose ``fleet-web`` bursts (the third, or the first of two)."""
    return 2 if clusters >= 3 else 0


def demo_catalog() -> Catalog:
    """The simulated inventory the demo runs against (three zones).

    General-purpose 4- and 8-core machines (two of each 4-core warm per zone), a 1-GPU and a 2-GPU
    NVIDIA L4 machine family (tainted ``nvidia.com/gpu=present:NoSchedule`` as on GKE) and an
    H100 family. Prices are illustrative USD/hour.
    """
    zones = ("sim-zone-a", "sim-zone-b", "sim-zone-c")
    pods = {"pods": "110", "ephemeral-storage": "100Gi"}
    cc = {"cloud.google.com/compute-class": "Balanced"}
    shapes = []
    shapes += offer("sim-standard-4", zones, {"cpu": "4", "memory": "16Gi", **pods}, 0.19,
                    count=12, warm=2, extra_labels=cc)
    shapes += offer("sim-standard-8", zones, {"cpu": "8", "memory": "32Gi", **pods}, 0.38,
                    count=6, extra_labels=cc)
    shapes += offer("g2-standard-8", zones,
                    {"cpu": "8", "memory": "32Gi", GPU: "1", **pods}, 0.85, count=4,
                    extra_labels={"cloud.google.com/gke-accelerator": "nvidia-l4"},
                    taints=[GPU_TAINT])
    shapes += offer("g2-standard-24", zones,
                    {"cpu": "24", "memory": "96Gi", GPU: "2", **pods}, 2.0, count=2,
                    extra_labels={"cloud.google.com/gke-accelerator": "nvidia-l4"},
                    taints=[GPU_TAINT])
    shapes += offer("a3-highgpu-8g", zones,
                    {"cpu": "208", "memory": "1872Gi", GPU: "8", **pods}, 88.49, count=1,
                    extra_labels={"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
                    taints=[GPU_TAINT])
    return Catalog(shapes)


@dataclass(frozen=True)
class DemoTiming:
    """Speeds of the simulated world (seconds). The defaults are the demo's; tests may shrink."""

    rollup_interval: float = 1.0
    progress_interval: float = 1.0
    poll_interval: float = 0.2
    binder_interval: float = 0.2
    create_delay: float = 0.3
    boot_delay: float = 0.5
    configure_delay: float = 0.5
    drain_wait: float = 0.5
    drain_step: float = 0.3
    # Drain deadline per reclaim. 3 s: the drain re-checks 0.25 s after an admitted eviction and
    # once more at the deadline, and the sim's Pods vanish at once, so demo drains finish well
    # inside it (green with 2 s, also 4 demos at once on 2 CPUs); +1 s over the shard's default
    # is margin for slow CI. It was 10 s while drains only re-listed every 2 s.
    reclaim_grace_seconds: int = 3
    surplus_rollups: int = 2

    def engine_config(self, seed: int) -> EngineConfig:
        """The shard engine knobs for this timing."""
        return EngineConfig(
            seed=seed,
            create_delay=self.create_delay,
            boot_delay=self.boot_delay,
            configure_delay=self.configure_delay,
            drain_wait=self.drain_wait,
            drain_step=self.drain_step,
            reclaim_grace_seconds=self.reclaim_grace_seconds,
            surplus_rollups=self.surplus_rollups,
        )


@dataclass
class DemoSummary:
    """What the scenario did. ``ok`` False means ``failure`` says what did not converge."""

    ok: bool = False
    failure: str | None = None
    kubeconfig: str | None = ""  # None once removed at exit (a temporary directory)
    workloads: list[str] = field(default_factory=list)
    pods_created: int = 0
    crs: int = 0
    needs: int = 0
    rollup_bytes: int = 0
    rollups: int = 0
    machines_configured: int = 0
    machines_by_state: dict[str, int] = field(default_factory=dict)
    upcoming_ready: int = 0
    nodes_ready: int = 0
    pods_bound: int = 0
    hourly_cost: float = 0.0
    scaled_down: str = ""
    pods_deleted: int = 0
    reclaims_issued: int = 0
    reclaims_acked: int = 0
    machines_released: int = 0
    reclaimed_nodes: list[str] = field(default_factory=list)
    upcoming_deleted: int = 0
    machines_bound_while_reclaiming: int = 0
    """Bindings started during the scale-down (demand that came back, e.g. evicted Pods)."""
    machines_failed_while_reclaiming: int = 0
    """Bindings ended by a failure during the scale-down (a bootstrap pull past its deadline)."""
    drains_completed: int = 0
    pods_replaced: int = 0
    final_pods: int = 0
    final_machines_configured: int = 0
    final_hourly_cost: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    operator: dict[str, Any] = field(default_factory=dict)
    diagnostics: str = ""
    """``HOST:PORT`` of the demo's /metrics, /healthz, /readyz and /events ("" = disabled)."""
    clusters: list[dict[str, Any]] = field(default_factory=list)
    """Per cluster: ``name``, ``kubeconfig``, ``pods``, ``pods_bound``, ``pods_pending`` (with
    why), ``machines`` (Configured), ``spot_machines``, ``hourly_cost``, ``diagnostics``."""
    moves: list[dict[str, Any]] = field(default_factory=list)
    """Machines that moved between clusters: ``machine``, ``node``, ``instance_type``, ``from``,
    ``to``, ``why`` (surplus, preempted, failed), ``spot``, ``t`` (seconds into the run)."""
    preemptions: int = 0
    spot_machines: int = 0
    story: list[str] = field(default_factory=list)
    """What moved where and why, one sentence each."""
    page: str = ""
    """URL of the live page ("" = disabled)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view."""
        return asdict(self)


# ------------------------------------------------------------------------------------------------
# Manifests
# ------------------------------------------------------------------------------------------------


def manifest_paths(directory: str | os.PathLike[str]) -> list[Path]:
    """The manifest files of a directory (``*.yaml``, ``*.yml``, ``*.json``), sorted."""
    base = Path(directory)
    return sorted(p for p in base.iterdir()
                  if p.is_file() and p.suffix in (".yaml", ".yml", ".json"))


def add_extended_resource_tolerations(pod: dict[str, Any],
                                      tainted: Iterable[str] = (GPU,)) -> None:
    """The ExtendedResourceToleration admission plugin: a Pod requesting ``nvidia.com/gpu`` gets
    ``{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}`` (GKE enables it)."""
    spec = pod.setdefault("spec", {})
    wanted: set[str] = set()
    for c in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
        res = c.get("resources") or {}
        for section in ("requests", "limits"):
            wanted.update(k for k in (res.get(section) or {}) if k in tainted)
    tols = spec.setdefault("tolerations", [])
    for key in sorted(wanted):
        if not any(t.get("key") == key and t.get("operator") == "Exists" for t in tols):
            tols.append({"key": key, "operator": "Exists", "effect": "NoSchedule"})
    if not tols:
        spec.pop("tolerations")


def workload_of(pod: Mapping[str, Any]) -> str:
    """``"Kind/name"`` of the workload that owns a Pod (Deployment for a ReplicaSet with a
    pod-template-hash), or ``"Pod/name"``."""
    meta = pod.get("metadata") or {}
    refs = meta.get("ownerReferences") or []
    if not refs:
        return f"Pod/{meta.get('name')}"
    kind, name = refs[0].get("kind"), refs[0].get("name", "")
    h = (meta.get("labels") or {}).get("pod-template-hash")
    if kind == "ReplicaSet" and h and name.endswith("-" + h):
        return f"Deployment/{name[: -len(h) - 1]}"
    return f"{kind}/{name}"


def pick_scale_down(pods: Iterable[Mapping[str, Any]]) -> str | None:
    """The workload to scale down: one whose Pods are the only (non-DaemonSet) Pods on their
    nodes, so a reclaim of those nodes evicts nobody else; most nodes first, then
    Deployments before other kinds, then name. Falls back to the workload with the fewest Pods."""
    by_node: dict[str, set[str]] = {}
    by_workload: dict[str, set[str]] = {}
    for pod in pods:
        if is_terminal(pod):
            continue
        w = workload_of(pod)
        if w.startswith("DaemonSet/"):
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        by_workload.setdefault(w, set())
        if node:
            by_node.setdefault(node, set()).add(w)
            by_workload[w].add(node)
    if not by_workload:
        return None
    isolated = [w for w, nodes in by_workload.items()
                if nodes and all(by_node[n] == {w} for n in nodes)]
    if isolated:
        return min(isolated, key=lambda w: (-len(by_workload[w]),
                                            not w.startswith("Deployment/"), w))
    return min(by_workload, key=lambda w: (len(by_workload[w]), w))


def pod_body(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What to POST for an expanded Pod (the apiserver assigns uid; status comes later)."""
    meta = dict(pod.get("metadata") or {})
    meta.pop("uid", None)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod.get("spec") or {}}


# ------------------------------------------------------------------------------------------------
# State snapshot (read from the apiserver and the shard)
# ------------------------------------------------------------------------------------------------


@dataclass
class World:
    """One consistent-enough read of everything the progress line and the checks need."""

    pods: list[dict[str, Any]]
    crs: list[dict[str, Any]]
    upcoming: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    shard: dict[str, Any]

    @property
    def live_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.pods if not is_terminal(p)
                and not (p.get("metadata") or {}).get("deletionTimestamp")]

    def pods_without_cr(self) -> list[str]:
        owners = {(c.get("metadata") or {}).get("labels", {}).get(OWNED_BY_POD) for c in self.crs}
        return sorted(f"{p['metadata'].get('namespace')}/{p['metadata']['name']}"
                      for p in self.live_pods if p["metadata"].get("uid") not in owners)

    def bound(self) -> int:
        return sum(1 for p in self.live_pods if (p.get("spec") or {}).get("nodeName"))

    def upcoming_phases(self) -> Counter[str]:
        return Counter((u.get("status") or {}).get("phase") or "New" for u in self.upcoming)

    def nodes_ready(self) -> int:
        from .binder import node_ready

        return sum(1 for n in self.nodes if node_ready(n))


async def read_world(client: KubeClient, shard: Any) -> World:
    """List Pods, CRs, UpcomingNodes and Nodes; snapshot the shard."""
    pods = (await client.list(PODS)).items
    crs = (await client.list(CAPACITY_REQUESTS)).items
    upcoming = (await client.list(UPCOMING_NODES)).items
    nodes = (await client.list(NODES)).items
    return World(pods, crs, upcoming, nodes, shard.snapshot())


class ClusterView:
    """One cluster's share of a fleet shard, with the :class:`SimShard` views the checks and the
    progress line read (``engine``, ``last_rollup``, ``reclaims_issued``, :meth:`snapshot`)."""

    def __init__(self, shard: SimShard, cluster_id: str) -> None:
        self.shard = shard
        self.cluster_id = cluster_id

    @property
    def engine(self) -> ShardEngine:
        """The cluster's engine."""
        return self.shard.engine_of(self.cluster_id)

    @property
    def last_rollup(self) -> Any:
        """The cluster's last accepted roll-up."""
        return self.engine.last_rollup

    @property
    def reclaims_issued(self) -> list[ReclaimRecord]:
        """Every ReclaimInstruction issued to the cluster, in order."""
        return list(self.engine.reclaims)

    def snapshot(self) -> dict[str, Any]:
        """:meth:`SimShard.snapshot` of this cluster."""
        return self.shard.snapshot(self.cluster_id)


def rollup_matches_crs(shard: Any, crs: list[dict[str, Any]]) -> bool:
    """The shard's last accepted roll-up carries exactly the needs built from scratch over the
    CRs (as multisets of encoded needs; order is not part of the contract)."""
    from bigfleet_trio.operator.rollup.aggregate import build_from_scratch

    last = shard.last_rollup
    if last is None:
        return False
    want = sorted(bytes(n) for n in build_from_scratch(crs))
    have = sorted(bytes(n) for n in last.needs)
    return want == have


def bound_machines(shard: Any) -> list[Any]:
    """The shard's machines bound to the cluster."""
    return list(shard.engine.bound_machines())


def hourly_cost(shard: Any) -> float:
    """USD/hour of every bound machine."""
    return round(float(sum(m.shape.price_per_hour for m in bound_machines(shard))), 2)


def converged_up(world: World, shard: Any) -> list[str]:
    """Why the scale-up phase is not done yet ([] = converged)."""
    why: list[str] = []
    live = world.live_pods
    if not live:
        why.append("no Pods yet")
    missing = world.pods_without_cr()
    if missing:
        why.append(f"{len(missing)} Pods without a CapacityRequest (e.g. {missing[0]})")
    if not rollup_matches_crs(shard, world.crs):
        why.append("the last roll-up the shard accepted does not match the CapacityRequests yet")
    short = [n.key for n in shard.engine.needs if n.short]
    if short:
        why.append(f"{len(short)} needs short of machines")
    machines = [m for m in bound_machines(shard) if m.reclaim is None]
    not_cfg = [m for m in machines if m.state.name != "CONFIGURED"]
    if not_cfg:
        why.append(f"{len(not_cfg)} machines not Configured yet")
    phases = {(u.get("metadata") or {}).get("name"): (u.get("status") or {}).get("phase")
              for u in world.upcoming}
    not_ready = [m.machine_id for m in machines if phases.get(f"un-{m.machine_id}") != "Ready"]
    if not_ready:
        why.append(f"{len(not_ready)} UpcomingNodes not Ready")
    unbound = len(live) - world.bound()
    if unbound:
        why.append(f"{unbound} Pods not bound to a node")
    return why


# UpcomingNode phases of a binding being reclaimed (the operator deletes the record at Drained).
_RECLAIM_PHASES = ("Draining", "Drained")


def reclaimed_binding_left(world: World, shard: Any,
                           rec: ReclaimRecord) -> tuple[bool, bool, bool]:
    """Whether the binding ``rec`` reclaimed is over: ``(released, upcoming_gone, node_gone)``.

    A released machine may be bound again (warm reuse: Pods the drain evicted come back through
    their controllers and the cheapest pool machine is the one just released), and its next
    binding has an UpcomingNode and a Node of the same names. So once the machine is in a later
    binding, an UpcomingNode still in a reclaim phase (Draining/Drained) or a cordoned Node of
    that name is the reclaimed binding's, anything else the new binding's
    (docs/rules.md#reclaim-the-same-machine-again).
    """
    m = shard.engine.machine(rec.machine_id)
    released = rec.released_at is not None
    later = m is not None and m.binding != rec.binding
    un = next((u for u in world.upcoming
               if (u.get("metadata") or {}).get("name") == f"un-{rec.machine_id}"), None)
    node = next((n for n in world.nodes
                 if (n.get("metadata") or {}).get("name") == rec.node_name), None)
    if later:
        un_gone = un is None or (un.get("status") or {}).get("phase") not in _RECLAIM_PHASES
        node_gone = node is None or not (node.get("spec") or {}).get("unschedulable")
    else:
        un_gone, node_gone = un is None, node is None
    return released, un_gone, node_gone


def reclaims_pending(world: World, shard: Any, reclaim_floor: int) -> list[str]:
    """Why the reclaims issued since ``reclaim_floor`` are not done yet ([] = done): each
    acknowledged, its binding released, that binding's UpcomingNode and Node deleted."""
    why: list[str] = []
    recs = shard.reclaims_issued[reclaim_floor:]
    if not recs:
        why.append("the shard has not reclaimed any machine yet")
    unacked = [r for r in recs if r.acked_at is None]
    if unacked:
        why.append(f"{len(unacked)} ReclaimInstructions not acknowledged")
    for r in recs:
        released, un_gone, node_gone = reclaimed_binding_left(world, shard, r)
        if not released:
            m = shard.engine.machine(r.machine_id)
            state = str(m.state.name).lower() if m is not None else "?"
            why.append(f"machine {r.machine_id} ({r.node_name}) still bound ({state})")
        elif not un_gone:
            why.append(f"UpcomingNode un-{r.machine_id} not deleted yet")
        elif not node_gone:
            why.append(f"Node {r.node_name} not deleted yet")
    return why


def converged_down(world: World, shard: Any, reclaim_floor: int) -> list[str]:
    """Why the scale-down phase is not done yet ([] = converged): :func:`reclaims_pending`, then
    the scale-up checks over what is left (machines bound again included)."""
    why = reclaims_pending(world, shard, reclaim_floor)
    why += [w for w in converged_up(world, shard) if not w.startswith("no Pods")]
    return why



def converged_fleet(world: World, view: ClusterView, reclaim_floor: int) -> list[str]:
    """Why a fleet cluster (not the first) is not settled after the scale-down and the burst
    ([] = settled): its reclaims since ``reclaim_floor`` done (:func:`reclaims_pending`), and the
    scale-up checks; a cluster that lost machines to preemption may keep short needs and Pending
    Pods (nothing free fits them: that is what preemption means), everything else must hold."""
    recs = view.reclaims_issued[reclaim_floor:]
    why = reclaims_pending(world, view, reclaim_floor) if recs else []
    preempted = any(r.reason == "preempted" for r in recs)
    for w in converged_up(world, view):
        if preempted and ("short of machines" in w or "not bound to a node" in w):
            continue
        why.append(w)
    return why


def cluster_row(name: str, kubeconfig: str, diagnostics: str, world: World | None,
                view: ClusterView) -> dict[str, Any]:
    """One cluster's line of the summary (see :attr:`DemoSummary.clusters`)."""
    eng = view.engine
    bound = eng.bound_machines()
    configured = [m for m in bound if m.state.name == "CONFIGURED"]
    recs = eng.reclaims
    preempted = sum(1 for r in recs if r.reason == "preempted")
    live = world.live_pods if world is not None else []
    pending = sorted(f"{(p.get('metadata') or {}).get('namespace')}/"
                     f"{(p.get('metadata') or {}).get('name')}"
                     for p in live if not (p.get("spec") or {}).get("nodeName"))
    short = [n for n in eng.needs if n.short]
    if pending and preempted:
        pending_why = (f"{preempted} of its machines were preempted by higher-priority demand "
                       "in another cluster and nothing free fits")
    elif pending:
        pending_why = f"{len(short)} needs short of machines" if short else "being placed"
    else:
        pending_why = ""
    return {
        "name": name,
        "kubeconfig": kubeconfig,
        "diagnostics": diagnostics,
        "pods": len(live),
        "pods_bound": world.bound() if world is not None else 0,
        "pods_pending": pending,
        "pending_why": pending_why,
        "machines": len(configured),
        "spot_machines": sum(1 for m in configured if m.spot),
        "hourly_cost": round(float(sum(m.shape.price_per_hour for m in bound)), 2),
        "short_needs": len(short),
        "reclaims": len(recs),
        "preempted": preempted,
    }


def move_row(move: Any, t0: float) -> dict[str, Any]:
    """A :class:`~bigfleet_trio.sim.shard.fleet.Move` as a summary row (``t``: seconds since
    ``t0``, the run's start on the same clock)."""
    return {"machine": move.machine_id, "node": move.node_name,
            "instance_type": move.instance_type, "from": move.from_cluster,
            "to": move.to_cluster, "why": move.why, "spot": move.spot,
            "t": round(move.time - t0, 2)}
