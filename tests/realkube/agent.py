"""Both binaries and the sim shard as processes, the way users run them, against the real
control plane: ``bigfleet-trio sim shard`` registers Nodes with the admin identity (it stands
for the cloud and the kubelets); ``bigfleet-trio pod-controller`` and ``bigfleet-trio operator``
run with their ServiceAccount tokens (TokenRequest) under the shipped RBAC.

    async with running_agent(realkube, tmp_path) as a:
        await a.until("3 CRs", lambda: ...)
        a.kill("operator")                 # kill -9 by pid
"""

from __future__ import annotations

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
from scripts.realkube import free_port
from tests.support.realkube import RealKube, until

BIN = str(Path(sys.executable).parent / "bigfleet-trio")
CLUSTER_ID = "realkube"


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
        self.shard_port = free_port()

    async def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115, ASYNC230 - a local file
        proc = await self.nursery.start(partial(
            trio.run_process, [BIN, *args], stdout=log, stderr=log, check=False,
            env={**os.environ, **(env or {})}))
        self.procs[name] = proc

    async def start_shard(self) -> None:
        await self.start("shard", "sim", "shard", "--port", str(self.shard_port),
                         "--kubeconfig", str(self.rk.kubeconfig))

    async def start_pod_controller(self, name: str = "pod-controller") -> None:
        self.probes[name] = f"127.0.0.1:{free_port()}"
        self.metrics[name] = f"127.0.0.1:{free_port()}"
        await self.start(name, "pod-controller",
                         "--kubeconfig", str(self.rk.pod_controller_kubeconfig),
                         "--metrics-addr", self.metrics[name],
                         "--health-probe-addr", self.probes[name])

    async def start_operator(self, name: str = "operator", *, leader_elect: bool = False) -> None:
        self.probes[name] = f"127.0.0.1:{free_port()}"
        self.metrics[name] = f"127.0.0.1:{free_port()}"
        extra = ["--leader-elect"] if leader_elect else []
        await self.start(name, "operator", "--kubeconfig", str(self.rk.operator_kubeconfig),
                         "--cluster-id", CLUSTER_ID, "--shard-addr", f"127.0.0.1:{self.shard_port}",
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
                    seconds: float = 90.0) -> None:
        """:func:`tests.support.realkube.until`, failing with every process's log."""
        await until(what, check, seconds, self.logs)

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


def phase(obj: dict[str, Any]) -> str:
    return str((obj.get("status") or {}).get("phase") or "")
