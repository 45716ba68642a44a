"""Re-issued reclaim instructions and the session's dispatch slots (docs/wire.md#the-session,
docs/rules.md#reclaim-instruction-ids): the duplicates of an instruction still being handled
hold no slot while they wait for its answer, so a burst of them cannot stall the NodeStateUpdate
workers that share the slots. The real ReclaimHandler in a real Session, over the in-memory
stream and the embedded apiserver; the autojump clock."""

from __future__ import annotations

from typing import Any

import betterproto
import trio

from bigfleet_trio.operator.reclaim.handler import ReclaimHandler
from bigfleet_trio.operator.session.core import Session
from bigfleet_trio.operator.session.types import Reply, SessionConfig
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.transport import memory_stream_pair

from .test_reclaim import instr, make, standard_cluster
from .test_session import FakeSource


class Handlers:
    """The real reclaim handler; node states recorded."""

    def __init__(self, reclaim: ReclaimHandler) -> None:
        self.reclaim = reclaim
        self.node_states: list[str] = []

    async def on_bootstrap_request(self, req: pb.BootstrapRequest) -> pb.BootstrapBlobResponse:
        return pb.BootstrapBlobResponse()

    async def on_reclaim_instruction(self, instr: pb.ReclaimInstruction, reply: Reply) -> None:
        await self.reclaim.on_reclaim_instruction(instr, reply)

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> None:
        self.node_states.append(u.machine_id)

    async def on_available_capacity(self, u: pb.AvailableCapacityUpdate) -> None:
        pass


async def test_a_burst_of_reissued_instructions_does_not_stall_node_states(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    c = standard_cluster(nursery)
    drains, reclaim, _ = make(c)
    await nursery.start(drains.run)
    handlers = Handlers(reclaim)
    op, shard = memory_stream_pair()
    session = Session(op, SessionConfig(cluster_id="c1", dispatch_concurrency=2,
                                        dispatch_backlog=64),
                      FakeSource(), handlers)
    nursery.start_soon(session.run)
    await shard.receive()  # hello
    await shard.receive()  # roll-up
    c.gate = trio.Event()  # the apiserver is slow: the first attempt's cordon waits
    for _ in range(1 + 16):  # the instruction, then the shard re-issues it 16 times
        await shard.send(pb.ShardMessage(reclaim_instruction=instr("r", "n-1")))
    await shard.send(pb.ShardMessage(node_state_update=pb.NodeStateUpdate(machine_id="m-9")))
    await trio.sleep(5)
    assert handlers.node_states == ["m-9"]  # handled while the reclaim is still waiting
    c.gate.set()
    acks: list[Any] = []
    with trio.fail_after(60):
        while len(acks) < 17:
            kind, msg = betterproto.which_one_of(await shard.receive(), "payload")
            if kind == "reclaim_ack":
                acks.append((msg.instruction_id, msg.nodes_started))
    assert acks == [("r", 1)] * 17  # every re-issue answered with the first answer
    assert len([call for call in c.calls if call[0] == "patch"]) >= 1
