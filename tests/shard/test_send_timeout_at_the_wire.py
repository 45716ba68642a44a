"""The send timeout holds at the wire: a shard whose HTTP/2 window is full ends the session.

docs/wire.md#send-timeout. The shard is a separate process (``stalled_h2_shard.py``) that
grants a stream window of Hello plus 10 bytes and never a byte more; the operator side is the
real gRPC connector and session. Hello fits in the window, the first roll-up does not: it is
the frame that waits. Before the fix, 16 roll-ups went into a buffer between the session and
grpclib before any send timed out; the assertions are on what was handed over and how the
session ended, not on time.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import betterproto
import pytest
import trio

from bigfleet_trio.operator.session.core import Session
from bigfleet_trio.operator.session.types import Reply, SendStalled, SessionConfig
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.bridge import open_loop
from bigfleet_trio.shard.codec import EncodedFrame
from bigfleet_trio.shard.grpc import GrpcConnector
from bigfleet_trio.shard.transport import OperatorStream

SERVER = Path(__file__).with_name("stalled_h2_shard.py")
DEADLINE = 60.0


class Source:
    """Roll-ups of ~60 bytes, a new one every tick."""

    def __init__(self) -> None:
        self.n = 0

    async def build(self) -> pb.ClusterCapacityNeeds:
        self.n += 1
        return pb.ClusterCapacityNeeds(
            timestamp_unix_nanos=self.n,
            needs=[pb.CapacityNeed(aggregate_resources={"cpu": "2", "memory": "8Gi"}, group="g")],
        )

    async def after_enqueue(self) -> None:
        pass


class Handlers:
    async def on_bootstrap_request(self, req: pb.BootstrapRequest) -> pb.BootstrapBlobResponse:
        raise AssertionError("not sent")

    async def on_reclaim_instruction(self, instr: pb.ReclaimInstruction, reply: Reply) -> None:
        raise AssertionError("not sent")

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> None:
        raise AssertionError("not sent")

    async def on_available_capacity(self, u: pb.AvailableCapacityUpdate) -> None:
        raise AssertionError("not sent")


class Counting:
    """Counts the frames the session hands to the transport and those the transport took."""

    def __init__(self, inner: OperatorStream) -> None:
        self.inner = inner
        self.handed: list[str] = []
        self.written: list[str] = []

    async def send(self, msg: pb.OperatorMessage | EncodedFrame) -> None:
        kind = msg.kind if isinstance(msg, EncodedFrame) else betterproto.which_one_of(
            msg, "payload")[0]
        self.handed.append(kind)
        await self.inner.send(msg)
        self.written.append(kind)

    async def receive(self) -> pb.ShardMessage:
        return await self.inner.receive()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_shard_with_a_full_window_ends_the_session_with_send_stalled() -> None:
    hello = pb.OperatorMessage(hello=pb.Hello(cluster_id="c1", protocol_version="v1alpha1"))
    window = 5 + len(bytes(hello)) + 10  # gRPC prefix + Hello, and 10 bytes of a roll-up
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once, read one line, killed at the end
        [sys.executable, str(SERVER), str(window)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        port = int(await trio.to_thread.run_sync(proc.stdout.readline))
        config = SessionConfig("c1", rollup_interval=0.02, send_timeout=0.5)
        with trio.fail_after(DEADLINE):
            async with open_loop(), GrpcConnector("127.0.0.1", port).connect() as stream:
                counting = Counting(stream)
                with pytest.raises(SendStalled, match="rollup frame not accepted within 0.5s"):
                    await Session(counting, config, Source(), Handlers()).run()
    finally:
        proc.kill()
        proc.wait()
    # Exactly one frame was handed over and never written: the roll-up that did not fit the
    # window, the one that timed out. Roll-ups built meanwhile replaced each other in the
    # pending slot; none queued behind it (before the fix: 16 more in the uplink buffer).
    # (Normally Hello alone is written; a client may send before it applies the shard's
    # SETTINGS, so a roll-up or two can slip into the default window first.)
    assert counting.written[0] == "hello"
    assert counting.handed == [*counting.written, "rollup"]
    assert len(counting.written) < 16  # the old uplink buffer alone held 16
