"""``bench.py reclaim``: draining ``nodes x pods`` with PodDisruptionBudgets on the embedded
apiserver (BENCHMARKS.md `reclaim` row, the runs in docs/benchmarks/in-process.md; the flow:
docs/rules.md#reclaim).

Cluster (built before the clock starts, on an apiserver child process with its PDB status
controller on, so PDB status follows the Pods as kube-controller-manager would): ``--nodes``
Nodes, each with an UpcomingNode (``un-m-NNN``, Ready, ``nodeRef`` to the Node) and
``--pods`` Running+Ready Pods; Pod *j* of every node belongs to app *j* and every app has a PDB
``maxUnavailable: 10%`` -- so evictions of one app across nodes compete for its budget and some
are refused with 429 and retried (the drain's ~2 s rounds).

Measured: one ReclaimInstruction naming every machine goes through the real
:class:`~bigfleet_trio.operator.reclaim.ReclaimHandler` (cordon, UpcomingNode to Draining, ack)
and :class:`~bigfleet_trio.operator.reclaim.DrainManager` (evict until empty, UpcomingNode
Drained and deleted); the clock stops when every drain has finished. Figures: time to ack, time
to all Drained, successful evictions/s, eviction calls (429s included).

Baseline (same server, same run): the raw eviction rate -- ``nodes x pods`` Pods in namespace
``kube-public`` under one PDB that never blocks, evicted by 32 concurrent tasks.
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from typing import Any

from scripts.bench import _common as C

RAW_NS = "kube-public"


def _pod(name: str, ns: str, node: str, app: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "c", "image": "busybox",
                            "resources": {"requests": {"cpu": "100m"}}}],
        },
    }


def _pdb(name: str, ns: str, app: str, max_unavailable: str) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": {"app": app}}},
    }


RUNNING = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


async def _fan_out(items: list[Any], conc: int, fn: Any) -> float:
    import trio

    todo = iter(items)

    async def worker() -> None:
        for item in todo:
            await fn(item)

    t0 = time.perf_counter()
    async with trio.open_nursery() as n:
        for _ in range(conc):
            n.start_soon(worker)
    return time.perf_counter() - t0


async def _one(srv: Any, nodes: int, pods: int, grace: int) -> dict[str, Any]:
    import trio

    from bigfleet_trio.kube.client import KubeClient
    from bigfleet_trio.kube.config import KubeConfig
    from bigfleet_trio.kube.resources import NODES, PDBS, PODS, UPCOMING_NODES
    from bigfleet_trio.operator.reclaim.drain import DrainManager
    from bigfleet_trio.operator.reclaim.handler import ReclaimHandler
    from bigfleet_trio.operator.upcoming.plan import DrainMemory
    from bigfleet_trio.proto import pb

    kube = KubeClient(KubeConfig(server=srv.url), qps=1e9, burst=10**9)
    node_names = [f"n-{i:03d}" for i in range(nodes)]
    # ---- set-up (not timed)
    for j in range(pods):
        await kube.create(PDBS, _pdb(f"app-{j}", "default", f"app-{j}", "10%"), "default")
    await kube.create(PDBS, _pdb("raw", RAW_NS, "raw", "100%"), RAW_NS)

    async def make_node(i: int) -> None:
        node = node_names[i]
        await kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        un = f"un-m-{i:03d}"
        await kube.create(UPCOMING_NODES, {"apiVersion": UPCOMING_NODES.api_version,
                                           "kind": "UpcomingNode", "metadata": {"name": un},
                                           "spec": {"resources": {}}})
        await kube.patch(UPCOMING_NODES, un, {"status": {
            "phase": "Ready", "nodeRef": {"kind": "Node", "name": node}}}, subresource="status")

    await _fan_out(list(range(nodes)), 16, make_node)
    work = [(f"p-{i:03d}-{j:02d}", i, j) for i in range(nodes) for j in range(pods)]

    async def make_pod(item: tuple[str, int, int]) -> None:
        name, i, j = item
        await kube.create(PODS, _pod(name, "default", node_names[i], f"app-{j}"), "default")
        await kube.patch(PODS, name, RUNNING, "default", subresource="status")
        await kube.create(PODS, _pod(name, RAW_NS, node_names[i], "raw"), RAW_NS)
        await kube.patch(PODS, name, RUNNING, RAW_NS, subresource="status")

    await _fan_out(work, 16, make_pod)

    # ---- baseline: raw eviction rate on the same server
    raw_errors = 0

    async def evict_raw(item: tuple[str, int, int]) -> None:
        nonlocal raw_errors
        try:
            await kube.evict(item[0], RAW_NS, grace_period_seconds=30)
        except Exception:  # noqa: BLE001 - counted
            raw_errors += 1

    s0 = srv.cpu()
    raw_s = await _fan_out(work, 32, evict_raw)
    raw_server_cpu = srv.cpu() - s0

    # ---- measured: reclaim -> drained
    client = C.CountingClient(kube)
    memory = DrainMemory()
    drains = DrainManager(client, memory, rng=random.Random(1))
    handler = ReclaimHandler(client, drains, memory)
    acks: list[tuple[str, int]] = []

    def reply(msg: pb.OperatorMessage) -> bool:
        acks.append((msg.reclaim_ack.instruction_id, msg.reclaim_ack.nodes_started))
        return True

    instr = pb.ReclaimInstruction(
        instruction_id="bench-1",
        nodes=[f"m-{i:03d}" for i in range(nodes)],
        grace_period_seconds=grace,
        preemptor_priority=100,
    )
    s0 = srv.cpu()
    async with trio.open_nursery() as op:
        await op.start(drains.run)
        t0 = time.perf_counter()
        await handler.on_reclaim_instruction(instr, reply)
        ack_s = time.perf_counter() - t0
        await drains.wait_idle()
        drained_s = time.perf_counter() - t0
        op.cancel_scope.cancel()
    server_cpu = srv.cpu() - s0
    outcomes = [r.outcome for r in drains.results.values()]
    left = len((await kube.list(PODS, "default")).items)
    remaining_un = len((await kube.list(UPCOMING_NODES)).items)
    await kube.aclose()
    return {
        "ack_s": ack_s,
        "drained_s": drained_s,
        "evictions_ok": nodes * pods - left,
        "evict_calls": client.counts.get("evict", 0),
        "requests": dict(client.counts),
        "drained": outcomes.count("drained"),
        "failed": outcomes.count("failed"),
        "pods_left": left,
        "upcoming_left": remaining_un,
        "acks": acks,
        "raw_s": raw_s,
        "raw_errors": raw_errors,
        "raw_server_cpu_ms_per_eviction": raw_server_cpu / len(work) * 1e3,
        "server_cpu_s": server_cpu,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import trio

    logging.getLogger("bigfleet_trio").setLevel(logging.WARNING)
    nodes = 10 if args.quick else args.nodes
    pods = args.pods
    rounds = 1 if args.quick else args.rounds
    rows = []
    for _ in range(rounds):
        with C.ApiServerProcess(engine="fast", pdb_controller=True) as srv:
            rows.append(trio.run(_one, srv, nodes, pods, args.grace))
    n = nodes * pods
    figs = [
        C.figure("time to ack (cordon + Draining for every node)", "s", [r["ack_s"] for r in rows]),
        C.figure(f"time to all Drained ({nodes} nodes x {pods} Pods)", "s",
                 [r["drained_s"] for r in rows], target="reported"),
        C.figure("evictions/s (successful, through the drain)", "1/s",
                 [r["evictions_ok"] / r["drained_s"] for r in rows],
                 baseline=[n / r["raw_s"] for r in rows],
                 baseline_label="raw eviction rate on the same server: 32 concurrent evict "
                 "calls, PDB that never blocks", target="reported"),
        C.figure("eviction calls per evicted Pod (429 retries included)", "x",
                 [r["evict_calls"] / max(1, r["evictions_ok"]) for r in rows]),
        C.figure("drains ended Drained", "nodes", [r["drained"] for r in rows], target=f"{nodes}",
                 met=all(r["drained"] == nodes and r["pods_left"] == 0 for r in rows)),
        C.figure("apiserver CPU per evicted Pod (drain)", "ms",
                 [r["server_cpu_s"] / n * 1e3 for r in rows],
                 baseline=[r["raw_server_cpu_ms_per_eviction"] for r in rows]),
    ]
    notes = ["evictions blocked by a PDB (429) are retried in rounds of ~2 s (jittered): the "
             "time to Drained is bounded by the budgets and that interval, not by the request "
             "rate"]
    return C.result("reclaim", {"nodes": nodes, "pods_per_node": pods, "rounds": rounds,
                                "pdb": "one per app, maxUnavailable 10%", "grace_s": args.grace},
                    figs, notes, {"last": rows[-1]})


def register(sub: Any) -> None:
    p = sub.add_parser("reclaim", parents=[sub.common],
                       help="reclaim N nodes x M Pods with PDBs: time to Drained, evictions/s")
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--pods", type=int, default=20, help="Pods per node (= apps = PDBs)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--grace", type=int, default=600, help="instruction grace period, s")
    p.set_defaults(func=run)
