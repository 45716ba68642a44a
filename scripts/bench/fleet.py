"""``python -m scripts.bench fleet``: a soak of the whole agent through the real CLI processes.

Five processes on loopback, as in production: the embedded apiserver (fast engine), ``sim
cluster --kubeconfig`` (workload controllers + scheduler/kubelet), ``sim shard`` (a fleet
catalog of ``--machines`` machines, shard-side timestamps at ``--stats-addr``), ``pod-controller``
and ``operator``. The bench itself applies workloads cloned from the bundled real manifests
(``bigfleet_trio/sim/workloads``: zone/hostname-spread and co-located Deployments, a StatefulSet,
GPU Deployments and Jobs, CPU Jobs) to ``--pods`` Pods, about ``--per-profile`` Pods per Profile
(each clone has its own requests, so one clone = one Profile), and watches Pods, CRs and
UpcomingNodes to time what the users watch.

Phases: ramp (everything applied, until every Pod is bound), churn (``--duration``: random
scale up/down of Deployments/StatefulSets, Jobs finishing after ``--job-run-seconds`` and
replaced), reclaim (a quarter of the scalable workloads to 0), quiesce (until CRs, the roll-up,
UpcomingNodes and bound machines agree). Per phase: Pod created -> CR exists; CR change -> the
roll-up carrying it; NodeStateUpdate sent -> UpcomingNode written; BootstrapRequest -> response
(and count past the 10 s one-cycle deadline); reclaim instruction -> ack; object counts; RSS and
CPU of every process (RSS growth per hour over churn); operator outbox drops and reconnects.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.bench import _common as C
from scripts.bench._fleet_analysis import nsu_latencies, rollup_latencies
from scripts.bench._fleet_events import pod_event_figures
from scripts.bench._fleet_observe import (
    Observed,
    StatsPoller,
    cr_view,
    node_view,
    pending_why,
    pod_view,
    read_histogram,
    read_metrics,
    un_view,
    wire,
)
from scripts.bench._fleet_procs import Fleet
from scripts.bench._fleet_report import NSU_WAIT_HISTOGRAMS, report
from scripts.bench._fleet_workload import Workload, fleet_catalog, fleet_workloads

# The helpers live in the private _fleet_* modules; these names stay importable from here.
__all__ = ["fleet_catalog", "fleet_workloads", "nsu_latencies", "register", "rollup_latencies",
           "run"]

log = logging.getLogger("bench.fleet")


async def _drive(args: argparse.Namespace, fleet: Fleet, obs: Observed,
                 result: dict[str, Any]) -> None:
    import trio

    from bigfleet_trio.kube.client import KubeClient
    from bigfleet_trio.kube.config import load_kubeconfig
    from bigfleet_trio.kube.errors import (
        AlreadyExists,
        KubeTransportError,
        NotFound,
        ServerError,
        TooManyRequests,
    )
    from bigfleet_trio.kube.informer import Informer
    from bigfleet_trio.kube.resources import (
        CAPACITY_REQUESTS,
        DEPLOYMENTS,
        EVENTS,
        JOBS,
        NAMESPACES,
        NODES,
        PODS,
        PRIORITY_CLASSES,
        STATEFULSETS,
        UPCOMING_NODES,
    )

    res_of = {"Deployment": DEPLOYMENTS, "StatefulSet": STATEFULSETS, "Job": JOBS}
    classes, workloads = fleet_workloads(args.pods, args.per_profile, args.seed, args.job_share)
    rng = random.Random(args.seed)
    cfg = load_kubeconfig(fleet.kubeconfig, env={})
    async with KubeClient(cfg, qps=0, user_agent="bench-fleet") as client:
        pods = Informer(client, PODS, transform=pod_view)
        crs = Informer(client, CAPACITY_REQUESTS, transform=cr_view)
        uns = Informer(client, UPCOMING_NODES, transform=un_view)
        nodes = Informer(client, NODES, transform=node_view)
        jobs = Informer(client, JOBS, transform=lambda o: {"metadata": {
            "name": o["metadata"]["name"], "namespace": o["metadata"].get("namespace")}})
        wire(obs, pods, crs, uns)
        stop_jobs = trio.Event()
        counts: list[dict[str, Any]] = []

        def snapshot(stats: dict[str, Any] | None, why: bool = True) -> dict[str, Any]:
            live = [p for p in pods.store.list() if p["phase"] not in ("Succeeded", "Failed")]
            bound = set((stats or {}).get("bound") or [])
            un_names = {u["metadata"]["name"].removeprefix("un-") for u in uns.store.list()}
            return {
                "t": round(time.time() - t0, 1), "phase": obs.phase,
                "pods": len(live), "pods_bound": sum(1 for p in live if p["node"]),
                "pods_total": len(pods.store), "crs": len(crs.store),
                "upcoming": len(uns.store), "machines_bound": len(bound),
                "upcoming_stale": len(un_names - bound) if stats else None,
                "upcoming_drained": sum(1 for u in uns.store.list() if u["phase"] == "Drained"),
                "rollup_matches": bool(stats and stats["rollups"] and
                                       (stats["rollups"][-1][2], stats["rollups"][-1][3])
                                       == (obs.cpu, obs.mem)),
                "cr_cpu_milli": obs.cpu,
                "unbound_not_job": sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}"
                                          for p in live if not p["node"] and not p["job"])[:8],
                # at phase ends only: the progress line does not print it
                "pending_why": pending_why(live, crs, nodes.store.list()) if why else [],
                # kube-scheduler found no place for these; the rest it has not tried yet
                "pending_unschedulable": sum(1 for p in live if not p["node"]
                                             and not p["job"] and p.get("unschedulable")),
            }

        async def progress() -> None:
            while True:
                await trio.sleep(args.progress_interval)
                fleet.sample()
                dead = fleet.dead()
                if dead:
                    raise RuntimeError(f"process {dead[0]} exited:\n{fleet.log(dead[0])}")
                s = snapshot(None, why=False)
                print(f"[{s['t']:7.1f}s] {obs.phase:<8} pods {s['pods_bound']:>6}/{s['pods']:<6} "
                      f"bound | CRs {s['crs']:>6} | upcoming {s['upcoming']:>5} | "
                      f"cpu {obs.cpu / 1000:9.1f}", file=sys.stderr, flush=True)

        async def write(what: str, fn: Any, *a: Any, **kw: Any) -> None:
            """One of the bench's own writes. The single-threaded sim apiserver can stop
            answering for 30 s at 50K Pods; the bench retries (and counts) instead of ending
            the run, and gives a write up after 5 tries (noted in the result)."""
            last: Exception | None = None
            for attempt in range(5):
                try:
                    await fn(*a, **kw)
                    return
                except (KubeTransportError, ServerError, TooManyRequests) as exc:
                    result["extra"]["bench_write_retries"] = (
                        result["extra"].get("bench_write_retries", 0) + 1)
                    last = exc
                    await trio.sleep(2 ** attempt)
            result["notes"].append(f"{obs.phase}: bench write gave up: {what}: {last}")

        async def create(w: Workload) -> None:
            body = copy.deepcopy(w.body)
            if w.kind == "Job" and w.gen:
                body["metadata"]["name"] = f"{w.name}-{w.gen}"
            try:
                await write(f"create {w.kind} {w.namespace}/{body['metadata']['name']}",
                            client.create, res_of[w.kind], body, w.namespace)
            except AlreadyExists:
                pass

        async def job_refill() -> None:
            """Replace finished (ttl-deleted) Jobs with new ones of the same shape."""
            while not stop_jobs.is_set():
                await trio.sleep(2)
                names = {f"{j['metadata']['namespace']}/{j['metadata']['name']}"
                         for j in jobs.store.list()}
                for w in workloads:
                    cur = f"{w.namespace}/{w.name}" + (f"-{w.gen}" if w.gen else "")
                    if w.kind == "Job" and cur not in names and not stop_jobs.is_set():
                        w.gen += 1
                        await create(w)

        async def churn(until: float) -> None:
            scalable = [w for w in workloads if w.scalable]
            while time.time() < until and scalable:
                await trio.sleep(args.churn_interval)
                w = rng.choice(scalable)
                n = max(1, int(w.replicas * rng.uniform(0.7, 1.3)))
                try:
                    await write(f"scale {w.namespace}/{w.name}", client.patch, res_of[w.kind],
                                w.name, {"spec": {"replicas": n}}, w.namespace)
                except NotFound:
                    pass

        async def wait_until(what: str, check: Any, limit: float) -> bool:
            deadline = time.time() + limit
            while time.time() < deadline:
                if await check():
                    return True
                await trio.sleep(1)
            result["notes"].append(f"{obs.phase}: {what} not reached within {limit:g}s")
            return False

        async def all_bound() -> bool:
            # Jobs keep finishing and being replaced (their new Pods wait for machines): the
            # ramp is done when every workload's Pods were created and the others are bound.
            live = [p for p in pods.store.list()
                    if not p["job"] and p["phase"] not in ("Succeeded", "Failed")]
            return len(obs.pod_added) >= want_pods and sum(
                1 for p in live if not p["node"]) <= args.unbound_ok * len(live)

        stable: dict[str, Any] = {"sig": None, "since": 0.0}
        poll_stats = StatsPoller(fleet.stats_port)

        async def quiet() -> bool:
            """Settled: the last roll-up came after the last CR change and carries it, every
            bound machine is Configured with its UpcomingNode (none stale or Drained), no
            reclaim is in flight, few Pods pending -- and all that unchanged for a roll-up
            interval and then some."""
            stats = await trio.to_thread.run_sync(poll_stats)
            if stats is None:  # not known: not settled (logged and counted by the poller)
                stable.update(sig=None, since=time.time())
                return False
            s = snapshot(stats)
            snap = stats.get("snapshot") or {}
            states = {k: v for k, v in (snap.get("machines") or {}).items()
                      if k not in ("FREE", "CONFIGURED")}
            last_change = obs.states[-1][0] if obs.states else 0.0
            ok = (s["pods"] - s["pods_bound"] <= args.unbound_ok * s["pods"]
                  and s["rollup_matches"] and bool(stats["rollups"])
                  and stats["rollups"][-1][0] > last_change
                  and not states
                  and snap.get("reclaims_acked") == snap.get("reclaims_issued")
                  and s["upcoming_stale"] == 0 and s["upcoming_drained"] == 0
                  and s["upcoming"] == s["machines_bound"])
            sig = (s["machines_bound"], s["upcoming"], s["crs"], s["pods_bound"]) if ok else None
            now = time.time()
            if sig is None or sig != stable["sig"]:
                stable.update(sig=sig, since=now)
                return False
            return now - stable["since"] >= args.rollup_seconds + 2

        async def end_phase(name: str) -> None:
            stats = await trio.to_thread.run_sync(poll_stats)
            s = snapshot(stats)
            s["end_of"] = name
            s["operator_metrics"] = {k: v for k, v in (await trio.to_thread.run_sync(
                read_metrics, fleet.metrics_port)).items()
                if k.endswith("_total") and ("outbox_dropped" in k or "reconnects" in k)}
            s["nsu_duration_buckets"] = await trio.to_thread.run_sync(
                read_histogram, fleet.metrics_port,
                "bigfleet_operator_node_state_update_duration_seconds")
            # where a machine's wait for a node-state worker goes (docs/wire.md#the-session)
            for key, family, having in NSU_WAIT_HISTOGRAMS:  # not `name`: the phase's, printed
                s[key] = await trio.to_thread.run_sync(read_histogram, fleet.metrics_port,
                                                       family, having)
            s["client"] = {}
            for who, port in (("operator", fleet.metrics_port),
                              ("pod-controller", fleet.pc_metrics_port)):
                m = await trio.to_thread.run_sync(read_metrics, port)
                s["client"][who] = {
                    "requests": m.get("bigfleet_kube_client_rate_limiter_wait_seconds_count", 0),
                    "limiter_wait_s": m.get("bigfleet_kube_client_rate_limiter_wait_seconds_sum",
                                            0),
                    "throttled_429": m.get("bigfleet_kube_client_throttled_total", 0),
                    # docs/kube-api.md#unchanged-pod-events
                    "unchanged_events": m.get("bigfleet_informer_unchanged_events_total", 0)}
            counts.append(s)
            print(f"-- end of {name}: {json.dumps(s)}", file=sys.stderr, flush=True)

        want_pods = sum(w.replicas for w in workloads)
        t0 = time.time()
        async with trio.open_nursery() as nursery:
            for inf in (pods, crs, uns, jobs, nodes):
                await nursery.start(inf.run)
            for inf in (pods, crs, uns, jobs, nodes):
                await inf.wait_synced()
            nursery.start_soon(progress)
            for ns in sorted({w.namespace for w in workloads}):
                try:
                    await client.create(NAMESPACES, {"metadata": {"name": ns}})
                except AlreadyExists:
                    pass
            for pc in classes:
                try:
                    await client.create(PRIORITY_CLASSES, {k: v for k, v in pc.items()})
                except AlreadyExists:
                    pass
            obs.set_phase("ramp")
            limiter = trio.CapacityLimiter(8)

            async def create_limited(w: Workload) -> None:
                async with limiter:
                    await create(w)

            async with trio.open_nursery() as apply:
                for w in workloads:
                    apply.start_soon(create_limited, w)
            nursery.start_soon(job_refill)
            await wait_until("every Pod bound", all_bound, args.phase_timeout)
            result["extra"]["ramp_seconds"] = round(time.time() - t0, 1)
            await end_phase("ramp")

            obs.set_phase("churn")
            await churn(time.time() + args.duration)
            await end_phase("churn")

            obs.set_phase("reclaim")
            stop_jobs.set()
            t_reclaim = time.time()
            victims = [w for w in workloads if w.scalable][::4]
            for w in victims:
                await write(f"scale {w.namespace}/{w.name} to 0", client.patch, res_of[w.kind],
                            w.name, {"spec": {"replicas": 0}}, w.namespace)
            # back to base size for the others, so the quiesced state is known
            for w in workloads:
                if w.scalable and w not in victims:
                    await write(f"scale {w.namespace}/{w.name}", client.patch, res_of[w.kind],
                                w.name, {"spec": {"replicas": w.replicas}}, w.namespace)
            await wait_until("the fleet to settle after the reclaim", quiet, args.phase_timeout)
            result["extra"]["reclaim_seconds"] = round(time.time() - t_reclaim, 1)
            await end_phase("reclaim")

            obs.set_phase("quiesce")
            await trio.sleep(args.quiesce)
            await wait_until("quiet state", quiet, args.phase_timeout)
            await end_phase("quiesce")
            result["extra"]["counts"] = counts
            for _ in range(3):
                final = await trio.to_thread.run_sync(poll_stats)
                if final is not None:
                    break
            result["extra"]["final_stats"] = final
            # Pod Events per Pod, against the bound of docs/rules.md (outcomes)
            result["extra"]["pod_events"] = pod_event_figures(
                (await client.list(EVENTS)).items, len(obs.pod_added))
            print(f"-- pod events: {json.dumps(result['extra']['pod_events'])}",
                  file=sys.stderr, flush=True)
            result["extra"]["stats_poll_failures"] = poll_stats.failures
            nursery.cancel_scope.cancel()


def run(args: argparse.Namespace) -> dict[str, Any]:
    import trio

    logging.getLogger("bigfleet_trio").setLevel(logging.WARNING)
    if args.quick:
        args.machines, args.pods, args.duration = 200, 2000, min(args.duration, 30.0)
        args.phase_timeout = min(args.phase_timeout, 120.0)
        args.job_run_seconds = min(args.job_run_seconds, 10.0)
        args.quiesce = min(args.quiesce, 5.0)
    args.rollup_seconds = _seconds(args.rollup_interval)
    params = {k: getattr(args, k) for k in ("kube", "machines", "pods", "per_profile", "duration",
                                            "rollup_interval", "job_run_seconds", "job_share",
                                            "qps", "seed", "control_plane_nice")}
    result = C.result("fleet", params, [], [
        "latencies are wall-clock differences between the bench's own watch events (Pods, CRs, "
        "UpcomingNodes) and the shard's send/receive timestamps, all on this machine; the bench's "
        "watch delivery adds to 'Pod -> CR' equally on both ends",
        "CR change -> roll-up: matched by the sum of the CRs' cpu and memory requests against "
        "the roll-up's aggregate totals (a state superseded before the next roll-up counts as "
        "carried by the roll-up that carries its successor)",
    ], {})
    import signal

    def _term(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt  # stop the child processes on the way out

    signal.signal(signal.SIGTERM, _term)
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp_dir:
        tmp = args.keep_logs or tmp_dir
        Path(tmp).mkdir(parents=True, exist_ok=True)
        fleet = Fleet(Path(tmp), args.machines, args.rollup_interval, args.job_run_seconds,
                      args.qps, kube=args.kube, control_plane_nice=args.control_plane_nice)
        obs = Observed()
        try:
            fleet.start()
            fleet.wait_ready()
            trio.run(_drive, args, fleet, obs, result)
        except BaseException:
            for n in fleet.procs:
                print(f"--- {n} log tail:\n{fleet.log(n)}", file=sys.stderr)
            raise
        finally:
            fleet.sample()
            fleet.stop()
        if args.keep_logs:
            # the raw observations beside the logs, for re-analysis with another matcher
            raw = {"stats": result["extra"].get("final_stats"), "phase_at": obs.phase_at,
                   "un_events": obs.un_events, "pod_added": obs.pod_added,
                   "cr_added": obs.cr_added, "pod_deleted": obs.pod_deleted}
            (Path(tmp) / "observed.json").write_text(json.dumps(raw))
        report(args, fleet, obs, result)
    return result


def _seconds(text: str) -> float:
    from bigfleet_trio.durations import parse_duration

    return float(parse_duration(text))


def register(sub: Any) -> None:
    p = sub.add_parser("fleet", parents=[sub.common],
                       help="soak: apiserver, sim cluster, sim shard, pod-controller and "
                       "operator as processes; ramp, churn, reclaim, quiesce")
    p.add_argument("--kube", choices=("sim", "real"), default="sim",
                   help="sim: the embedded apiserver and `sim cluster` (workload controllers, "
                   "scheduler/kubelet stand-in); real: etcd, kube-apiserver, "
                   "kube-controller-manager, kube-scheduler and kwok (python -m scripts.realkube "
                   "build), the binaries under ServiceAccount tokens (APF applies)")
    p.add_argument("--control-plane-nice", type=int, default=10, metavar="N",
                   help="--kube real: run the control plane's processes at `nice -n N` (0: as "
                   "the bench). On a real cluster the agent runs on a worker node, not on the "
                   "control plane's cores; on one small box an equal share lets the server's "
                   "threads starve the agent's and the sim shard's event loops "
                   "(docs/benchmarks/fleet-real.md)")
    p.add_argument("--machines", type=int, default=5000, help="fleet size (--quick: 200)")
    p.add_argument("--pods", type=int, default=50000, help="Pods at base size (--quick: 2000)")
    p.add_argument("--per-profile", type=int, default=100, help="Pods per Profile (~CRs)")
    p.add_argument("--duration", type=float, default=600.0, help="churn seconds (--quick: 30)")
    p.add_argument("--rollup-interval", default="10s", help="operator --rollup-interval")
    p.add_argument("--job-run-seconds", type=float, default=60.0,
                   help="how long a Job's Pod runs (--quick: 10)")
    p.add_argument("--qps", type=float, default=500.0,
                   help="--qps of pod-controller and operator (burst 2x); 0: the binaries' "
                   "own defaults")
    p.add_argument("--job-share", type=float, default=0.2,
                   help="share of the CPU workloads that are Jobs (each Job Pod finishing costs "
                   "the pod controller a CR delete)")
    p.add_argument("--churn-interval", type=float, default=2.0, help="seconds between scalings")
    p.add_argument("--phase-timeout", type=float, default=900.0, help="per phase wait limit")
    p.add_argument("--quiesce", type=float, default=20.0, help="quiesce hold seconds")
    p.add_argument("--progress-interval", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep-logs", metavar="DIR", default="",
                   help="write the five processes' logs to DIR and keep them, with the raw "
                        "observations (observed.json: shard stats, watch events) (default: a "
                        "temporary directory, removed at the end)")
    p.add_argument("--plot", metavar="PNG", default="",
                   help="draw the run: latency p50/p99/max over time per matched latency, CPU "
                   "and RSS per process (needs matplotlib, the bench extra)")
    p.add_argument("--unbound-ok", type=float, default=0.05,
                   help="share of Pods that may stay pending for a phase to count as settled "
                   "(the scheduler packs across Profiles, the shard plans per Profile: a few "
                   "Pods can be left without room)")
    p.set_defaults(func=run)
