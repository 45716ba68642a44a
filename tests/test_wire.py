"""Wire compatibility: the proto sources, the committed descriptor and the generated code agree
with BigFleet's wire contract (docs/wire.md#shardsession-and-its-messages).

The expected table below is transcribed by hand from BigFleet's published protocol; it is what
a real BigFleet shard understands. Three checks hang off it:

* every message, field number, type, label, oneof, map, enum value and reserved number in the
  committed ``bigfleet_trio/proto/descriptor.binpb`` equals the table (nothing more, nothing less);
* regenerating from ``proto/`` reproduces the committed code and descriptor byte for byte (stale
  generated code fails here);
* frames encoded by the generated betterproto classes decode with Google's protobuf runtime built
  from the descriptor, and vice versa.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, message_factory

from bigfleet_trio.proto import pb

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "bigfleet.v1alpha1"

F = descriptor_pb2.FieldDescriptorProto
STRING, BYTES, INT32, INT64, DOUBLE = (
    F.TYPE_STRING,
    F.TYPE_BYTES,
    F.TYPE_INT32,
    F.TYPE_INT64,
    F.TYPE_DOUBLE,
)
MSG, ENUM = F.TYPE_MESSAGE, F.TYPE_ENUM
ONE, REP = F.LABEL_OPTIONAL, F.LABEL_REPEATED
MAP = "map<string,string>"

# message -> {field name: (number, type, label, type_name or None, oneof or None)}
# A map field is written as MAP: a repeated nested *Entry message with string key/value.
MESSAGES: dict[str, dict[str, tuple[object, ...]]] = {
    "OperatorMessage": {
        "hello": (1, MSG, ONE, "Hello", "payload"),
        "rollup": (2, MSG, ONE, "ClusterCapacityNeeds", "payload"),
        "bootstrap_response": (3, MSG, ONE, "BootstrapBlobResponse", "payload"),
        "reclaim_ack": (4, MSG, ONE, "ReclaimAck", "payload"),
    },
    "ShardMessage": {
        "ack": (1, MSG, ONE, "Acknowledgement", "payload"),
        "bootstrap_request": (2, MSG, ONE, "BootstrapRequest", "payload"),
        "reclaim_instruction": (3, MSG, ONE, "ReclaimInstruction", "payload"),
        "node_state_update": (4, MSG, ONE, "NodeStateUpdate", "payload"),
        "available_capacity": (5, MSG, ONE, "AvailableCapacityUpdate", "payload"),
    },
    "Hello": {
        "cluster_id": (1, STRING, ONE, None, None),
        "protocol_version": (3, STRING, ONE, None, None),
    },
    "Acknowledgement": {
        "echo": (1, STRING, ONE, None, None),
        "coordinator_term": (2, INT64, ONE, None, None),
        "shard_epoch": (3, INT64, ONE, None, None),
    },
    "BootstrapRequest": {
        "request_id": (1, STRING, ONE, None, None),
        "requirements": (2, MSG, REP, "NodeSelectorRequirement", None),
        "cluster_id": (3, STRING, ONE, None, None),
    },
    "BootstrapBlobResponse": {
        "request_id": (1, STRING, ONE, None, None),
        "user_data": (2, BYTES, ONE, None, None),
        "ttl_seconds": (3, INT64, ONE, None, None),
        "error": (4, STRING, ONE, None, None),
    },
    "ReclaimInstruction": {
        "instruction_id": (1, STRING, ONE, None, None),
        "nodes": (2, STRING, REP, None, None),
        "grace_period_seconds": (3, INT64, ONE, None, None),
        "preemptor_priority": (4, INT32, ONE, None, None),
    },
    "ReclaimAck": {
        "instruction_id": (1, STRING, ONE, None, None),
        "nodes_started": (2, INT32, ONE, None, None),
    },
    "NodeStateUpdate": {
        "supersedes_key": (1, STRING, ONE, None, None),
        "machine_id": (2, STRING, ONE, None, None),
        "cluster_id": (3, STRING, ONE, None, None),
        "state": (4, ENUM, ONE, "MachineState", None),
        "node_name": (5, STRING, ONE, None, None),
        "provider_id": (6, STRING, ONE, None, None),
        "last_error": (8, STRING, ONE, None, None),
        "labels": (9, MAP),
        "resources": (10, MSG, ONE, "Resources", None),
        "taints": (11, MSG, REP, "Taint", None),
    },
    "Taint": {
        "key": (1, STRING, ONE, None, None),
        "value": (2, STRING, ONE, None, None),
        "effect": (3, STRING, ONE, None, None),
    },
    "AvailableCapacityUpdate": {
        "supersedes_key": (1, STRING, ONE, None, None),
        "requirements": (2, MSG, REP, "NodeSelectorRequirement", None),
        "resources": (3, MSG, ONE, "Resources", None),
        "available_count": (4, INT32, ONE, None, None),
        "confidence": (5, ENUM, ONE, "AvailableCapacityUpdate.Confidence", None),
        "cost_per_hour": (6, DOUBLE, ONE, None, None),
    },
    "ClusterCapacityNeeds": {
        "cluster_id": (1, STRING, ONE, None, None),
        "timestamp_unix_nanos": (2, INT64, ONE, None, None),
        "needs": (3, MSG, REP, "CapacityNeed", None),
    },
    "CapacityNeed": {
        "requirements": (1, MSG, REP, "NodeSelectorRequirement", None),
        "aggregate_resources": (2, MAP),
        "priority": (3, INT32, ONE, None, None),
        "spread": (5, MSG, REP, "TopologySpread", None),
        "interruption_penalty_bucket": (6, ENUM, ONE, "PenaltyBucket", None),
        "reclamation_penalty_bucket": (7, ENUM, ONE, "PenaltyBucket", None),
        "min_unit": (8, MAP),
        "group": (9, STRING, ONE, None, None),
    },
    "NodeSelectorRequirement": {
        "key": (1, STRING, ONE, None, None),
        "operator": (2, ENUM, ONE, "NodeSelectorRequirement.Operator", None),
        "values": (3, STRING, REP, None, None),
    },
    "TopologySpread": {
        "topology_key": (1, STRING, ONE, None, None),
        "max_skew": (2, INT32, ONE, None, None),
        "when_unsatisfiable": (3, ENUM, ONE, "TopologySpread.WhenUnsatisfiable", None),
    },
    "Resources": {
        "resources": (1, MAP),
    },
}

RESERVED: dict[str, set[int]] = {
    "Hello": {2},
    "CapacityNeed": {4},
    "NodeStateUpdate": {7},
    "AvailableCapacityUpdate": {7, 8, 9},
}

_BUCKETS = ["ZERO", "HALF_DOLLAR"] + [str(2**k) for k in range(24)]
ENUMS: dict[str, dict[str, int]] = {
    "MachineState": {
        f"MACHINE_STATE_{n}": i
        for i, n in enumerate(
            "UNSPECIFIED SPECULATIVE CREATING IDLE CONFIGURING CONFIGURED DRAINING DELETING "
            "FAILED".split()
        )
    },
    "PenaltyBucket": {
        "PENALTY_BUCKET_UNSPECIFIED": 0,
        **{f"PENALTY_BUCKET_{n}": i + 1 for i, n in enumerate(_BUCKETS)},
        "PENALTY_BUCKET_PINNED": 27,
    },
    "NodeSelectorRequirement.Operator": {
        "OPERATOR_UNSPECIFIED": 0,
        "OPERATOR_IN": 1,
        "OPERATOR_NOT_IN": 2,
        "OPERATOR_EXISTS": 3,
        "OPERATOR_DOES_NOT_EXIST": 4,
        "OPERATOR_SAME": 5,
    },
    "TopologySpread.WhenUnsatisfiable": {
        "WHEN_UNSATISFIABLE_UNSPECIFIED": 0,
        "WHEN_UNSATISFIABLE_DO_NOT_SCHEDULE": 1,
        "WHEN_UNSATISFIABLE_SCHEDULE_ANYWAY": 2,
    },
    "AvailableCapacityUpdate.Confidence": {
        "CONFIDENCE_UNSPECIFIED": 0,
        "CONFIDENCE_NONE": 1,
        "CONFIDENCE_LOW": 2,
        "CONFIDENCE_MEDIUM": 3,
        "CONFIDENCE_HIGH": 4,
    },
}


def _descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    data = resources.files("bigfleet_trio.proto").joinpath("descriptor.binpb").read_bytes()
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(data)
    return fds


def _collect() -> tuple[
    dict[str, descriptor_pb2.DescriptorProto],
    dict[str, descriptor_pb2.EnumDescriptorProto],
    list[descriptor_pb2.ServiceDescriptorProto],
]:
    messages: dict[str, descriptor_pb2.DescriptorProto] = {}
    enums: dict[str, descriptor_pb2.EnumDescriptorProto] = {}
    services: list[descriptor_pb2.ServiceDescriptorProto] = []

    def walk(prefix: str, msg: descriptor_pb2.DescriptorProto) -> None:
        name = f"{prefix}{msg.name}"
        if msg.options.map_entry:
            return
        messages[name] = msg
        for e in msg.enum_type:
            enums[f"{name}.{e.name}"] = e
        for nested in msg.nested_type:
            walk(f"{name}.", nested)

    for f in _descriptor_set().file:
        assert f.package == PACKAGE, f.name
        for m in f.message_type:
            walk("", m)
        for e in f.enum_type:
            enums[e.name] = e
        services.extend(f.service)
    return messages, enums, services


def _field_shape(
    msg: descriptor_pb2.DescriptorProto, fld: descriptor_pb2.FieldDescriptorProto
) -> tuple[object, ...]:
    if fld.type == MSG:
        entry = next(
            (
                n
                for n in msg.nested_type
                if f".{n.name}" == fld.type_name[fld.type_name.rfind(".") :]
            ),
            None,
        )
        if entry is not None and entry.options.map_entry:
            key, value = entry.field
            assert (key.type, value.type) == (STRING, STRING), fld.name
            return (fld.number, MAP)
    type_name = fld.type_name.removeprefix(f".{PACKAGE}.") or None
    oneof = msg.oneof_decl[fld.oneof_index].name if fld.HasField("oneof_index") else None
    return (fld.number, fld.type, fld.label, type_name, oneof)


def test_messages_fields_and_reserved_numbers_match_protocol_md() -> None:
    messages, _, _ = _collect()
    assert set(messages) == set(MESSAGES)
    for name, expected in MESSAGES.items():
        msg = messages[name]
        got = {f.name: _field_shape(msg, f) for f in msg.field}
        assert got == expected, name
        reserved = {n for r in msg.reserved_range for n in range(r.start, r.end)}
        assert reserved == RESERVED.get(name, set()), name
        # A reserved number must never be reused by a field.
        assert not reserved & {f.number for f in msg.field}, name


def test_enums_match_protocol_md() -> None:
    _, enums, _ = _collect()
    assert set(enums) == set(ENUMS)
    for name, expected in ENUMS.items():
        assert {v.name: v.number for v in enums[name].value} == expected, name


def test_service_is_one_bidirectional_session_rpc() -> None:
    _, _, services = _collect()
    assert [s.name for s in services] == ["Shard"]
    (rpc,) = services[0].method
    assert rpc.name == "Session"
    assert rpc.input_type == f".{PACKAGE}.OperatorMessage"
    assert rpc.output_type == f".{PACKAGE}.ShardMessage"
    assert rpc.client_streaming and rpc.server_streaming
    # The path grpclib dials (betterproto stub) is the one a real shard serves.
    assert "/bigfleet.v1alpha1.Shard/Session" in Path(pb.__file__).read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="scripts/gen-proto is a bash script")
def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHON=sys.executable)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("VIRTUAL_ENV", None)
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen-proto"), str(tmp_path)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    committed = ROOT / "bigfleet_trio" / "proto"
    assert (tmp_path / "sources.sha256").read_text() == (
        committed / "sources.sha256"
    ).read_text(), "a .proto changed since the code was generated: run scripts/gen-proto and commit"
    assert (tmp_path / "descriptor.binpb").read_bytes() == (
        committed / "descriptor.binpb"
    ).read_bytes(), "descriptor.binpb is stale: run scripts/gen-proto and commit"
    fresh = sorted(p.relative_to(tmp_path) for p in (tmp_path / "bigfleet").rglob("*.py"))
    ours = sorted(p.relative_to(committed) for p in (committed / "bigfleet").rglob("*.py"))
    assert fresh == ours
    for rel in fresh:
        assert (tmp_path / rel).read_text() == (committed / rel).read_text(), (
            f"{rel} is stale: run scripts/gen-proto and commit"
        )


def _google_classes() -> dict[str, type]:
    return message_factory.GetMessages(list(_descriptor_set().file))


def test_betterproto_frames_decode_with_google_protobuf_and_back() -> None:
    classes = _google_classes()
    rollup = pb.OperatorMessage(
        rollup=pb.ClusterCapacityNeeds(
            cluster_id="c1",
            timestamp_unix_nanos=1_700_000_000_000_000_000,
            needs=[
                pb.CapacityNeed(
                    requirements=[
                        pb.NodeSelectorRequirement(
                            key="topology.kubernetes.io/zone",
                            operator=pb.NodeSelectorRequirementOperator.OPERATOR_SAME,
                        )
                    ],
                    aggregate_resources={"cpu": "3", "memory": "6Gi"},
                    min_unit={"cpu": "1", "memory": "2Gi"},
                    priority=-5,
                    spread=[
                        pb.TopologySpread(
                            "zone",
                            1,
                            pb.TopologySpreadWhenUnsatisfiable.WHEN_UNSATISFIABLE_DO_NOT_SCHEDULE,
                        )
                    ],
                    interruption_penalty_bucket=pb.PenaltyBucket.PINNED,
                    reclamation_penalty_bucket=pb.PenaltyBucket.HALF_DOLLAR,
                    group="topology.kubernetes.io/zone\x00app=db,;",
                )
            ],
        )
    )
    g = classes[f"{PACKAGE}.OperatorMessage"]()
    g.ParseFromString(bytes(rollup))
    need = g.rollup.needs[0]
    assert g.WhichOneof("payload") == "rollup"
    assert g.rollup.cluster_id == "c1"
    assert dict(need.aggregate_resources) == {"cpu": "3", "memory": "6Gi"}
    assert dict(need.min_unit) == {"cpu": "1", "memory": "2Gi"}
    assert need.priority == -5
    assert need.requirements[0].operator == 5
    assert need.interruption_penalty_bucket == 27
    assert need.reclamation_penalty_bucket == 2
    assert need.spread[0].when_unsatisfiable == 1
    assert need.group == "topology.kubernetes.io/zone\x00app=db,;"

    down = classes[f"{PACKAGE}.ShardMessage"]()
    nsu = down.node_state_update
    nsu.supersedes_key, nsu.machine_id, nsu.state, nsu.node_name = "node:m1", "m1", 5, "n1"
    nsu.labels["zone"] = "a"
    nsu.resources.resources["cpu"] = "8"
    nsu.taints.add(key="gpu", value="true", effect="NoSchedule")
    ours = pb.ShardMessage().parse(down.SerializeToString())
    assert ours.node_state_update.state == pb.MachineState.CONFIGURED
    assert ours.node_state_update.labels == {"zone": "a"}
    assert ours.node_state_update.resources.resources == {"cpu": "8"}
    assert ours.node_state_update.taints[0].effect == "NoSchedule"
