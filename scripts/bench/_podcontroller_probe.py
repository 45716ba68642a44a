#!/usr/bin/env python
"""Benchmark the pod controller (issue 6 "Benchmark"): Pods created → all CRs present.

One run, one embedded apiserver (a child process ``bigfleet-trio sim apiserver``, so it has its
own CPU; ``--inproc`` serves it inside this process instead):

1. ``--pods`` Pods are created (their create rate is printed too);
2. raw: the apiserver's raw create rate for the very CapacityRequests the controller will
   write: the controller's own bodies (:func:`translate_pod` + :func:`build_capacity_request`
   over the created Pods, built before the clock starts: same names, labels, ownerReferences
   and spec, byte for byte), POSTed by ``--workers`` concurrent tasks through a
   :class:`KubeClient` (no rate limit) after a warm-up, then deleted, so the store holds what
   the controller phase will see (the Pods, CRs growing from 0);
3. the controller starts (``--workers`` workers, no client rate limit) and the clock runs from
   its start (initial LIST included) until its CR informer holds one CR per Pod ("all CRs
   present"), then until all are Pending.

Prints CRs/s, the raw create rate, their ratio (target >= 0.8) and CPU ms per CR of the
client/controller process and of the apiserver process for both phases.

Usage: python -m scripts.bench._podcontroller_probe [--pods 10000] [--workers 16] [--quick]
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import trio

from bigfleet_trio.kube import CAPACITY_REQUESTS, PODS, KubeClient, load_kubeconfig
from bigfleet_trio.podcontroller.controller import PodController
from bigfleet_trio.podcontroller.translate import (
    OWNED_BY_POD_LABEL,
    build_capacity_request,
    translate_pod,
)

UNLIMITED = {"qps": 1e9, "burst": 10**9}


def pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"bench-{i:06d}", "namespace": "default",
                     "labels": {"app": f"a{i % 50}"}},
        "spec": {
            "priority": i % 1000,
            "nodeSelector": {"topology.kubernetes.io/zone": f"zone-{i % 3}"},
            "containers": [{"name": "c", "image": "busybox",
                            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}],
        },
    }


def cr(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "bigfleet.lucy.sh/v1alpha1", "kind": "CapacityRequest",
        "metadata": {"name": f"raw-{i:06d}", "namespace": "default", "labels": {"bench": "raw"}},
        "spec": {"priority": i % 1000, "resources": {"cpu": "500m", "memory": "1Gi"},
                 "requirements": [{"key": "topology.kubernetes.io/zone", "operator": "In",
                                   "values": [f"zone-{i % 3}"]}]},
    }


async def fan_out(n: int, conc: int, fn: Any) -> float:
    """Run ``fn(i)`` for i in range(n) on ``conc`` tasks; returns seconds."""
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            await fn(i)

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(conc):
            nursery.start_soon(worker)
    return time.perf_counter() - t0


def _cpu(pid: int | None) -> float:
    """CPU seconds (user+sys) of this process (pid None) or of a child process."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def controller_bodies(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The CapacityRequests the controller will create for ``pods`` (its own translation)."""
    return [build_capacity_request(p, translate_pod(p, None)) for p in pods]


async def raw_phase(client: KubeClient, bodies: list[dict[str, Any]], workers: int,
                    server_pid: int | None, out: dict[str, float], label: str) -> None:
    """POST ``bodies`` (prebuilt) on ``workers`` tasks, record rate and CPU, delete them."""
    n = len(bodies)
    c0, s0 = _cpu(None), _cpu(server_pid) if server_pid else 0.0
    secs = await fan_out(n, workers, lambda i: client.create(CAPACITY_REQUESTS, bodies[i]))
    out[f"{label}_per_s"] = n / secs
    out[f"{label}_client_cpu_ms_per_cr"] = (_cpu(None) - c0) / n * 1000
    if server_pid:
        out[f"{label}_server_cpu_ms_per_cr"] = (_cpu(server_pid) - s0) / n * 1000
    await client.delete_collection(CAPACITY_REQUESTS, "default",
                                   label_selector=OWNED_BY_POD_LABEL)


async def bench(kubeconfig: str, n: int, workers: int, pod_conc: int,
                server_pid: int | None = None) -> dict[str, float]:
    cfg = load_kubeconfig(kubeconfig, env={})
    out: dict[str, float] = {}
    async with KubeClient(cfg, **UNLIMITED) as client:
        pods: list[dict[str, Any]] = [{} for _ in range(n)]

        async def create_pod(i: int) -> None:
            pods[i] = await client.create(PODS, pod(i))

        secs = await fan_out(n, pod_conc, create_pod)
        out["pod_create_per_s"] = n / secs
        bodies = controller_bodies(pods)
        # warm-up (connections, first-request costs), not measured
        await fan_out(min(n, 500), workers, lambda i: client.create(CAPACITY_REQUESTS, cr(i)))
        await client.delete_collection(CAPACITY_REQUESTS, "default", label_selector="bench=raw")
        # raw: same store as the controller will see (n Pods, CRs growing from 0 to n)
        await raw_phase(client, bodies, workers, server_pid, out, "raw_cr_create")

    async with KubeClient(cfg, **UNLIMITED) as client:
        ctl = PodController(client, workers=workers)
        present, pending = trio.Event(), trio.Event()
        stamped: set[str] = set()
        cpu_at_present: list[float] = []

        def seen(*objs: dict[str, Any]) -> None:
            cr = objs[-1]
            if len(ctl.crs.store) >= n and not present.is_set():
                cpu_at_present.extend([_cpu(None), _cpu(server_pid) if server_pid else 0.0])
                present.set()
            if (cr.get("status") or {}).get("phase") == "Pending":
                stamped.add(cr["metadata"]["name"])
                if len(stamped) >= n:
                    pending.set()

        ctl.crs.add_handler(on_add=seen, on_update=seen)
        c0, s0 = _cpu(None), _cpu(server_pid) if server_pid else 0.0
        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            await nursery.start(ctl.run)
            out["sync_s"] = time.perf_counter() - t0
            await present.wait()
            out["all_present_s"] = time.perf_counter() - t0
            await pending.wait()
            out["all_pending_s"] = time.perf_counter() - t0
            nursery.cancel_scope.cancel()
        out["controller_cpu_ms_per_cr"] = (cpu_at_present[0] - c0) / n * 1000
        if server_pid:
            out["server_cpu_ms_per_cr"] = (cpu_at_present[1] - s0) / n * 1000
        out["crs_per_s"] = n / out["all_present_s"]
        out["crs_pending_per_s"] = n / out["all_pending_s"]
        out["ratio"] = out["crs_per_s"] / out["raw_cr_create_per_s"]
        out["cr_created"] = ctl.outcomes["cr_created"]
        out["errors"] = ctl.outcomes["error"]
    return out


async def run_inproc(n: int, workers: int, pod_conc: int, kc: str) -> dict[str, float]:
    from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig

    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve, ApiServer())
        write_kubeconfig(url, kc)
        out = await bench(kc, n, workers, pod_conc)
        nursery.cancel_scope.cancel()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--pod-concurrency", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="1000 Pods")
    ap.add_argument("--inproc", action="store_true", help="serve the apiserver in this process")
    args = ap.parse_args()
    n = 1000 if args.quick else args.pods
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        kc = os.path.join(tmp, "kubeconfig")
        if args.inproc:
            out = trio.run(run_inproc, n, args.workers, args.pod_concurrency, kc)
        else:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bigfleet_trio", "sim", "apiserver", "--port", "0",
                 "--kubeconfig-out", kc, "--log-level", "error"],
                stdout=subprocess.PIPE, text=True)
            try:
                assert proc.stdout is not None
                line = proc.stdout.readline()
                if "listening" not in line:
                    print(f"apiserver did not start: {line!r}", file=sys.stderr)
                    return 1
                out = trio.run(bench, kc, n, args.workers, args.pod_concurrency, proc.pid)
            finally:
                proc.terminate()
                proc.wait(10)
    print(f"pods                      {n}")
    print(f"workers                   {args.workers}")
    print(f"apiserver                 {'in-process' if args.inproc else 'child process'}")
    for k, v in out.items():
        print(f"{k:25s} {v:10.2f}")
    verdict = "OK" if out["ratio"] >= 0.8 else "BELOW TARGET"
    print(f"ratio crs_per_s / raw_cr_create_per_s = {out['ratio']:.2f} "
          f"(target >= 0.8: {verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
