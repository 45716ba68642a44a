"""``kill -9`` the operator while a reclaim's drain is blocked by a PodDisruptionBudget, start it
again (docs/rules.md#reclaim-resume-after-restart), with real processes: ``sim apiserver``, the
real ``bigfleet-trio operator`` binary, and a scripted shard (``_reclaim_shard.py``) that, like
the real one, re-issues its ReclaimInstruction only while the ack is missing.

After the restart the Node must stay cordoned and the UpcomingNode Draining until the budget is
relaxed, then the UpcomingNode reaches Drained (deleted); the restarted operator runs exactly one
drain of the Node and the shard saw exactly one ack.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import load_kubeconfig
from bigfleet_trio.kube.errors import NotFound
from bigfleet_trio.kube.resources import NODES, UPCOMING_NODES
from tests.operator.test_reclaim import _pdb_allows, _pod_names, _seed
from tests.support.ports import free_port

pytestmark = pytest.mark.slow

BIN = str(Path(sys.executable).parent / "bigfleet-trio")
SHARD = str(Path(__file__).parent / "_reclaim_shard.py")




class Procs:
    def __init__(self, tmp: Path, nursery: trio.Nursery) -> None:
        self.tmp = tmp
        self.nursery = nursery

    async def start(self, name: str, *argv: str) -> trio.Process:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115, ASYNC230 - a local file
        proc: trio.Process = await self.nursery.start(
            partial(trio.run_process, list(argv), stdout=log, stderr=log, check=False)
        )
        return proc

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text() if path.exists() else ""  # noqa: ASYNC240 - a local file

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(self.tmp.glob("*.log"))
        )


async def until(procs: Procs, what: str, check: Callable[[], Awaitable[bool]],
                seconds: float = 60.0) -> None:
    with trio.move_on_after(seconds):
        while not await check():  # noqa: ASYNC110 - the condition is read from processes
            await trio.sleep(0.2)
        return
    pytest.fail(f"timed out waiting for {what}\n{procs.logs()}")


async def test_kill_9_during_pdb_blocked_drain_resumes_after_restart(tmp_path: Path) -> None:
    kubeconfig = str(tmp_path / "sim.kubeconfig")
    shard_port = free_port()

    def operator_argv() -> list[str]:
        return [BIN, "operator", "--kubeconfig", kubeconfig, "--cluster-id", "c1",
                "--shard-addr", f"127.0.0.1:{shard_port}",
                "--metrics-addr", f"127.0.0.1:{free_port()}",
                "--health-probe-addr", f"127.0.0.1:{free_port()}",
                "--reconnect-initial-backoff", "200ms", "--reconnect-max-backoff", "1s"]

    async with trio.open_nursery() as nursery:
        procs = Procs(tmp_path, nursery)
        apiserver = await procs.start("apiserver", BIN, "sim", "apiserver", "--port",
                                      str(free_port()), "--kubeconfig-out", kubeconfig)
        with trio.fail_after(30):
            while not os.path.exists(kubeconfig):  # noqa: ASYNC110, ASYNC240 - local file
                await trio.sleep(0.1)
        shard = await procs.start("shard", sys.executable, SHARD, str(shard_port), "m-1", "300")
        async with KubeClient(load_kubeconfig(kubeconfig)) as client:
            await until(procs, "apiserver up", partial(_answers, client))
            await _seed(client)  # Node n-1, un-m-1 Ready -> n-1, Pods web (PDB 0) and agent (DS)

            async def un() -> dict[str, Any] | None:
                try:
                    return await client.get(UPCOMING_NODES, "un-m-1")
                except NotFound:
                    return None

            async def cordoned() -> bool:
                return bool((await client.get(NODES, "n-1"))["spec"].get("unschedulable"))

            # 1. the first operator cordons, marks Draining, acks; the drain is PDB-blocked
            first = await procs.start("operator-1", *operator_argv())

            async def blocked() -> bool:
                return "drain: eviction blocked, will retry node=n-1" in procs.log("operator-1")

            await until(procs, "a PDB-blocked drain", blocked)
            assert "ack r-1 1" in procs.log("shard")

            # 2. kill -9: nothing runs at exit
            os.kill(first.pid, signal.SIGKILL)
            await first.wait()
            assert first.returncode == -signal.SIGKILL
            obj = await un()
            assert obj is not None and obj["status"]["phase"] == "Draining"
            assert await cordoned()

            # 3. a new operator process resumes from the cluster's record
            second = await procs.start("operator-2", *operator_argv())

            async def resumed() -> bool:
                return "drain: eviction blocked, will retry node=n-1" in procs.log("operator-2")

            await until(procs, "the resumed drain evicting", resumed)
            assert "drain: resuming after restart node=n-1 upcoming=un-m-1" in procs.log(
                "operator-2"
            )
            obj = await un()
            assert obj is not None and obj["status"]["phase"] == "Draining"
            assert await cordoned()
            assert await _pod_names(client) == ["agent", "web"]

            # 4. the budget allows one disruption: Drained (deleted), Node cordoned throughout
            await _pdb_allows(client, 1)
            samples = 0

            async def drained() -> bool:
                nonlocal samples
                assert await cordoned(), procs.logs()
                samples += 1
                return await un() is None

            await until(procs, "un-m-1 Drained and deleted", drained)
            assert samples >= 1 and await cordoned()
            assert await _pod_names(client) == ["agent"]

            log2 = procs.log("operator-2")
            assert log2.count("drain: started node=n-1 ") == 1, log2
            assert log2.count("drain: node drained node=n-1 ") == 1, log2
            assert "drain: deadline passed" not in log2
            shard_log = procs.log("shard")
            assert shard_log.count("sent r-1") == 1, shard_log  # never re-issued after the ack
            assert shard_log.count("ack r-1") == 1, shard_log
        for proc in (second, shard, apiserver):
            proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(30) as waited:
            for proc in (second, shard, apiserver):
                await proc.wait()
        if waited.cancelled_caught:
            nursery.cancel_scope.cancel()


async def _answers(client: KubeClient) -> bool:
    try:
        await client.list(NODES)
    except Exception:  # noqa: BLE001 - not up yet
        return False
    return True
