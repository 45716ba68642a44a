"""The real operator against the Go shard peer (grpc-go server, protobuf-go codec): the uplink
as protobuf-go decodes it, every downlink kind, stream ends with a status, and the > 4 MiB
roll-up (docs/wire.md#go-interop)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import trio

from bigfleet_trio.kube.errors import NotFound
from bigfleet_trio.kube.resources import (
    AVAILABLE_CAPACITIES,
    CAPACITY_REQUESTS,
    NODES,
    UPCOMING_NODES,
)
from bigfleet_trio.operator.available import available_capacity_name
from bigfleet_trio.proto import pb
from tests.interop._peer import world
from tests.support.capacity import cr

pytestmark = [pytest.mark.interop, pytest.mark.slow]

ZONE = "topology.kubernetes.io/zone"


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
        await w.start_operator()
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


INSTANCE = "node.kubernetes.io/instance-type"
REQ = [{"key": INSTANCE, "operator": "OPERATOR_IN", "values": ["m.go"]}]


def nsu(state: str, **extra: Any) -> dict[str, Any]:
    return {"send": {"node_state_update": {
        "supersedes_key": "node:go-m-1", "machine_id": "go-m-1", "cluster_id": "c1",
        "state": state, "labels": {INSTANCE: "m.go", "topology.kubernetes.io/zone": "z-a"},
        "resources": {"resources": {"cpu": "4", "memory": "16Gi"}},
        "taints": [{"key": "bigfleet.lucy.sh/new", "value": "1", "effect": "NoSchedule"}],
        **extra}}}


def every_kind(gate: Path) -> list[dict[str, Any]]:
    return [
        {"await": "hello"},
        {"send": {"ack": {"echo": "hello", "coordinator_term": "3", "shard_epoch": "9"}}},
        {"await": "rollup"},
        {"send": {"available_capacity": {
            "supersedes_key": "available:go-1", "requirements": REQ,
            "resources": {"resources": {"cpu": "4", "memory": "16Gi"}}, "available_count": 5,
            "confidence": "CONFIDENCE_HIGH", "cost_per_hour": 0.25}}},
        nsu("MACHINE_STATE_CREATING"),
        {"send": {"bootstrap_request": {"request_id": "go-boot-1", "cluster_id": "c1",
                                        "requirements": REQ}}},
        {"await": "bootstrap_response"},
        nsu("MACHINE_STATE_CONFIGURED", node_name="go-node-1", provider_id="go://go-m-1"),
        {"wait_file": str(gate)},  # the test has checked the UpcomingNode
        {"send": {"reclaim_instruction": {"instruction_id": "go-r-1", "nodes": ["go-node-1"],
                                          "grace_period_seconds": "5", "preemptor_priority": 100}}},
        {"await": "reclaim_ack"},
    ]


async def test_go_downlink_ack_available_capacity_node_state_update_bootstrap_request_reclaim_instruction_handled_uplink_hello_rollup_bootstrap_response_reclaim_ack_byte_identical(  # noqa: E501 - the name lists the kinds
    tmp_path: Path, goshard: str
) -> None:
    gate = tmp_path / "reclaim.gate"
    script = {"sessions": [every_kind(gate)]}
    async with world(tmp_path, goshard, script, start_operator=False) as w:
        await w.client.create(NODES, {"apiVersion": "v1", "kind": "Node",
                                      "metadata": {"name": "go-node-1"}})
        await w.start_operator()

        async def upcoming_ready() -> dict[str, Any] | None:
            try:
                un = await w.client.get(UPCOMING_NODES, "un-go-m-1")
            except NotFound:
                return None
            return un if (un.get("status") or {}).get("phase") == "Ready" else None

        await w.until("the UpcomingNode Ready", upcoming_ready, 90)
        un = await upcoming_ready()
        assert un is not None
        assert un["spec"]["labels"] == {INSTANCE: "m.go", "topology.kubernetes.io/zone": "z-a"}
        assert un["spec"]["taints"] == [
            {"key": "bigfleet.lucy.sh/new", "value": "1", "effect": "NoSchedule"}
        ]
        assert un["status"]["providerID"] == "go://go-m-1"
        assert un["status"]["nodeRef"]["name"] == "go-node-1"
        gate.touch()
        await w.until("the ReclaimAck", lambda: w.peer.uplink("reclaim_ack"), 90)
        log = w.operator_log()
        assert "shard ack echo=hello term=3 epoch=9 cluster=c1" in log
        (boot,) = w.peer.uplink("bootstrap_response")
        answer = boot["frame"]["bootstrap_response"]
        assert answer["request_id"] == "go-boot-1" and answer.get("user_data")
        assert not answer.get("error"), answer
        (ack,) = w.peer.uplink("reclaim_ack")
        assert ack["frame"]["reclaim_ack"] == {"instruction_id": "go-r-1", "nodes_started": 1}
        node = await w.client.get(NODES, "go-node-1")
        assert node["spec"].get("unschedulable") is True  # cordoned for the drain
        # Every uplink frame kind, re-encoded by protobuf-go, is the bytes we sent.
        ups = w.peer.uplink(session=1)
        assert {r["kind"] for r in ups} == {"hello", "rollup", "bootstrap_response",
                                            "reclaim_ack"}
        assert [r for r in ups if not r["reencoded_identical"]] == []

        ac = await w.client.get(AVAILABLE_CAPACITIES, available_capacity_name("available:go-1"))
        assert ac["spec"] == {
            "availability": "High", "availableCount": 5, "cost": "250m",
            "resources": {"cpu": "4", "memory": "16Gi"},
            "requirements": [{"key": INSTANCE, "operator": "In", "values": ["m.go"]}],
        }
        # The reclaimed machine's Node drained (no Pods): its UpcomingNode is gone.
        await w.until("the UpcomingNode drained", lambda: upcoming_ready_gone(w))


async def upcoming_ready_gone(w: Any) -> bool:
    try:
        await w.client.get(UPCOMING_NODES, "un-go-m-1")
    except NotFound:
        return True
    return False


async def test_stream_ended_by_go_with_a_status_is_logged_with_the_shards_message(
    tmp_path: Path, goshard: str
) -> None:
    script = {"sessions": [[
        {"await": "hello"},
        {"end": {"code": 14, "message": "shard go-1 draining for upgrade (interop)"}},
    ]], "default": [{"await": "hello"}]}
    async with world(tmp_path, goshard, script) as w:
        await w.until("the redial", lambda: w.peer.records("open", session=2))
        (end,) = w.peer.records("end", session=1)
        assert end["code"] == 14
        await w.until("the status in the operator's log",
                      lambda: "shard go-1 draining for upgrade (interop)" in w.operator_log())
        line = next(ln for ln in w.operator_log().splitlines() if "(interop)" in ln)
        assert "UNAVAILABLE" in line, line


async def test_rollup_above_4mib_decoded_by_protobuf_go_byte_identical(
    tmp_path: Path, goshard: str
) -> None:
    # grpc-go's default receive limit is 4 MiB; the shard raises it to 256 MiB, as the agent
    # does for its sends. 720 needs of ~6 KB each (a long In list) make a ~4.4 MB roll-up.
    values = [f"instance-type-{i:03d}-" + "x" * 40 for i in range(100)]
    crs = [cr(f"big-{i:04d}", i, {"cpu": "1"},
              requirements=[{"key": INSTANCE, "operator": "In", "values": values}])
           for i in range(720)]
    async with world(tmp_path, goshard, {"default": [{"await": "rollup", "count": 3}]},
                     start_operator=False) as w:
        async with trio.open_nursery() as nursery:
            for chunk in range(0, len(crs), 90):
                nursery.start_soon(create_all, w.client, crs[chunk:chunk + 90])
        await w.start_operator()
        await w.until("the > 4 MiB roll-up", lambda: [
            r for r in w.peer.uplink("rollup") if r["needs"] == 720], 180)
        big = next(r for r in w.peer.uplink("rollup") if r["needs"] == 720)
        assert big["raw_len"] > 4 * 1024 * 1024
        assert big["reencoded_identical"], big
        assert w.peer.records("end") == []  # no RESOURCE_EXHAUSTED, the stream stays up


async def test_node_state_update_burst_30k_from_go_every_bootstrap_request_answered_on_time(
    tmp_path: Path, goshard: str
) -> None:
    # 10K machines x 3 states, written by grpc-go as fast as flow control lets it, with a
    # BootstrapRequest after every 1000 updates. (Answers are written one at a time, so a larger
    # batch of simultaneous requests measures that, not the burst; docs/wire.md#go-interop.)
    # The shard gives each request one roll-up cycle (10 s, the peer's -bootstrap-deadline)
    # before it counts a shortfall (docs/wire.md#bootstrap-first).
    script = {"sessions": [[
        {"await": "hello"},
        {"await": "rollup"},
        {"burst": {"cluster_id": "c1", "machines": 10_000, "bootstrap_every": 1000,
                   "states": ["MACHINE_STATE_IDLE", "MACHINE_STATE_CONFIGURING",
                              "MACHINE_STATE_CONFIGURED"]}},
        {"await_bootstrap_answers": True, "timeout": "120s"},
    ]]}
    async with world(tmp_path, goshard, script) as w:
        await w.until("every bootstrap request answered",
                      lambda: w.peer.records("bootstrap_all_answered"), 240)
        (sent,) = w.peer.records("burst_sent")
        assert (sent["node_state_updates"], sent["bootstrap_requests"]) == (30_000, 30)
        answers = w.peer.records("bootstrap_answer")
        assert len(answers) == 30
        assert [a for a in answers if a["late"] or a["error"]] == []
        assert w.peer.records("end") == []
