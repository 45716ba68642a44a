"""``bench.py podcontroller``: Pods -> CapacityRequests through the real pod controller against
the embedded apiserver in a child process (issue 8 "pod controller"; issue 6).

Wraps ``_podcontroller_probe`` (its ``bench()``): ``--pods`` Pods are created, then the
raw create rate of the same apiserver is measured for the very CapacityRequests the controller
will write (its own translation of those Pods, prebuilt; ``--workers`` concurrent POSTs, the
baseline), then the controller runs from its initial LIST until its CR informer holds one CR per
Pod. Each round uses a fresh apiserver process.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import subprocess
import sys
import tempfile
from typing import Any

from scripts.bench import _common as C


def _round(n: int, workers: int, pod_conc: int) -> dict[str, float]:
    import trio

    script = importlib.import_module("scripts.bench._podcontroller_probe")
    with tempfile.TemporaryDirectory() as tmp:
        kc = os.path.join(tmp, "kubeconfig")
        proc = subprocess.Popen(
            [sys.executable, "-m", "bigfleet_trio", "sim", "apiserver", "--port", "0",
             "--kubeconfig-out", kc, "--log-level", "error"],
            stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if "listening" not in line:
                raise RuntimeError(f"apiserver did not start: {line!r}")
            out: dict[str, float] = trio.run(script.bench, kc, n, workers, pod_conc, proc.pid)
        finally:
            proc.terminate()
            proc.wait(10)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    logging.basicConfig(level=logging.ERROR)
    n = 500 if args.quick else args.pods
    rounds = 1 if args.quick else args.rounds
    rows = [_round(n, args.workers, args.pod_concurrency) for _ in range(rounds)]

    def col(key: str) -> list[float]:
        return [r[key] for r in rows if key in r]

    figs = [
        C.figure(f"CRs/s, {n:,} Pods -> all CRs present", "CR/s", col("crs_per_s"),
                 baseline=col("raw_cr_create_per_s"),
                 baseline_label=f"raw create rate of the same apiserver for the controller's "
                 f"own CR bodies, prebuilt ({args.workers} concurrent POSTs, no rate limit)",
                 target=">= 0.8 (ratio)", met=lambda _m, r: r is not None and r >= 0.8),
        C.figure("CRs/s to all Pending", "CR/s", col("crs_pending_per_s"),
                 baseline=col("raw_cr_create_per_s")),
        C.figure("controller CPU per CR", "ms", col("controller_cpu_ms_per_cr"),
                 baseline=col("raw_cr_create_client_cpu_ms_per_cr")),
        C.figure("apiserver CPU per CR (controller phase)", "ms", col("server_cpu_ms_per_cr"),
                 baseline=col("raw_cr_create_server_cpu_ms_per_cr")),
        C.figure("errors", "count", col("errors")),
    ]
    return C.result("podcontroller", {"pods": n, "workers": args.workers, "rounds": rounds,
                                      "apiserver": "child process (hypercorn engine)"},
                    figs, [], {"rounds": rows})


def register(sub: Any) -> None:
    p = sub.add_parser("podcontroller", parents=[sub.common],
                       help="Pods -> CRs: controller CRs/s vs raw apiserver create rate")
    p.add_argument("--pods", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--pod-concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.set_defaults(func=run)
