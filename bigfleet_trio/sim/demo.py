"""``bigfleet-trio demo``: the whole BigFleet loop on one laptop.

One ``trio.run`` (with a trio-asyncio loop for grpclib) runs, in one nursery:

1. the embedded Kubernetes apiserver (loopback, port 0) and a kubeconfig for it;
2. the simulated shard (:class:`~bigfleet_trio.sim.shard.SimShard`) served over grpclib on
   loopback, registering a Node for each Configured machine through the Kubernetes API;
3. the pod controller (one CapacityRequest per Pod) and the operator (roll-ups every second,
   UpcomingNodes, bootstrap, reclaim), the operator dialling the shard over the real stream;
4. a minimal binder standing in for kube-scheduler (:mod:`bigfleet_trio.sim.binder`).

Then the scenario: apply the bundled real workloads (PriorityClasses/RuntimeClasses first;
Deployments, StatefulSets, Jobs expanded to the Pods their controllers would create), show live
progress, wait until every Pod has a CR, the roll-up matches the CRs, the machines for the demand
are Configured, their UpcomingNodes Ready and every Pod bound; then scale one workload down (the
one whose Pods sit alone on their nodes), and wait for the shard to reclaim the surplus machines
and the operator to cordon, acknowledge and drain them until their UpcomingNodes are deleted.
A summary table (or ``--json``) ends the run; exit 0, or 1 with what did not converge.

:func:`run_scenario` is the headless entry point the end-to-end test drives.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import trio

from bigfleet_trio.config import OperatorConfig, yaml_error_line
from bigfleet_trio.kube import (
    CAPACITY_REQUESTS,
    NAMESPACES,
    NODES,
    PODS,
    PRIORITY_CLASSES,
    RUNTIME_CLASSES,
    UPCOMING_NODES,
    KubeClient,
    load_kubeconfig,
)
from bigfleet_trio.kube.errors import AlreadyExists, NotFound
from bigfleet_trio.observability.events import EventFeed
from bigfleet_trio.sim.demo_options import DemoOptions

from .binder import Binder, is_terminal
from .shard import (
    Catalog,
    CatalogError,
    EngineConfig,
    KubeNodeHooks,
    ShapeTaint,
    SimShard,
    load_catalog,
    offer,
    serve_sim_shard,
)

log = logging.getLogger(__name__)

__all__ = ["DemoSummary", "DemoTiming", "demo_catalog", "run_demo", "run_scenario",
           "bundled_workloads_dir"]

CLUSTER_ID = "demo-cluster"
OWNED_BY_POD = "bigfleet.lucy.sh/owned-by-pod"
GPU = "nvidia.com/gpu"
GPU_TAINT = ShapeTaint(GPU, "present", "NoSchedule")


def bundled_workloads_dir() -> Path:
    """Directory of the real manifests shipped with the package."""
    return Path(__file__).resolve().parent / "workloads"


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
    kubeconfig: str = ""
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
    drains_completed: int = 0
    pods_replaced: int = 0
    final_pods: int = 0
    final_machines_configured: int = 0
    final_hourly_cost: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    operator: dict[str, Any] = field(default_factory=dict)
    diagnostics: str = ""
    """``HOST:PORT`` of the demo's /metrics, /healthz, /readyz and /events ("" = disabled)."""

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


async def read_world(client: KubeClient, shard: SimShard) -> World:
    """List Pods, CRs, UpcomingNodes and Nodes; snapshot the shard."""
    pods = (await client.list(PODS)).items
    crs = (await client.list(CAPACITY_REQUESTS)).items
    upcoming = (await client.list(UPCOMING_NODES)).items
    nodes = (await client.list(NODES)).items
    return World(pods, crs, upcoming, nodes, shard.snapshot())


def rollup_matches_crs(shard: SimShard, crs: list[dict[str, Any]]) -> bool:
    """The shard's last accepted roll-up carries exactly the needs built from scratch over the
    CRs (as multisets of encoded needs; order is not part of the contract)."""
    from bigfleet_trio.operator.rollup import build_from_scratch

    last = shard.last_rollup
    if last is None:
        return False
    want = sorted(bytes(n) for n in build_from_scratch(crs))
    have = sorted(bytes(n) for n in last.needs)
    return want == have


def bound_machines(shard: SimShard) -> list[Any]:
    """The shard's machines bound to the cluster."""
    return list(shard.engine.bound_machines())


def hourly_cost(shard: SimShard) -> float:
    """USD/hour of every bound machine."""
    return round(float(sum(m.shape.price_per_hour for m in bound_machines(shard))), 2)


def converged_up(world: World, shard: SimShard) -> list[str]:
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


def converged_down(world: World, shard: SimShard, reclaim_floor: int) -> list[str]:
    """Why the scale-down phase is not done yet ([] = converged)."""
    why: list[str] = []
    recs = shard.reclaims_issued[reclaim_floor:]
    if not recs:
        why.append("the shard has not reclaimed any machine yet")
    unacked = [r for r in recs if r.acked_at is None]
    if unacked:
        why.append(f"{len(unacked)} ReclaimInstructions not acknowledged")
    upcoming = {(u.get("metadata") or {}).get("name") for u in world.upcoming}
    node_names = {(n.get("metadata") or {}).get("name") for n in world.nodes}
    for r in recs:
        m = shard.engine.machine(r.machine_id)
        if m is not None and m.bound:
            why.append(f"machine {r.machine_id} ({r.node_name}) still bound "
                       f"({str(m.state.name).lower()})")
        elif f"un-{r.machine_id}" in upcoming:
            why.append(f"UpcomingNode un-{r.machine_id} not deleted yet")
        elif r.node_name in node_names:
            why.append(f"Node {r.node_name} not deleted yet")
    why += [w for w in converged_up(world, shard) if not w.startswith("no Pods")]
    return why


# ------------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------------


def progress_line(elapsed: float, world: World, shard: SimShard, stage: str) -> str:
    """One line of live progress."""
    snap = world.shard
    machines = {k: v for k, v in snap["machines"].items() if k != "FREE"}
    mtxt = " ".join(f"{k.lower()} {v}" for k, v in sorted(machines.items())) or "none"
    up = world.upcoming_phases()
    utxt = " ".join(f"{k} {v}" for k, v in sorted(up.items())) or "none"
    live = world.live_pods
    return (f"[{elapsed:5.1f}s] {stage:<10} pods {world.bound():>3}/{len(live):<3} bound | "
            f"CRs {len(world.crs):>3} | needs {snap['needs']:>2} | machines: {mtxt} | "
            f"upcoming: {utxt} | nodes ready {world.nodes_ready():>2} | "
            f"reclaims {snap['reclaims_acked']}/{snap['reclaims_issued']} acked, "
            f"{snap['released']} drained")


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def render_summary(s: DemoSummary) -> str:
    """The human summary table."""
    t = s.timings
    rows: list[tuple[str, str]] = [
        ("workloads applied", ", ".join(s.workloads) or "-"),
        ("Pods created", str(s.pods_created)),
        ("CapacityRequests", str(s.crs)),
        ("needs in the roll-up", f"{s.needs} ({s.rollup_bytes} bytes on the wire, "
                                 f"{s.rollups} roll-ups accepted)"),
        ("machines Configured", f"{s.machines_configured} (${s.hourly_cost:.2f}/h)"),
        ("UpcomingNodes Ready", str(s.upcoming_ready)),
        ("Nodes Ready", str(s.nodes_ready)),
        ("Pods bound", f"{s.pods_bound}/{s.pods_created}"),
        ("time to all Pods bound", _secs(t.get("all_bound"))),
        ("scaled down", f"{s.scaled_down or '-'} ({s.pods_deleted} Pods deleted)"),
        ("reclaims issued / acked", f"{s.reclaims_issued} / {s.reclaims_acked}"),
        ("machines drained and released", f"{s.machines_released} "
                                          f"({', '.join(s.reclaimed_nodes) or '-'})"),
        ("drains finished (operator)", str(s.drains_completed)),
        ("evicted Pods recreated", str(s.pods_replaced)),
        ("UpcomingNodes deleted", str(s.upcoming_deleted)),
        ("time from scale-down to drained", _secs(t.get("reclaim"))),
        ("after: machines Configured", f"{s.final_machines_configured} "
                                       f"(${s.final_hourly_cost:.2f}/h)"),
        ("total wall time", f"{t.get('total', 0):.1f}s"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = ["", "BigFleet demo summary" + ("" if s.ok else " (FAILED)"),
             "-" * (width + 40)]
    lines += [f"{k:<{width}}  {v}" for k, v in rows]
    if s.diagnostics:
        lines.append(f"{'diagnostics':<{width}}  {_diagnostics_urls(s.diagnostics)}")
    if s.failure:
        lines.append(f"{'did not converge':<{width}}  {s.failure}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# Scenario
# ------------------------------------------------------------------------------------------------


async def _create_ignoring_exists(client: KubeClient, res: Any, body: dict[str, Any],
                                  namespace: str | None = None) -> None:
    try:
        await client.create(res, body, namespace)
    except AlreadyExists:
        pass


class Workloads:
    """The demo's stand-in for the workload controllers (ReplicaSet, StatefulSet, Job).

    Keeps, per workload, the number of Pods it should have (as expanded at apply time); a Pod
    that disappears (evicted by a drain, deleted by hand) is replaced by a new one, as its
    controller would do, and a workload scaled to ``n`` has its surplus Pods deleted.

    Args:
        client: the demo's :class:`KubeClient`.
        objects: every manifest object (PriorityClasses/RuntimeClasses are used for admission).
    """

    def __init__(self, client: KubeClient, objects: list[dict[str, Any]]) -> None:
        self.client = client
        self.classes = [o for o in objects if o.get("kind") in ("PriorityClass", "RuntimeClass")]
        self.sources: dict[str, dict[str, Any]] = {}
        self.desired: dict[str, int] = {}
        self.replaced = 0
        self._gen = 0

    def expand(self, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Pods of one workload object, admitted, with GPU tolerations; fresh names each call."""
        import random

        from bigfleet_trio.podcontroller.expand import expand_manifests

        self._gen += 1
        pods = expand_manifests([*self.classes, dict(obj)], daemonset_nodes=(),
                                rng=random.Random(self._gen))
        for pod in pods:
            add_extended_resource_tolerations(pod)
        return pods

    async def create(self, pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Create Pods (16 at a time); returns them as stored."""
        created: list[dict[str, Any]] = []
        limiter = trio.CapacityLimiter(16)

        async def one(pod: dict[str, Any]) -> None:
            async with limiter:
                with contextlib.suppress(AlreadyExists):
                    created.append(await self.client.create(
                        PODS, pod_body(pod), pod["metadata"].get("namespace")))

        async with trio.open_nursery() as nursery:
            for pod in pods:
                nursery.start_soon(one, pod)
        return created

    async def apply(self, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Create the Pods of every workload object; remember how many each should keep."""
        pods: list[dict[str, Any]] = []
        for obj in objects:
            if obj.get("kind") in ("PriorityClass", "RuntimeClass"):
                continue
            mine = self.expand(obj)
            if not mine:
                continue
            w = workload_of(mine[0])
            self.sources[w] = obj
            self.desired[w] = len(mine)
            pods += mine
        namespaces = sorted({p["metadata"].get("namespace") or "default" for p in pods})
        for ns in namespaces:
            await _create_ignoring_exists(self.client, NAMESPACES, {"metadata": {"name": ns}})
        return await self.create(pods)

    async def reconcile(self, live: list[dict[str, Any]]) -> int:
        """Replace missing Pods and delete surplus ones. Returns Pods created + deleted."""
        by_w: dict[str, list[dict[str, Any]]] = {}
        for p in live:
            by_w.setdefault(workload_of(p), []).append(p)
        changes = 0
        for w, want in self.desired.items():
            have = by_w.get(w, [])
            if len(have) > want:
                for p in sorted(have, key=lambda p: p["metadata"]["name"])[want:]:
                    with contextlib.suppress(NotFound):
                        await self.client.delete(PODS, p["metadata"]["name"],
                                                 p["metadata"].get("namespace"))
                    changes += 1
            elif len(have) < want:
                names = {p["metadata"]["name"] for p in have}
                fresh = [p for p in self.expand(self.sources[w])
                         if p["metadata"]["name"] not in names][: want - len(have)]
                created = await self.create(fresh)
                self.replaced += len(created)
                changes += len(created)
                for p in created:
                    log.info("replaced a missing Pod of %s: %s", w, p["metadata"]["name"],
                             extra={"workload": str(w), "pod": p["metadata"]["name"]})
        return changes


async def apply_workloads(client: KubeClient, directory: str | os.PathLike[str],
                          out: Callable[[str], None]) -> tuple[Workloads, list[dict[str, Any]]]:
    """Apply PriorityClasses/RuntimeClasses, then create the Pods the workloads expand to.

    Returns:
        The :class:`Workloads` keeping them, and the Pods as created.

    Raises:
        bigfleet_trio.podcontroller.expand.ExpandError: a manifest cannot be read or expanded.
    """
    from bigfleet_trio.podcontroller.expand import load_manifests

    objs = load_manifests(manifest_paths(directory))
    classes = 0
    for obj in objs:
        kind = obj.get("kind")
        if kind in ("PriorityClass", "RuntimeClass"):
            res = PRIORITY_CLASSES if kind == "PriorityClass" else RUNTIME_CLASSES
            await _create_ignoring_exists(client, res, dict(obj))
            classes += 1
    workloads = Workloads(client, objs)
    created = await workloads.apply(objs)
    out(f"applied {len(objs)} objects from {directory}: {classes} Priority/RuntimeClasses, "
        f"{len(workloads.desired)} workloads -> {len(created)} Pods")
    for w, n in sorted(workloads.desired.items()):
        out(f"  {w:<40} {n:>3} Pods")
    return workloads, created


class _Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self.t0


async def run_scenario(
    opts: DemoOptions,
    *,
    out: TextIO | None = None,
    timing: DemoTiming | None = None,
    keep_running: Callable[[DemoSummary], Any] | None = None,
    inspect: Callable[[dict[str, Any]], Any] | None = None,
    catalog: Catalog | None = None,
) -> DemoSummary:
    """Run the demo scenario headless-capable; must run inside a trio-asyncio loop or opens one.

    Args:
        opts: demo options (``workloads_dir``, ``timeout``, ``quiet``, ``seed``,
            ``kubeconfig_out``).
        out: where progress lines go (None = nowhere).
        timing: world speed (default :class:`DemoTiming`).
        keep_running: called with the summary once the scenario ended; awaited if it returns an
            awaitable (the CLI prints and waits for Ctrl-C there), with everything still running.
        inspect: test hook, called with ``{"server", "client", "shard", "operator",
            "pod_controller", "binder", "summary"}`` after the scenario, before shutdown; awaited
            if it returns an awaitable.
        catalog: the shard's inventory (default :func:`demo_catalog`; ``demo --catalog``).

    Returns:
        The :class:`DemoSummary` (``ok`` False with ``failure`` on timeout).
    """
    from bigfleet_trio.shard.grpc import GrpcConnector, open_loop
    from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig

    timing = timing or DemoTiming()
    clock = _Clock()
    summary = DemoSummary()

    def say(line: str) -> None:
        if out is not None and not opts.quiet:
            print(line, file=out, flush=True)

    workloads_dir = opts.workloads_dir or str(bundled_workloads_dir())
    with contextlib.ExitStack() as stack:
        if opts.kubeconfig_out:
            kubeconfig = os.path.abspath(opts.kubeconfig_out)  # noqa: ASYNC240 - no I/O
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bigfleet-demo-"))
            kubeconfig = os.path.join(tmp, "kubeconfig")
        summary.kubeconfig = kubeconfig
        async with open_loop(), trio.open_nursery() as nursery:
            server = ApiServer(gc_dangling=False)
            url = await nursery.start(serve, server)
            write_kubeconfig(url, kubeconfig)
            say(f"apiserver      {url}  (kubeconfig {kubeconfig})")
            kcfg = load_kubeconfig(kubeconfig, env={})
            client = KubeClient(kcfg, qps=500, burst=1000)
            op_client = KubeClient(kcfg, qps=200, burst=400)
            pc_client = KubeClient(kcfg, qps=200, burst=400)
            stack_clients = [client, op_client, pc_client]
            try:
                shard = SimShard(demo_catalog() if catalog is None else catalog,
                                 timing.engine_config(opts.seed),
                                 hooks=KubeNodeHooks(client))
                port = await nursery.start(
                    partial(serve_sim_shard, shard, host="127.0.0.1", port=0))
                say(f"sim shard      grpc://127.0.0.1:{port}  "
                    f"({sum(s.count for s in shard.engine.catalog)} machines in "
                    f"{len(shard.engine.catalog)} shapes, seed {opts.seed})")

                from bigfleet_trio.podcontroller.controller import PodController

                pod_controller = PodController(pc_client, resync_period=60.0, orphan_grace=5.0)
                await nursery.start(pod_controller.run)
                say("pod controller synced")

                from bigfleet_trio.operator.app import Operator

                cfg = OperatorConfig(
                    cluster_id=CLUSTER_ID, shard_addr=f"127.0.0.1:{port}", kubeconfig=kubeconfig,
                    rollup_interval=timing.rollup_interval, metrics_addr="0",
                    drain_shutdown_timeout=1.0, reconnect_initial_backoff=0.2,
                    reconnect_max_backoff=2.0, log_level=opts.log_level,
                    log_format=opts.log_format,
                )
                cfg.validate()
                connector = GrpcConnector("127.0.0.1", port, keepalive_time=None)
                feed = EventFeed()
                operator = Operator(cfg, client=op_client, connector=connector, feed=feed)
                await nursery.start(operator.run)
                say(f"operator       cluster {CLUSTER_ID}, roll-up every "
                    f"{timing.rollup_interval:g}s, session to the shard over grpclib")
                summary.diagnostics = await _serve_diagnostics(
                    nursery, opts.metrics_addr, operator, pod_controller, feed) or ""
                if summary.diagnostics:
                    say(f"diagnostics    {_diagnostics_urls(summary.diagnostics)}")

                binder = Binder(client, interval=timing.binder_interval)
                await nursery.start(binder.run)
                say("binder         (kube-scheduler stand-in) running")
                say("")

                await _drive(opts, operator, client, shard, binder, workloads_dir, timing,
                             clock, summary, say)
                with contextlib.suppress(Exception):
                    summary.operator = asdict(operator.statistics())
                if inspect is not None:
                    ret = inspect({"server": server, "client": client, "shard": shard,
                                   "operator": operator, "pod_controller": pod_controller,
                                   "binder": binder, "summary": summary})
                    if hasattr(ret, "__await__"):
                        await ret
                if keep_running is not None:
                    ret = keep_running(summary)
                    if hasattr(ret, "__await__"):
                        await ret
            finally:
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True):
                    for c in stack_clients:
                        with contextlib.suppress(Exception):
                            await c.aclose()
    return summary


async def _serve_diagnostics(nursery: trio.Nursery, addr: str, operator: Any,
                             pod_controller: Any, feed: EventFeed) -> str | None:
    """Serve /metrics (both binaries' families), /healthz, /readyz (operator and pod controller
    ready) and /events (the operator's feed) on ``addr``; the bound ``HOST:PORT`` or None."""
    from bigfleet_trio.observability.http import serve_observability
    from bigfleet_trio.observability.metrics import BinaryRegistry
    from bigfleet_trio.podcontroller.app import pod_controller_readiness

    def readiness() -> tuple[bool, list[str]]:
        op_ok, op_detail = operator.ready()
        pc_ok, pc_detail = pod_controller_readiness(pod_controller, leader_elect=False)
        pc_list = [pc_detail] if isinstance(pc_detail, str) else list(pc_detail)
        return (op_ok and pc_ok,
                [f"operator: {d}" for d in op_detail] + [f"pod controller: {d}" for d in pc_list])

    bound: str | None = await nursery.start(partial(
        serve_observability, addr, readiness=readiness, feed=feed,
        registry=BinaryRegistry(None)))
    return bound


def _diagnostics_urls(addr: str) -> str:
    return (f"http://{addr}/metrics  http://{addr}/healthz  http://{addr}/readyz  "
            f"ws://{addr}/events")


def _drains(operator: Any) -> tuple[int, int]:
    """(active, completed + failed + abandoned) drains of the operator (0s without one)."""
    try:
        st = operator.statistics()
    except Exception:  # noqa: BLE001 - statistics are informative only
        return 0, 0
    return (int(st.drains_active),
            int(st.drains_completed) + int(st.drains_failed) + int(st.drains_abandoned))


def _drains_pending(operator: Any, shard: SimShard, floor: int, drains_floor: int) -> list[str]:
    active, finished = _drains(operator)
    recs = len(shard.reclaims_issued) - floor
    why = []
    if active:
        why.append(f"{active} drains still running")
    if finished - drains_floor < recs:
        why.append(f"{recs - (finished - drains_floor)} drains not finished")
    return why


async def _drive(opts: DemoOptions, operator: Any, client: KubeClient, shard: SimShard,
                 binder: Binder,
                 workloads_dir: str, timing: DemoTiming, clock: _Clock, summary: DemoSummary,
                 say: Callable[[str], None]) -> None:
    stage = "apply"
    last_world: list[World] = []

    async def progress() -> None:
        while True:
            await trio.sleep(timing.progress_interval)
            if last_world:
                say(progress_line(clock(), last_world[-1], shard, stage))

    async def wait_for(check: Callable[[World], list[str]]) -> World:
        while True:
            world = await read_world(client, shard)
            if await workloads.reconcile(world.live_pods):
                world = await read_world(client, shard)
            last_world.append(world)
            del last_world[:-1]
            why = check(world)
            if not why:
                return world
            summary.failure = "; ".join(why)
            await trio.sleep(timing.poll_interval)

    workloads: Workloads
    floor = drains_floor = 0  # the scale-down's starting counts (read after a timeout too)
    deadline = trio.current_time() + opts.timeout
    async with trio.open_nursery() as nursery:
        nursery.start_soon(progress)
        with trio.move_on_at(deadline) as scope:
            workloads, created = await apply_workloads(client, workloads_dir, say)
            summary.workloads = sorted(workloads.desired)
            summary.pods_created = len(created)
            summary.timings["applied"] = round(clock(), 2)
            binder.kick()
            stage = "scale-up"
            world = await wait_for(lambda w: converged_up(w, shard))
            summary.timings["all_bound"] = round(clock(), 2)
            say(progress_line(clock(), world, shard, stage))
            _fill_up(summary, world, shard)
            say(f"converged: {len(world.live_pods)} Pods bound on {summary.machines_configured} "
                f"machines (${summary.hourly_cost:.2f}/h) in {summary.timings['all_bound']:.1f}s")

            victim = pick_scale_down(world.live_pods)
            if victim is None:
                raise RuntimeError("no workload to scale down")
            victims = [p for p in world.live_pods if workload_of(p) == victim]
            summary.scaled_down = victim
            summary.pods_deleted = len(victims)
            floor = len(shard.reclaims_issued)
            drains_floor = _drains(operator)[1]
            t_down = clock()
            say("")
            say(f"scaling {victim} down to 0: deleting {len(victims)} Pods")
            workloads.desired[victim] = 0
            await workloads.reconcile(world.live_pods)
            stage = "reclaim"
            world = await wait_for(lambda w: converged_down(w, shard, floor)
                                   + _drains_pending(operator, shard, floor, drains_floor))
            summary.timings["reclaim"] = round(clock() - t_down, 2)
            say(progress_line(clock(), world, shard, stage))
            _fill_down(summary, world, shard, floor)
            summary.pods_replaced = workloads.replaced
            summary.drains_completed = _drains(operator)[1] - drains_floor
            summary.failure = None
            summary.ok = True
        nursery.cancel_scope.cancel()
    summary.timings["total"] = round(clock(), 2)
    if scope.cancelled_caught:
        summary.ok = False
        # Keep what was last observed (the live lines showed it) rather than zeros.
        if last_world and stage == "scale-up":
            _fill_up(summary, last_world[-1], shard)
        elif last_world and stage == "reclaim":
            _fill_down(summary, last_world[-1], shard, floor)
            summary.drains_completed = _drains(operator)[1] - drains_floor
        summary.failure = failure_line(opts.timeout, stage, summary.failure)


_STAGE_WORDS = {
    "apply": "applying the workloads",
    "scale-up": "waiting for every Pod to get a machine and be bound",
    "reclaim": "waiting for the scaled-down workload's machines to be reclaimed and drained",
}


def failure_line(timeout: float, stage: str, why: str | None) -> str:
    """One plain line saying why the demo did not converge (stage, then what was missing)."""
    doing = _STAGE_WORDS.get(stage, f"in stage {stage}")
    return f"not done after {timeout:g}s while {doing}: {why or 'no progress observed'}"


def _fill_up(s: DemoSummary, world: World, shard: SimShard) -> None:
    last = shard.last_rollup
    s.crs = len(world.crs)
    s.needs = len(last.needs) if last is not None else 0
    s.rollup_bytes = len(bytes(last)) if last is not None else 0
    s.rollups = shard.engine.rollups_accepted
    s.machines_by_state = {k: v for k, v in world.shard["machines"].items() if k != "FREE"}
    s.machines_configured = s.machines_by_state.get("CONFIGURED", 0)
    s.upcoming_ready = world.upcoming_phases().get("Ready", 0)
    s.nodes_ready = world.nodes_ready()
    s.pods_bound = world.bound()
    s.hourly_cost = hourly_cost(shard)


def _fill_down(s: DemoSummary, world: World, shard: SimShard, floor: int) -> None:
    recs = shard.reclaims_issued[floor:]
    s.reclaims_issued = len(recs)
    s.reclaims_acked = sum(1 for r in recs if r.acked_at is not None)
    s.machines_released = shard.engine.released
    s.reclaimed_nodes = [r.node_name for r in recs]
    names = {(u.get("metadata") or {}).get("name") for u in world.upcoming}
    s.upcoming_deleted = sum(1 for r in recs if f"un-{r.machine_id}" not in names)
    s.final_pods = len(world.live_pods)
    s.final_machines_configured = world.shard["machines"].get("CONFIGURED", 0)
    s.final_hourly_cost = hourly_cost(shard)


# ------------------------------------------------------------------------------------------------
# CLI entry
# ------------------------------------------------------------------------------------------------


def _print_summary(summary: DemoSummary, opts: DemoOptions, out: TextIO) -> None:
    if opts.json_summary:
        print(json.dumps(summary.to_dict(), sort_keys=True), file=out, flush=True)
    else:
        print(render_summary(summary), file=out, flush=True)


def print_keep_running_banner(summary: DemoSummary, out: TextIO) -> None:
    """What ``--keep-running`` prints after the summary: kubectl commands and the diagnostics
    addresses (both with the virtualenv's paths, so they work without an activated venv)."""
    bin_dir = os.path.dirname(sys.executable)
    kubectl = os.path.join(bin_dir, "kubectl")
    kubectl = kubectl if os.path.exists(kubectl) else "kubectl"
    print("", file=out)
    print("The simulated cluster keeps running. Explore it with kubectl:", file=out)
    print(f"  export KUBECONFIG={summary.kubeconfig}", file=out)
    for cmd in ("get nodes -L node.kubernetes.io/instance-type,topology.kubernetes.io/zone",
                "get pods -A -o wide",
                "get capacityrequests -A",
                "get upcomingnodes",
                "get availablecapacities"):
        print(f"  {kubectl} {cmd}", file=out)
    if summary.diagnostics:
        addr = summary.diagnostics
        print("Diagnostics (operator and pod controller):", file=out)
        print(f"  metrics  http://{addr}/metrics", file=out)
        print(f"  health   http://{addr}/healthz  http://{addr}/readyz", file=out)
        cli = os.path.join(bin_dir, "bigfleet-trio")
        cli = cli if os.path.exists(cli) else "bigfleet-trio"
        print(f"  events   {cli} events --addr {addr}", file=out)
    print("Press Ctrl-C to stop.", file=out, flush=True)


def check_workloads(directory: str) -> str | None:
    """Parse every manifest of ``directory`` before anything starts; the problem as one line
    (``FILE:LINE:COLUMN: invalid YAML: …`` for a syntax error) or None."""
    import yaml

    from bigfleet_trio.podcontroller.expand import ExpandError, load_manifests

    for path in manifest_paths(directory):
        try:
            load_manifests([path])
        except ExpandError as exc:
            if isinstance(exc.__cause__, yaml.YAMLError):
                return yaml_error_line(str(path), exc.__cause__)
            return " ".join(str(exc).split())
    return None


def run_demo(opts: DemoOptions, catalog_file: str | None = None) -> int:
    """``bigfleet-trio demo``: run the scenario, print the summary, return the exit code.

    With ``--keep-running`` the summary is printed with the kubeconfig path and kubectl commands,
    and everything keeps serving until SIGINT/SIGTERM. ``catalog_file`` (``--catalog``) replaces
    :func:`demo_catalog` with a YAML catalog (:func:`~bigfleet_trio.sim.shard.load_catalog`),
    read before anything starts.

    Returns:
        0 when the scenario converged, 1 otherwise (with what did not converge on stderr), or
        1 with one line ``demo: <file>: <what>`` when the catalog file is unusable.
    """
    import signal

    catalog: Catalog | None = None
    if catalog_file is not None:
        try:
            catalog = load_catalog(catalog_file)
        except CatalogError as exc:
            print(f"demo: {exc}", file=sys.stderr, flush=True)
            return 1

    problem = check_workloads(opts.workloads_dir or str(bundled_workloads_dir()))
    if problem:
        print(f"demo: {problem}", file=sys.stderr, flush=True)
        return 1

    # The summary goes to stdout; with --json that is the only thing there (pure JSON), so the
    # live progress and the --keep-running banner go to stderr.
    out = sys.stdout
    progress = sys.stderr if opts.json_summary else sys.stdout
    printed = False

    async def wait_for_signal(summary: DemoSummary) -> None:
        nonlocal printed
        _print_summary(summary, opts, out)
        printed = True
        print_keep_running_banner(summary, progress)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                break

    async def main() -> DemoSummary:
        return await run_scenario(
            opts, out=progress, keep_running=wait_for_signal if opts.keep_running else None,
            catalog=catalog)

    try:
        summary = trio.run(main)
    except KeyboardInterrupt:
        print("demo: interrupted", file=sys.stderr, flush=True)
        return 1
    if not printed:
        _print_summary(summary, opts, out)
    if not summary.ok:
        print(f"demo: did not converge: {summary.failure}", file=sys.stderr, flush=True)
        return 1
    return 0
