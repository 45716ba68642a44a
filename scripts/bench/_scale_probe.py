"""Child processes of ``bench scale``: a sim apiserver holding N Pods (with their CRs) that takes
commands on stdin, and the pod controller (or the operator's CR cache and roll-up) sampling its
own event-loop lag and RSS::

    python -m scripts.bench._scale_probe server --pods N [--crs]
    python -m scripts.bench._scale_probe podcontroller --kubeconfig FILE
    python -m scripts.bench._scale_probe operator --kubeconfig FILE

``server`` fills its store in-process (no HTTP), prints its URL, then reads commands from
stdin, one a line: ``relist`` (drop every watch and forget the watch history, so each watcher's
re-watch gets 410 Expired and relists), ``churn`` (delete every Pod, with its CR, and create as
many new Pods; 1,000 per step, yielding between steps) and ``stats``. It prints one JSON line
per command when done.

The agent children print one JSON line every 0.5 s: wall time, the worst event-loop lag since
the last line (a task sleeping 50 ms in a loop, measured as ``bigfleet_event_loop_lag_seconds``
is: how late it woke), VmRSS, cache sizes, relists, queue length.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from typing import Any

import trio
import trio.lowlevel

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import load_kubeconfig
from scripts.bench._podcontroller_probe import UNLIMITED, rss_kb

ZONES = ("zone-a", "zone-b", "zone-c")


def realistic_pod(i: int, gen: int = 0) -> dict[str, Any]:
    """Pod ``i`` of a Deployment-like workload as a real apiserver stores it (labels, owner,
    managedFields, a status with conditions, bound to one of 5,000 Nodes): about 3 KB of JSON."""
    app = f"app-{i % 200}"
    name = f"{app}-5d8f7c9b6-g{gen}-{i:07d}"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": f"team-{i % 20}", "generateName": f"{app}-5d8f7c9b6-",
            "labels": {"app": app, "pod-template-hash": "5d8f7c9b6", "tier": "backend"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-20T10:00:00Z"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": f"{app}-5d8f7c9b6", "controller": True,
                                 "blockOwnerDeletion": True,
                                 "uid": f"0f6e{i % 200:08x}-aaaa-4bbb-8ccc-0123456789ab"}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                               "apiVersion": "v1", "time": "2026-11-20T10:00:00Z",
                               "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}},
                                            "f:spec": {"f:containers": {}}}}],
        },
        "spec": {
            "priority": (i % 10) * 100,
            "nodeName": f"node-{i % 5000:04d}",  # bound, as nearly every Pod of a cluster
            "nodeSelector": {"topology.kubernetes.io/zone": ZONES[i % 3]},
            "containers": [{
                "name": "app", "image": f"registry.example.com/{app}:1.2.3",
                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "env": [{"name": "MODE", "value": "serve"}, {"name": "LOG", "value": "info"}],
                "resources": {"requests": {"cpu": f"{(i % 4 + 1) * 250}m", "memory": "1Gi"},
                              "limits": {"memory": "1Gi"}},
                "volumeMounts": [{"name": "kube-api-access", "readOnly": True,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log",
                "imagePullPolicy": "IfNotPresent"}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 300}],
            "restartPolicy": "Always", "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "schedulerName": "default-scheduler",
            "terminationGracePeriodSeconds": 30,
        },
    }


# -- the server ----------------------------------------------------------------------------------


class _Fill:
    """Creates Pods (and, with ``crs``, each Pod's CR stamped Pending, as the controller would
    have left it) straight into the sim apiserver's store."""

    def __init__(self, api: Any, crs: bool) -> None:
        self.api = api
        self.crs = crs
        self.pods_res = api.find("pods")
        self.cr_res = api.find("capacityrequests")
        self.live: list[tuple[str, str]] = []
        ns_res = api.find("namespaces")
        for k in range(20):
            api.create(ns_res, None, {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": f"team-{k}"}})

    def pod(self, i: int, gen: int) -> None:
        from bigfleet_trio.podcontroller.translate import build_capacity_request, translate_pod

        body = realistic_pod(i, gen)
        ns = body["metadata"]["namespace"]
        made = self.api.create(self.pods_res, ns, body)
        self.live.append((ns, made["metadata"]["name"]))
        if self.crs:
            cr = build_capacity_request(made, translate_pod(made, None))
            self.api.create(self.cr_res, ns, cr)
            self.api.patch(self.cr_res, ns, cr["metadata"]["name"],
                           {"status": {"phase": "Pending"}},
                           "application/merge-patch+json", subresource="status")

    async def churn(self, gen: int) -> None:
        old, self.live = self.live, []
        for i, (ns, name) in enumerate(old):
            self.api.delete(self.pods_res, ns, name)  # its CR goes with it (ownerReference GC)
            self.pod(i, gen)
            if i % 1000 == 999:
                await trio.lowlevel.checkpoint()


async def serve_server(pods: int, crs: bool, history: int) -> None:
    from bigfleet_trio.sim.apiserver import ApiServer, serve

    api = ApiServer(history=history, gc_dangling=False)
    fill = _Fill(api, crs)
    t0 = time.perf_counter()
    for i in range(pods):
        fill.pod(i, 0)
    gc.collect()
    gc.freeze()  # the store is long-lived: keep the collector off it
    filled = time.perf_counter() - t0
    async with trio.open_nursery() as nursery:
        url = await nursery.start(lambda task_status: serve(api, engine="fast",
                                                             task_status=task_status))
        print(json.dumps({"url": url, "filled_s": round(filled, 1)}), flush=True)
        gen = 0
        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            cmd = line.strip()
            if not line:
                nursery.cancel_scope.cancel()
                return
            t1 = time.perf_counter()
            if cmd == "relist":
                api.store.rv += 1  # every watcher's resourceVersion is now older than the store's
                api.faults.drop_watches()
                api.faults.compact()
            elif cmd == "churn":
                gen += 1
                await fill.churn(gen)
            print(json.dumps({"done": cmd, "s": round(time.perf_counter() - t1, 1),
                              "pods": len(fill.live), "rss_kb": rss_kb()}), flush=True)


# -- the agent children ----------------------------------------------------------------------


class Sampler:
    """Worst event-loop lag, the longest garbage-collector pass and RSS, printed as a JSON line
    every ``report`` seconds."""

    def __init__(self, stats: Any, interval: float = 0.05, report: float = 0.5) -> None:
        self.stats = stats
        self.interval = interval
        self.report = report
        self.worst = 0.0
        self.gc_worst = 0.0
        self._gc_start = 0.0
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc_worst = max(self.gc_worst, time.perf_counter() - self._gc_start)

    async def run(self) -> None:
        last = trio.current_time()
        while True:
            t0 = trio.current_time()
            await trio.sleep(self.interval)
            now = trio.current_time()
            self.worst = max(self.worst, now - t0 - self.interval)
            if now - last >= self.report:
                print(json.dumps({"t": time.time(), "lag": round(self.worst, 4),
                                  "gc": round(self.gc_worst, 4), "rss_kb": rss_kb(),
                                  # live pymalloc blocks: RSS that grows while they do not is
                                  # the allocator holding freed memory, not live objects
                                  "blocks": sys.getallocatedblocks(),
                                  "cpu_s": round(time.process_time(), 3),
                                  **self.stats()}), flush=True)
                self.worst = self.gc_worst = 0.0
                last = now


async def run_podcontroller(kubeconfig: str, workers: int, watch_list: bool = False) -> None:
    from bigfleet_trio.podcontroller.controller import PodController
    from bigfleet_trio.podcontroller.scope import PodScope

    gc.collect()
    base = rss_kb()
    async with KubeClient(load_kubeconfig(kubeconfig, env={}), **UNLIMITED) as client:
        # the binary's defaults (its Node cache, the nodeName kept per bound Pod)
        ctl = PodController(client, workers=workers, resync_period=3600, watch_list=watch_list,
                            freeze_heap=os.environ.get("BIGFLEET_BENCH_FREEZE", "1") == "1",
                            scope=PodScope.parse())

        def stats() -> dict[str, Any]:
            return {"base_kb": base, "pods": len(ctl.pods.store), "crs": len(ctl.crs.store),
                    "relists": ctl.pods.relists + ctl.crs.relists, "queue": len(ctl.queue),
                    "synced": ctl.synced, "done": sum(ctl.outcomes.values())}

        async with trio.open_nursery() as nursery:
            nursery.start_soon(Sampler(stats).run)
            await nursery.start(ctl.run)
            await trio.sleep_forever()


async def run_operator(kubeconfig: str, watch_list: bool = False) -> None:
    """The operator's CR cache (its transform) feeding the incremental roll-up, and the
    roll-up's from-scratch consistency check over the cache every 10 s (the operator runs it
    every ``consistency_interval``)."""
    from bigfleet_trio.kube.informer import Informer
    from bigfleet_trio.kube.resources import CAPACITY_REQUESTS
    from bigfleet_trio.operator.crview import slim
    from bigfleet_trio.operator.wiring import CapacityRequestRollup

    gc.collect()
    base = rss_kb()
    async with KubeClient(load_kubeconfig(kubeconfig, env={}), **UNLIMITED) as client:
        inf = Informer(client, CAPACITY_REQUESTS, transform=slim, watch_list=watch_list,
                       freeze_heap=os.environ.get("BIGFLEET_BENCH_FREEZE", "1") == "1")
        source = CapacityRequestRollup("bench", events=None, acknowledger=None)
        source.attach(inf)
        rollups = [0]

        def stats() -> dict[str, Any]:
            return {"base_kb": base, "crs": len(inf.store), "relists": inf.relists,
                    "synced": inf.synced, "queue": 0, "done": rollups[0]}

        async with trio.open_nursery() as nursery:
            nursery.start_soon(Sampler(stats).run)
            await nursery.start(inf.run)
            await inf.wait_synced()
            while True:
                await source.check_consistency()
                rollups[0] += 1
                await trio.sleep(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["server", "podcontroller", "operator"])
    ap.add_argument("--kubeconfig")
    ap.add_argument("--pods", type=int, default=10_000)
    ap.add_argument("--crs", action="store_true", help="server: each Pod's CR too")
    ap.add_argument("--history", type=int, default=400_000)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--watch-list", action="store_true", help="agent: streaming lists")
    args = ap.parse_args()
    if args.mode == "server":
        trio.run(serve_server, args.pods, args.crs, args.history)
    elif args.mode == "podcontroller":
        trio.run(run_podcontroller, args.kubeconfig, args.workers, args.watch_list)
    else:
        trio.run(run_operator, args.kubeconfig, args.watch_list)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
