"""Roll-ups go out from the aggregator's cached per-need encodings, byte-identical to betterproto.

docs/wire.md#roll-up-encoding. The encoder itself is checked against betterproto over random
CR sets in test_rollup_property.py; here: the source, the session's first and later roll-ups.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import trio

from bigfleet_trio.operator.rollup.aggregate import RollupAggregator
from bigfleet_trio.operator.rollup.encoding import build_rollup_message
from bigfleet_trio.operator.session.core import Session
from bigfleet_trio.operator.session.types import Reply, SessionConfig
from bigfleet_trio.operator.wiring import CapacityRequestRollup
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.codec import EncodedFrame
from bigfleet_trio.shard.grpc import OperatorCodec
from bigfleet_trio.shard.transport import StreamClosed
from tests.support import capacity


def cr(name: str, cpu: str, *, zone: str | None = None, op: str = "In",
       phase: str | None = None) -> dict[str, Any]:
    extra = ({"requirements": [{"key": "zone", "operator": op, "values": [zone]}]}
             if zone is not None else {})
    return capacity.cr(name, 5, {"cpu": cpu, "memory": "1Gi"}, namespace="ns",
                       resource_version="1", phase=phase, **extra)


def betterproto_bytes(cluster: str, needs: list[pb.CapacityNeed], now: int) -> bytes:
    return bytes(pb.OperatorMessage(rollup=build_rollup_message(cluster, needs, now)))


def test_aggregator_encoded_rollup_is_betterprotos_bytes() -> None:
    agg = RollupAggregator()
    for i, (cpu, zone) in enumerate([("1", "a"), ("500m", "a"), ("2", "b"), ("3", None)]):
        agg.upsert(f"ns/c{i}", cr(f"c{i}", cpu, zone=zone))
    frame = agg.encoded_rollup("c1", 1_700_000_000_123_456_789)
    assert frame.kind == "rollup" and agg.need_count == 3
    assert frame.data == betterproto_bytes("c1", agg.needs(), 1_700_000_000_123_456_789)
    empty = RollupAggregator().encoded_rollup("c1", 0)
    assert empty.data == betterproto_bytes("c1", [], 0) == bytes.fromhex("1204" "0a026331")


async def test_source_build_encoded_equals_build_and_remembers_pending() -> None:
    src = CapacityRequestRollup("c1", events=None, acknowledger=None, now_ns=lambda: 42)
    src.on_add(cr("a", "1", zone="a", phase="Pending"))
    src.on_add(cr("b", "2", zone="b"))
    src.on_add(cr("g", "4", zone="1", op="Gt"))  # excluded: the wire cannot carry Gt
    frame = await src.build_encoded()
    assert frame.data == bytes(pb.OperatorMessage(rollup=await src.build()))
    assert src.statistics().needs_last_rollup == 2
    assert src.statistics().rollups_built == 2


class RecordingStream:
    """An agent stream that records what the session hands over, as handed over."""

    def __init__(self) -> None:
        self.sent: list[pb.OperatorMessage | EncodedFrame] = []
        self.two_rollups = trio.Event()

    async def send(self, msg: pb.OperatorMessage | EncodedFrame) -> None:
        self.sent.append(msg)
        if sum(isinstance(m, EncodedFrame) for m in self.sent) == 2:
            self.two_rollups.set()

    async def receive(self) -> pb.ShardMessage:
        await trio.sleep_forever()
        raise AssertionError  # pragma: no cover

    async def aclose(self) -> None:
        pass


class NoHandlers:
    async def on_bootstrap_request(self, req: pb.BootstrapRequest) -> pb.BootstrapBlobResponse:
        raise AssertionError("no frames in this test")

    async def on_reclaim_instruction(self, instr: pb.ReclaimInstruction, reply: Reply) -> None:
        raise AssertionError("no frames in this test")

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> None:
        raise AssertionError("no frames in this test")

    async def on_available_capacity(self, u: pb.AvailableCapacityUpdate) -> None:
        raise AssertionError("no frames in this test")


async def test_session_sends_first_and_later_rollups_from_cached_encodings(
    autojump_clock: trio.abc.Clock,
) -> None:
    clock = iter(range(100, 200))
    src = CapacityRequestRollup("c1", events=None, acknowledger=None, now_ns=lambda: next(clock))
    src.on_add(cr("a", "1", zone="a"))
    stream = RecordingStream()
    session = Session(stream, SessionConfig("c1", rollup_interval=10, send_timeout=math.inf),
                      src, NoHandlers())
    with trio.move_on_after(60):
        async with trio.open_nursery() as n:
            n.start_soon(session.run)
            await trio.sleep(5)  # first roll-up at connect
            src.on_add(cr("b", "3", zone="b"))  # changes demand before the second one
            await stream.two_rollups.wait()
            n.cancel_scope.cancel()
    hello, first, second = stream.sent[:3]
    assert isinstance(hello, pb.OperatorMessage) and hello.hello.cluster_id == "c1"
    assert isinstance(first, EncodedFrame) and isinstance(second, EncodedFrame)
    agg_one = RollupAggregator()
    agg_one.upsert("ns/a", cr("a", "1", zone="a"))
    assert first.data == betterproto_bytes("c1", agg_one.needs(), 100)
    assert second.data == betterproto_bytes("c1", src.aggregator.needs(), 101)


def test_grpc_codec_writes_encoded_frames_as_they_are() -> None:
    codec = OperatorCodec(max_message_bytes=8)
    assert codec.encode(EncodedFrame("rollup", b"\x12\x00"), pb.OperatorMessage) == b"\x12\x00"
    with pytest.raises(ValueError, match="exceeds the 8 byte limit"):
        codec.encode(EncodedFrame("rollup", b"x" * 9), pb.OperatorMessage)
    assert codec.decode(b"\x0a\x00", pb.ShardMessage) == b"\x0a\x00"  # decoded by the bridge


def test_memory_stream_delivers_encoded_frames_as_messages() -> None:
    """The in-memory seam does what the wire does: the shard end gets a message."""
    from bigfleet_trio.shard.transport import memory_stream_pair

    async def main() -> pb.OperatorMessage:
        op, shard = memory_stream_pair()
        data = bytes(pb.OperatorMessage(rollup=pb.ClusterCapacityNeeds(cluster_id="c1")))
        await op.send(EncodedFrame("rollup", data))
        got = await shard.receive()
        await op.aclose()
        with pytest.raises(StreamClosed):
            await shard.receive()
        return got

    assert trio.run(main).rollup.cluster_id == "c1"


def test_pending_snapshot_is_not_changed_by_later_events() -> None:
    agg = RollupAggregator()
    agg.upsert("ns/a", cr("a", "1", phase="Pending"))
    agg.upsert("ns/b", cr("b", "1"))  # no status yet: Pending too
    agg.upsert("ns/x", cr("x", "1", phase="Acknowledged"))
    snap = agg.pending_snapshot()
    assert snap == {"ns/a", "ns/b"}
    agg.upsert("ns/c", cr("c", "1"))
    agg.delete("ns/a")
    agg.upsert("ns/b", cr("b", "1", phase="Acknowledged"))
    assert snap == {"ns/a", "ns/b"}  # what the last roll-up saw
    assert agg.pending() == agg.pending_snapshot() == {"ns/c"}
    agg.upsert("ns/d", cr("d", "1"))
    assert agg.pending() == {"ns/c", "ns/d"}
