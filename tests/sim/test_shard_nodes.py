"""Node registration hooks of the simulated shard: a Node is registered for each Configured
machine through the Kubernetes API."""

from __future__ import annotations

import datetime as dt
from typing import Any

import trio

from bigfleet_trio.kube.resources import NODES
from bigfleet_trio.sim.shard.catalog import ShapeTaint
from bigfleet_trio.sim.shard.engine import MachineInfo
from bigfleet_trio.sim.shard.nodes import KubeNodeHooks, node_manifest
from tests.support.kube import RecordingKube

MACHINE = MachineInfo(
    machine_id="i-1",
    node_name="gpu-z-a-abc",
    provider_id="sim://r/z-a/i-1",
    instance_type="gpu",
    zone="z-a",
    labels={"kubernetes.io/hostname": "gpu-z-a-abc", "topology.kubernetes.io/zone": "z-a"},
    allocatable={"cpu": "16", "nvidia.com/gpu": "4"},
    taints=(ShapeTaint("nvidia.com/gpu", "present", "NoSchedule"),
            ShapeTaint("x", "", "NoExecute")),
    price_per_hour=3.0,
)
NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def test_node_manifest() -> None:
    node = node_manifest(MACHINE, now=NOW)
    assert node["metadata"] == {
        "name": "gpu-z-a-abc",
        "labels": {"kubernetes.io/hostname": "gpu-z-a-abc", "topology.kubernetes.io/zone": "z-a"},
        "annotations": {"bigfleet.lucy.sh/machine-id": "i-1"},
    }
    assert node["spec"] == {
        "providerID": "sim://r/z-a/i-1",
        "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                   {"key": "x", "effect": "NoExecute"}],
    }
    st = node["status"]
    assert st["capacity"] == st["allocatable"] == {"cpu": "16", "nvidia.com/gpu": "4"}
    assert st["conditions"][0]["type"] == "Ready" and st["conditions"][0]["status"] == "True"
    assert st["conditions"][0]["lastHeartbeatTime"] == "2026-01-02T03:04:05Z"


def _calls(kube: RecordingKube) -> list[tuple[Any, ...]]:
    """Writes as ``(op, plural, name)``; a patch as ``(patch, plural, name, subresource, keys)``."""
    out: list[tuple[Any, ...]] = []
    for r in kube.history:
        if r.op.startswith("patch"):
            out.append(("patch", r.plural, r.name, r.op.partition("/")[2] or None, sorted(r.body)))
        else:
            out.append((r.op, r.plural, r.name))
    return out


async def test_kube_hooks_create_then_status_patch(nursery: trio.Nursery) -> None:
    kube = RecordingKube.over_sim(nursery)
    await KubeNodeHooks(kube).on_machine_configured(MACHINE)
    assert _calls(kube) == [("create", NODES.plural, "gpu-z-a-abc"),
                            ("patch", "nodes", "gpu-z-a-abc", "status", ["status"]),
                            ("create", "leases", "gpu-z-a-abc")]
    node = kube.objects(NODES)["gpu-z-a-abc"]
    assert node["status"]["allocatable"] == {"cpu": "16", "nvidia.com/gpu": "4"}


async def test_a_registered_node_has_its_kubelet_lease(nursery: trio.Nursery) -> None:
    """``kubectl describe node`` reads ``kube-node-lease/<node>``: the sim writes it, owned by
    the Node."""
    from bigfleet_trio.kube.resources import LEASES

    kube = RecordingKube.over_sim(nursery)
    await KubeNodeHooks(kube).on_machine_configured(MACHINE)
    node = kube.objects(NODES)["gpu-z-a-abc"]
    lease = await kube.get(LEASES, "gpu-z-a-abc", "kube-node-lease")
    assert "holderIdentity" not in lease["spec"]  # kwok takes it (sim/test_shard_heartbeat.py)
    assert lease["spec"]["renewTime"] and lease["spec"]["leaseDurationSeconds"] == 40
    (owner,) = lease["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Node", "gpu-z-a-abc", node["metadata"]["uid"])


async def test_kube_hooks_existing_node_is_patched(nursery: trio.Nursery) -> None:
    kube = RecordingKube.over_sim(nursery)
    kube.seed(NODES, {"metadata": {"name": "gpu-z-a-abc"}})
    await KubeNodeHooks(kube).on_machine_configured(MACHINE)
    assert [c[0] for c in _calls(kube)] == ["create", "patch", "patch", "create"]
    assert _calls(kube)[1] == ("patch", "nodes", "gpu-z-a-abc", None, ["metadata", "spec"])
    assert kube.objects(NODES)["gpu-z-a-abc"]["spec"]["providerID"] == "sim://r/z-a/i-1"


async def test_kube_hooks_delete_ignores_not_found(nursery: trio.Nursery) -> None:
    kube = RecordingKube.over_sim(nursery)  # no such Node: a real 404
    await KubeNodeHooks(kube).on_machine_released(MACHINE)
    assert _calls(kube) == [("delete", "nodes", "gpu-z-a-abc")]
