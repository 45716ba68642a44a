"""``bench acknowledge``: memory and tasks held by a backlog of Pending CapacityRequests.

The operator acknowledges every Pending CR of an enqueued roll-up; after a restart (or a slow
apiserver) that is the whole backlog at once. The product's
:class:`~bigfleet_trio.operator.acknowledge.Acknowledger` queues the keys for a fixed pool of
``--ack-concurrency`` workers; the baseline, measured in the same run, is the design it replaced:
one Trio task per CR, a CapacityLimiter bounding only the patches in flight.

Set-up per measurement (a fresh child process each, so RSS is not polluted): ``--crs`` keys
submitted in one batch to a client whose every ``patch`` waits on a gate (an apiserver that has
not answered yet: the backlog is at its largest), then the gate opens and every patch succeeds.
Figures: RSS growth and tracemalloc growth per queued CR while the backlog is held, live Trio
tasks, and the seconds to submit and to drain (in-process, no HTTP: the cost of the bookkeeping
only).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc
from typing import Any

from scripts.bench import _common as C

MODES = ("pool", "task-per-cr")


def _rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _live_tasks() -> int:
    import trio

    root = trio.lowlevel.current_root_task()
    assert root is not None
    count, todo = 0, [root]
    while todo:
        task = todo.pop()
        count += 1
        for nursery in task.child_nurseries:
            todo.extend(nursery.child_tasks)
    return count


class _GatedClient:
    def __init__(self) -> None:
        import trio

        self.gate = trio.Event()
        self.all_done = trio.Event()
        self.patched = 0
        self.expected = 0

    async def patch(self, *a: Any, **kw: Any) -> dict[str, Any]:
        await self.gate.wait()
        self.patched += 1
        if self.patched == self.expected:
            self.all_done.set()
        return {}


class _TaskPerCR:
    """The baseline: the Acknowledger's former shape (a task per CR under a limiter)."""

    def __init__(self, client: Any, concurrency: int) -> None:
        import trio

        self._client = client
        self._limiter = trio.CapacityLimiter(concurrency)
        self._in_flight: set[tuple[str, str]] = set()
        self._nursery: Any = None

    async def run(self, *, task_status: Any) -> None:
        import trio

        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def submit_keys(self, keys: list[tuple[str, str]]) -> int:
        batch = [k for k in keys if k not in self._in_flight]
        self._in_flight.update(batch)
        self._nursery.start_soon(self._batch, batch)
        return len(batch)

    async def _batch(self, keys: list[tuple[str, str]]) -> None:
        import trio

        async with trio.open_nursery() as nursery:
            for key in keys:
                nursery.start_soon(self._one, key)

    async def _one(self, key: tuple[str, str]) -> None:
        try:
            async with self._limiter:
                await self._client.patch(None, key[1], {}, key[0])
        finally:
            self._in_flight.discard(key)


async def _measure(mode: str, crs: int, concurrency: int, trace: bool) -> dict[str, Any]:
    import trio
    import trio.testing

    from bigfleet_trio.operator.acknowledge import Acknowledger

    client = _GatedClient()
    client.expected = crs
    ack: Any = (Acknowledger(client, concurrency=concurrency) if mode == "pool"  # type: ignore[arg-type]
                else _TaskPerCR(client, concurrency))
    keys = [("bench", f"cr-{i:07d}") for i in range(crs)]
    async with trio.open_nursery() as nursery:
        await nursery.start(ack.run)
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        tasks0, rss0 = _live_tasks(), _rss_bytes()
        if trace:
            tracemalloc.start()
        t0 = time.perf_counter()
        ack.submit_keys(keys)
        await trio.testing.wait_all_tasks_blocked()
        submitted = time.perf_counter() - t0
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] if trace else 0
        if trace:
            tracemalloc.stop()
        rss, tasks = _rss_bytes() - rss0, _live_tasks() - tasks0
        t1 = time.perf_counter()
        client.gate.set()
        await client.all_done.wait()
        drained = time.perf_counter() - t1
        nursery.cancel_scope.cancel()
    return {"mode": mode, "crs": crs, "rss_bytes": rss, "traced_bytes": held,
            "extra_tasks": tasks, "submit_s": submitted, "drain_s": drained}


def _child(mode: str, crs: int, concurrency: int, trace: bool) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.bench.acknowledge", "--child", mode, "--crs", str(crs),
         "--concurrency", str(concurrency), *(["--trace"] if trace else [])],
        capture_output=True, text=True, check=True, env=os.environ.copy(), cwd=C.ROOT,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run(args: argparse.Namespace) -> dict[str, Any]:
    crs = 10_000 if args.quick else args.crs
    rounds = 1 if args.quick else args.rounds
    s: dict[str, dict[str, list[float]]] = {
        m: {"rss": [], "traced": [], "tasks": [], "submit": [], "drain": []} for m in MODES
    }
    for _ in range(rounds):
        for mode in MODES:
            plain = _child(mode, crs, args.concurrency, trace=False)
            traced = _child(mode, crs, args.concurrency, trace=True)
            s[mode]["rss"].append(plain["rss_bytes"] / crs)
            s[mode]["traced"].append(traced["traced_bytes"] / crs)
            s[mode]["tasks"].append(plain["extra_tasks"])
            s[mode]["submit"].append(plain["submit_s"])
            s[mode]["drain"].append(plain["drain_s"])
    pool, base = s["pool"], s["task-per-cr"]
    label = "one task per CR under a limiter (the former design), same run"
    figs = [
        C.figure("RSS growth per queued CR", "B", pool["rss"], baseline=base["rss"],
                 baseline_label=label),
        C.figure("tracemalloc growth per queued CR", "B", pool["traced"],
                 baseline=base["traced"], baseline_label=label),
        C.figure("RSS growth, whole backlog", "MiB", [r * crs / 2**20 for r in pool["rss"]],
                 baseline=[r * crs / 2**20 for r in base["rss"]], baseline_label=label),
        C.figure("live tasks added by the backlog", "tasks", pool["tasks"],
                 baseline=base["tasks"], baseline_label=label,
                 target="0 (the pool exists before)", met=lambda m, _r: m == 0),
        C.figure("seconds to submit + settle", "s", pool["submit"], baseline=base["submit"],
                 baseline_label=label),
        C.figure("seconds to drain (gate open, no HTTP)", "s", pool["drain"],
                 baseline=base["drain"], baseline_label=label),
    ]
    return C.result(
        "acknowledge",
        {"crs": crs, "rounds": rounds, "concurrency": args.concurrency},
        figs,
        ["each measurement in a fresh process; RSS growth includes allocator slack, "
         "tracemalloc counts live Python objects only; the patches never reach HTTP"],
    )


def register(sub: Any) -> None:
    p = sub.add_parser("acknowledge", parents=[sub.common],
                       help="memory/tasks of a Pending-CR acknowledgement backlog")
    p.add_argument("--crs", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=16)
    p.set_defaults(func=run)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", choices=MODES, required=True)
    ap.add_argument("--crs", type=int, required=True)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--trace", action="store_true")
    args = ap.parse_args()
    import trio

    out = trio.run(_measure, args.child, args.crs, args.concurrency, args.trace)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
