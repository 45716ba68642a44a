#!/usr/bin/env python3
"""Roll-up benchmark: a cycle should cost O(needs), not O(CRs), and the roll-up size stay flat.

For 1K / 10K / 100K CapacityRequests (~500 profiles, ~10% co-located) it measures:

* initial load: upserting every CR into a :class:`RollupAggregator` (the informer's initial list);
* incremental cycle: ``needs()`` + ``build_rollup_message`` + encode after a tick's worth of churn
  (1% of CRs updated/replaced), i.e. what the roll-up task does every 10 s;
* idle cycle: the same with no churn;
* from-scratch rebuild: :func:`build_from_scratch` over all CRs (the periodic consistency check);
* encoded roll-up bytes, and the slim-cache memory per CR (tracemalloc).

Usage: ``python -m scripts.bench._rollup_workload`` (full) or ``--quick`` (1K and 10K only,
fewer repeats).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc
from typing import Any

from bigfleet_trio.operator.crview import slim
from bigfleet_trio.operator.rollup.aggregate import RollupAggregator, build_from_scratch
from bigfleet_trio.operator.rollup.encoding import build_rollup_message, encode_operator_rollup

ZONES = ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"]
TYPES = [f"m7i.{s}" for s in ("large", "xlarge", "2xlarge", "4xlarge", "8xlarge")]
CPU = ["250m", "500m", "1", "2", "4"]
MEM = ["256Mi", "512Mi", "1Gi", "2Gi", "8Gi"]


def make_spec(profile: int, rng: random.Random) -> dict[str, Any]:
    """Profile ``profile`` in 0..499 -> a spec; resources vary independently of the profile."""
    spec: dict[str, Any] = {
        "priority": (profile % 10) * 100,
        "requirements": [
            {
                "key": "topology.kubernetes.io/zone",
                "operator": "In",
                "values": [ZONES[profile % 4]],
            },
            {
                "key": "node.kubernetes.io/instance-type",
                "operator": "In",
                "values": [TYPES[(profile // 4) % 5]],
            },
        ],
        "resources": {"cpu": rng.choice(CPU), "memory": rng.choice(MEM)},
        "interruptionPenalty": str((profile // 20) % 25),
    }
    if profile % 3 == 0:
        spec["topologySpread"] = [
            {
                "topologyKey": "topology.kubernetes.io/zone",
                "maxSkew": 1,
                "whenUnsatisfiable": "DoNotSchedule",
            }
        ]
    if profile % 7 == 0:
        spec["resources"]["nvidia.com/gpu"] = "8"
    return spec


def make_cr(i: int, rng: random.Random) -> tuple[str, dict[str, Any]]:
    profile = rng.randrange(500)
    spec = make_spec(profile, rng)
    if rng.random() < 0.10:  # co-located: ~50 jobs, each job one profile
        job = rng.randrange(50)
        spec = make_spec(job * 10, rng)
        spec["coLocation"] = {
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"job": f"trainer-{job}"}},
        }
    obj = {
        "apiVersion": "bigfleet.lucy.sh/v1alpha1",
        "kind": "CapacityRequest",
        "metadata": {
            "name": f"pod-{i}",
            "namespace": f"team-{i % 20}",
            "uid": f"{i:08x}-0000-4000-8000-{i:012x}",
            "resourceVersion": str(1000 + i),
            "labels": {"app": "x"},
            "ownerReferences": [{"kind": "Pod", "name": f"pod-{i}", "uid": "u"}],
        },
        "spec": spec,
        "status": {"phase": rng.choice(["Pending", "Acknowledged", "Acknowledged"])},
    }
    return f"team-{i % 20}/pod-{i}", obj


def timeit(fn: Any, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def run(n: int, repeat: int) -> dict[str, float]:
    rng = random.Random(n)
    raw = [make_cr(i, rng) for i in range(n)]

    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    cache = {k: slim(o) for k, o in raw}
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    mem = sum(s.size_diff for s in after.compare_to(before, "filename")) / n

    agg = RollupAggregator()
    t0 = time.perf_counter()
    for k, o in cache.items():
        agg.upsert(k, o)
    load = time.perf_counter() - t0

    def cycle() -> bytes:
        return encode_operator_rollup("bench", time.time_ns(), agg.needs_encoded())

    def cycle_betterproto() -> bytes:
        return bytes(build_rollup_message("bench", agg.needs(), time.time_ns()))

    cycle()
    idle = timeit(cycle, repeat)
    idle_bp = timeit(cycle_betterproto, max(1, repeat // 5))

    keys = list(cache)
    churn = max(1, n // 100)

    def churn_and_cycle() -> None:
        for _ in range(churn):
            k = rng.choice(keys)
            if rng.random() < 0.5:
                agg.delete(k)
                cache.pop(k, None)
            else:
                _, o = make_cr(int(k.rsplit("-", 1)[1]), rng)
                cache[k] = slim(o)
                agg.upsert(k, cache[k])
        cycle()

    t0 = time.perf_counter()
    churn_and_cycle()
    events_and_cycle = time.perf_counter() - t0
    for _ in range(churn):  # a tick's churn, then time only the cycle (dirty needs rebuilt)
        k = rng.choice(keys)
        if k in cache:
            cache[k] = slim(make_cr(int(k.rsplit("-", 1)[1]), rng)[1])
            agg.upsert(k, cache[k])
    t0 = time.perf_counter()
    encoded = cycle()
    dirty_cycle = time.perf_counter() - t0

    crs = list(cache.values())
    scratch = timeit(lambda: build_from_scratch(crs), max(1, repeat // 5))
    assert [bytes(x) for x in build_from_scratch(agg_crs(agg, cache))] == [
        bytes(x) for x in agg.needs()
    ], "incremental and from-scratch disagree"
    return {
        "crs": n,
        "needs": len(agg.needs()),
        "load_s": load,
        "idle_cycle_ms": idle * 1e3,
        "dirty_cycle_ms": dirty_cycle * 1e3,
        "betterproto_cycle_ms": idle_bp * 1e3,
        "churn_events_plus_cycle_ms": events_and_cycle * 1e3,
        "from_scratch_ms": scratch * 1e3,
        "rollup_bytes": len(encoded),
        "slim_bytes_per_cr": mem,
    }


def agg_crs(agg: RollupAggregator, cache: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [cache[k] for k in sorted(cache)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1K and 10K only, fewer repeats")
    args = ap.parse_args()
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    repeat = 5 if args.quick else 20
    cols = [
        "crs",
        "needs",
        "load_s",
        "idle_cycle_ms",
        "dirty_cycle_ms",
        "betterproto_cycle_ms",
        "churn_events_plus_cycle_ms",
        "from_scratch_ms",
        "rollup_bytes",
        "slim_bytes_per_cr",
    ]
    print("  ".join(f"{c:>14}" for c in cols))
    for n in sizes:
        r = run(n, repeat)
        print(
            "  ".join(f"{r[c]:>14.3f}" if isinstance(r[c], float) else f"{r[c]:>14}" for c in cols)
        )


if __name__ == "__main__":
    main()
