"""After a reclaim, ``kubectl get events -A`` tells the story: Reclaim, Cordoned and Drained on the
Node, EvictionBlocked (the PodDisruptionBudget's refusal) and Evicted on the Pod.

The operator's reclaim pieces (ReclaimHandler, DrainManager, EventRecorder) run in process
against the embedded apiserver served on loopback; the real kubectl reads the Events back.
"""

from __future__ import annotations

import json
import random
from functools import partial
from pathlib import Path
from typing import Any

import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.resources import EVENTS
from bigfleet_trio.operator.kubeevents import EventRecorder
from bigfleet_trio.operator.reclaim.drain import DrainManager
from bigfleet_trio.operator.reclaim.handler import ReclaimHandler
from bigfleet_trio.operator.upcoming.plan import DrainMemory
from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig
from tests.operator.test_reclaim import Replies, _pdb_allows, _seed, instr
from tests.support.kubectl import KUBECTL_MARKS, run_kubectl

pytestmark = KUBECTL_MARKS


async def kubectl_json(kubeconfig: str, tmp: Path, *args: str) -> Any:
    """:func:`run_kubectl`'s output, parsed as JSON."""
    return json.loads(await run_kubectl(kubeconfig, tmp, *args))


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

    server = ApiServer()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(partial(serve, server, engine="fast"))
        kubeconfig = str(tmp_path / "kubeconfig")
        write_kubeconfig(url, kubeconfig)
        async with KubeClient(KubeConfig(server=url)) as client:
            await KubeNodeHooks(client).on_machine_configured(MACHINE)
        out = await run_kubectl(kubeconfig, tmp_path, "describe", "node", MACHINE.node_name)
        nursery.cancel_scope.cancel()
    lease = out[out.index("Lease:"):].splitlines()
    # no holder (a kubelet stand-in such as kwok takes it: sim/test_shard_heartbeat.py)
    assert lease[1].split() == ["HolderIdentity:", "<unset>"], out
    assert lease[3].split()[0] == "RenewTime:", out
