"""Bootstrap first, over the real gRPC transport (loopback sockets, grpclib both ends).

docs/wire.md#bootstrap-first: a BootstrapRequest is answered as soon as it is read off the
connection, ahead of queued NodeStateUpdates, and NodeStateUpdates keep per-machine order.
Real I/O, so no autojump clock: each test is bounded by a generous ``fail_after``; the
assertions are about order, never about time.
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

DEADLINE = 120.0
MACHINES = 10_000


class Handlers:
    """NodeStateUpdate handlers wait until the bootstrap pull was answered."""

    def __init__(self) -> None:
        self.answered = trio.Event()
        self.handled: list[tuple[str, int]] = []
        self.handled_when_answered = -1
        self.all_handled = trio.Event()
        self.expected = MACHINES

    async def on_bootstrap_request(self, req: pb.BootstrapRequest) -> pb.BootstrapBlobResponse:
        self.handled_when_answered = len(self.handled)
        self.answered.set()
        return pb.BootstrapBlobResponse(user_data=b"#cloud-config", ttl_seconds=600)

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> None:
        await self.answered.wait()
        self.handled.append((u.machine_id, int(u.state)))
        if len(self.handled) == self.expected:
            self.all_handled.set()

    async def on_reclaim_instruction(self, instr: pb.ReclaimInstruction, reply: Reply) -> None:
        raise AssertionError("not sent")

    async def on_available_capacity(self, u: pb.AvailableCapacityUpdate) -> None:
        raise AssertionError("not sent")


def nsu(i: int, state: pb.MachineState = pb.MachineState.CONFIGURED) -> pb.ShardMessage:
    return pb.ShardMessage(
        node_state_update=pb.NodeStateUpdate(
            supersedes_key=f"node:m-{i:05d}", machine_id=f"m-{i:05d}", cluster_id="c1",
            state=state, node_name=f"node-{i:05d}", labels={"zone": "a"},
            resources=pb.Resources(resources={"cpu": "4"}),
        )
    )


async def run_session(frames: list[pb.ShardMessage], handlers: Handlers) -> list[str]:
    """Serve ``frames`` after Hello, then record the kinds the shard receives until all handled."""
    received: list[str] = []
    response_seen = trio.Event()

    async def shard(end: ShardStream) -> None:
        await end.receive()  # Hello
        for f in frames:
            await end.send(f)
        try:
            while True:
                kind, _ = betterproto.which_one_of(await end.receive(), "payload")
                received.append(kind)
                if kind == "bootstrap_response":
                    response_seen.set()
        except StreamClosed:
            return

    # A backlog cap far below the burst: the ordered pump pauses after 100 waiting machines
    # (and stays paused: every handler waits for the bootstrap answer); only the bootstrap
    # lane can get the pull answered.
    config = SessionConfig("c1", node_state_pending_cap=100, send_timeout=math.inf,
                           rollup_interval=3600)
    with trio.fail_after(DEADLINE):
        async with open_loop(), trio.open_nursery() as n:
            port = await n.start(partial(serve_shard, shard, port=0))
            async with GrpcConnector("127.0.0.1", port).connect() as stream, \
                    trio.open_nursery() as inner:
                inner.start_soon(Session(stream, config, EmptyRollupSource(), handlers).run)
                await response_seen.wait()
                await handlers.all_handled.wait()
                inner.cancel_scope.cancel()
            n.cancel_scope.cancel()
    return received


async def test_bootstrap_request_behind_10k_node_state_updates_is_answered_first() -> None:
    handlers = Handlers()
    frames = [nsu(i) for i in range(MACHINES)]
    frames.append(pb.ShardMessage(bootstrap_request=pb.BootstrapRequest(request_id="req-1")))
    received = await run_session(frames, handlers)
    assert handlers.handled_when_answered == 0  # answered before any queued update was handled
    assert "bootstrap_response" in received
    assert sorted(m for m, _ in handlers.handled) == [f"m-{i:05d}" for i in range(MACHINES)]


async def test_node_state_updates_keep_per_machine_order_around_a_bootstrap() -> None:
    handlers = Handlers()
    states = [pb.MachineState.CREATING, pb.MachineState.CONFIGURING, pb.MachineState.CONFIGURED]
    frames: list[pb.ShardMessage] = []
    for state in states:  # machine-interleaved: 3 rounds over 200 machines
        frames.extend(nsu(i, state) for i in range(200))
        if state == pb.MachineState.CONFIGURING:
            frames.append(pb.ShardMessage(bootstrap_request=pb.BootstrapRequest(request_id="r")))
    # Coalescing may skip intermediate states; count what the workers will handle by waiting
    # for every machine's last state instead of a fixed number of calls.
    handlers.expected = -1
    last_seen = trio.Event()

    async def on_nsu(u: pb.NodeStateUpdate) -> None:
        await handlers.answered.wait()
        handlers.handled.append((u.machine_id, int(u.state)))
        finals = {m for m, s in handlers.handled if s == int(pb.MachineState.CONFIGURED)}
        if len(finals) == 200:
            last_seen.set()
            handlers.all_handled.set()

    handlers.on_node_state_update = on_nsu  # type: ignore[method-assign]
    await run_session(frames, handlers)
    assert handlers.handled_when_answered == 0
    per_machine: dict[str, list[int]] = {}
    for m, s in handlers.handled:
        per_machine.setdefault(m, []).append(s)
    assert len(per_machine) == 200
    for seq in per_machine.values():
        assert seq == sorted(seq) and len(seq) == len(set(seq))  # arrival order, no repeats
        assert seq[-1] == int(pb.MachineState.CONFIGURED)  # the latest state always handled
