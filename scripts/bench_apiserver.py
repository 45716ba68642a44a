#!/usr/bin/env python
"""Benchmark the embedded apiserver (issue 3 "Benchmark").

Measures, over real HTTP (hypercorn + httpx, CONCURRENCY parallel clients):
  * creates/s of CapacityRequests,
  * merge-patches/s (main resource) and status merge-patches/s,
  * a full list of all objects (seconds, MB),
and in-process (no HTTP) the same creates/s, plus RSS growth for N stored objects.

Usage: .venv/bin/python scripts/bench_apiserver.py [--objects 100000] [--http 5000] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import httpx
import trio

from bigfleet_trio.sim.apiserver import ApiServer, serve

CR = "/apis/bigfleet.lucy.sh/v1alpha1/namespaces/default/capacityrequests"


def body(i: int) -> dict:
    return {
        "apiVersion": "bigfleet.lucy.sh/v1alpha1",
        "kind": "CapacityRequest",
        "metadata": {"name": f"req-{i:06d}", "labels": {"app": f"a{i % 50}"}},
        "spec": {
            "priority": i % 1000,
            "resources": {"cpu": "500m", "memory": "1Gi"},
            "requirements": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a", "us-east-1b"]}],
        },
    }


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def http_phase(n: int, conc: int) -> dict[str, float]:
    api = ApiServer()
    out: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve, api)
        limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as c:

            async def run(label: str, fn) -> None:
                todo = iter(range(n))

                async def worker() -> None:
                    for i in todo:
                        r = await fn(i)
                        assert r.status_code < 300, r.text

                t0 = time.perf_counter()
                async with trio.open_nursery() as wn:
                    for _ in range(conc):
                        wn.start_soon(worker)
                out[label] = n / (time.perf_counter() - t0)

            await run("http_create_per_s", lambda i: c.post(CR, content=json.dumps(body(i)), headers={"content-type": "application/json"}))
            await run("http_merge_patch_per_s", lambda i: c.patch(f"{CR}/req-{i:06d}", content=json.dumps({"spec": {"priority": 7}}),
                                                                  headers={"content-type": "application/merge-patch+json"}))
            await run("http_status_patch_per_s", lambda i: c.patch(f"{CR}/req-{i:06d}/status", content=json.dumps({"status": {"phase": "Acknowledged"}}),
                                                                   headers={"content-type": "application/merge-patch+json"}))
        nursery.cancel_scope.cancel()
    return out


async def big_phase(n: int) -> dict[str, float]:
    before = rss_mb()
    api = ApiServer()
    res = api.find("capacityrequests")
    t0 = time.perf_counter()
    for i in range(n):
        api.create(res, "default", body(i))
    create_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(n):
        api.patch(res, "default", f"req-{i:06d}", {"spec": {"priority": 7}}, "application/merge-patch+json")
    patch_s = time.perf_counter() - t0
    after = rss_mb()
    out = {
        "inproc_create_per_s": n / create_s,
        "inproc_merge_patch_per_s": n / patch_s,
        "rss_mb_for_objects": after - before,
        "rss_mb_total": after,
    }
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve, api)
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            t0 = time.perf_counter()
            r = await c.get("/apis/bigfleet.lucy.sh/v1alpha1/capacityrequests")
            out["http_full_list_s"] = time.perf_counter() - t0
            out["http_full_list_mb"] = len(r.content) / 1e6
            assert len(r.json()["items"]) == n
            t0 = time.perf_counter()
            cont = ""
            pages = 0
            while True:
                params = {"limit": "500"}
                if cont:
                    params["continue"] = cont
                page = (await c.get("/apis/bigfleet.lucy.sh/v1alpha1/capacityrequests", params=params)).json()
                pages += 1
                cont = page["metadata"].get("continue", "")
                if not cont:
                    break
            out["http_paged_list_500_s"] = time.perf_counter() - t0
        nursery.cancel_scope.cancel()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--http", type=int, default=5_000)
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    results = trio.run(big_phase, args.objects)
    results.update(trio.run(http_phase, args.http, args.concurrency))
    for k, v in results.items():
        print(f"{k:28s} {v:12.1f}")


if __name__ == "__main__":
    main()
