"""Downlink decoding: upb + conversion equals betterproto on a corpus; malformed frames rejected.

Rules in docs/wire.md#downlink-decoding and docs/wire.md#malformed-frames. The transport test
uses real loopback sockets (no autojump clock), bounded by a generous ``fail_after``.
"""

from __future__ import annotations

import logging
from functools import partial

import betterproto
import pytest
import trio

from bigfleet_trio.proto import pb
from bigfleet_trio.shard.bridge import open_loop
from bigfleet_trio.shard.codec import (
    MALFORMED_FRAMES,
    EncodedFrame,
    MalformedFrame,
    NodeStateFrame,
    decode_deferred,
    decode_shard_message,
    is_bootstrap_frame,
)
from bigfleet_trio.shard.grpc import GrpcConnector
from bigfleet_trio.shard.server import serve_shard
from bigfleet_trio.shard.transport import ShardStream

DEADLINE = 10.0

REQ = pb.NodeSelectorRequirement
OP = pb.NodeSelectorRequirementOperator


def corpus() -> list[pb.ShardMessage]:
    """Every downlink kind, with every field kind set (and left empty) at least once."""
    full_nsu = pb.NodeStateUpdate(
        supersedes_key="node:m-00001",
        machine_id="m-00001",
        cluster_id="c1",
        state=pb.MachineState.CONFIGURED,
        node_name="node-00001",
        provider_id="sim://c1/m-00001",
        last_error="ünïcode ☃ error",
        labels={"topology.kubernetes.io/zone": "z1", "node.kubernetes.io/instance-type": "m5"},
        resources=pb.Resources(resources={"cpu": "4", "memory": "16Gi", "pods": "110"}),
        taints=[pb.Taint("dedicated", "gpu", "NoSchedule"), pb.Taint("k", "", "NoExecute")],
    )
    return [
        pb.ShardMessage(ack=pb.Acknowledgement(echo="hello", coordinator_term=7, shard_epoch=3)),
        pb.ShardMessage(ack=pb.Acknowledgement(echo="", coordinator_term=-1, shard_epoch=2**62)),
        pb.ShardMessage(ack=pb.Acknowledgement()),
        pb.ShardMessage(
            bootstrap_request=pb.BootstrapRequest(
                request_id="req-1",
                cluster_id="c1",
                requirements=[
                    REQ("zone", OP.OPERATOR_IN, ["a", "b"]),
                    REQ("gpu", OP.OPERATOR_DOES_NOT_EXIST, []),
                    REQ("pool", OP.OPERATOR_SAME, []),
                ],
            )
        ),
        pb.ShardMessage(bootstrap_request=pb.BootstrapRequest()),
        pb.ShardMessage(
            reclaim_instruction=pb.ReclaimInstruction(
                instruction_id="i-1", nodes=["n1", "n2"], grace_period_seconds=30,
                preemptor_priority=-5,
            )
        ),
        pb.ShardMessage(node_state_update=full_nsu),
        pb.ShardMessage(node_state_update=pb.NodeStateUpdate(machine_id="m-2")),
        pb.ShardMessage(
            node_state_update=pb.NodeStateUpdate(machine_id="m-3", state=pb.MachineState.FAILED,
                                                 last_error="boom", resources=pb.Resources())
        ),
        pb.ShardMessage(
            available_capacity=pb.AvailableCapacityUpdate(
                supersedes_key="available:abc",
                requirements=[REQ("zone", OP.OPERATOR_NOT_IN, ["c"])],
                resources=pb.Resources(resources={"cpu": "96"}),
                available_count=12,
                confidence=pb.AvailableCapacityUpdateConfidence.CONFIDENCE_HIGH,
                cost_per_hour=3.125,
            )
        ),
        pb.ShardMessage(),
    ]


@pytest.mark.parametrize("msg", corpus(), ids=lambda m: betterproto.which_one_of(m, "payload")[0])
def test_upb_decode_equals_betterproto_decode(msg: pb.ShardMessage) -> None:
    data = bytes(msg)
    ours = decode_shard_message(data)
    assert ours == pb.ShardMessage().parse(data) == msg
    assert betterproto.which_one_of(ours, "payload") == betterproto.which_one_of(msg, "payload")
    # and it encodes back to the same message (map entries may come out in another order)
    assert pb.ShardMessage().parse(bytes(ours)) == msg


@pytest.mark.parametrize("msg", corpus(), ids=lambda m: betterproto.which_one_of(m, "payload")[0])
def test_deferred_decode_converts_to_the_same_message(msg: pb.ShardMessage) -> None:
    """A NodeStateUpdate frame is checked at once and converted when taken; the result is the
    eager decode's, and every other kind is decoded at once."""
    data = bytes(msg)
    got = decode_deferred(data)
    kind, value = betterproto.which_one_of(msg, "payload")
    if kind == "node_state_update":
        assert isinstance(got, NodeStateFrame)
        assert (got.machine_id, got.state) == (value.machine_id, int(value.state))
        assert got.to_message() == decode_shard_message(data).node_state_update == value
    else:
        assert got == decode_shard_message(data) == msg


def test_enums_are_members_and_unknown_values_stay_ints() -> None:
    known = decode_shard_message(
        bytes(pb.ShardMessage(node_state_update=pb.NodeStateUpdate(state=pb.MachineState.CONFIGURING)))
    )
    assert known.node_state_update.state is pb.MachineState.CONFIGURING
    # A newer shard's enum value: carried through as the number (the handler reports it).
    raw = bytes.fromhex("22022014")  # NodeStateUpdate{state: 20}
    unknown = decode_shard_message(raw)
    assert unknown.node_state_update.state == 20
    assert unknown == pb.ShardMessage().parse(raw)


def test_unknown_field_numbers_and_kinds_are_accepted() -> None:
    # Field 15 (varint) inside NodeStateUpdate: a newer shard's field, ignored.
    nsu = bytes.fromhex("1201" "61" "7801")  # machine_id="a", field 15 = 1
    msg = decode_shard_message(bytes([0x22, len(nsu)]) + nsu)
    assert msg.node_state_update.machine_id == "a"
    # Oneof field 9: a payload kind this build does not know; nothing is set.
    unknown_kind = decode_shard_message(bytes.fromhex("4a00"))
    assert betterproto.which_one_of(unknown_kind, "payload") == ("", None)


def _count(problem: str) -> float:
    return MALFORMED_FRAMES.labels(problem)._value.get()


@pytest.mark.parametrize(
    ("hexdata", "problem", "detail"),
    [
        # field 4 (NodeStateUpdate) claiming 100 bytes with 4 present
        ("22640a026162", "corrupt", "corrupt"),
        # field 1 (Acknowledgement) as a varint instead of a message
        ("0801", "wrong_wire_type", "ShardMessage field 1 has wire type 0"),
        # NodeStateUpdate.machine_id (string) as a varint
        ("22021001", "wrong_wire_type", "NodeStateUpdate field 2 has wire type 0"),
        # Resources map inside a NodeStateUpdate as a fixed64
        ("2209" "51" "0000000000000000", "wrong_wire_type", "NodeStateUpdate field 10"),
        # unterminated varint
        ("ffffffff", "corrupt", "corrupt"),
        # a string that is not UTF-8
        ("220312" "01ff", "corrupt", "corrupt"),
    ],
)
def test_malformed_frames_are_rejected_and_counted(
    hexdata: str, problem: str, detail: str
) -> None:
    data = bytes.fromhex(hexdata)
    for decode in (decode_shard_message, decode_deferred):  # deferred: rejected when read too
        before = _count(problem)
        with pytest.raises(MalformedFrame, match=detail) as err:
            decode(data)
        assert err.value.problem == problem
        assert _count(problem) == before + 1


def test_deferred_decode_checks_nested_messages_when_read() -> None:
    # Taint.key (string) as a varint, inside a NodeStateUpdate: caught before any worker.
    taint = bytes.fromhex("0801")
    nsu = bytes([0x5a, len(taint)]) + taint  # NodeStateUpdate field 11 (taints)
    with pytest.raises(MalformedFrame, match="Taint field 1 has wire type 0"):
        decode_deferred(bytes([0x22, len(nsu)]) + nsu)


def test_bootstrap_lane_is_chosen_by_the_first_byte() -> None:
    assert is_bootstrap_frame(bytes(pb.ShardMessage(bootstrap_request=pb.BootstrapRequest())))
    assert is_bootstrap_frame(
        bytes(pb.ShardMessage(bootstrap_request=pb.BootstrapRequest(request_id="r")))
    )
    for msg in corpus():
        if betterproto.which_one_of(msg, "payload")[0] != "bootstrap_request":
            assert not is_bootstrap_frame(bytes(msg))


async def test_transport_skips_malformed_frames_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Garbage between valid frames never reaches the caller of receive(); each is logged."""
    good = [
        pb.ShardMessage(ack=pb.Acknowledgement(echo="first")),
        pb.ShardMessage(node_state_update=pb.NodeStateUpdate(machine_id="m-1")),
        pb.ShardMessage(ack=pb.Acknowledgement(echo="last")),
    ]

    async def shard(end: ShardStream) -> None:
        await end.receive()
        await end.send(good[0])
        await end.send(EncodedFrame("raw", bytes.fromhex("22640a026162")))  # type: ignore[arg-type]
        await end.send(good[1])
        await end.send(EncodedFrame("raw", bytes.fromhex("0801")))  # type: ignore[arg-type]
        await end.send(good[2])
        await trio.sleep_forever()

    corrupt, wire = _count("corrupt"), _count("wrong_wire_type")
    caplog.set_level(logging.WARNING, logger="bigfleet_trio.shard.grpc")
    with trio.fail_after(DEADLINE):
        async with open_loop(), trio.open_nursery() as n:
            port = await n.start(partial(serve_shard, shard, port=0))
            async with GrpcConnector("127.0.0.1", port).connect() as s:
                await s.send(pb.OperatorMessage(hello=pb.Hello(cluster_id="c1")))
                got = [await s.receive() for _ in good]
            n.cancel_scope.cancel()
    assert got == good
    assert (_count("corrupt"), _count("wrong_wire_type")) == (corrupt + 1, wire + 1)
    skipped = [r.getMessage() for r in caplog.records if "downlink frame skipped" in r.message]
    assert len(skipped) == 2
    assert "corrupt" in skipped[0] and "22 64 0a 02 61 62" in skipped[0]
    assert "ShardMessage field 1 has wire type 0" in skipped[1]
