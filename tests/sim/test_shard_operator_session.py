"""The simulated shard against the agent's real session tasks (bigfleet_trio.operator.session),
over the in-memory pair: roll-up -> pull -> Configured, then a withdrawn roll-up -> reclaim ->
ack -> Draining -> Idle. Handlers here are recording stand-ins for
the apiserver-writing ones."""

from __future__ import annotations

import pytest
import trio

from bigfleet_trio.operator.session.core import Session
from bigfleet_trio.operator.session.types import SessionConfig
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
    session = Session(op, SessionConfig("c1", rollup_interval=2.0),
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


async def test_two_agents_with_one_cluster_id_are_told_so(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture,
) -> None:
    """Two agents with cluster ID c1 and one simulated shard: each replaced session ends with
    the shard's ABORTED and its message, logged at WARNING and counted by reason; after several
    replacements in a row an agent says at ERROR that another agent has its cluster ID."""
    import logging

    from bigfleet_trio.observability.metrics import SESSION_CLOSES
    from bigfleet_trio.operator.agent import REPLACED_IN_A_ROW, Agent, AgentConfig
    from bigfleet_trio.operator.session.types import SessionConfig
    from bigfleet_trio.shard.transport import MemoryConnector

    caplog.set_level(logging.INFO)
    before = SESSION_CLOSES.labels("aborted")._value.get()
    shard = SimShard(Catalog([MachineShape("m", "z-a", {"cpu": "4"}, 0.1, count=2)]),
                     EngineConfig(seed=1))
    connector = MemoryConnector()
    async with trio.open_nursery() as nursery:
        await nursery.start(shard.run)

        async def accept() -> None:
            async with trio.open_nursery() as sessions:
                async for end in connector.accepted:
                    sessions.start_soon(shard.serve_session, end)

        nursery.start_soon(accept)
        agents = [Agent(connector, Source(), Handlers(),
                        AgentConfig(session=SessionConfig(cluster_id="c1"), initial_backoff=1.0,
                                    max_backoff=2.0))
                  for _ in range(2)]
        for agent in agents:
            nursery.start_soon(agent.run)
        await trio.sleep(60)
        nursery.cancel_scope.cancel()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and r.name == "bigfleet_trio.operator.agent"]
    assert any("grpc: ABORTED session replaced: a newer session for cluster 'c1' connected"
               in w for w in warnings), warnings
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR
              and r.name == "bigfleet_trio.operator.agent"]
    assert errors and all("another agent with the same --cluster-id is connected" in e
                          for e in errors), errors
    assert f"replaced {REPLACED_IN_A_ROW} times in a row" in errors[0]
    assert SESSION_CLOSES.labels("aborted")._value.get() - before >= REPLACED_IN_A_ROW
