"""The simulated shard against the agent's real session tasks (bigfleet_trio.operator.session),
over the in-memory pair: roll-up -> pull -> Configured, then a withdrawn roll-up -> reclaim ->
ack -> Draining -> Idle. Handlers here are recording stand-ins for
the apiserver-writing ones."""

from __future__ import annotations

import trio

from bigfleet_trio.operator import session as session_mod
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.transport import memory_stream_pair
from bigfleet_trio.sim.shard.catalog import Catalog, MachineShape
from bigfleet_trio.sim.shard.engine import EngineConfig, MachineInfo
from bigfleet_trio.sim.shard.session import SimShard

S = pb.MachineState


class Source:
    def __init__(self) -> None:
        self.cpu: str | None = "3"

    async def build(self) -> pb.ClusterCapacityNeeds:
        needs = [] if self.cpu is None else [pb.CapacityNeed(
            requirements=[pb.NodeSelectorRequirement(
                key="node.kubernetes.io/instance-type",
                operator=pb.NodeSelectorRequirementOperator.OPERATOR_EXISTS)],
            aggregate_resources={"cpu": self.cpu}, min_unit={"cpu": "1"})]
        return pb.ClusterCapacityNeeds(cluster_id="c1", needs=needs)

    async def after_enqueue(self) -> None:
        return None


class Handlers:
    def __init__(self) -> None:
        self.latest: dict[str, pb.MachineState] = {}
        self.reclaimed: list[str] = []

    async def on_bootstrap_request(self, req: pb.BootstrapRequest) -> pb.BootstrapBlobResponse:
        return pb.BootstrapBlobResponse(request_id=req.request_id, user_data=b"#cloud-config\n",
                                        ttl_seconds=600)

    async def on_reclaim_instruction(self, instr: pb.ReclaimInstruction, reply) -> None:  # type: ignore[no-untyped-def]
        self.reclaimed += list(instr.nodes)
        reply(pb.OperatorMessage(reclaim_ack=pb.ReclaimAck(instr.instruction_id,
                                                           len(instr.nodes))))

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> None:
        self.latest[u.node_name] = u.state

    async def on_available_capacity(self, u: pb.AvailableCapacityUpdate) -> None:
        return None


class Hooks:
    def __init__(self) -> None:
        self.nodes: set[str] = set()

    async def on_machine_configured(self, machine: MachineInfo) -> None:
        self.nodes.add(machine.node_name)

    async def on_machine_released(self, machine: MachineInfo) -> None:
        self.nodes.discard(machine.node_name)


async def test_full_loop_with_the_agent_session(autojump_clock: trio.abc.Clock) -> None:
    catalog = Catalog([MachineShape("small", "z-a", {"cpu": "2"}, 0.1, count=4, warm=1)])
    hooks = Hooks()
    shard = SimShard(catalog, EngineConfig(seed=5), hooks=hooks)
    source, handlers = Source(), Handlers()
    op, sh = memory_stream_pair()
    session = session_mod.Session(op, session_mod.SessionConfig("c1", rollup_interval=2.0),
                                  source, handlers)
    async with trio.open_nursery() as nursery:
        await nursery.start(shard.run)
        nursery.start_soon(shard.serve_session, sh)
        nursery.start_soon(session.run)
        # 3 cpu -> 2 machines of 2 cpu; defaults reach Configured in well under 2 s
        with trio.fail_after(5):
            await shard.wait_until(lambda s: s.machines_by_state().get("CONFIGURED") == 2)
        t_ready = trio.current_time()
        assert t_ready < 2.5
        await trio.sleep(0.1)
        assert sorted(handlers.latest.values()) == [S.CONFIGURED, S.CONFIGURED]
        assert hooks.nodes == set(handlers.latest)
        # withdraw: the next roll-up reclaims both; the agent acks; Draining -> Idle
        source.cpu = None
        with trio.fail_after(10):
            await shard.wait_until(lambda s: s.engine.released == 2)
        await trio.sleep(0.1)
        assert sorted(handlers.reclaimed) == sorted(handlers.latest)
        assert set(handlers.latest.values()) == {S.IDLE}
        assert hooks.nodes == set()
        assert shard.machines_by_state() == {"FREE": 4}
        nursery.cancel_scope.cancel()
