"""``bench informer``: resident memory per cached CapacityRequest (the operator's roll-up cache
holds one CR per Pod).

Wraps ``scripts/bench/_informer_probe.py``: a paginated LIST of N realistic CRs (managedFields,
ownerReferences, labels) served from an ``httpx.MockTransport`` is synced by the real
:class:`~bigfleet_trio.kube.Informer`; every measurement runs in a fresh child process. Figures:
bytes per cached CR with the operator's slim projection (tracemalloc and RSS growth) against the
full-object cache (the baseline, same run), and seconds to synced.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from scripts.bench import _common as C


def run(args: argparse.Namespace) -> dict[str, Any]:
    script = importlib.import_module("scripts.bench._informer_probe")
    count = 5_000 if args.quick else args.count
    rounds = 1 if args.quick else args.rounds
    samples: dict[str, dict[str, list[float]]] = {}
    for _ in range(rounds):
        for mode in ("full", "slim") if args.quick else ("full", "slim", "tuple"):
            out = script.measure(mode, count, args.page_size)
            s = samples.setdefault(mode, {"traced": [], "rss": [], "synced": []})
            s["traced"].append(out["trace"]["tracemalloc_bytes_per_object"])
            s["rss"].append(out["rss"]["rss_bytes_per_object"])
            s["synced"].append(out["rss"]["seconds_to_synced"])
    full, slim = samples["full"], samples["slim"]
    tup = samples.get("tuple", {"traced": []})
    figs = [
        C.figure("slim cache bytes/CR (tracemalloc)", "B", slim["traced"], baseline=full["traced"],
                 baseline_label="full-object cache (no transform), same LIST",
                 target="<= 1 KB", met=lambda m, _r: m <= 1024),
        C.figure("slim cache bytes/CR (RSS growth)", "B", slim["rss"], baseline=full["rss"],
                 target="<= 1 KB", met=lambda m, _r: m <= 1024),
        C.figure("interned-tuple projection bytes/CR (tracemalloc)", "B", tup["traced"],
                 baseline=full["traced"]),
        C.figure("seconds to synced (slim)", "s", slim["synced"], baseline=full["synced"]),
    ]
    return C.result(
        "informer",
        {"count": count, "rounds": rounds, "page_size": args.page_size},
        figs,
        ["each measurement in a fresh process; RSS growth includes allocator slack, tracemalloc "
         "counts live Python objects only"],
    )


def register(sub: Any) -> None:
    p = sub.add_parser("informer", parents=[sub.common], help="informer cache memory per CR")
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--page-size", type=int, default=500)
    p.set_defaults(func=run)
