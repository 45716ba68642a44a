"""Both binaries and the sim shard as processes, the way users run them, against the real
control plane: ``bigfleet-trio sim shard`` registers Nodes with the admin identity (it stands
for the cloud and the kubelets); ``bigfleet-trio pod-controller`` and ``bigfleet-trio operator``
run with their ServiceAccount tokens (TokenRequest) under the shipped RBAC.

    async with agent_in_namespace(realkube, tmp_path, "loop") as (a, ns):
        seen = await a.record(UPCOMING_NODES)          # every version from now on
        await acknowledged(a, ns, "web", 3)            # or a.until("...", check)
        a.kill("operator")                             # kill -9 by pid

The sim shard gets a seed of its own per test, so its machine ids and node names (and the
Events about those Nodes) never repeat those of an earlier test on the shared control plane.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.errors import (
    Expired,
    Forbidden,
    KubeTransportError,
    ServerError,
    Unauthorized,
)
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, PODS, Resource
from tests.support.ports import free_port
from tests.support.realkube import RealKube, until
from tests.support.simproc import SHARD_LISTENING

BIN = str(Path(sys.executable).parent / "bigfleet-trio")
CLUSTER_ID = "realkube"
_shard_seeds = itertools.count(1)


class Agent:
    """The processes of one test (by name) plus the admin client and wait helpers."""

    def __init__(self, rk: RealKube, tmp: Path, nursery: trio.Nursery, admin: KubeClient) -> None:
        self.rk = rk
        self.tmp = tmp
        self.nursery = nursery
        self.admin = admin
        self.procs: dict[str, trio.Process] = {}
        self.probes: dict[str, str] = {}
        self.metrics: dict[str, str] = {}
        self.shard_port = 0  # the port the shard bound (start_shard)
        self.shard_seed = next(_shard_seeds)

    async def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115, ASYNC230 - a local file
        proc = await self.nursery.start(partial(
            trio.run_process, [BIN, *args], stdout=log, stderr=log, check=False,
            env={**os.environ, **(env or {})}))
        self.procs[name] = proc

    async def start_shard(self, *extra: str) -> None:
        """Start the sim shard on a port it picks (``--port 0``: no other process can take it
        between a choice and the bind) and read that port from its log; ``extra``: more flags
        (e.g. ``--reclaim-grace``)."""
        (self.tmp / "shard.log").unlink(missing_ok=True)  # a restart's port is read anew
        await self.start("shard", "sim", "shard", "--port", "0",
                         "--seed", str(self.shard_seed), "--kubeconfig", str(self.rk.kubeconfig),
                         *extra)
        log = self.tmp / "shard.log"

        async def listening() -> bool:
            found = SHARD_LISTENING.search(log.read_text(errors="replace"))  # noqa: ASYNC240
            if found:
                self.shard_port = int(found.group(1))
            return found is not None

        await self.until("the sim shard listening", listening, 60)

    async def start_pod_controller(self, name: str = "pod-controller", *,
                                   kubeconfig: Path | None = None) -> None:
        self.probes[name] = f"127.0.0.1:{free_port()}"
        self.metrics[name] = f"127.0.0.1:{free_port()}"
        await self.start(name, "pod-controller",
                         "--kubeconfig", str(kubeconfig or self.rk.pod_controller_kubeconfig),
                         "--metrics-addr", self.metrics[name],
                         "--health-probe-addr", self.probes[name])

    async def start_operator(self, name: str = "operator", *, leader_elect: bool = False,
                             kubeconfig: Path | None = None, shard_port: int = 0) -> None:
        """Start an operator; ``kubeconfig`` and ``shard_port`` default to the operator
        ServiceAccount's and the shard's own (a fault test passes a proxy's)."""
        self.probes[name] = f"127.0.0.1:{free_port()}"
        self.metrics[name] = f"127.0.0.1:{free_port()}"
        extra = ["--leader-elect"] if leader_elect else []
        await self.start(name, "operator",
                         "--kubeconfig", str(kubeconfig or self.rk.operator_kubeconfig),
                         "--cluster-id", CLUSTER_ID,
                         "--shard-addr", f"127.0.0.1:{shard_port or self.shard_port}",
                         "--rollup-interval", "1s", "--metrics-addr", self.metrics[name],
                         "--health-probe-addr", self.probes[name], *extra,
                         # the leader-election identity starts with $POD_NAME
                         env={"POD_NAME": name})

    async def ready(self, name: str, seconds: float = 60.0) -> None:
        """Wait until process ``name`` answers 200 on /readyz."""
        async def ok() -> bool:
            try:
                async with httpx.AsyncClient(timeout=2) as c:
                    return (await c.get(f"http://{self.probes[name]}/readyz")).status_code == 200
            except httpx.HTTPError:
                return False
        await self.until(f"{name} ready", ok, seconds)

    async def metric(self, name: str, family: str, **labels: str) -> float:
        """Sum of the samples of ``family`` (with these label values) on process ``name``'s
        /metrics."""
        async with httpx.AsyncClient(timeout=5) as c:
            text = (await c.get(f"http://{self.metrics[name]}/metrics")).text
        total = 0.0
        want = [f'{k}="{v}"' for k, v in labels.items()]
        for line in text.splitlines():
            if (line.startswith(family) and line[len(family):len(family) + 1] in ("{", " ")
                    and all(w in line for w in want)):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        os.kill(self.procs[name].pid, sig)

    def logs(self) -> str:
        parts = [f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                 for p in sorted(self.tmp.glob("*.log"))]
        for comp in ("kube-apiserver", "kube-controller-manager", "kwok"):
            parts.append(f"--- {comp}\n{self.rk.cp.log_tail(comp, 10)}")
        return "\n".join(parts)

    async def until(self, what: str, check: Callable[[], Awaitable[bool]],
                    seconds: float = 90.0, status: Callable[[], str] | None = None) -> None:
        """:func:`tests.support.realkube.until`, failing with every process's log."""
        await until(what, check, seconds, self.logs, status)

    async def record(self, res: Resource, namespace: str | None = None) -> list[dict[str, Any]]:
        """Start recording every version of ``res`` from now on (:func:`record`, in this
        agent's nursery); returns the list it appends to."""
        seen: list[dict[str, Any]] = []
        await self.nursery.start(record, self.admin, res, namespace, seen)
        return seen

    async def until_recorded(self, what: str, seen: list[dict[str, Any]],
                             done: Callable[[list[dict[str, Any]]], bool]) -> None:
        """Wait until the recorder's versions ``seen`` satisfy ``done``. A list (or GET) can
        show a change before the watch delivers it: assert on a recorded history only after
        this."""
        async def check() -> bool:
            return done(seen)
        await self.until(f"the watch to deliver {what}", check,
                         status=lambda: f"{len(seen)} versions recorded")

    async def stop(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.terminate()
        with trio.move_on_after(15):
            for proc in self.procs.values():
                await proc.wait()
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.kill()


@asynccontextmanager
async def running_agent(rk: RealKube, tmp: Path, *, operators: int = 1,
                        leader_elect: bool = False) -> AsyncIterator[Agent]:
    """The shard, the pod controller and ``operators`` operator processes (named ``operator``,
    or ``operator-0``... with several), each ready before this yields (with leader election,
    only the leader is waited for)."""
    async with rk.client() as admin, trio.open_nursery() as nursery:
        a = Agent(rk, tmp, nursery, admin)
        try:
            await a.start_shard()
            await a.start_pod_controller()
            names = ["operator"] if operators == 1 else [f"operator-{i}" for i in range(operators)]
            for name in names:
                await a.start_operator(name, leader_elect=leader_elect)
            await a.ready("pod-controller")
            if not leader_elect:
                for name in names:
                    await a.ready(name)
            yield a
        finally:
            await a.stop()
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def agent_in_namespace(rk: RealKube, tmp: Path, prefix: str, **agent: Any
                             ) -> AsyncIterator[tuple[Agent, str]]:
    """:meth:`RealKube.reset`, a fresh namespace named from ``prefix``, and
    :func:`running_agent` (``agent`` its keyword arguments): yields the agent and the
    namespace."""
    rk.reset()
    ns = rk.namespace(prefix)
    async with running_agent(rk, tmp, **agent) as a:
        yield a, ns


async def record(kube: KubeClient, res: Resource, namespace: str | None,
                 sink: list[dict[str, Any]], *, task_status: Any = trio.TASK_STATUS_IGNORED
                 ) -> None:
    """Append every object version of ``res`` from now on to ``sink`` (one watch, reopened
    from the last resourceVersion if the server ends it or goes away). A watch the server
    refuses as too old (410: a restarted kube-apiserver's watch cache starts at etcd's current
    revision) is followed by a LIST, and an object it no longer shows is recorded DELETED, as
    an informer's relist does."""
    listed = await kube.list(res, namespace)
    rv = listed.resource_version
    last = {o["metadata"]["name"]: o for o in listed.items}
    task_status.started()
    while True:
        try:
            # bounded: a watch opened on a kube-apiserver that is shutting down can go silent
            # without an EOF; the server ends it within 30 s and silence ends it after 45 s
            async with kube.watch(res, namespace, resource_version=rv, timeout_seconds=30,
                                  inactivity_timeout=45) as stream:
                async for ev in stream:
                    if ev.type == "ERROR":
                        raise Expired(410, "Expired", str(ev.object.get("message", "")))
                    if ev.type in ("ADDED", "MODIFIED", "DELETED"):
                        sink.append({"type": ev.type, **ev.object})
                        name = ev.object["metadata"]["name"]
                        if ev.type == "DELETED":
                            last.pop(name, None)
                        else:
                            last[name] = ev.object
                    rv = ev.object.get("metadata", {}).get("resourceVersion") or rv
        except Expired:
            listed = await kube.list(res, namespace)
            rv = listed.resource_version
            now = {o["metadata"]["name"]: o for o in listed.items}
            for name, obj in last.items():
                if name not in now:
                    sink.append({"type": "DELETED", **obj})
            for obj in listed.items:
                sink.append({"type": "MODIFIED", **obj})
            last = now
        except (KubeTransportError, ServerError, Forbidden, Unauthorized):
            # the apiserver restarting (its authorizer warms up after it listens): reopen
            await trio.sleep(0.5)


def phase(obj: dict[str, Any]) -> str:
    return str((obj.get("status") or {}).get("phase") or "")


def dedup(seq: list[str]) -> list[str]:
    """``seq`` without repeats in a row, and without "" (an object is created without a status:
    the apiserver drops it on create; the status subresource sets it next)."""
    seq = [x for x in seq if x]
    return [x for i, x in enumerate(seq) if i == 0 or seq[i - 1] != x]


def history(seen: list[dict[str, Any]], name: str) -> list[str]:
    """The phases object ``name`` went through in the recorded versions ``seen``
    (:func:`dedup`)."""
    return dedup([phase(v) for v in seen if v["metadata"]["name"] == name])


def deleted(seen: list[dict[str, Any]], name: str) -> bool:
    """The recorder saw object ``name`` DELETED."""
    return any(v["type"] == "DELETED" and v["metadata"]["name"] == name for v in seen)


def container(cpu: str) -> dict[str, Any]:
    return {"name": "c", "image": "registry.example/app:1",
            "resources": {"requests": {"cpu": cpu, "memory": "256Mi"}}}


def deployment(name: str, replicas: int, cpu: str = "1") -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [container(cpu)]}}}}


async def acknowledged(a: Agent, ns: str, app: str, count: int, *, total: int | None = None
                       ) -> None:
    """Wait until ``count`` live (not terminating) Pods labelled ``app`` exist, each with an
    Acknowledged CR, and ``total`` CRs in the namespace (default ``count``): no more.

    On timeout the failure says what the last check saw: the live Pods, the CRs, the CRs not
    Acknowledged (with their phases) and the live Pods without a CR."""
    want_total = count if total is None else total
    last = "no check completed"

    async def check() -> bool:
        nonlocal last
        pods = (await a.admin.list(PODS, ns, label_selector=f"app={app}")).items
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        crs = (await a.admin.list(CAPACITY_REQUESTS, ns)).items
        by_owner = {c["metadata"]["ownerReferences"][0]["uid"]: c for c in crs}
        not_ack = sorted(f"{c['metadata']['name']}={phase(c) or 'no phase'}" for c in crs
                         if phase(c) != "Acknowledged")
        no_cr = sorted(p["metadata"]["name"] for p in live
                       if p["metadata"]["uid"] not in by_owner)
        last = (f"{len(live)} live {app} Pods (want {count}; {len(pods) - len(live)} "
                f"terminating), {len(crs)} CRs in {ns} (want {want_total}), "
                f"{len(not_ack)} CRs not Acknowledged {not_ack}, "
                f"{len(no_cr)} live Pods without a CR {no_cr}")
        return (len(live) == count and len(crs) == want_total
                and all(phase(by_owner.get(p["metadata"]["uid"], {})) == "Acknowledged"
                        for p in live))

    await a.until(f"{count} {app} Pods with an Acknowledged CR each", check,
                  status=lambda: last)
