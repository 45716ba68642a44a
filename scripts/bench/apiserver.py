"""``bench apiserver``: the embedded test apiserver's own write rates (the ceiling every
apiserver-bound scenario here runs under).

Wraps ``_apiserver_probe``: in-process store create/merge-patch rates (the baseline:
no HTTP at all) and, per HTTP engine (hypercorn, fast) in a child process, client-observed
creates/merge-patches/status-patches per second with ``--conc`` httpx clients and the server's
CPU per request.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from scripts.bench import _common as C

LABEL = {"create": "creates", "merge_patch": "merge-patches", "status_patch": "status patches"}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import trio

    script = importlib.import_module("scripts.bench._apiserver_probe")
    objects = 2_000 if args.quick else args.objects
    http = 300 if args.quick else args.http
    rounds = 1 if args.quick else args.rounds
    rows = []
    for _ in range(rounds):
        r = trio.run(script.inprocess, objects)
        for engine in ("hypercorn", "fast"):
            r.update(trio.run(script.over_http, engine, http, args.conc))
        rows.append(r)

    def col(key: str) -> list[float]:
        return [r[key] for r in rows]

    figs = [
        C.figure(f"in-process creates/s ({objects:,} CRs)", "1/s", col("inproc_create_per_s")),
        C.figure("in-process merge-patches/s", "1/s", col("inproc_merge_patch_per_s")),
        C.figure(f"RSS after {objects:,} creates", "MB", col("rss_mb_after_creates")),
    ]
    for engine in ("fast", "hypercorn"):
        for op in ("create", "merge_patch", "status_patch"):
            figs.append(C.figure(
                f"HTTP {LABEL[op]}/s ({engine}, {args.conc} clients)", "1/s",
                col(f"{engine}_{op}_per_s"),
                baseline=col(f"inproc_{'create' if op == 'create' else 'merge_patch'}_per_s"),
                baseline_label="the same write in-process (no HTTP)"))
        figs.append(C.figure(f"server CPU per create ({engine})", "ms",
                             col(f"{engine}_create_server_ms_per_req")))
    figs.append(C.figure(f"full LIST of {objects:,} over HTTP", "s", col("http_full_list_s"),
                         baseline=col("http_paged_list_500_s"),
                         baseline_label="paged LIST (limit=500)"))
    return C.result("apiserver", {"objects": objects, "http": http, "conc": args.conc,
                                  "rounds": rounds}, figs)


def register(sub: Any) -> None:
    p = sub.add_parser("apiserver", parents=[sub.common],
                       help="embedded apiserver write rates per engine")
    p.add_argument("--objects", type=int, default=100_000)
    p.add_argument("--http", type=int, default=3_000)
    p.add_argument("--conc", type=int, default=16)
    p.add_argument("--rounds", type=int, default=1)
    p.set_defaults(func=run)
