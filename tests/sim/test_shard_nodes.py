"""Node registration hooks of the simulated shard: a Node is registered for each Configured
machine through the Kubernetes API."""

from __future__ import annotations

import datetime as dt
from typing import Any

from bigfleet_trio.kube import NODES
from bigfleet_trio.kube.errors import AlreadyExists, NotFound
from bigfleet_trio.sim.shard import KubeNodeHooks, MachineInfo, ShapeTaint, node_manifest

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


class FakeClient:
    def __init__(self, exists: bool = False, gone: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.exists = exists
        self.gone = gone

    async def create(self, res: Any, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", res.plural, body["metadata"]["name"]))
        if self.exists:
            raise AlreadyExists(409, "AlreadyExists", "exists", None)
        return body

    async def patch(self, res: Any, name: str, patch: Any, namespace: str | None = None, *,
                    subresource: str | None = None) -> dict[str, Any]:
        self.calls.append(("patch", res.plural, name, subresource, sorted(patch)))
        return {}

    async def delete(self, res: Any, name: str) -> None:
        self.calls.append(("delete", res.plural, name))
        if self.gone:
            raise NotFound(404, "NotFound", "gone", None)


async def test_kube_hooks_create_then_status_patch() -> None:
    client = FakeClient()
    await KubeNodeHooks(client).on_machine_configured(MACHINE)
    assert client.calls == [("create", NODES.plural, "gpu-z-a-abc"),
                            ("patch", "nodes", "gpu-z-a-abc", "status", ["status"])]


async def test_kube_hooks_existing_node_is_patched() -> None:
    client = FakeClient(exists=True)
    await KubeNodeHooks(client).on_machine_configured(MACHINE)
    assert [c[0] for c in client.calls] == ["create", "patch", "patch"]
    assert client.calls[1] == ("patch", "nodes", "gpu-z-a-abc", None, ["metadata", "spec"])


async def test_kube_hooks_delete_ignores_not_found() -> None:
    client = FakeClient(gone=True)
    await KubeNodeHooks(client).on_machine_released(MACHINE)
    assert client.calls == [("delete", "nodes", "gpu-z-a-abc")]
