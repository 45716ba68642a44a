#!/usr/bin/env python
"""Benchmark: sync N CapacityRequests through an Informer.

Serves a paginated LIST of N realistic CapacityRequests from an ``httpx.MockTransport``
(objects are generated per page, so the fake server holds nothing), runs the informer until
``wait_synced()``, and reports time to synced and memory per cached object, for the full
objects and for a slim projection. Memory is measured twice: tracemalloc (bytes still allocated
after sync, minus the baseline) and the process RSS growth (each mode runs in a fresh process).

Modes: ``full`` (no transform: the whole object is cached), ``slim`` (the operator's real
projection, :func:`bigfleet_trio.operator.crview.slim`), ``tuple`` (an interned-tuple projection:
a lower bound for what any dict-free projection could reach).

Usage: ``python -m scripts.bench._informer_probe [--count 100000] [--mode both|full|slim|tuple]
[--page-size 500]`` (also ``python -m scripts.bench informer``, which repeats and tabulates).
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
from pathlib import Path
from typing import Any

import httpx
import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.informer import Informer
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS
from bigfleet_trio.operator.crview import slim as operator_slim

ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]
FAMILIES = ["m5", "c5", "r5", "m6i"]


def make_cr(i: int, rv: int) -> dict[str, Any]:
    ns = f"team-{i % 50}"
    return {
        "apiVersion": "bigfleet.lucy.sh/v1alpha1",
        "kind": "CapacityRequest",
        "metadata": {
            "name": f"pod-{i:07d}-cr",
            "namespace": ns,
            "uid": f"5c1e{i:08x}-1f2a-4b3c-9d8e-7f6a5b4c3d2e",
            "resourceVersion": str(rv),
            "generation": 1,
            "creationTimestamp": "2026-11-21T10:00:00Z",
            "labels": {"bigfleet.lucy.sh/pod": f"pod-{i:07d}", "app": f"app-{i % 200}"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": f"pod-{i:07d}",
                    "uid": f"9a8b{i:08x}-0000-4000-8000-00000000abcd",
                    "controller": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "bigfleet-podcontroller",
                    "operation": "Update",
                    "apiVersion": "bigfleet.lucy.sh/v1alpha1",
                    "time": "2026-11-21T10:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:priority": {}, "f:resources": {}}},
                }
            ],
        },
        "spec": {
            "priority": (i % 10) * 100,
            "resources": {"cpu": f"{(i % 8) + 1}", "memory": f"{((i % 16) + 1) * 512}Mi"},
            "requirements": [
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONES[i % 3]]},
                {
                    "key": "node.kubernetes.io/instance-type",
                    "operator": "In",
                    "values": [f"{FAMILIES[i % 4]}.xlarge", f"{FAMILIES[i % 4]}.2xlarge"],
                },
            ],
            "interruptionPenalty": "2",
            "reclamationPenalty": "1",
        },
        "status": {"phase": "Acknowledged", "acknowledgedAt": "2026-11-21T10:00:01Z"},
    }


_interned: dict[Any, Any] = {}


def _intern(value: Any) -> Any:
    return _interned.setdefault(value, value)


def tuple_slim(obj: dict[str, Any]) -> tuple[Any, ...]:
    """Projection the operator's rollup needs: (uid, rv, priority, cpu, memory, requirements,
    interruption, reclamation, phase); repeated values are interned/shared."""
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    res = spec.get("resources") or {}
    reqs = tuple(
        _intern((r.get("key"), r.get("operator"), tuple(r.get("values") or ())))
        for r in spec.get("requirements") or ()
    )
    return (
        meta.get("uid"),
        meta.get("resourceVersion"),
        spec.get("priority"),
        _intern(res.get("cpu")),
        _intern(res.get("memory")),
        _intern(reqs),
        _intern(spec.get("interruptionPenalty")),
        _intern(spec.get("reclamationPenalty")),
        _intern((obj.get("status") or {}).get("phase")),
    )


def make_pages(count: int, page_size: int) -> dict[int, bytes]:
    """Pre-rendered LIST pages keyed by start offset (built before measuring, so neither the
    rendering time nor the fake server's memory counts against the informer)."""
    list_rv = count + 1000
    pages: dict[int, bytes] = {}
    for start in range(0, count, page_size):
        end = min(count, start + page_size)
        meta: dict[str, Any] = {"resourceVersion": str(list_rv)}
        if end < count:
            meta["continue"] = str(end)
        pages[start] = json.dumps(
            {
                "kind": "CapacityRequestList",
                "apiVersion": "bigfleet.lucy.sh/v1alpha1",
                "metadata": meta,
                "items": [make_cr(i, 100 + i) for i in range(start, end)],
            }
        ).encode()
    return pages


def transport(pages: dict[int, bytes]) -> httpx.MockTransport:
    async def handler(request: httpx.Request) -> httpx.Response:
        params = request.url.params
        if params.get("watch") == "1":
            send, recv = trio.open_memory_channel[bytes](0)

            class Body(httpx.AsyncByteStream):
                async def __aiter__(self):  # type: ignore[no-untyped-def]
                    async for chunk in recv:
                        yield chunk

            request.extensions["keep"] = send  # keep the stream open (never sends)
            return httpx.Response(200, stream=Body())
        start = int(params.get("continue") or 0)
        return httpx.Response(
            200, content=pages[start], headers={"content-type": "application/json"}
        )

    return httpx.MockTransport(handler)


def rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def run_once(count: int, mode: str, page_size: int, trace: bool) -> dict[str, Any]:
    pages = make_pages(count, page_size)
    gc.collect()
    rss0 = rss_bytes()
    if trace:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0] if trace else 0
    client = KubeClient(KubeConfig(server="http://bench"), transport=transport(pages), qps=0)
    transform = {"slim": operator_slim, "tuple": tuple_slim}.get(mode)
    inf = Informer(client, CAPACITY_REQUESTS, transform=transform, page_size=page_size)
    t0 = time.perf_counter()
    async with trio.open_nursery() as n:
        await n.start(inf.run)
        await inf.wait_synced()
        elapsed = time.perf_counter() - t0
        n.cancel_scope.cancel()
    gc.collect()
    held = (tracemalloc.get_traced_memory()[0] - base) if trace else 0
    if trace:
        tracemalloc.stop()
    rss = rss_bytes() - rss0
    assert len(inf.store) == count
    return {
        "mode": mode,
        "count": count,
        "seconds_to_synced": round(elapsed, 2),
        "tracemalloc_bytes_per_object": round(held / count) if trace else None,
        "rss_bytes_per_object": round(rss / count),
        "store_len": len(inf.store),
        "_keep": inf,
    }


def measure(mode: str, count: int, page_size: int = 500) -> dict[str, dict[str, Any]]:
    """One fresh child process per measurement: ``{"rss": {...}, "trace": {...}}``."""
    out: dict[str, Any] = {}
    for child in ("rss", "trace"):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "scripts.bench._informer_probe",
                "--child",
                child,
                "--mode",
                mode,
                "--count",
                str(count),
                "--page-size",
                str(page_size),
            ],
            capture_output=True,
            text=True,
            check=True,
            env=os.environ.copy(),
            cwd=Path(__file__).resolve().parents[2],
        )
        out[child] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--mode", choices=["both", "full", "slim", "tuple"], default="both")
    ap.add_argument("--page-size", type=int, default=500)
    ap.add_argument("--child", choices=["rss", "trace"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        res = trio.run(run_once, args.count, args.mode, args.page_size, args.child == "trace")
        res.pop("_keep")
        print(json.dumps(res))
        return 0
    modes = ["full", "slim"] if args.mode == "both" else [args.mode]
    print(f"{'mode':5} {'objects':>8} {'synced_s':>9} {'rss_B/obj':>10} {'traced_B/obj':>13}")
    for mode in modes:
        out = measure(mode, args.count, args.page_size)
        print(
            f"{mode:5} {args.count:8d} {out['rss']['seconds_to_synced']:9.2f} "
            f"{out['rss']['rss_bytes_per_object']:10d} "
            f"{out['trace']['tracemalloc_bytes_per_object']:13d}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
