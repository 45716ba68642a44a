"""Unknown enum values on the downlink (docs/wire.md#unknown-enum-values): found in decoded
frames from both codecs, reported once per value, and never handed to a handler."""

from __future__ import annotations

import logging
from typing import Any

import betterproto
import pytest
import trio
from prometheus_client import REGISTRY

from bigfleet_trio.operator.session.core import Session
from bigfleet_trio.operator.session.types import SessionConfig
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.codec import decode_shard_message
from bigfleet_trio.shard.enums import UnknownEnum, UnknownEnumReporter, unknown_enum_values
from bigfleet_trio.shard.transport import memory_stream_pair
from tests.support.rollup import EmptyRollupSource

Op = pb.NodeSelectorRequirementOperator


def req(op: int) -> pb.NodeSelectorRequirement:
    return pb.NodeSelectorRequirement(key="zone", operator=op, values=["a"])


def test_known_values_are_not_reported() -> None:
    assert (
        unknown_enum_values(
            "node_state_update", pb.NodeStateUpdate(state=pb.MachineState.CONFIGURED)
        )
        == []
    )
    assert (
        unknown_enum_values("node_state_update", pb.NodeStateUpdate()) == []
    )  # UNSPECIFIED is known
    acu = pb.AvailableCapacityUpdate(confidence=4, requirements=[req(Op.OPERATOR_SAME)])
    assert unknown_enum_values("available_capacity", acu) == []
    assert unknown_enum_values("ack", pb.Acknowledgement(echo="x")) == []
    assert unknown_enum_values("reclaim_instruction", pb.ReclaimInstruction(nodes=["n"])) == []


def test_each_unknown_value_is_named_with_its_field() -> None:
    assert unknown_enum_values("node_state_update", pb.NodeStateUpdate(state=42)) == [
        UnknownEnum("MachineState", 42, "state")
    ]
    acu = pb.AvailableCapacityUpdate(confidence=42, requirements=[req(1), req(9)])
    assert unknown_enum_values("available_capacity", acu) == [
        UnknownEnum("Operator", 9, "requirements[1].operator"),
        UnknownEnum("Confidence", 42, "confidence"),
    ]
    br = pb.BootstrapRequest(request_id="r", requirements=[req(77)])
    assert unknown_enum_values("bootstrap_request", br) == [
        UnknownEnum("Operator", 77, "requirements[0].operator")
    ]


# The frames tried: field 5 (confidence) of an AvailableCapacityUpdate (ShardMessage field 5)
# and field 4 (state) of a NodeStateUpdate (field 4), hand-encoded with values no build knows.
FRAMES = {
    "confidence 42": (bytes.fromhex("2a02282a"), [UnknownEnum("Confidence", 42, "confidence")]),
    "machine state 42": (bytes.fromhex("2202202a"), [UnknownEnum("MachineState", 42, "state")]),
    "operator 9": (
        bytes.fromhex("2a0712050a017a1009"),
        [UnknownEnum("Operator", 9, "requirements[0].operator")],
    ),
}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_frames_on_the_wire_decode_to_ints_that_are_found(name: str) -> None:
    data, expected = FRAMES[name]
    msg = decode_shard_message(data)
    kind, value = betterproto.which_one_of(msg, "payload")
    assert unknown_enum_values(kind, value) == expected


def test_reporter_logs_once_per_kind_and_value_and_counts_every_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def count() -> float:
        return (
            REGISTRY.get_sample_value(
                "bigfleet_operator_unknown_enum_values_total", {"enum": "Confidence"}
            )
            or 0.0
        )

    before = count()
    r = UnknownEnumReporter()
    u = [UnknownEnum("Confidence", 42, "confidence")]
    with caplog.at_level(logging.WARNING, logger="bigfleet_trio.shard.enums"):
        r.report("available_capacity", u, "frame skipped")
        r.report("available_capacity", u, "frame skipped")
        r.report(
            "available_capacity", [UnknownEnum("Confidence", 43, "confidence")], "frame skipped"
        )
    lines = [rec.getMessage() for rec in caplog.records]
    assert lines == [
        "unknown enum value on the downlink kind=available_capacity field=confidence "
        "enum=Confidence value=42: frame skipped (logged once per value; a newer shard?)",
        "unknown enum value on the downlink kind=available_capacity field=confidence "
        "enum=Confidence value=43: frame skipped (logged once per value; a newer shard?)",
    ]
    assert count() - before == 3


class Handlers:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def on_bootstrap_request(self, req: pb.BootstrapRequest) -> pb.BootstrapBlobResponse:
        self.calls.append("bootstrap")
        return pb.BootstrapBlobResponse(user_data=b"x")

    async def on_reclaim_instruction(self, instr: Any, reply: Any) -> None:
        self.calls.append("reclaim")

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> None:
        self.calls.append(f"node:{u.machine_id}")

    async def on_available_capacity(self, u: pb.AvailableCapacityUpdate) -> None:
        self.calls.append(f"available:{u.supersedes_key}")


async def test_session_skips_frames_with_unknown_enums_and_answers_bootstrap_with_an_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    op, shard = memory_stream_pair()
    handlers = Handlers()
    session = Session(op, SessionConfig(cluster_id="c1"), EmptyRollupSource(), handlers)
    async with trio.open_nursery() as n:
        n.start_soon(session.run)
        for msg in (
            pb.ShardMessage(
                available_capacity=pb.AvailableCapacityUpdate(supersedes_key="bad", confidence=42)
            ),
            pb.ShardMessage(node_state_update=pb.NodeStateUpdate(machine_id="m-bad", state=42)),
            pb.ShardMessage(
                bootstrap_request=pb.BootstrapRequest(request_id="r1", requirements=[req(9)])
            ),
            pb.ShardMessage(
                available_capacity=pb.AvailableCapacityUpdate(supersedes_key="ok", confidence=2)
            ),
            pb.ShardMessage(
                node_state_update=pb.NodeStateUpdate(machine_id="m-ok", state=pb.MachineState.IDLE)
            ),
        ):
            await shard.send(msg)
        responses = []
        while not responses:
            kind, value = betterproto.which_one_of(await shard.receive(), "payload")
            if kind == "bootstrap_response":
                responses.append(value)
        await trio.sleep(1)
        n.cancel_scope.cancel()
    assert responses[0].request_id == "r1"
    assert (
        responses[0].error == "operator: unknown enum values: requirements[0].operator=Operator(9)"
    )
    assert sorted(handlers.calls) == ["available:ok", "node:m-ok"]
    assert session.stats.unknown_enum_frames == 3
