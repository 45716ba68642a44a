"""``python -m scripts.bench fleet``: a soak of the whole agent through the real CLI processes.

Five processes on loopback, as in production: the embedded apiserver (fast engine), ``sim
cluster --kubeconfig`` (workload controllers + scheduler/kubelet), ``sim shard`` (a fleet
catalog of ``--machines`` machines, shard-side timestamps at ``--stats-addr``), ``pod-controller``
and ``operator``. The bench itself applies workloads cloned from the bundled real manifests
(``bigfleet_trio/sim/workloads``: zone/hostname-spread and co-located Deployments, a StatefulSet,
GPU Deployments and Jobs, CPU Jobs) to ``--pods`` Pods, about ``--per-profile`` Pods per Profile
(each clone has its own requests, so one clone = one Profile), and watches Pods, CRs and
UpcomingNodes to time what the users watch.

Phases: ramp (everything applied, until every Pod is bound), churn (``--duration``: random
scale up/down of Deployments/StatefulSets, Jobs finishing after ``--job-run-seconds`` and
replaced), reclaim (a quarter of the scalable workloads to 0), quiesce (until CRs, the roll-up,
UpcomingNodes and bound machines agree). Per phase: Pod created -> CR exists; CR change -> the
roll-up carrying it; NodeStateUpdate sent -> UpcomingNode written; BootstrapRequest -> response
(and count past the 10 s one-cycle deadline); reclaim instruction -> ack; object counts; RSS and
CPU of every process (RSS growth per hour over churn); operator outbox drops and reconnects.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from scripts.bench import _common as C

log = logging.getLogger("bench.fleet")

OWNED_BY_POD = "bigfleet.lucy.sh/owned-by-pod"
BOOTSTRAP_DEADLINE = 10.0
PHASE_OF_STATE = {"SPECULATIVE": "Provisioning", "CREATING": "Provisioning", "IDLE": "Launched",
                  "CONFIGURING": "Registered", "CONFIGURED": "Ready"}
GPU = "nvidia.com/gpu"
PROCS = ("apiserver", "cluster", "shard", "pod-controller", "operator")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


# ------------------------------------------------------------------------------------------------
# The fleet: catalog and workloads (pure)
# ------------------------------------------------------------------------------------------------


def fleet_catalog(machines: int) -> dict[str, Any]:
    """A catalog of ~``machines`` machines in 3 zones: 8-core general purpose (2% warm) and
    2-GPU L4 machines (2% of the fleet, tainted as on GKE)."""
    gpu = max(3, machines // 50) // 3
    general = max(1, (machines - 3 * gpu) // 3)
    pods = {"pods": "110", "ephemeral-storage": "100Gi"}
    return {
        "zones": ["sim-zone-a", "sim-zone-b", "sim-zone-c"],
        "shapes": [
            {"instanceType": "sim-standard-8", "pricePerHour": 0.38, "count": general,
             "warm": max(1, general // 50),
             "allocatable": {"cpu": "8", "memory": "32Gi", **pods},
             "labels": {"cloud.google.com/compute-class": "Balanced"}},
            {"instanceType": "g2-standard-24", "pricePerHour": 2.0, "count": gpu,
             "allocatable": {"cpu": "24", "memory": "96Gi", GPU: "2", **pods},
             "labels": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
             "taints": [{"key": GPU, "value": "present", "effect": "NoSchedule"}]},
        ],
    }


def _set_requests(spec: dict[str, Any], cpu: str, memory: str) -> None:
    for c in spec.get("containers") or []:
        res = c.setdefault("resources", {})
        gpu = (res.get("limits") or {}).get(GPU) or (res.get("requests") or {}).get(GPU)
        res["requests"] = {"cpu": cpu, "memory": memory, **({GPU: gpu} if gpu else {})}
        res["limits"] = {GPU: gpu} if gpu else {}
    for c in spec.get("initContainers") or []:
        c.pop("resources", None)


@dataclass
class Workload:
    """One workload clone: kind, namespace, name, base size, and its body."""

    kind: str
    namespace: str
    name: str
    replicas: int
    body: dict[str, Any]
    gen: int = 0

    @property
    def scalable(self) -> bool:
        return self.kind in ("Deployment", "StatefulSet")


def fleet_workloads(pods: int, per_profile: int, seed: int,
                    job_share: float = 0.2) -> tuple[list[dict[str, Any]], list[Workload]]:
    """PriorityClasses and workload clones of the bundled manifests adding up to ~``pods`` Pods.

    Each clone gets its own cpu/memory requests (one Profile per clone), label ``app: <name>``
    (own selector), ~``per_profile`` replicas (GPU clones: 10); StatefulSets ``Parallel``;
    ``job_share`` of the CPU clones are Jobs, the rest 3:1 Deployments:StatefulSets.
    """
    from bigfleet_trio.podcontroller.expand import load_manifests
    from bigfleet_trio.sim.demo import bundled_workloads_dir, manifest_paths

    objs = load_manifests(manifest_paths(bundled_workloads_dir()))
    classes = [o for o in objs if o.get("kind") == "PriorityClass"]
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for o in objs:
        if o.get("kind") in ("Deployment", "StatefulSet", "Job"):
            spec = ((o.get("spec") or {}).get("template") or {}).get("spec") or {}
            is_gpu = any(GPU in json.dumps(c.get("resources") or {})
                         for c in spec.get("containers") or [])
            by_kind[("gpu-" if is_gpu else "") + o["kind"]].append(o)
    cpu_job = copy.deepcopy(by_kind["Deployment"][0])
    cpu_job["kind"], cpu_job["apiVersion"] = "Job", "batch/v1"
    cpu_job["spec"] = {"template": cpu_job["spec"]["template"]}
    by_kind["Job"].append(cpu_job)
    rng = random.Random(seed)
    jobs = round(20 * job_share)
    mix = ["Job"] * jobs + ["Deployment"] * round((20 - jobs) * 0.75)
    mix += ["StatefulSet"] * (20 - len(mix))
    gpu_mix = ["gpu-Deployment", "gpu-Job"]
    out: list[Workload] = []
    total = 0
    i = 0
    n_gpu = max(1, pods // (per_profile * 50))
    while total < pods:
        gpu = i < n_gpu
        family = gpu_mix[i % len(gpu_mix)] if gpu else mix[i % len(mix)]
        source = rng.choice(by_kind[family] or by_kind[family.removeprefix("gpu-")])
        kind = str(source["kind"])
        replicas = 10 if gpu else min(per_profile, pods - total)
        name = f"{kind.lower()[:3]}-{i:04d}"
        ns = f"fleet-{i % 10}"
        body = copy.deepcopy(source)
        body["metadata"] = {"name": name, "namespace": ns}
        spec = body.setdefault("spec", {})
        tpl = spec.setdefault("template", {})
        tpl.setdefault("metadata", {})["labels"] = {"app": name}
        pspec = tpl.setdefault("spec", {})
        cpu = f"{250 + (i * 37) % 500}m"
        memory = f"{512 + (i * 53) % 1024}Mi"
        _set_requests(pspec, "2" if gpu else cpu, "8Gi" if gpu else memory)
        pspec.pop("priorityClassName", None) if not gpu else None
        if kind == "Job":
            pspec["restartPolicy"] = "Never"
            spec.update({"completions": replicas, "parallelism": replicas,
                         "ttlSecondsAfterFinished": 5})
            spec.pop("selector", None)
        else:
            spec["replicas"] = replicas
            spec["selector"] = {"matchLabels": {"app": name}}
        if kind == "StatefulSet":
            spec["podManagementPolicy"] = "Parallel"
            spec.pop("volumeClaimTemplates", None)
        out.append(Workload(kind, ns, name, replicas, body))
        total += replicas
        i += 1
    return classes, out


# ------------------------------------------------------------------------------------------------
# Processes
# ------------------------------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    samples: list[tuple[float, float, float]] = field(default_factory=list)  # t, rss MB, cpu s

    def sample(self, t: float) -> None:
        try:
            with open(f"/proc/{self.popen.pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            with open(f"/proc/{self.popen.pid}/status") as fh:
                rss = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError):
            return
        self.samples.append((t, rss / 1024, cpu))


class Fleet:
    """The five processes (see the module docstring)."""

    def __init__(self, tmp: Path, machines: int, rollup_interval: str, job_run_seconds: float,
                 qps: float = 50.0):
        self.tmp = tmp
        self.kubeconfig = str(tmp / "kubeconfig")
        self.api_port = _free_port()
        self.shard_port = _free_port()
        self.stats_port = _free_port()
        self.metrics_port = _free_port()
        self.probe_ports = {"pod-controller": _free_port(), "operator": _free_port()}
        self.procs: dict[str, Proc] = {}
        self.machines = machines
        self.rollup_interval = rollup_interval
        self.job_run_seconds = job_run_seconds
        self.qps = ["--qps", f"{qps:g}", "--burst", f"{2 * qps:g}"]

    def _spawn(self, name: str, *args: str) -> None:
        out = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - lives with the process
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.procs[name] = Proc(name, subprocess.Popen([sys.executable, *args], stdout=out,
                                                       stderr=subprocess.STDOUT, env=env,
                                                       cwd=C.ROOT))

    def start(self) -> None:
        cat = self.tmp / "catalog.yaml"
        cat.write_text(yaml.safe_dump(fleet_catalog(self.machines)))
        self._spawn("apiserver", "-m", "bigfleet_trio.sim.apiserver", str(self.api_port),
                    self.kubeconfig, "fast")
        deadline = time.monotonic() + 60
        while not os.path.exists(self.kubeconfig):
            if time.monotonic() > deadline or self.procs["apiserver"].popen.poll() is not None:
                raise RuntimeError(f"apiserver did not start:\n{self.log('apiserver')}")
            time.sleep(0.1)
        quiet = ["--log-level", "warning"]
        self._spawn("cluster", "-m", "bigfleet_trio", "sim", "cluster", "--kubeconfig",
                    self.kubeconfig, "--job-run-seconds", str(self.job_run_seconds), *quiet)
        self._spawn("shard", "-m", "bigfleet_trio", "sim", "shard", "--port",
                    str(self.shard_port), "--kubeconfig", self.kubeconfig, "--catalog", str(cat),
                    "--stats-addr", f"127.0.0.1:{self.stats_port}", *quiet)
        self._spawn("pod-controller", "-m", "bigfleet_trio", "pod-controller", "--kubeconfig",
                    self.kubeconfig, "--metrics-addr", f"127.0.0.1:{_free_port()}",
                    "--health-probe-addr", f"127.0.0.1:{self.probe_ports['pod-controller']}",
                    *self.qps, *quiet)
        self._spawn("operator", "-m", "bigfleet_trio", "operator", "--kubeconfig",
                    self.kubeconfig, "--cluster-id", "fleet", "--shard-addr",
                    f"127.0.0.1:{self.shard_port}", "--metrics-addr",
                    f"127.0.0.1:{self.metrics_port}", "--health-probe-addr",
                    f"127.0.0.1:{self.probe_ports['operator']}", "--rollup-interval",
                    self.rollup_interval, *self.qps, *quiet)

    def wait_ready(self, limit: float = 120.0) -> None:
        """Until the pod controller and the operator answer /readyz with 200."""
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + limit
        for name, port in self.probe_ports.items():
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5):
                        break
                except (OSError, urllib.error.URLError):
                    pass
                if time.monotonic() > deadline or self.dead():
                    raise RuntimeError(f"{name} not ready:\n{self.log(name)}")
                time.sleep(0.2)

    def log(self, name: str, tail: int = 3000) -> str:
        try:
            return (self.tmp / f"{name}.log").read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def dead(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.popen.poll() is not None]

    def sample(self) -> None:
        t = time.time()
        for p in self.procs.values():
            p.sample(t)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.popen.poll() is None:
                p.popen.terminate()
        for p in self.procs.values():
            try:
                p.popen.wait(15)
            except subprocess.TimeoutExpired:
                p.popen.kill()


# ------------------------------------------------------------------------------------------------
# Observation (the bench's own watches)
# ------------------------------------------------------------------------------------------------


def _milli(q: Any) -> int:
    return int(Decimal(q.value) * 1000)


@dataclass
class Observed:
    phase: str = "start"
    pod_added: dict[str, tuple[float, str]] = field(default_factory=dict)   # uid -> t, phase
    cr_added: dict[str, float] = field(default_factory=dict)               # pod uid -> t
    pod_to_cr: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    cpu: int = 0
    mem: int = 0
    contrib: dict[str, tuple[int, int]] = field(default_factory=dict)
    states: list[tuple[float, int, int, str]] = field(default_factory=list)
    un_events: dict[str, list[tuple[float, str]]] = field(default_factory=lambda: defaultdict(list))
    phase_at: list[tuple[float, str]] = field(default_factory=list)

    def set_phase(self, name: str) -> None:
        self.phase = name
        self.phase_at.append((time.time(), name))

    def phase_of(self, t: float) -> str:
        cur = "start"
        for at, name in self.phase_at:
            if at <= t:
                cur = name
        return cur


def _pod_view(pod: dict[str, Any]) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "uid": meta.get("uid")},
            "node": (pod.get("spec") or {}).get("nodeName"),
            "job": any(r.get("kind") == "Job" for r in meta.get("ownerReferences") or ()),
            "phase": (pod.get("status") or {}).get("phase")}


def _cr_view(cr: dict[str, Any]) -> dict[str, Any]:
    meta = cr.get("metadata") or {}
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "labels": meta.get("labels") or {}},
            "spec": cr.get("spec") or {}}


def _un_view(un: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": (un.get("metadata") or {}).get("name")},
            "phase": (un.get("status") or {}).get("phase") or ""}


def _wire(obs: Observed, pods: Any, crs: Any, uns: Any) -> None:
    from bigfleet_trio.operator.rollup import CapacityRequestError, contribution_from_cr

    def pod_add(p: dict[str, Any]) -> None:
        obs.pod_added[str(p["metadata"]["uid"])] = (time.time(), obs.phase)

    def cr_change(key: str, cr: dict[str, Any] | None) -> None:
        old = obs.contrib.pop(key, (0, 0))
        new = (0, 0)
        if cr is not None:
            try:
                c = contribution_from_cr(cr)
                new = (_milli(c.resources["cpu"]) if "cpu" in c.resources else 0,
                       _milli(c.resources["memory"]) if "memory" in c.resources else 0)
                obs.contrib[key] = new
            except CapacityRequestError:
                pass
        if old != new:
            obs.cpu += new[0] - old[0]
            obs.mem += new[1] - old[1]
            obs.states.append((time.time(), obs.cpu, obs.mem, obs.phase))

    def cr_add(cr: dict[str, Any]) -> None:
        now = time.time()
        uid = cr["metadata"]["labels"].get(OWNED_BY_POD)
        if uid:
            obs.cr_added[uid] = now
            seen = obs.pod_added.get(uid)
            if seen is not None:
                obs.pod_to_cr[seen[1]].append(now - seen[0])
        cr_change(_k(cr), cr)

    def un_event(u: dict[str, Any]) -> None:
        obs.un_events[str(u["metadata"]["name"]).removeprefix("un-")].append(
            (time.time(), u["phase"]))

    pods.add_handler(on_add=pod_add)
    crs.add_handler(on_add=cr_add, on_update=lambda _o, n: cr_change(_k(n), n),
                    on_delete=lambda o: cr_change(_k(o), None))
    uns.add_handler(on_add=un_event, on_update=lambda o, n: un_event(n) if o["phase"] != n[
        "phase"] else None, on_delete=lambda o: un_event({**o, "phase": "Deleted"}))


def _k(obj: dict[str, Any]) -> str:
    return f"{obj['metadata'].get('namespace')}/{obj['metadata'].get('name')}"


# ------------------------------------------------------------------------------------------------
# Analysis (pure)
# ------------------------------------------------------------------------------------------------


def rollup_latencies(states: list[tuple[float, int, int, str]],
                     rollups: list[list[Any]]) -> dict[str, list[float]]:
    """Per phase: for each CR-total state (t, cpu, mem), the time to the first roll-up received
    at or after t whose totals equal this state or any later one current by then (a later change
    superseding it is carried by the same roll-up). States never carried are left out.

    O(states + roll-ups x log states): a roll-up with totals T carries every state up to the
    last one with totals T current when it arrived; a pointer walks the (sampled) states once.
    """
    import bisect

    out: dict[str, list[float]] = defaultdict(list)
    if not states or not rollups:
        return out
    by_total: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, (_t, cpu, mem, _ph) in enumerate(states):
        by_total[(cpu, mem)].append(i)
    times = [st[0] for st in states]
    sampled: list[int] = []
    last = -1.0
    for i, t in enumerate(times):  # at most one state per 0.2 s
        if t - last >= 0.2:
            sampled.append(i)
            last = t
    p = 0
    for r in sorted(rollups, key=lambda r: r[0]):
        at, total = r[0], (r[2], r[3])
        idx = by_total.get(total)
        if not idx:
            continue
        # the last state with these totals that was current when the roll-up arrived
        k = bisect.bisect_right(idx, bisect.bisect_right(times, at) - 1) - 1
        if k < 0:
            continue
        j = idx[k]
        while p < len(sampled) and sampled[p] <= j:
            i = sampled[p]
            out[states[i][3]].append(at - states[i][0])
            p += 1
    return out


def nsu_latencies(nsu: list[list[Any]], un_events: dict[str, list[tuple[float, str]]],
                  phase_of: Any) -> dict[str, list[float]]:
    """Per phase: NodeStateUpdate sent -> the UpcomingNode event showing its phase, for updates
    that change the phase (the first Provisioning, Launched after Creating, Registered, Ready)."""
    out: dict[str, list[float]] = defaultdict(list)
    prev: dict[str, str] = {}
    for t, machine, state in sorted(nsu):
        before = prev.get(machine)
        prev[machine] = state
        want = PHASE_OF_STATE.get(state)
        if want is None or PHASE_OF_STATE.get(before or "") == want:
            continue
        if state == "IDLE" and before not in ("CREATING", "SPECULATIVE"):
            continue  # a released machine: its UpcomingNode is deleted, not Launched
        for te, phase in un_events.get(machine, ()):
            if te >= t - 0.05 and phase == want:
                out[phase_of(t)].append(max(0.0, te - t))
                break
    return out


def _rows(name: str, samples: list[float], unit: str = "s", *, baseline: float | None = None,
          label: str = "", target: str = "", met: Any = None) -> list[dict[str, Any]]:
    """Two table rows: the samples (median = p50, min, max, n) and their p99 on its own."""
    row = C.figure(f"{name} (p50)", unit, samples if samples else [float("nan")],
                   baseline=baseline, baseline_label=label, target=target, met=met)
    row["n"] = len(samples)
    p99 = C.figure(f"{name} (p99)", unit, _pct(samples, 0.99), baseline=baseline,
                   baseline_label=label)
    return [row, p99]


# ------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------


def _stats(port: int) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=30) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def _metrics(port: int) -> dict[str, float]:
    import urllib.request

    out: dict[str, float] = defaultdict(float)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return out
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        try:
            out[name] += float(line.rsplit(" ", 1)[1])
        except ValueError:
            pass
    return out


async def _drive(args: argparse.Namespace, fleet: Fleet, obs: Observed,
                 result: dict[str, Any]) -> None:
    import trio

    from bigfleet_trio.kube import (
        CAPACITY_REQUESTS,
        DEPLOYMENTS,
        JOBS,
        NAMESPACES,
        PODS,
        PRIORITY_CLASSES,
        STATEFULSETS,
        UPCOMING_NODES,
        Informer,
        KubeClient,
        load_kubeconfig,
    )
    from bigfleet_trio.kube.errors import AlreadyExists, NotFound

    res_of = {"Deployment": DEPLOYMENTS, "StatefulSet": STATEFULSETS, "Job": JOBS}
    classes, workloads = fleet_workloads(args.pods, args.per_profile, args.seed, args.job_share)
    rng = random.Random(args.seed)
    cfg = load_kubeconfig(fleet.kubeconfig, env={})
    async with KubeClient(cfg, qps=0, user_agent="bench-fleet") as client:
        pods = Informer(client, PODS, transform=_pod_view)
        crs = Informer(client, CAPACITY_REQUESTS, transform=_cr_view)
        uns = Informer(client, UPCOMING_NODES, transform=_un_view)
        jobs = Informer(client, JOBS, transform=lambda o: {"metadata": {
            "name": o["metadata"]["name"], "namespace": o["metadata"].get("namespace")}})
        _wire(obs, pods, crs, uns)
        stop_jobs = trio.Event()
        counts: list[dict[str, Any]] = []

        def snapshot(stats: dict[str, Any] | None) -> dict[str, Any]:
            live = [p for p in pods.store.list() if p["phase"] not in ("Succeeded", "Failed")]
            bound = set((stats or {}).get("bound") or [])
            un_names = {u["metadata"]["name"].removeprefix("un-") for u in uns.store.list()}
            return {
                "t": round(time.time() - t0, 1), "phase": obs.phase,
                "pods": len(live), "pods_bound": sum(1 for p in live if p["node"]),
                "pods_total": len(pods.store), "crs": len(crs.store),
                "upcoming": len(uns.store), "machines_bound": len(bound),
                "upcoming_stale": len(un_names - bound) if stats else None,
                "upcoming_drained": sum(1 for u in uns.store.list() if u["phase"] == "Drained"),
                "rollup_matches": bool(stats and stats["rollups"] and
                                       (stats["rollups"][-1][2], stats["rollups"][-1][3])
                                       == (obs.cpu, obs.mem)),
                "cr_cpu_milli": obs.cpu,
                "unbound_not_job": sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}"
                                          for p in live if not p["node"] and not p["job"])[:8],
            }

        async def progress() -> None:
            while True:
                await trio.sleep(args.progress_interval)
                fleet.sample()
                dead = fleet.dead()
                if dead:
                    raise RuntimeError(f"process {dead[0]} exited:\n{fleet.log(dead[0])}")
                s = snapshot(None)
                print(f"[{s['t']:7.1f}s] {obs.phase:<8} pods {s['pods_bound']:>6}/{s['pods']:<6} "
                      f"bound | CRs {s['crs']:>6} | upcoming {s['upcoming']:>5} | "
                      f"cpu {obs.cpu / 1000:9.1f}", file=sys.stderr, flush=True)

        async def create(w: Workload) -> None:
            body = copy.deepcopy(w.body)
            if w.kind == "Job" and w.gen:
                body["metadata"]["name"] = f"{w.name}-{w.gen}"
            try:
                await client.create(res_of[w.kind], body, w.namespace)
            except AlreadyExists:
                pass

        async def job_refill() -> None:
            """Replace finished (ttl-deleted) Jobs with new ones of the same shape."""
            while not stop_jobs.is_set():
                await trio.sleep(2)
                names = {f"{j['metadata']['namespace']}/{j['metadata']['name']}"
                         for j in jobs.store.list()}
                for w in workloads:
                    cur = f"{w.namespace}/{w.name}" + (f"-{w.gen}" if w.gen else "")
                    if w.kind == "Job" and cur not in names and not stop_jobs.is_set():
                        w.gen += 1
                        await create(w)

        async def churn(until: float) -> None:
            scalable = [w for w in workloads if w.scalable]
            while time.time() < until and scalable:
                await trio.sleep(args.churn_interval)
                w = rng.choice(scalable)
                n = max(1, int(w.replicas * rng.uniform(0.7, 1.3)))
                try:
                    await client.patch(res_of[w.kind], w.name, {"spec": {"replicas": n}},
                                       w.namespace)
                except NotFound:
                    pass

        async def wait_until(what: str, check: Any, limit: float) -> bool:
            deadline = time.time() + limit
            while time.time() < deadline:
                if await check():
                    return True
                await trio.sleep(1)
            result["notes"].append(f"{obs.phase}: {what} not reached within {limit:g}s")
            return False

        async def all_bound() -> bool:
            # Jobs keep finishing and being replaced (their new Pods wait for machines): the
            # ramp is done when every workload's Pods were created and the others are bound.
            live = [p for p in pods.store.list()
                    if not p["job"] and p["phase"] not in ("Succeeded", "Failed")]
            return len(obs.pod_added) >= want_pods and sum(
                1 for p in live if not p["node"]) <= args.unbound_ok * len(live)

        stable: dict[str, Any] = {"sig": None, "since": 0.0}

        async def quiet() -> bool:
            """Settled: the last roll-up came after the last CR change and carries it, every
            bound machine is Configured with its UpcomingNode (none stale or Drained), no
            reclaim is in flight, few Pods pending -- and all that unchanged for a roll-up
            interval and then some."""
            stats = await trio.to_thread.run_sync(_stats, fleet.stats_port)
            s = snapshot(stats)
            snap = stats.get("snapshot") or {}
            states = {k: v for k, v in (snap.get("machines") or {}).items()
                      if k not in ("FREE", "CONFIGURED")}
            last_change = obs.states[-1][0] if obs.states else 0.0
            ok = (s["pods"] - s["pods_bound"] <= args.unbound_ok * s["pods"]
                  and s["rollup_matches"] and bool(stats["rollups"])
                  and stats["rollups"][-1][0] > last_change
                  and not states
                  and snap.get("reclaims_acked") == snap.get("reclaims_issued")
                  and s["upcoming_stale"] == 0 and s["upcoming_drained"] == 0
                  and s["upcoming"] == s["machines_bound"])
            sig = (s["machines_bound"], s["upcoming"], s["crs"], s["pods_bound"]) if ok else None
            now = time.time()
            if sig is None or sig != stable["sig"]:
                stable.update(sig=sig, since=now)
                return False
            return now - stable["since"] >= args.rollup_seconds + 2

        async def end_phase(name: str) -> None:
            stats = await trio.to_thread.run_sync(_stats, fleet.stats_port)
            s = snapshot(stats)
            s["end_of"] = name
            s["operator_metrics"] = {k: v for k, v in (await trio.to_thread.run_sync(
                _metrics, fleet.metrics_port)).items()
                if k.endswith("_total") and ("outbox_dropped" in k or "reconnects" in k)}
            counts.append(s)
            print(f"-- end of {name}: {json.dumps(s)}", file=sys.stderr, flush=True)

        want_pods = sum(w.replicas for w in workloads)
        t0 = time.time()
        async with trio.open_nursery() as nursery:
            for inf in (pods, crs, uns, jobs):
                await nursery.start(inf.run)
            for inf in (pods, crs, uns, jobs):
                await inf.wait_synced()
            nursery.start_soon(progress)
            for ns in sorted({w.namespace for w in workloads}):
                try:
                    await client.create(NAMESPACES, {"metadata": {"name": ns}})
                except AlreadyExists:
                    pass
            for pc in classes:
                try:
                    await client.create(PRIORITY_CLASSES, {k: v for k, v in pc.items()})
                except AlreadyExists:
                    pass
            obs.set_phase("ramp")
            limiter = trio.CapacityLimiter(8)

            async def create_limited(w: Workload) -> None:
                async with limiter:
                    await create(w)

            async with trio.open_nursery() as apply:
                for w in workloads:
                    apply.start_soon(create_limited, w)
            nursery.start_soon(job_refill)
            await wait_until("every Pod bound", all_bound, args.phase_timeout)
            result["extra"]["ramp_seconds"] = round(time.time() - t0, 1)
            await end_phase("ramp")

            obs.set_phase("churn")
            await churn(time.time() + args.duration)
            await end_phase("churn")

            obs.set_phase("reclaim")
            stop_jobs.set()
            t_reclaim = time.time()
            victims = [w for w in workloads if w.scalable][::4]
            for w in victims:
                await client.patch(res_of[w.kind], w.name, {"spec": {"replicas": 0}}, w.namespace)
            # back to base size for the others, so the quiesced state is known
            for w in workloads:
                if w.scalable and w not in victims:
                    await client.patch(res_of[w.kind], w.name, {"spec": {"replicas": w.replicas}},
                                       w.namespace)
            await wait_until("the fleet to settle after the reclaim", quiet, args.phase_timeout)
            result["extra"]["reclaim_seconds"] = round(time.time() - t_reclaim, 1)
            await end_phase("reclaim")

            obs.set_phase("quiesce")
            await trio.sleep(args.quiesce)
            await wait_until("quiet state", quiet, args.phase_timeout)
            await end_phase("quiesce")
            result["extra"]["counts"] = counts
            result["extra"]["final_stats"] = await trio.to_thread.run_sync(_stats,
                                                                           fleet.stats_port)
            nursery.cancel_scope.cancel()


def _report(args: argparse.Namespace, fleet: Fleet, obs: Observed,
            result: dict[str, Any]) -> None:
    stats = result["extra"].pop("final_stats", None) or {}
    figures: list[dict[str, Any]] = []
    cycle = float(args.rollup_seconds)
    phases = ("ramp", "churn", "reclaim", "quiesce")
    roll = rollup_latencies(obs.states, stats.get("rollups") or [])
    nsu = nsu_latencies(stats.get("nsu") or [], obs.un_events, obs.phase_of)
    boot: dict[str, list[float]] = defaultdict(list)
    unanswered = 0
    for _rid, sent, answered, _err in stats.get("bootstrap") or []:
        if answered is None:
            unanswered += 1
            continue
        boot[obs.phase_of(sent)].append(answered - sent)
    rec: dict[str, list[float]] = defaultdict(list)
    for _iid, _node, issued, acked in stats.get("reclaim") or []:
        if acked is not None:
            rec[obs.phase_of(issued)].append(acked - issued)
    for ph in phases:
        if obs.pod_to_cr.get(ph):
            figures += _rows(f"{ph}: Pod created -> CR exists", obs.pod_to_cr[ph],
                             baseline=cycle, label="one roll-up interval")
        if roll.get(ph):
            figures += _rows(f"{ph}: CR change -> roll-up carrying it", roll[ph],
                             baseline=cycle, label="one roll-up interval")
        if nsu.get(ph):
            figures += _rows(f"{ph}: NodeStateUpdate -> UpcomingNode written", nsu[ph],
                             baseline=cycle, label="one roll-up interval")
        if boot.get(ph):
            late = sum(1 for x in boot[ph] if x > BOOTSTRAP_DEADLINE)
            rows = _rows(f"{ph}: BootstrapRequest -> response", boot[ph],
                         baseline=BOOTSTRAP_DEADLINE,
                         label="the shard's one-cycle deadline (10 s)",
                         target=f"0 past 10 s (here {late})", met=late == 0)
            figures += rows
        if rec.get(ph):
            figures += _rows(f"{ph}: reclaim instruction -> ack", rec[ph],
                             baseline=cycle, label="one roll-up interval")
    for c in result["extra"].get("counts") or []:
        ph = c["end_of"]
        figures.append(C.figure(f"end of {ph}: UpcomingNodes", "objects", c["upcoming"],
                                baseline=c["machines_bound"] or 0,
                                baseline_label="machines bound at the shard (ratio 1 = live set)",
                                target="= bound machines, 0 stale",
                                met=c["upcoming"] == c["machines_bound"]
                                and c["upcoming_stale"] == 0 and c["upcoming_drained"] == 0))
        figures.append(C.figure(f"end of {ph}: CapacityRequests", "objects", c["crs"],
                                baseline=c["pods"],
                                baseline_label="live Pods (ratio 1 = one each)"))
        figures.append(C.figure(f"end of {ph}: Pods left pending", "pods",
                                c["pods"] - c["pods_bound"], baseline=c["pods"],
                                baseline_label="live Pods"))
        m = c.get("operator_metrics") or {}
        figures.append(C.figure(f"end of {ph}: outbox drops, reconnects", "count",
                                sum(v for k, v in m.items() if "outbox_dropped" in k)
                                + sum(v for k, v in m.items() if "reconnects" in k),
                                target="0", met=not any(m.values())))
    churn_t = [t for t, name in obs.phase_at if name in ("churn", "reclaim")]
    for name, p in fleet.procs.items():
        if not p.samples:
            continue
        peak = max(s[1] for s in p.samples)
        cpu = p.samples[-1][2]
        window = [s for s in p.samples if len(churn_t) == 2 and churn_t[0] <= s[0] <= churn_t[1]]
        growth = float("nan")
        if len(window) >= 3:
            xs = [s[0] for s in window]
            ys = [s[1] for s in window]
            growth = statistics.linear_regression(xs, ys).slope * 3600
        ramp_rss = [s[1] for s in p.samples if obs.phase_of(s[0]) == "ramp"]
        row = C.figure(f"{name}: peak RSS", "MB", peak,
                       baseline=max(ramp_rss) if ramp_rss else None,
                       baseline_label="peak RSS during the ramp")
        figures.append(row)
        wall = p.samples[-1][0] - p.samples[0][0] if len(p.samples) > 1 else float("nan")
        figures.append(C.figure(f"{name}: CPU seconds", "s", cpu, baseline=wall,
                                baseline_label="wall seconds sampled (ratio = cores used)"))
        figures.append(C.figure(f"{name}: RSS growth over churn", "MB/h", growth,
                                baseline=peak, baseline_label="peak RSS (ratio = share per hour)"))
    result["figures"] = figures
    result["extra"]["bootstrap_unanswered"] = unanswered
    result["extra"]["bootstrap_past_deadline"] = sum(1 for v in boot.values() for x in v
                                                     if x > BOOTSTRAP_DEADLINE)
    result["extra"]["processes"] = {
        n: {"samples": [[round(t, 1), round(r, 1), round(c, 2)] for t, r, c in p.samples[::6]]}
        for n, p in fleet.procs.items()}
    result["extra"]["rollups_received"] = len(stats.get("rollups") or [])
    result["extra"]["machines_bound_end"] = len(stats.get("bound") or [])


def run(args: argparse.Namespace) -> dict[str, Any]:
    import trio

    logging.getLogger("bigfleet_trio").setLevel(logging.WARNING)
    if args.quick:
        args.machines, args.pods, args.duration = 200, 2000, min(args.duration, 30.0)
        args.phase_timeout = min(args.phase_timeout, 120.0)
        args.job_run_seconds = min(args.job_run_seconds, 10.0)
        args.quiesce = min(args.quiesce, 5.0)
    args.rollup_seconds = _seconds(args.rollup_interval)
    params = {k: getattr(args, k) for k in ("machines", "pods", "per_profile", "duration",
                                            "rollup_interval", "job_run_seconds", "job_share",
                                            "qps", "seed")}
    result = C.result("fleet", params, [], [
        "latencies are wall-clock differences between the bench's own watch events (Pods, CRs, "
        "UpcomingNodes) and the shard's send/receive timestamps, all on this machine; the bench's "
        "watch delivery adds to 'Pod -> CR' equally on both ends",
        "CR change -> roll-up: matched by the sum of the CRs' cpu and memory requests against "
        "the roll-up's aggregate totals (a state superseded before the next roll-up counts as "
        "carried by the roll-up that carries its successor)",
    ], {})
    import signal

    def _term(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt  # stop the child processes on the way out

    signal.signal(signal.SIGTERM, _term)
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        fleet = Fleet(Path(tmp), args.machines, args.rollup_interval, args.job_run_seconds,
                      args.qps)
        obs = Observed()
        try:
            fleet.start()
            fleet.wait_ready()
            trio.run(_drive, args, fleet, obs, result)
        except BaseException:
            for n in PROCS:
                print(f"--- {n} log tail:\n{fleet.log(n)}", file=sys.stderr)
            raise
        finally:
            fleet.sample()
            fleet.stop()
        _report(args, fleet, obs, result)
    return result


def _seconds(text: str) -> float:
    from bigfleet_trio.durations import parse_duration

    return float(parse_duration(text))


def register(sub: Any) -> None:
    p = sub.add_parser("fleet", parents=[sub.common],
                       help="soak: apiserver, sim cluster, sim shard, pod-controller and "
                       "operator as processes; ramp, churn, reclaim, quiesce")
    p.add_argument("--machines", type=int, default=5000, help="fleet size (--quick: 200)")
    p.add_argument("--pods", type=int, default=50000, help="Pods at base size (--quick: 2000)")
    p.add_argument("--per-profile", type=int, default=100, help="Pods per Profile (~CRs)")
    p.add_argument("--duration", type=float, default=600.0, help="churn seconds (--quick: 30)")
    p.add_argument("--rollup-interval", default="10s", help="operator --rollup-interval")
    p.add_argument("--job-run-seconds", type=float, default=60.0,
                   help="how long a Job's Pod runs (--quick: 10)")
    p.add_argument("--qps", type=float, default=500.0,
                   help="--qps of pod-controller and operator (burst 2x); their default 50 "
                   "bounds a fleet ramp at ~50 CRs/s")
    p.add_argument("--job-share", type=float, default=0.2,
                   help="share of the CPU workloads that are Jobs (each Job Pod finishing costs "
                   "the pod controller a CR delete-collection)")
    p.add_argument("--churn-interval", type=float, default=2.0, help="seconds between scalings")
    p.add_argument("--phase-timeout", type=float, default=900.0, help="per phase wait limit")
    p.add_argument("--quiesce", type=float, default=20.0, help="quiesce hold seconds")
    p.add_argument("--progress-interval", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--unbound-ok", type=float, default=0.05,
                   help="share of Pods that may stay pending for a phase to count as settled "
                   "(the scheduler packs across Profiles, the shard plans per Profile: a few "
                   "Pods can be left without room)")
    p.set_defaults(func=run)
