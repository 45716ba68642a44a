"""The demo scenario: start the whole loop in one nursery, apply the workloads, scale, converge.

:func:`run_scenario` (the headless entry the end-to-end test drives) starts the apiserver, the
simulated shard, the pod controller, the operator and the binder, then drives the phases (apply,
scale-up, reclaim) until :mod:`.demo_world`'s checks pass or the timeout fires. :class:`Workloads`
stands in for the workload controllers. The CLI entry is :mod:`.demo`, which re-exports this.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, TextIO

import trio

from bigfleet_trio.config import OperatorConfig
from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import load_kubeconfig
from bigfleet_trio.kube.errors import AlreadyExists, NotFound
from bigfleet_trio.kube.resources import NAMESPACES, PODS, PRIORITY_CLASSES, RUNTIME_CLASSES
from bigfleet_trio.observability.events import EventFeed
from bigfleet_trio.sim.demo_options import DemoOptions
from bigfleet_trio.sim.shard.catalog import Catalog
from bigfleet_trio.sim.shard.cli import serve_sim_shard
from bigfleet_trio.sim.shard.nodes import ClusterNodeHooks, KubeNodeHooks
from bigfleet_trio.sim.shard.session import SimShard

from .binder import Binder
from .demo_causes import observed_causes
from .demo_render import diagnostics_urls, failure_line, fleet_line, fleet_story, progress_line
from .demo_world import (
    BURST_REPLICAS,
    FLEET_NAMESPACE,
    FLEET_POOL,
    IDLE_WORKLOAD,
    WEB_WORKLOAD,
    ClusterView,
    DemoSummary,
    DemoTiming,
    World,
    add_extended_resource_tolerations,
    bundled_workloads_dir,
    burst_cluster,
    cluster_names,
    cluster_row,
    converged_down,
    converged_fleet,
    converged_up,
    demo_catalog,
    fleet_manifests,
    hourly_cost,
    manifest_paths,
    move_row,
    pick_scale_down,
    pod_body,
    read_world,
    reclaimed_binding_left,
    with_fleet_shapes,
    workload_of,
)

# The demo's logger (these lines were the demo module's before the split; filters keep matching).
log = logging.getLogger("bigfleet_trio.sim.demo")


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

        from bigfleet_trio.sim.expand import expand_manifests

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


async def apply_workloads(client: KubeClient, directory: str | os.PathLike[str] | None,
                          out: Callable[[str], None], extra: Iterable[Mapping[str, Any]] = (),
                          ) -> tuple[Workloads, list[dict[str, Any]]]:
    """Apply PriorityClasses/RuntimeClasses, then create the Pods the workloads expand to.

    ``directory``: the manifests (None: only ``extra``); ``extra``: more objects (the fleet
    workloads, :func:`~.demo_world.fleet_manifests`) applied after them.

    Returns:
        The :class:`Workloads` keeping them, and the Pods as created.

    Raises:
        bigfleet_trio.sim.expand.ExpandError: a manifest cannot be read or expanded.
    """
    from bigfleet_trio.sim.expand import load_manifests

    objs = load_manifests(manifest_paths(directory)) if directory is not None else []
    objs += [dict(o) for o in extra]
    classes = 0
    for obj in objs:
        kind = obj.get("kind")
        if kind in ("PriorityClass", "RuntimeClass"):
            res = PRIORITY_CLASSES if kind == "PriorityClass" else RUNTIME_CLASSES
            await _create_ignoring_exists(client, res, dict(obj))
            classes += 1
    workloads = Workloads(client, objs)
    created = await workloads.apply(objs)
    source = directory if directory is not None else "the fleet workloads"
    out(f"applied {len(objs)} objects from {source}: {classes} Priority/RuntimeClasses, "
        f"{len(workloads.desired)} workloads -> {len(created)} Pods")
    for w, n in sorted(workloads.desired.items()):
        out(f"  {w:<40} {n:>3} Pods")
    return workloads, created


class _Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self.t0


@dataclass
class ClusterRig:
    """One simulated cluster of the demo: its apiserver, clients, pod controller, operator and
    binder, and its share of the shard (``view``)."""

    name: str
    server: Any
    url: str
    kubeconfig: str
    client: KubeClient
    pod_controller: Any
    operator: Any
    binder: Binder
    feed: EventFeed
    view: ClusterView
    diagnostics: str = ""
    workloads: Workloads | None = None
    clients: list[KubeClient] = field(default_factory=list)


async def _start_cluster(nursery: trio.Nursery, name: str, kubeconfig: str, shard: Any,
                         hooks: ClusterNodeHooks, port: int, timing: DemoTiming,
                         opts: DemoOptions, metrics_addr: str,
                         say: Callable[[str], None]) -> ClusterRig:
    """Start one cluster: apiserver, kubeconfig, its Nodes' hooks on the shard, the pod
    controller, the operator (dialling the shard over grpclib), diagnostics, the binder."""
    from bigfleet_trio.operator.app import Operator
    from bigfleet_trio.podcontroller.controller import PodController
    from bigfleet_trio.shard.grpc import GrpcConnector
    from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig

    server = ApiServer(gc_dangling=False)
    url = await nursery.start(serve, server)
    write_kubeconfig(url, kubeconfig)
    kcfg = load_kubeconfig(kubeconfig, env={})
    client = KubeClient(kcfg, qps=500, burst=1000)
    op_client = KubeClient(kcfg, qps=200, burst=400)
    pc_client = KubeClient(kcfg, qps=200, burst=400)
    clients = [client, op_client, pc_client]
    hooks.add(name, KubeNodeHooks(client))
    pod_controller = PodController(pc_client, resync_period=60.0, orphan_grace=5.0)
    await nursery.start(pod_controller.run)
    cfg = OperatorConfig(
        cluster_id=name, shard_addr=f"127.0.0.1:{port}", kubeconfig=kubeconfig,
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
    diagnostics = await _serve_diagnostics(
        nursery, metrics_addr, operator, pod_controller, feed) or ""
    binder = Binder(client, interval=timing.binder_interval)
    await nursery.start(binder.run)
    say(f"cluster        {name}: apiserver {url} (kubeconfig {kubeconfig}), pod controller, "
        f"operator (roll-up every {timing.rollup_interval:g}s over grpclib), binder")
    return ClusterRig(name, server, url, kubeconfig, client, pod_controller, operator, binder,
                      feed, ClusterView(shard, name), diagnostics, clients=clients)


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
            ``kubeconfig_out``, ``clusters``, ``page_addr``).
        out: where progress lines go (None = nowhere).
        timing: world speed (default :class:`DemoTiming`).
        keep_running: called with the summary once the scenario ended; awaited if it returns an
            awaitable (the CLI prints and waits for Ctrl-C there), with everything still running.
        inspect: test hook, called with ``{"server", "client", "shard", "operator",
            "pod_controller", "binder", "summary"}`` of the first cluster (``shard``: its
            :class:`~.demo_world.ClusterView`), ``"fleet"`` (the :class:`SimShard`) and
            ``"clusters"`` (every :class:`ClusterRig`) after the scenario, before shutdown;
            awaited if it returns an awaitable.
        catalog: the shard's inventory (default :func:`demo_catalog`; ``demo --catalog``); with
            more than one cluster the fleet pool (:func:`~.demo_world.fleet_shapes`) is added.

    Returns:
        The :class:`DemoSummary` (``ok`` False with ``failure`` on timeout).
    """
    from bigfleet_trio.shard.bridge import open_loop

    timing = timing or DemoTiming()
    clock = _Clock()
    summary = DemoSummary()

    def say(line: str) -> None:
        if out is not None and not opts.quiet:
            print(line, file=out, flush=True)

    workloads_dir = opts.workloads_dir or str(bundled_workloads_dir())
    names = cluster_names(opts.clusters)
    with contextlib.ExitStack() as stack:
        if opts.kubeconfig_out:
            kubeconfig = os.path.abspath(opts.kubeconfig_out)  # noqa: ASYNC240 - no I/O
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bigfleet-demo-"))
            kubeconfig = os.path.join(tmp, "kubeconfig")
        summary.kubeconfig = kubeconfig
        rigs: list[ClusterRig] = []
        async with open_loop(), trio.open_nursery() as nursery:
            try:
                hooks = ClusterNodeHooks()
                inventory = with_fleet_shapes(demo_catalog() if catalog is None else catalog,
                                              opts.clusters)
                shard = SimShard(inventory, timing.engine_config(opts.seed), hooks=hooks)
                port = await nursery.start(
                    partial(serve_sim_shard, shard, host="127.0.0.1", port=0))
                say(f"sim shard      grpc://127.0.0.1:{port}  "
                    f"({sum(s.count for s in inventory)} machines in {len(inventory)} shapes, "
                    f"seed {opts.seed}, one pool for {len(names)} "
                    f"cluster{'s' if len(names) > 1 else ''})")
                started: dict[int, ClusterRig] = {}

                async def start(i: int, name: str) -> None:
                    # the first cluster's listener is --metrics-addr; the others' (their /events
                    # feeds the live page follows) pick free loopback ports
                    addr = opts.metrics_addr if i == 0 or opts.metrics_addr == "0" else (
                        "127.0.0.1:0")
                    started[i] = await _start_cluster(
                        nursery, name, kubeconfig if i == 0 else f"{kubeconfig}-{name}",
                        shard, hooks, port, timing, opts, addr, say)

                # the clusters start side by side (each waits for its informers); every task
                # they leave running belongs to the scenario's nursery
                async with trio.open_nursery() as starting:
                    for i, name in enumerate(names):
                        starting.start_soon(start, i, name)
                rigs += [started[i] for i in range(len(names))]
                summary.diagnostics = rigs[0].diagnostics
                if summary.diagnostics:
                    say(f"diagnostics    {diagnostics_urls(summary.diagnostics)}")
                if opts.page_addr != "0":
                    from .demo_page import serve_page

                    summary.page = await nursery.start(partial(
                        serve_page, opts.page_addr, shard, rigs, clock))
                    say(f"live page      {summary.page}")
                say("")

                await _drive(opts, rigs, shard, workloads_dir, timing, clock, summary, say)
                with contextlib.suppress(Exception):
                    summary.operator = asdict(rigs[0].operator.statistics())
                if inspect is not None:
                    first = rigs[0]
                    ret = inspect({"server": first.server, "client": first.client,
                                   "shard": first.view, "operator": first.operator,
                                   "pod_controller": first.pod_controller,
                                   "binder": first.binder, "summary": summary,
                                   "fleet": shard, "clusters": rigs})
                    if hasattr(ret, "__await__"):
                        await ret
                if keep_running is not None:
                    await _start_workload_controllers(nursery, rigs, say)
                    ret = keep_running(summary)
                    if hasattr(ret, "__await__"):
                        await ret
            finally:
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True):
                    for rig in rigs:
                        for c in rig.clients:
                            with contextlib.suppress(Exception):
                                await c.aclose()
    return summary


async def _start_workload_controllers(nursery: trio.Nursery, rigs: list[ClusterRig],
                                      say: Callable[[str], None]) -> None:
    """After the scenario, with ``--keep-running``: the workload controllers ``sim cluster``
    runs (Deployment, ReplicaSet, StatefulSet, Job), one set per cluster, so what a user
    applies with kubectl gets Pods; the binder places them as it placed the scenario's, and a
    Job's Pods finish after their run time as ``sim cluster``'s kubelet finishes them (the
    rest of that kubelet is the binder's: it reports a bound Pod Running). The scenario's own
    Pods stay the demo's (their owners are not objects in the apiserver)."""
    from bigfleet_trio.sim.cluster import JobPodFinisher, WorkloadControllers

    for rig in rigs:
        controllers = WorkloadControllers(rig.client)
        finisher = JobPodFinisher(rig.client, controllers.pods)  # its handler before the sync
        await nursery.start(controllers.run)
        await nursery.start(finisher.run)
    say(f"workload controllers (Deployment, ReplicaSet, StatefulSet, Job) running in "
        f"{len(rigs)} cluster{'s' if len(rigs) > 1 else ''}")


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



def _drains(operator: Any) -> tuple[int, int]:
    """(active, completed + failed + abandoned) drains of the operator (0s without one)."""
    try:
        st = operator.statistics()
    except Exception:  # noqa: BLE001 - statistics are informative only
        return 0, 0
    return (int(st.drains_active),
            int(st.drains_completed) + int(st.drains_failed) + int(st.drains_abandoned))


def _drains_pending(operator: Any, shard: Any, floor: int, drains_floor: int) -> list[str]:
    active, finished = _drains(operator)
    recs = len(shard.reclaims_issued) - floor
    why = []
    if active:
        why.append(f"{active} drains still running")
    if finished - drains_floor < recs:
        why.append(f"{recs - (finished - drains_floor)} drains not finished")
    return why


async def _drive(opts: DemoOptions, rigs: list[ClusterRig], shard: SimShard,
                 workloads_dir: str, timing: DemoTiming, clock: _Clock, summary: DemoSummary,
                 say: Callable[[str], None]) -> None:
    first = rigs[0]
    operator, view = first.operator, first.view
    stage = "apply"
    last_world: list[World] = []
    worlds: dict[str, World] = {}

    async def progress() -> None:
        while True:
            await trio.sleep(timing.progress_interval)
            if last_world:
                say(progress_line(clock(), last_world[-1], view, stage))
                if len(rigs) > 1:
                    say(fleet_line(rigs, worlds, shard))

    async def wait_for(check: Callable[[dict[str, World]], list[str]]) -> World:
        while True:
            for rig in rigs:
                world = await read_world(rig.client, rig.view)
                assert rig.workloads is not None
                if await rig.workloads.reconcile(world.live_pods):
                    world = await read_world(rig.client, rig.view)
                worlds[rig.name] = world
            last_world.append(worlds[first.name])
            del last_world[:-1]
            why = check(worlds)
            if not why:
                return worlds[first.name]
            summary.failure = "; ".join(why)
            await trio.sleep(timing.poll_interval)

    # the scale-down's starting counts (read after a timeout too): reclaims, drains, shard
    # bindings started and ended by a failure
    floor = drains_floor = 0
    floors = (0, 0, 0)
    fleet_floors: dict[str, int] = {}
    burst = rigs[burst_cluster(len(rigs))] if len(rigs) > 1 else None
    deadline = trio.current_time() + opts.timeout
    async with trio.open_nursery() as nursery:
        nursery.start_soon(progress)
        with trio.move_on_at(deadline) as scope:
            for i, rig in enumerate(rigs):
                fleet = fleet_manifests(i, len(rigs))
                rig.workloads, created = await apply_workloads(
                    rig.client, workloads_dir if i == 0 else None,
                    _prefixed(say, rig.name) if len(rigs) > 1 else say, fleet)
                rig.binder.kick()
                if i == 0:
                    summary.workloads = sorted(rig.workloads.desired)
                    summary.pods_created = len(created)
            summary.timings["applied"] = round(clock(), 2)
            stage = "scale-up"
            world = await wait_for(lambda ws: _every_cluster(rigs, ws, converged_up))
            summary.timings["all_bound"] = round(clock(), 2)
            say(progress_line(clock(), world, view, stage))
            _fill_up(summary, world, view)
            say(f"converged: {len(world.live_pods)} Pods bound on {summary.machines_configured} "
                f"machines (${summary.hourly_cost:.2f}/h) in {summary.timings['all_bound']:.1f}s")

            victim = pick_scale_down(p for p in world.live_pods if not _is_fleet(p))
            if victim is None:
                raise RuntimeError("no workload to scale down")
            victims = [p for p in world.live_pods if workload_of(p) == victim]
            summary.scaled_down = victim
            summary.pods_deleted = len(victims)
            floor = len(view.reclaims_issued)
            drains_floor = _drains(operator)[1]
            floors = (floor, view.engine.binds, view.engine.failed)
            fleet_floors = {r.name: len(r.view.reclaims_issued) for r in rigs}
            t_down = clock()
            say("")
            say(f"scaling {victim} down to 0: deleting {len(victims)} Pods")
            assert first.workloads is not None
            first.workloads.desired[victim] = 0
            if IDLE_WORKLOAD in first.workloads.desired:
                say(f"scaling {first.name} {IDLE_WORKLOAD} down to 0: its machine goes back "
                    "to the pool")
                first.workloads.desired[IDLE_WORKLOAD] = 0
            await first.workloads.reconcile(world.live_pods)
            if IDLE_WORKLOAD in first.workloads.desired:
                # the burst comes once the idle machine is on its way back to the pool, so the
                # run shows both: a reclaimed machine moving on, and a preemption for the rest
                await wait_for(lambda ws: [] if _fleet_reclaim_issued(view, floor) else [
                    f"{first.name}: {IDLE_WORKLOAD}'s machine not reclaimed yet"])
            if burst is not None and burst.workloads is not None:
                say(f"burst in {burst.name}: {WEB_WORKLOAD} (priority 1000) 1 -> "
                    f"{BURST_REPLICAS} replicas; the fleet pool is empty")
                burst.workloads.desired[WEB_WORKLOAD] = BURST_REPLICAS
                await burst.workloads.reconcile(worlds[burst.name].live_pods)
            stage = "reclaim"

            def down(ws: dict[str, World]) -> list[str]:
                why = converged_down(ws[first.name], view, floor)
                why += _drains_pending(operator, view, floor, drains_floor)
                why = [f"{first.name}: {w}" for w in why] if len(rigs) > 1 else why
                for rig in rigs[1:]:
                    why += [f"{rig.name}: {w}" for w in converged_fleet(
                        ws[rig.name], rig.view, fleet_floors[rig.name])]
                if burst is not None and not any(
                        m.to_cluster == burst.name for m in shard.fleet.moves):
                    why.append(f"no machine moved to {burst.name} yet")
                return why

            world = await wait_for(down)
            summary.timings["reclaim"] = round(clock() - t_down, 2)
            say(progress_line(clock(), world, view, stage))
            _fill_down(summary, world, view, floors)
            summary.pods_replaced = first.workloads.replaced
            summary.drains_completed = _drains(operator)[1] - drains_floor
            summary.failure = None
            summary.ok = True
        nursery.cancel_scope.cancel()
    summary.timings["total"] = round(clock(), 2)
    _fill_fleet(summary, rigs, worlds, shard, clock)
    if scope.cancelled_caught:
        summary.ok = False
        fill_stalled(summary, stage, last_world[-1] if last_world else None, view, floors)
        if stage == "reclaim":
            summary.drains_completed = _drains(operator)[1] - drains_floor
        summary.failure = failure_line(opts.timeout, stage, summary.failure)
        causes = await observed_causes(first.client, last_world[-1] if last_world else None,
                                       shard, first.binder)
        if causes:  # what it saw holding it back, not only what was missing
            summary.failure += "; seen: " + "; ".join(causes)


def _fleet_reclaim_issued(view: ClusterView, floor: int) -> bool:
    """A fleet pool machine of the first cluster is being reclaimed since ``floor``."""
    for rec in view.reclaims_issued[floor:]:
        m = view.engine.machine(rec.machine_id)
        if m is not None and FLEET_POOL in m.labels:
            return True
    return False


def _prefixed(say: Callable[[str], None], name: str) -> Callable[[str], None]:
    return lambda line: say(f"{name}: {line}")


def _is_fleet(pod: Mapping[str, Any]) -> bool:
    return (pod.get("metadata") or {}).get("namespace") == FLEET_NAMESPACE


def _every_cluster(rigs: list[ClusterRig], worlds: dict[str, World],
                   check: Callable[[World, Any], list[str]]) -> list[str]:
    if len(rigs) == 1:
        return check(worlds[rigs[0].name], rigs[0].view)
    return [f"{r.name}: {w}" for r in rigs for w in check(worlds[r.name], r.view)]


def fill_stalled(s: DemoSummary, stage: str, world: World | None, view: Any,
                 floors: tuple[int, int, int]) -> None:
    """Fill the summary of a run that ran out of time in ``stage`` (``apply``, ``scale-up``,
    ``reclaim``) from what was last observed, ``world`` (None: nothing read yet), rather than
    zeros; ``view``: the first cluster's share of the shard; ``floors``: the scale-down's
    starting (reclaims, binds, failed bindings). The machines Configured at the end are the
    last observed ones in every stage (the scale-down's rows stay 0 before it started)."""
    if world is None:
        return
    if stage == "reclaim":
        _fill_down(s, world, view, floors)
    else:
        _fill_up(s, world, view)
        _fill_final(s, world, view)


def _fill_fleet(s: DemoSummary, rigs: list[ClusterRig], worlds: dict[str, World],
                shard: SimShard, clock: _Clock) -> None:
    """The per-cluster rows, the moves and the story (what moved where, and why)."""
    s.clusters = [cluster_row(r.name, r.kubeconfig, r.diagnostics, worlds.get(r.name), r.view)
                  for r in rigs]
    t0 = trio.current_time() - clock()
    s.moves = [move_row(m, t0) for m in shard.fleet.moves]
    recs = [rec for r in rigs for rec in r.view.reclaims_issued]
    s.preemptions = sum(1 for rec in recs if rec.reason == "preempted")
    s.spot_machines = sum(row["spot_machines"] for row in s.clusters)
    s.story = fleet_story(s)


def _fill_up(s: DemoSummary, world: World, shard: Any) -> None:
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


def _fill_down(s: DemoSummary, world: World, shard: Any,
               floors: tuple[int, int, int]) -> None:
    floor, binds_floor, failed_floor = floors
    recs = shard.reclaims_issued[floor:]
    s.reclaims_issued = len(recs)
    s.reclaims_acked = sum(1 for r in recs if r.acked_at is not None)
    s.machines_released = shard.engine.released
    s.reclaimed_nodes = [r.node_name for r in recs]
    s.upcoming_deleted = sum(1 for r in recs if reclaimed_binding_left(world, shard, r)[1])
    s.machines_bound_while_reclaiming = shard.engine.binds - binds_floor
    s.machines_failed_while_reclaiming = shard.engine.failed - failed_floor
    _fill_final(s, world, shard)


def _fill_final(s: DemoSummary, world: World, shard: Any) -> None:
    s.final_pods = len(world.live_pods)
    s.final_machines_configured = world.shard["machines"].get("CONFIGURED", 0)
    s.final_hourly_cost = hourly_cost(shard)
