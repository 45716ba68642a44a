#!/usr/bin/env python
"""Benchmark the embedded apiserver.

In-process (no HTTP): creates/s and merge-patches/s of CapacityRequests and RSS growth for
``--objects`` stored objects, plus the time to list them all over HTTP.

Over HTTP, for each engine (hypercorn, fast): the server runs in its own process; ``--conc``
httpx clients create ``--http`` CapacityRequests, then merge-patch each, then status-patch each.
Reported: client-observed writes/s and the server's own CPU per request (from /proc), which is
the server's capacity limit independent of how fast the Python client is.

Usage: python -m scripts.bench._apiserver_probe [--objects 100000] [--http 3000] [--conc 16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx
import trio
import yaml

CR = "/apis/bigfleet.lucy.sh/v1alpha1/namespaces/default/capacityrequests"
MERGE = {"content-type": "application/merge-patch+json"}

SERVER = """
import functools, sys, trio
from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig
async def main():
    api = ApiServer()
    async with trio.open_nursery() as n:
        url = await n.start(functools.partial(serve, api, engine=sys.argv[1]))
        write_kubeconfig(url, sys.argv[2])
        print(url, flush=True)
trio.run(main)
"""


def body(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "bigfleet.lucy.sh/v1alpha1",
        "kind": "CapacityRequest",
        "metadata": {"name": f"req-{i:06d}", "labels": {"app": f"a{i % 50}"}},
        "spec": {
            "priority": i % 1000,
            "resources": {"cpu": "500m", "memory": "1Gi"},
            "requirements": [
                {
                    "key": "topology.kubernetes.io/zone",
                    "operator": "In",
                    "values": ["us-east-1a", "us-east-1b"],
                }
            ],
        },
    }


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def inprocess(n: int) -> dict[str, float]:
    from bigfleet_trio.sim.apiserver import ApiServer, serve

    before = rss_mb()
    api = ApiServer()
    res = api.find("capacityrequests")
    t0 = time.perf_counter()
    for i in range(n):
        api.create(res, "default", body(i))
    create_s = time.perf_counter() - t0
    after_create = rss_mb()
    t0 = time.perf_counter()
    for i in range(n):
        api.patch(
            res,
            "default",
            f"req-{i:06d}",
            {"spec": {"priority": 7}},
            "application/merge-patch+json",
        )
    patch_s = time.perf_counter() - t0
    out = {
        "inproc_create_per_s": n / create_s,
        "inproc_merge_patch_per_s": n / patch_s,
        "rss_mb_after_creates": after_create - before,
        "rss_mb_after_patches_incl_history": rss_mb() - before,
    }
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            lambda task_status: serve(api, engine="fast", task_status=task_status)
        )
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            t0 = time.perf_counter()
            r = await c.get("/apis/bigfleet.lucy.sh/v1alpha1/capacityrequests")
            out["http_full_list_s"] = time.perf_counter() - t0
            out["http_full_list_mb"] = len(r.content) / 1e6
            assert len(r.json()["items"]) == n
            t0 = time.perf_counter()
            cont = ""
            while True:
                params = {"limit": "500", **({"continue": cont} if cont else {})}
                cont = (
                    (await c.get("/apis/bigfleet.lucy.sh/v1alpha1/capacityrequests", params=params))
                    .json()["metadata"]
                    .get("continue", "")
                )
                if not cont:
                    break
            out["http_paged_list_500_s"] = time.perf_counter() - t0
        nursery.cancel_scope.cancel()
    return out


async def over_http(engine: str, n: int, conc: int) -> dict[str, float]:
    kc = tempfile.mktemp(suffix=".yaml")
    # Benchmark set-up, before any measurement: blocking start-up of the server child is fine.
    cmd = [sys.executable, "-c", SERVER, engine, kc]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)  # noqa: ASYNC220
    assert proc.stdout is not None
    proc.stdout.readline()
    with open(kc) as fh:  # noqa: ASYNC230
        url = yaml.safe_load(fh)["clusters"][0]["cluster"]["server"]
    out: dict[str, float] = {}
    try:
        limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as c:

            async def phase(label: str, fn: Any) -> None:
                todo = iter(range(n))

                async def worker() -> None:
                    for i in todo:
                        r = await fn(i)
                        assert r.status_code < 300, r.text

                cpu0 = proc_cpu(proc.pid)
                t0 = time.perf_counter()
                async with trio.open_nursery() as wn:
                    for _ in range(conc):
                        wn.start_soon(worker)
                out[f"{engine}_{label}_per_s"] = n / (time.perf_counter() - t0)
                out[f"{engine}_{label}_server_ms_per_req"] = (proc_cpu(proc.pid) - cpu0) / n * 1000

            await phase(
                "create",
                lambda i: c.post(
                    CR, content=json.dumps(body(i)), headers={"content-type": "application/json"}
                ),
            )
            await phase(
                "merge_patch",
                lambda i: c.patch(
                    f"{CR}/req-{i:06d}", content=b'{"spec":{"priority":7}}', headers=MERGE
                ),
            )
            await phase(
                "status_patch",
                lambda i: c.patch(
                    f"{CR}/req-{i:06d}/status",
                    content=b'{"status":{"phase":"Acknowledged"}}',
                    headers=MERGE,
                ),
            )
    finally:
        proc.terminate()
        proc.wait()
        os.unlink(kc)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--http", type=int, default=3_000)
    ap.add_argument("--conc", type=int, default=16)
    args = ap.parse_args()
    results = trio.run(inprocess, args.objects)
    for engine in ("hypercorn", "fast"):
        results.update(trio.run(over_http, engine, args.http, args.conc))
    for k, v in results.items():
        print(f"{k:42s} {v:12.2f}")


if __name__ == "__main__":
    main()
