"""``bench.py nodestate``: a NodeStateUpdate burst through the real Session into the real
:class:`~bigfleet_trio.operator.upcoming.UpcomingNodeHandler` (BENCHMARKS.md `nodestate`
row, the runs in docs/benchmarks/in-process.md; coalescing: docs/wire.md#the-session;
phases: docs/rules.md#upcomingnode-phases).

Set-up per measurement: a fresh embedded apiserver (:class:`~bigfleet_trio.sim.apiserver.ApiServer`)
in a child process over loopback HTTP (``--server fast``, default: it has its own CPU and real
request latency, as a real apiserver would), or in-process through ``InProcessTransport`` as the
operator integration tests do (``--server inproc``: requests cost CPU but no wall latency, so a
handler keeps pace with one frame per scheduler turn and nothing coalesces), a
:class:`~bigfleet_trio.kube.KubeClient` without client-side rate limit, and ``--machines``
UpcomingNodes already at Provisioning (the shard reports CREATING before IDLE; written through the
same handler, not measured). ``--fresh`` also measures machines with no UpcomingNode yet.

The burst: ``machines x 3`` frames in waves (every machine IDLE, then every machine CONFIGURING,
then CONFIGURED) on the shard end of an in-memory stream; by default (``--arrival prefilled``)
they are all queued before the session starts reading (a burst that arrives faster than the
apiserver writes), ``--arrival paced`` sends one per scheduler turn instead. The provisioning
frames carry the same labels/resources, so the burst changes status only.

* coalesced (the product): :class:`~bigfleet_trio.operator.session.Session` with its per-machine
  coalescer, 32 dispatch slots and the default dispatch_backlog (1024);
* coalesced-wide: the same with ``dispatch_backlog`` = the burst's frame count;
* baseline: the same frames, the same handler, one handler call per frame (per-machine FIFO lock
  keeps the order, 32 slots) -- the reference's "one write per frame".

Figures: apiserver writes (create/patch/update/delete of upcomingnodes counted by the server) per
frame, wall time and frames/s, p50/p99 frame->CR latency (from the frame's send to the end of the
first handler call that wrote that state or a later one for the machine), and convergence (every
UpcomingNode at the last state, Ready). Frames travel as objects (no protobuf decode here; see
``bench.py stream`` for the decode cost).
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import time
from typing import Any

from scripts.bench import _common as C

WRITE_VERBS = ("create", "patch", "update", "delete")
WAVES = (3, 4, 5)  # MachineState IDLE, CONFIGURING, CONFIGURED


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


async def _one(
    machines: int, mode: str, existing: bool, concurrency: int, arrival: str, srv: Any,
    lookup: str = "informer",
) -> dict[str, Any]:
    import trio

    from bigfleet_trio.kube.client import KubeClient
    from bigfleet_trio.kube.config import KubeConfig
    from bigfleet_trio.kube.informer import Informer
    from bigfleet_trio.kube.resources import UPCOMING_NODES
    from bigfleet_trio.operator.session.core import Session
    from bigfleet_trio.operator.session.types import SessionConfig
    from bigfleet_trio.operator.upcoming.handler import UpcomingNodeHandler
    from bigfleet_trio.operator.upcoming.plan import DrainMemory
    from bigfleet_trio.proto import pb
    from bigfleet_trio.shard.transport import StreamClosed, memory_stream_pair
    from bigfleet_trio.sim.apiserver import ApiServer
    from bigfleet_trio.sim.apiserver.testing import InProcessTransport

    server = ApiServer() if srv is None else None
    ids = [f"m-{i:05d}" for i in range(machines)]

    def update(mid: str, state: int) -> pb.NodeStateUpdate:
        return pb.NodeStateUpdate(
            supersedes_key=f"machine/{mid}",
            machine_id=mid,
            cluster_id="bench",
            state=pb.MachineState(state),
            node_name=f"node-{mid}" if state != pb.MachineState.CREATING else "",
            provider_id=f"sim://bench/{mid}",
            labels={"topology.kubernetes.io/zone": "z1", "node.kubernetes.io/instance-type": "m5"},
            resources=pb.Resources(resources={"cpu": "4", "memory": "16Gi", "pods": "110"}),
        )

    frames = [update(mid, state) for state in WAVES for mid in ids]
    rank = {s: i for i, s in enumerate(WAVES)}
    sent_at: dict[str, list[float]] = {mid: [] for mid in ids}
    recorded: dict[str, int] = dict.fromkeys(ids, 0)
    latencies: list[float] = []
    done = trio.Event()
    calls = 0

    async with trio.open_nursery() as nursery:
        if server is not None:
            kube = KubeClient(
                KubeConfig(server="http://apiserver"),
                transport=InProcessTransport(server.app, nursery),
                qps=1e9,
                burst=10**9,
            )
        else:
            kube = KubeClient(KubeConfig(server=srv.url), qps=1e9, burst=10**9)
            await kube.delete_collection(UPCOMING_NODES)  # a clean store for this round
        client = C.CountingClient(kube)
        informer_scope, informer_done = trio.CancelScope(), trio.Event()
        if lookup == "informer":  # as the operator: plan from the UpcomingNode informer cache
            informer = Informer(kube, UPCOMING_NODES)

            async def run_informer(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
                try:
                    with informer_scope:
                        await informer.run(task_status=task_status)
                finally:
                    informer_done.set()

            await nursery.start(run_informer)
            await informer.wait_synced()

            def cached(name: str) -> dict[str, Any] | None:
                obj = informer.store.get(name)
                return obj if isinstance(obj, dict) else None

            handler = UpcomingNodeHandler(client, DrainMemory(), get_cached=cached)
        else:  # a live GET before every write
            informer = None
            informer_done.set()
            handler = UpcomingNodeHandler(client, DrainMemory())

        if existing:  # UpcomingNodes at Provisioning, as after the shard's CREATING report
            limit = trio.Semaphore(concurrency)

            async def provision(mid: str) -> None:
                async with limit:
                    await handler.on_node_state_update(update(mid, pb.MachineState.CREATING))

            async with trio.open_nursery() as prep:
                for mid in ids:
                    prep.start_soon(provision, mid)
            if informer is not None:  # the operator's cache holds them before the burst
                with trio.fail_after(600):
                    while len(informer.store) < machines:  # noqa: ASYNC110 - bench set-up
                        await trio.sleep(0.01)
        client.reset()

        async def measured(u: pb.NodeStateUpdate) -> None:
            nonlocal calls
            calls += 1
            await handler.on_node_state_update(u)
            now = time.perf_counter()
            mid = u.machine_id
            upto = rank[int(u.state)] + 1
            sends = sent_at[mid]
            for i in range(recorded[mid], min(upto, len(sends))):
                latencies.append(now - sends[i])
            recorded[mid] = max(recorded[mid], min(upto, len(sends)))
            if len(latencies) == len(frames):
                done.set()

        op_end, shard_end = memory_stream_pair()

        class Source:
            async def build(self) -> pb.ClusterCapacityNeeds:
                return pb.ClusterCapacityNeeds()

            async def after_enqueue(self) -> None:
                pass

        class Handlers:
            async def on_bootstrap_request(self, req: Any) -> Any:
                return pb.BootstrapBlobResponse()

            async def on_reclaim_instruction(self, instr: Any, reply: Any) -> None:
                pass

            async def on_available_capacity(self, u: Any) -> None:
                pass

            async def on_node_state_update(self, u: pb.NodeStateUpdate) -> None:
                await measured(u)

        async def drain_shard_inbox() -> None:
            try:
                while True:
                    await shard_end.receive()
            except StreamClosed:
                pass

        async def push() -> None:
            for f in frames:
                sent_at[f.machine_id].append(time.perf_counter())
                await shard_end.send(pb.ShardMessage(node_state_update=f))

        if arrival == "prefilled":  # the whole burst already sits in the receive buffer
            for f in frames:
                sent_at[f.machine_id].append(time.perf_counter())
                shard_end._send.send_nowait(pb.ShardMessage(node_state_update=f))  # noqa: SLF001

        session: Session | None = None
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        scpu0 = srv.cpu() if srv is not None else 0.0
        async with trio.open_nursery() as run:
            run.start_soon(drain_shard_inbox)
            if mode.startswith("coalesced"):
                backlog = len(frames) if mode == "coalesced-wide" else 1024
                session = Session(
                    op_end,
                    SessionConfig("bench", rollup_interval=3600, dispatch_concurrency=concurrency,
                                  dispatch_backlog=backlog),
                    Source(),
                    Handlers(),
                )
                run.start_soon(session.run)
            else:  # baseline: one handler call per frame, per-machine FIFO, same slot count
                slots = trio.Semaphore(concurrency)
                admission = trio.Semaphore(concurrency + 1024)
                locks = {mid: trio.Lock() for mid in ids}

                async def one(u: pb.NodeStateUpdate) -> None:
                    try:
                        async with locks[u.machine_id], slots:
                            await measured(u)
                    finally:
                        admission.release()

                async def dispatch() -> None:
                    async with trio.open_nursery() as workers:
                        while True:
                            msg = await op_end.receive()
                            await admission.acquire()
                            workers.start_soon(one, msg.node_state_update)

                run.start_soon(dispatch)
            if arrival == "paced":
                run.start_soon(push)
            await done.wait()
            wall = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
            server_cpu = srv.cpu() - scpu0 if srv is not None else 0.0
            run.cancel_scope.cancel()
        counts = dict(client.counts)
        writes = client.writes()
        reads = counts.get("get", 0)
        items = (await kube.list(UPCOMING_NODES)).items
        phases = [(o.get("status") or {}).get("phase") for o in items]
        converged = len(items) == machines and all(p == "Ready" for p in phases)
        informer_scope.cancel()  # stop the watch before its client closes
        await informer_done.wait()
        await kube.aclose()
        nursery.cancel_scope.cancel()
    return {
        "frames": len(frames),
        "handler_calls": calls,
        "writes": writes,
        "reads": reads,
        "writes_per_frame": writes / len(frames),
        "wall_s": wall,
        "cpu_s": cpu,
        "server_cpu_s": server_cpu,
        "frames_per_s": len(frames) / wall,
        "p50_ms": _pct(latencies, 0.50) * 1e3,
        "p99_ms": _pct(latencies, 0.99) * 1e3,
        "converged": converged,
        "coalesced": session.stats.node_states_coalesced if session is not None else 0,
        "requests": counts,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import trio

    logging.getLogger("bigfleet_trio").setLevel(logging.WARNING)
    machines = 200 if args.quick else args.machines
    rounds = 1 if args.quick else args.rounds
    variants = [True, False] if args.fresh else [True]
    figs: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    for existing in variants:
        tag = "" if existing else " [fresh: no UpcomingNode yet]"
        got: dict[str, list[dict[str, Any]]] = {"coalesced": [], "coalesced-wide": [],
                                                "per-frame": []}
        for _ in range(rounds):
            for mode in got:
                if args.server == "inproc":
                    got[mode].append(trio.run(_one, machines, mode, existing, args.concurrency,
                                              args.arrival, None, args.lookup))
                    continue
                with C.ApiServerProcess(engine=args.server) as srv:
                    got[mode].append(trio.run(_one, machines, mode, existing, args.concurrency,
                                              args.arrival, srv, args.lookup))
        co, wide, base = got["coalesced"], got["coalesced-wide"], got["per-frame"]

        def col(rows: list[dict[str, Any]], key: str) -> list[float]:
            return [r[key] for r in rows]

        label = "no coalescing: one handler call per frame (per-machine FIFO, same 32 slots)"
        figs += [
            C.figure(f"apiserver writes / frame{tag}", "ratio", col(co, "writes_per_frame"),
                     baseline=col(base, "writes_per_frame"), baseline_label=label,
                     target="<= 0.4" if existing else "", met=(lambda m, _r: m <= 0.4)
                     if existing else None),
            C.figure(f"apiserver writes / frame, dispatch_backlog={machines * 3}{tag}", "ratio",
                     col(wide, "writes_per_frame"), baseline=col(base, "writes_per_frame"),
                     target="<= 0.4" if existing else "", met=(lambda m, _r: m <= 0.4)
                     if existing else None),
            C.figure(f"converged (all UpcomingNodes Ready){tag}", "bool",
                     float(all(r["converged"] for r in co + wide)),
                     baseline=float(all(r["converged"] for r in base)), target="yes",
                     met=all(r["converged"] for r in co + wide)),
            C.figure(f"burst wall time{tag}", "s", col(co, "wall_s"), baseline=col(base, "wall_s")),
            C.figure(f"frames/s{tag}", "frames/s", col(co, "frames_per_s"),
                     baseline=col(base, "frames_per_s")),
            C.figure(f"p50 frame->CR latency{tag}", "ms", col(co, "p50_ms"),
                     baseline=col(base, "p50_ms"), target="reported"),
            C.figure(f"p99 frame->CR latency{tag}", "ms", col(co, "p99_ms"),
                     baseline=col(base, "p99_ms"), target="reported"),
            C.figure(f"burst wall time, wide backlog{tag}", "s", col(wide, "wall_s"),
                     baseline=col(base, "wall_s")),
            C.figure(f"p50 frame->CR latency, wide backlog{tag}", "ms", col(wide, "p50_ms"),
                     baseline=col(base, "p50_ms")),
            C.figure(f"p99 frame->CR latency, wide backlog{tag}", "ms", col(wide, "p99_ms"),
                     baseline=col(base, "p99_ms")),
            C.figure(f"operator CPU per frame{tag}", "ms",
                     [r["cpu_s"] / r["frames"] * 1e3 for r in co],
                     baseline=[r["cpu_s"] / r["frames"] * 1e3 for r in base]),
            C.figure(f"apiserver CPU per frame{tag}", "ms",
                     [r["server_cpu_s"] / r["frames"] * 1e3 for r in co],
                     baseline=[r["server_cpu_s"] / r["frames"] * 1e3 for r in base]),
        ]
        extra["existing" if existing else "fresh"] = {
            "coalesced_last": co[-1], "per_frame_last": base[-1], "wide_last": wide[-1],
            "median_coalesced_frames": statistics.median(col(co, "coalesced")),
        }
    notes = [
        "node-state frames never block the recv pump: the coalescer keeps the latest frame per "
        "machine and a FIFO of ready machines; dispatch_concurrency (32) workers share the "
        "dispatch semaphore, and a read-ahead gate lets the pump read up to 256 frames before a "
        "worker starts a new machine, so each machine's 3 transitions collapse into ~1 call",
        "a machine whose UpcomingNode does not exist yet needs >= 2 writes (create, then the "
        "status subresource patch)",
        "--lookup informer (default): the handler plans from an UpcomingNode informer cache plus "
        "its last-write overlay, as the operator does (one request per call); --lookup get: a "
        "live GET before every write (reads are not counted as writes)"
        if args.lookup == "informer" else
        "--lookup get: every handler call GETs the object first (reads are not counted as "
        "writes); the operator itself plans from its informer cache (--lookup informer)",
    ]
    return C.result("nodestate", {"machines": machines, "frames": machines * 3, "rounds": rounds,
                                  "concurrency": args.concurrency, "arrival": args.arrival,
                                  "server": args.server, "lookup": args.lookup},
                    figs, notes, extra)


def register(sub: Any) -> None:
    p = sub.add_parser("nodestate", parents=[sub.common],
                       help="NodeStateUpdate burst: writes/frame, latency, convergence")
    p.add_argument("--machines", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=32, help="dispatch slots")
    p.add_argument("--fresh", action="store_true",
                   help="also measure machines with no UpcomingNode yet")
    p.add_argument("--arrival", choices=["prefilled", "paced"], default="prefilled",
                   help="prefilled: the whole burst is queued before the session reads it (a "
                   "burst faster than the writes); paced: the shard task sends one frame per "
                   "scheduler turn")
    p.add_argument("--server", choices=["fast", "hypercorn", "inproc"], default="fast",
                   help="apiserver in a child process over loopback HTTP (fast or hypercorn "
                   "engine), or in this process through InProcessTransport")
    p.add_argument("--lookup", choices=["informer", "get"], default="informer",
                   help="how the handler reads the current UpcomingNode: from an informer cache "
                   "(the operator's way, default) or a live GET per call")
    p.set_defaults(func=run)
