"""``bench.py rollup``: roll-up cycle cost vs CR count (BENCHMARKS.md `rollup` row; the runs:
docs/benchmarks/in-process.md): a cycle costs O(needs), not O(CRs), as
docs/deviations.md#2-roll-up-and-acknowledgement-operatorrollup-wiringpy-acknowledgepy says.

Workload: ``_rollup_workload``'s generator (~500 profiles, ~10% co-located in ~50 jobs,
penalties over 25 buckets, 1/3 with a topology spread, 1/7 with GPUs). For each size it loads the
slim cache into a :class:`RollupAggregator`, then measures (repeated; median/min/max):

* idle cycle: ``needs_encoded()`` + roll-up framing, nothing changed since the last cycle;
* dirty cycle: the same right after a tick's churn (1% of CRs replaced with a new spec);
* dirty cycle after 10 changed CRs: the same absolute churn at every size (the fair input for
  the "100K <= 2x 1K" target: 1% churn is 100x more work at 100K by construction);
* churn + cycle: applying that churn (the informer handlers' cost) plus the cycle;
* baseline: :func:`build_from_scratch` + encode over every cached CR (the reference design's
  list-every-cycle aggregation), on the same cache;
* encoded roll-up bytes (flat in CRs: bounded by needs) and slim-cache bytes per CR.
"""

from __future__ import annotations

import argparse
import importlib
import random
import time
import tracemalloc
from typing import Any

from scripts.bench import _common as C


def _measure(n: int, repeat: int) -> dict[str, Any]:
    from bigfleet_trio.operator.crview import slim
    from bigfleet_trio.operator.rollup.aggregate import RollupAggregator, build_from_scratch
    from bigfleet_trio.operator.rollup.encoding import (
        build_rollup_message,
        encode_operator_rollup,
    )

    gen = importlib.import_module("scripts.bench._rollup_workload")
    rng = random.Random(n)
    raw = [gen.make_cr(i, rng) for i in range(n)]
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    cache = {k: slim(o) for k, o in raw}
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    slim_bytes = sum(s.size_diff for s in after.compare_to(before, "filename")) / n
    del raw

    agg = RollupAggregator()
    t0 = time.perf_counter()
    for k, o in cache.items():
        agg.upsert(k, o)
    load_s = time.perf_counter() - t0

    def cycle() -> bytes:
        return encode_operator_rollup("bench", time.time_ns(), agg.needs_encoded())

    encoded = cycle()
    idle = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        cycle()
        idle.append(time.perf_counter() - t0)

    keys = list(cache)
    churn = max(1, n // 100)

    def apply_churn(count: int) -> None:
        for _ in range(count):
            k = rng.choice(keys)
            _, o = gen.make_cr(int(k.rsplit("-", 1)[1]), rng)
            cache[k] = slim(o)
            agg.upsert(k, cache[k])

    fixed = []
    for _ in range(repeat):  # the same absolute churn (10 CRs) at every size
        apply_churn(10)
        t0 = time.perf_counter()
        cycle()
        fixed.append(time.perf_counter() - t0)
    dirty, events_and_cycle = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        apply_churn(churn)
        t1 = time.perf_counter()
        encoded = cycle()
        t2 = time.perf_counter()
        dirty.append(t2 - t1)
        events_and_cycle.append(t2 - t0)

    crs = list(cache.values())
    scratch, scratch_agg = [], []
    for _ in range(max(1, repeat // 4)):
        t0 = time.perf_counter()
        needs = build_from_scratch(crs)
        t1 = time.perf_counter()
        bytes(build_rollup_message("bench", needs, time.time_ns()))
        scratch.append(time.perf_counter() - t0)
        scratch_agg.append(t1 - t0)
    same = [bytes(x) for x in build_from_scratch(cache[k] for k in sorted(cache))] == [
        bytes(x) for x in agg.needs()
    ]
    return {
        "n": n,
        "needs": len(agg.needs()),
        "load_s": load_s,
        "idle_ms": [x * 1e3 for x in idle],
        "dirty_ms": [x * 1e3 for x in dirty],
        "fixed_ms": [x * 1e3 for x in fixed],
        "events_and_cycle_ms": [x * 1e3 for x in events_and_cycle],
        "scratch_ms": [x * 1e3 for x in scratch],
        "scratch_agg_ms": [x * 1e3 for x in scratch_agg],
        "bytes": len(encoded),
        "slim_bytes_per_cr": slim_bytes,
        "incremental_equals_scratch": same,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [1_000, 10_000] if args.quick else [int(s) for s in args.sizes.split(",")]
    repeat = 5 if args.quick else args.repeat
    per = {n: _measure(n, repeat) for n in sizes}
    figs: list[dict[str, Any]] = []
    for n in sizes:
        r = per[n]
        figs.append(C.figure(f"idle cycle @{n:,} CRs ({r['needs']} needs)", "ms", r["idle_ms"],
                             baseline=r["scratch_ms"], baseline_label="from-scratch aggregation "
                             "+ encode over every cached CR (reference design)"))
        target = "<= 20 ms" if n == max(sizes) else ""
        figs.append(C.figure(f"dirty cycle after 1% churn @{n:,}", "ms", r["dirty_ms"],
                             baseline=r["scratch_ms"], target=target,
                             met=(lambda m, _r: m <= 20.0) if target else None))
        figs.append(C.figure(f"dirty cycle after 10 changed CRs @{n:,}", "ms", r["fixed_ms"]))
        figs.append(C.figure(f"from-scratch aggregation only (no encode) @{n:,}", "ms",
                             r["scratch_agg_ms"]))
        figs.append(C.figure(f"churn events + cycle @{n:,}", "ms", r["events_and_cycle_ms"]))
    lo, hi = per[sizes[0]], per[sizes[-1]]
    figs.append(C.figure(f"dirty cycle (10 changed CRs) {sizes[-1]:,} / {sizes[0]:,} CRs", "x",
                         C.stats(hi["fixed_ms"])["median"] / C.stats(lo["fixed_ms"])["median"],
                         target="<= 2x", met=lambda m, _r: m <= 2.0))
    figs.append(C.figure(f"dirty cycle (1% churn) {sizes[-1]:,} / {sizes[0]:,} CRs", "x",
                         C.stats(hi["dirty_ms"])["median"] / C.stats(lo["dirty_ms"])["median"]))
    figs.append(C.figure(f"idle cycle {sizes[-1]:,} / {sizes[0]:,} CRs", "x",
                         C.stats(hi["idle_ms"])["median"] / C.stats(lo["idle_ms"])["median"],
                         target="<= 2x", met=lambda m, _r: m <= 2.0))
    for n in sizes:
        figs.append(C.figure(f"encoded roll-up bytes @{n:,}", "B", per[n]["bytes"],
                             baseline=per[sizes[0]]["bytes"],
                             baseline_label=f"roll-up bytes at {sizes[0]:,} CRs",
                             target="flat (bounded by needs)"))
    for n in sizes:
        figs.append(C.figure(f"slim cache bytes/CR @{n:,} (tracemalloc)", "B",
                             per[n]["slim_bytes_per_cr"]))
    notes = []
    if not all(per[n]["incremental_equals_scratch"] for n in sizes):
        notes.append("MISMATCH: incremental aggregate differs from the from-scratch rebuild")
    series = ("idle_ms", "dirty_ms", "fixed_ms", "events_and_cycle_ms", "scratch_ms",
              "scratch_agg_ms")
    extra = {str(n): {k: v for k, v in per[n].items() if k not in series} for n in sizes}
    return C.result("rollup", {"sizes": sizes, "repeat": repeat}, figs, notes, extra)


def register(sub: Any) -> None:
    p = sub.add_parser("rollup", parents=[sub.common], help="roll-up cycle vs CR count")
    p.add_argument("--sizes", default="1000,10000,100000", help="comma-separated CR counts")
    p.add_argument("--repeat", type=int, default=20, help="cycles per figure")
    p.set_defaults(func=run)
