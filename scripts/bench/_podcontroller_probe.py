"""Child processes of ``bench podcontroller``: our pod controller, the raw-write baseline, and
the cache-memory probe. Each prints JSON lines on stdout for the parent (the kopf peer is
``_kopf_peer``)::

    python -m scripts.bench._podcontroller_probe ours --kubeconfig FILE [--workers 16]
    python -m scripts.bench._podcontroller_probe raw --kubeconfig FILE [--workers 16]
    python -m scripts.bench._podcontroller_probe cache --kubeconfig FILE [--full-objects]

``ours`` runs :class:`PodController` (no client-side rate limit: kopf has none) until killed.
``raw`` POSTs the controller's own CR bodies for every Pod (built before the clock starts)
then merge-patches each ``status.phase: Pending``, ``--workers`` concurrent tasks, and prints
its CPU per write. ``cache`` starts the controller's Pod informer (or one keeping full Pods)
and prints the RSS before and after it synced.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import time
from typing import Any

import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import load_kubeconfig
from bigfleet_trio.kube.informer import Informer
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, PODS
from bigfleet_trio.podcontroller.controller import PodController
from bigfleet_trio.podcontroller.translate import build_capacity_request, translate_pod

UNLIMITED: dict[str, Any] = {"qps": 0, "burst": 1}


PRIORITY_CLASSES = 10


def priority_class(k: int) -> dict[str, Any]:
    """PriorityClass ``bench-p<k>`` (value ``100 k``), for :func:`pod` with ``classes``."""
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": f"bench-p{k}"}, "value": 100 * k}


def pod(i: int, classes: bool = False) -> dict[str, Any]:
    """Pod number ``i`` of the workload (a Deployment-like Pod, one container; no owner: the
    embedded apiserver's garbage collector would remove a Pod whose owner does not exist).

    ``classes``: a real apiserver's Priority admission refuses ``spec.priority`` set by the
    client, so the Pod names one of :data:`PRIORITY_CLASSES` PriorityClasses instead of
    carrying one of 1,000 priority values."""
    out = _pod(i)
    if classes:
        del out["spec"]["priority"]
        out["spec"]["priorityClassName"] = f"bench-p{i % PRIORITY_CLASSES}"
    return out


def _pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"bench-{i:06d}", "namespace": "default",
                     "labels": {"app": f"a{i % 50}", "pod-template-hash": "5d8f7c9b6"}},
        "spec": {
            "priority": i % 1000,
            "nodeSelector": {"topology.kubernetes.io/zone": f"zone-{i % 3}"},
            "containers": [{"name": "app", "image": "registry.example.com/app:1.2.3",
                            "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                            "env": [{"name": "MODE", "value": "serve"}],
                            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                                          "limits": {"memory": "1Gi"}}}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 300}],
        },
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


def cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds (user+sys) of this process (pid None) or of another one."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kb(pid: int | str = "self", field: str = "VmRSS") -> int:
    """``VmRSS`` (or ``VmHWM``: the peak) of a process, in KiB."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def emit(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


async def create_pods(kubeconfig: str, n: int, conc: int = 32, classes: bool = False) -> float:
    """Create Pods 0..n-1 (``classes``: with PriorityClasses, created first if missing);
    returns seconds."""
    from bigfleet_trio.kube.errors import AlreadyExists
    from bigfleet_trio.kube.resources import PRIORITY_CLASSES as PCS

    async with KubeClient(load_kubeconfig(kubeconfig, env={}), **UNLIMITED) as client:
        for k in range(PRIORITY_CLASSES if classes else 0):
            try:
                await client.create(PCS, priority_class(k))
            except AlreadyExists:
                pass
        return await fan_out(n, conc, lambda i: client.create(PODS, pod(i, classes)))


def count_events(informers: dict[str, Informer]) -> dict[str, int]:
    """Counters of what each informer hands its handlers, ``"<kind> <ADDED|MODIFIED|DELETED>"``
    (a LIST's objects are ADDED), filled as events arrive; ``"<kind> MODIFIED skipped"`` is
    read from the informer when :func:`write_counts` runs."""
    counts: dict[str, int] = {}

    def bump(key: str) -> None:
        counts[key] = counts.get(key, 0) + 1

    for kind, inf in informers.items():
        inf.add_handler(on_add=lambda _n, k=kind: bump(f"{k} ADDED"),
                        on_update=lambda _o, _n, k=kind: bump(f"{k} MODIFIED"),
                        on_delete=lambda _o, k=kind: bump(f"{k} DELETED"))
    return counts


async def write_counts(path: str, counts: dict[str, int],
                       informers: dict[str, Informer]) -> None:
    """Rewrite ``path`` (JSON) with ``counts`` every 0.25 s until cancelled (the bench kills
    the process: what it reads is at most 0.25 s old)."""
    while True:
        snapshot = dict(counts)
        for kind, inf in informers.items():
            snapshot[f"{kind} MODIFIED skipped"] = inf.unchanged_events
        await trio.Path(path + ".tmp").write_text(json.dumps(snapshot))
        os.replace(path + ".tmp", path)
        await trio.sleep(0.25)


async def run_ours(kubeconfig: str, workers: int, protobuf: bool = True,
                   counts_path: str | None = None) -> None:
    async with KubeClient(load_kubeconfig(kubeconfig, env={}), **UNLIMITED,
                          protobuf=protobuf) as client:
        ctl = PodController(client, workers=workers, resync_period=3600)
        informers = {"Pod": ctl.pods, "CapacityRequest": ctl.crs}
        counts = count_events(informers)
        async with trio.open_nursery() as nursery:
            if counts_path:
                nursery.start_soon(write_counts, counts_path, counts, informers)
            await nursery.start(ctl.run)
            emit(event="synced", pods=len(ctl.pods.store))
            await trio.sleep_forever()


async def run_raw(kubeconfig: str, workers: int) -> None:
    async with KubeClient(load_kubeconfig(kubeconfig, env={}), **UNLIMITED) as client:
        pods = (await client.list(PODS, "default")).items
        bodies = [build_capacity_request(p, translate_pod(p, None)) for p in pods]
        names = [b["metadata"]["name"] for b in bodies]
        n = len(bodies)
        c0 = cpu_seconds()
        t_create = await fan_out(n, workers, lambda i: client.create(CAPACITY_REQUESTS, bodies[i]))
        c1 = cpu_seconds()
        t_stamp = await fan_out(n, workers, lambda i: client.patch(
            CAPACITY_REQUESTS, names[i], {"status": {"phase": "Pending"}}, "default",
            subresource="status"))
        c2 = cpu_seconds()
        emit(event="done", writes=2 * n, seconds=t_create + t_stamp, create_seconds=t_create,
             create_cpu_ms_per_write=(c1 - c0) / n * 1000,
             stamp_cpu_ms_per_write=(c2 - c1) / n * 1000,
             cpu_ms_per_write=(c2 - c0) / (2 * n) * 1000)


async def run_cache(kubeconfig: str, full_objects: bool) -> None:
    gc.collect()
    before = rss_kb()
    async with KubeClient(load_kubeconfig(kubeconfig, env={}), **UNLIMITED) as client:
        if full_objects:
            inf = Informer(client, PODS, page_size=500)
        else:  # exactly the controller's Pod cache
            inf = PodController(client).pods
        async with trio.open_nursery() as nursery:
            await nursery.start(inf.run)
            await inf.wait_synced()
            gc.collect()
            emit(event="cached", pods=len(inf.store), rss_before_kb=before, rss_after_kb=rss_kb())
            nursery.cancel_scope.cancel()


def _profile_to(path: str) -> None:
    """Sample this process's on-CPU stacks with py-spy (``pip install py-spy``; waiting on the
    server is not sampled) from now on; py-spy's collapsed stacks go to ``path`` when the
    process is stopped (SIGTERM: how the bench stops a contestant) or exits."""
    import atexit
    import shutil
    import signal
    import subprocess
    import sys

    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    proc = subprocess.Popen([spy, "record", "--pid", str(os.getpid()), "--rate", "250",
                             "--format", "raw", "--output", path, "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the work starts

    def write() -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
            proc.wait(30)

    def on_term(_sig: int, _frame: Any) -> None:
        write()
        os._exit(0)

    atexit.register(write)
    signal.signal(signal.SIGTERM, on_term)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["ours", "raw", "cache"])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--full-objects", action="store_true")
    ap.add_argument("--json", action="store_true",
                    help="ours: Pods in JSON (--kube-api-content-type application/json)")
    ap.add_argument("--counts", metavar="FILE",
                    help="ours: informer events by kind and type, rewritten to FILE (JSON)")
    ap.add_argument("--profile", metavar="FILE",
                    help="sample on-CPU stacks with py-spy (pip install py-spy); collapsed "
                    "stacks written to FILE when the process is stopped (SIGTERM) or ends")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.profile:
        _profile_to(args.profile)
    if args.mode == "ours":
        trio.run(run_ours, args.kubeconfig, args.workers, not args.json, args.counts)
    elif args.mode == "raw":
        trio.run(run_raw, args.kubeconfig, args.workers)
    else:
        trio.run(run_cache, args.kubeconfig, args.full_objects)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
