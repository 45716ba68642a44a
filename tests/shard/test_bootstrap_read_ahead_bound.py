"""Bootstrap first, at the read-ahead bound (docs/wire.md#bootstrap-first), over real gRPC.

A BootstrapRequest can only be answered once it has been read off the connection, and the frames
ahead of it have to be held to read it: the promise "answered even while the session is paused"
holds while the ordered lane has room (``downlink_buffer`` frames read ahead), and a request
further back is read as soon as the session takes frames again. Small buffers stand in for the
65,536-frame lane. Real I/O, so no autojump clock: a generous ``fail_after`` bounds each test;
the assertions are about order, never about time.
"""

from __future__ import annotations

import math
from functools import partial

import betterproto
import trio

from bigfleet_trio.operator.session.core import Session
from bigfleet_trio.operator.session.types import Reply, SessionConfig
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.bridge import open_loop
from bigfleet_trio.shard.grpc import GrpcConnector
from bigfleet_trio.shard.server import serve_shard
from bigfleet_trio.shard.transport import ShardStream, StreamClosed
from tests.support.rollup import EmptyRollupSource

DEADLINE = 60.0


class _Handlers:
    """NodeStateUpdates wait for ``release`` (a stuck apiserver), then go through."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.answered = trio.Event()
        self.handled = 0
        self.handled_when_answered = -1

    async def on_bootstrap_request(self, req: pb.BootstrapRequest) -> pb.BootstrapBlobResponse:
        self.handled_when_answered = self.handled
        self.answered.set()
        return pb.BootstrapBlobResponse(user_data=b"#cloud-config")

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> None:
        await self.release.wait()
        self.handled += 1

    async def on_reclaim_instruction(self, instr: pb.ReclaimInstruction, reply: Reply) -> None:
        raise AssertionError("not sent")

    async def on_available_capacity(self, u: pb.AvailableCapacityUpdate) -> None:
        raise AssertionError("not sent")


def _nsu(i: int) -> pb.ShardMessage:
    return pb.ShardMessage(node_state_update=pb.NodeStateUpdate(
        supersedes_key=f"node:m-{i:04d}", machine_id=f"m-{i:04d}", cluster_id="c1",
        state=pb.MachineState.CONFIGURED, node_name=f"node-{i:04d}",
    ))


async def _answered_while_paused(
    machines: int, downlink_buffer: int, *, lane_fits: bool
) -> tuple[bool, int]:
    """``machines`` NodeStateUpdates then a BootstrapRequest; the session pauses after 8
    machines and its handlers are stuck. Returns (answered while stuck, handled by then)."""
    handlers = _Handlers()
    frames = [_nsu(i) for i in range(machines)]
    frames.append(pb.ShardMessage(bootstrap_request=pb.BootstrapRequest(request_id="req-1")))
    got_answer = trio.Event()

    async def shard(end: ShardStream) -> None:
        await end.receive()  # Hello
        for f in frames:
            await end.send(f)
        try:
            while True:
                if betterproto.which_one_of(await end.receive(), "payload")[0] == (
                    "bootstrap_response"
                ):
                    got_answer.set()
        except StreamClosed:
            return

    config = SessionConfig("c1", node_state_pending_cap=8, dispatch_concurrency=2,
                           send_timeout=math.inf, rollup_interval=3600)
    with trio.fail_after(DEADLINE):
        async with open_loop(), trio.open_nursery() as n:
            port = await n.start(partial(serve_shard, shard, port=0))
            connector = GrpcConnector("127.0.0.1", port, downlink_buffer=downlink_buffer)
            async with connector.connect() as stream, trio.open_nursery() as inner:
                inner.start_soon(Session(stream, config, EmptyRollupSource(), handlers).run)
                if lane_fits:
                    await got_answer.wait()  # answered while every handler is stuck
                else:
                    # Wait for the reader to fill the ordered lane. The request sits behind more
                    # frames than the lane and the paused session hold together, so it cannot
                    # have been read yet, whatever the timing.
                    lane = stream._ordered  # noqa: SLF001 - the lane's fill level
                    # (polled: a memory channel has no "became full" event)
                    while lane.statistics().current_buffer_used < downlink_buffer:  # noqa: ASYNC110
                        await trio.sleep(0.01)
                while_stuck = got_answer.is_set()
                handlers.release.set()  # the apiserver answers again
                await got_answer.wait()
                inner.cancel_scope.cancel()
            n.cancel_scope.cancel()
    return while_stuck, handlers.handled_when_answered


async def test_bootstrap_answered_while_paused_when_the_backlog_fits_the_read_ahead() -> None:
    # 300 frames ahead of the request, lane of 1,024: all read ahead, the pull answered at once
    while_stuck, handled = await _answered_while_paused(300, downlink_buffer=1024, lane_fits=True)
    assert while_stuck and handled == 0


async def test_bootstrap_beyond_a_full_ordered_lane_waits_for_the_session_to_take_frames() -> None:
    # 300 frames ahead of the request, lane of 64: the reader stops at a full lane (HTTP/2 flow
    # control holds the shard back), so the request is read once the session takes frames again
    while_stuck, handled = await _answered_while_paused(300, downlink_buffer=64, lane_fits=False)
    assert not while_stuck
    assert handled > 0  # answered only after the stuck handlers went on
