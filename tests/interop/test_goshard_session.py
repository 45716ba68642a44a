"""The real operator against the Go shard peer (grpc-go server, protobuf-go codec): the uplink
as protobuf-go decodes it, every downlink kind, stream ends with a status, and the > 4 MiB
roll-up (docs/wire.md#go-interop)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from bigfleet_trio.kube.resources import CAPACITY_REQUESTS
from bigfleet_trio.proto import pb
from tests.interop._peer import operator_argv, world

pytestmark = [pytest.mark.interop, pytest.mark.slow]

API = "bigfleet.lucy.sh/v1alpha1"
ZONE = "topology.kubernetes.io/zone"


def cr(name: str, priority: int, resources: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "CapacityRequest",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"priority": priority, "resources": resources, **spec},
    }


#: CapacityRequests that exercise every CapacityNeed field: maps with several keys (map entry
#: order is where encoders differ), every operator the wire carries, spread, both penalties,
#: a co-location group (its key holds a NUL byte).
MIXED = [
    cr("plain", 100,
       {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1", "ephemeral-storage": "1Gi"}),
    cr("plain-2", 100, {"cpu": "500m", "memory": "8Gi"}),
    cr("reqs", -5, {"cpu": "1"}, interruptionPenalty="500m", reclamationPenalty="8192",
       requirements=[
           {"key": ZONE, "operator": "In", "values": ["b", "a"]},
           {"key": ZONE, "operator": "NotIn", "values": ["c"]},
           {"key": "kubernetes.io/arch", "operator": "Exists"},
           {"key": "spot", "operator": "DoesNotExist"},
       ],
       topologySpread=[
           {"topologyKey": ZONE, "maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"},
           {"topologyKey": "rack", "maxSkew": 3, "whenUnsatisfiable": "DoNotSchedule"},
       ]),
    cr("colo", 7, {"cpu": "3", "memory": "1Gi"},
       coLocation={"topologyKey": ZONE,
                   "labelSelector": {"matchLabels": {"app": "db", "tier": "x"}}}),
]


async def create_all(client: Any, objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        await client.create(CAPACITY_REQUESTS, obj, "default")


async def test_hello_and_rollup_decoded_by_protobuf_go_reencode_byte_identical(
    tmp_path: Path, goshard: str
) -> None:
    async with world(tmp_path, goshard, {"default": [{"await": "rollup", "count": 2}]},
                     start_operator=False) as w:
        await create_all(w.client, MIXED)
        w.operator = await w.procs.start(
            "operator", *operator_argv(w.kubeconfig, w.peer.addr, "c1"))
        await w.until("a roll-up with every need", lambda: any(
            len(r["frame"]["rollup"].get("needs", [])) == 3 for r in w.peer.uplink("rollup")))
        first = w.peer.uplink(session=1)
        assert first[0]["kind"] == "hello"
        assert first[0]["frame"] == {"hello": {"cluster_id": "c1", "protocol_version": "v1alpha1"}}
        rollup = next(r for r in w.peer.uplink("rollup")
                      if len(r["frame"]["rollup"].get("needs", [])) == 3)
        # protobuf-go's deterministic re-encoding gives back exactly the bytes we sent.
        assert rollup["reencoded_identical"], rollup
        assert first[0]["reencoded_identical"], first[0]
        # ... and they are the roll-up we meant (decoded on our side too).
        sent = pb.OperatorMessage().parse(base64.b64decode(rollup["raw_b64"]))
        assert sent.rollup.cluster_id == "c1"
        groups = sorted(n.group for n in sent.rollup.needs)
        assert groups[-1].startswith(ZONE + "\x00")
        go_needs = rollup["frame"]["rollup"]["needs"]
        assert sorted(n.get("priority", 0) for n in go_needs) == [-5, 7, 100]
        merged = next(n for n in go_needs if n.get("priority") == 100)
        assert merged["aggregate_resources"]["memory"] == "12Gi"
