"""Session tests of the simulated shard over the in-memory stream pair.

Shard-side rules as bigfleet_trio/sim/shard/session.py states them (Hello first, Ack "hello", Ack
"rollup", replacement, replay on reconnect) and the bootstrap pull (error -> shortfall). Catalog:
one shape, 3 machines of which 1 warm, so a 1-cpu need takes the warm machine straight to the
pull.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import betterproto
import pytest
import trio
from grpclib.const import Status

from bigfleet_trio.proto import pb
from bigfleet_trio.shard.transport import OperatorStream, StreamClosed, memory_stream_pair
from bigfleet_trio.sim.shard.catalog import Catalog, MachineShape
from bigfleet_trio.sim.shard.engine import EngineConfig, MachineInfo
from bigfleet_trio.sim.shard.session import SessionRejected, SimShard

S = pb.MachineState
C = pb.AvailableCapacityUpdateConfidence


def catalog() -> Catalog:
    return Catalog([MachineShape("small", "z-a", {"cpu": "2", "memory": "4Gi"}, 0.10,
                                 count=3, warm=1)])


CFG = EngineConfig(seed=3, create_delay=1.0, boot_delay=1.0, configure_delay=1.0,
                   bootstrap_timeout=10.0, reclaim_grace_seconds=3, reclaim_ack_timeout=5.0,
                   drain_wait=2.0, drain_step=0.5)


class RecordingHooks:
    def __init__(self, fail: bool = False) -> None:
        self.configured: list[MachineInfo] = []
        self.released: list[MachineInfo] = []
        self.fail = fail

    async def on_machine_configured(self, machine: MachineInfo) -> None:
        await trio.lowlevel.checkpoint()
        if self.fail:
            raise RuntimeError("apiserver down")
        self.configured.append(machine)

    async def on_machine_released(self, machine: MachineInfo) -> None:
        self.released.append(machine)


@asynccontextmanager
async def running(hooks: Any = None) -> AsyncIterator[tuple[SimShard, trio.Nursery]]:
    shard = SimShard(catalog(), CFG, hooks=hooks)
    async with trio.open_nursery() as nursery:
        await nursery.start(shard.run)
        yield shard, nursery
        nursery.cancel_scope.cancel()


def hello(cluster: str = "c1", version: str = "v1alpha1") -> pb.OperatorMessage:
    return pb.OperatorMessage(hello=pb.Hello(cluster_id=cluster, protocol_version=version))


def rollup_msg(*cpus: str) -> pb.OperatorMessage:
    needs = [pb.CapacityNeed(
        requirements=[pb.NodeSelectorRequirement(
            key="node.kubernetes.io/instance-type",
            operator=pb.NodeSelectorRequirementOperator.OPERATOR_EXISTS)],
        aggregate_resources={"cpu": c}, min_unit={"cpu": "1"}) for c in cpus]
    return pb.OperatorMessage(rollup=pb.ClusterCapacityNeeds(cluster_id="c1", needs=needs))


async def open_session(shard: SimShard, nursery: trio.Nursery) -> OperatorStream:
    op, sh = memory_stream_pair()
    nursery.start_soon(shard.serve_session, sh)
    await op.send(hello())
    return op


async def recv(op: OperatorStream) -> tuple[str, Any]:
    return betterproto.which_one_of(await op.receive(), "payload")


async def recv_until(op: OperatorStream, pred: Callable[[str, Any], bool]) -> list[tuple[str, Any]]:
    got = []
    while True:
        kind, val = await recv(op)
        got.append((kind, val))
        if pred(kind, val):
            return got


def is_state(state: pb.MachineState) -> Callable[[str, Any], bool]:
    return lambda k, v: k == "node_state_update" and v.state == state


async def configured_session(shard: SimShard, nursery: trio.Nursery) -> tuple[OperatorStream, str]:
    """Open a session, send a 1-cpu roll-up, answer the pull; returns (stream, node name)."""
    op = await open_session(shard, nursery)
    await recv_until(op, lambda k, v: k == "available_capacity")
    await op.send(rollup_msg("1"))
    got = await recv_until(op, lambda k, v: k == "bootstrap_request")
    br = got[-1][1]
    await op.send(pb.OperatorMessage(bootstrap_response=pb.BootstrapBlobResponse(
        request_id=br.request_id, user_data=b"#cloud-config\n", ttl_seconds=600)))
    got = await recv_until(op, is_state(S.CONFIGURED))
    return op, got[-1][1].node_name


# ------------------------------------------------------------------ Hello


async def test_hello_then_ack_then_available_capacity() -> None:
    async with running() as (shard, nursery):
        op = await open_session(shard, nursery)
        kind, ack = await recv(op)
        assert (kind, ack.echo, ack.coordinator_term, ack.shard_epoch) == ("ack", "hello", 1, 1)
        kind, ac = await recv(op)
        assert kind == "available_capacity"
        assert (ac.available_count, ac.confidence, ac.cost_per_hour) == (3, C.CONFIDENCE_HIGH, 0.10)
        await shard.wait_until(lambda s: s.connected)
        assert shard.cluster_id == "c1" and shard.sessions_started == 1


@pytest.mark.parametrize(
    ("first", "reason"),
    [
        (rollup_msg("1"), "first frame must be Hello, got 'rollup'"),
        (hello(cluster=""), "Hello.cluster_id is empty"),
        (hello(version="v2"), "Hello.protocol_version 'v2' is not 'v1alpha1'"),
    ],
)
async def test_invalid_first_frame_closes_the_stream_with_an_error(
    first: pb.OperatorMessage, reason: str
) -> None:
    async with running() as (shard, _):
        op, sh = memory_stream_pair()
        await op.send(first)
        with pytest.raises(SessionRejected) as info:
            await shard.serve_session(sh)
        assert info.value.status == Status.INVALID_ARGUMENT and info.value.reason == reason
        with pytest.raises(StreamClosed):
            await op.receive()
        assert shard.rejections == [reason] and not shard.connected


async def test_missing_hello_times_out_after_one_cycle(autojump_clock: trio.abc.Clock) -> None:
    async with running() as (shard, _):
        op, sh = memory_stream_pair()
        start = trio.current_time()
        with pytest.raises(SessionRejected, match="no Hello within 10s"):
            await shard.serve_session(sh)
        assert trio.current_time() - start == pytest.approx(10.0)
        with pytest.raises(StreamClosed):
            await op.receive()


async def test_peer_closing_before_hello_ends_quietly() -> None:
    async with running() as (shard, _):
        op, sh = memory_stream_pair()
        await op.aclose()
        await shard.serve_session(sh)
        assert shard.rejections == [] and not shard.connected


# ------------------------------------------------------------------ roll-up, bootstrap


async def test_rollup_bootstrap_to_configured(autojump_clock: trio.abc.Clock) -> None:
    hooks = RecordingHooks()
    async with running(hooks) as (shard, nursery):
        op = await open_session(shard, nursery)
        await recv_until(op, lambda k, v: k == "available_capacity")
        await op.send(rollup_msg("1"))
        kind, ack = await recv(op)
        assert (kind, ack.echo) == ("ack", "rollup")
        kind, nsu = await recv(op)
        assert (kind, nsu.state) == ("node_state_update", S.IDLE)  # the warm machine
        kind, br = await recv(op)
        assert kind == "bootstrap_request" and br.cluster_id == "c1"
        kind, ac = await recv(op)
        assert (kind, ac.available_count, ac.confidence) == (
            "available_capacity", 2, C.CONFIDENCE_MEDIUM)
        t0 = trio.current_time()
        await op.send(pb.OperatorMessage(bootstrap_response=pb.BootstrapBlobResponse(
            request_id=br.request_id, user_data=b"#cloud-config\n", ttl_seconds=600)))
        kind, u = await recv(op)
        assert (kind, u.state, u.machine_id) == ("node_state_update", S.CONFIGURING, nsu.machine_id)
        kind, u = await recv(op)
        assert (kind, u.state) == ("node_state_update", S.CONFIGURED)
        assert trio.current_time() - t0 == pytest.approx(1.0)  # configure_delay
        # the Node hook ran before the Configured frame went out
        assert [m.node_name for m in hooks.configured] == [u.node_name]
        assert shard.machines_by_state() == {"CONFIGURED": 1, "FREE": 2}
        assert shard.last_rollup is not None and len(shard.last_rollup.needs) == 1


async def test_speculative_machines_walk_the_whole_ladder(autojump_clock: trio.abc.Clock) -> None:
    async with running() as (shard, nursery):
        op = await open_session(shard, nursery)
        await recv_until(op, lambda k, v: k == "available_capacity")
        await op.send(rollup_msg("5"))  # 3 machines: warm + 2 speculative
        got = await recv_until(op, lambda k, v: k == "bootstrap_request"
                               and v.request_id == "bootstrap-000003")
        states = [(v.machine_id, v.state) for k, v in got if k == "node_state_update"]
        spec = [mid for mid, st in states if st == S.SPECULATIVE]
        assert len(spec) == 2
        for mid in spec:
            assert [st for m, st in states if m == mid] == [S.SPECULATIVE, S.CREATING, S.IDLE]


async def test_bootstrap_error_is_a_shortfall(autojump_clock: trio.abc.Clock) -> None:
    hooks = RecordingHooks()
    async with running(hooks) as (shard, nursery):
        op = await open_session(shard, nursery)
        await op.send(rollup_msg("1"))
        got = await recv_until(op, lambda k, v: k == "bootstrap_request")
        await op.send(pb.OperatorMessage(bootstrap_response=pb.BootstrapBlobResponse(
            request_id=got[-1][1].request_id, error="parse bootstrap-template-file: boom")))
        got = await recv_until(op, lambda k, v: k == "node_state_update")
        assert [k for k, _ in got] == ["available_capacity", "node_state_update"]
        u = got[-1][1]
        assert (u.state, u.last_error) == (
            S.FAILED, "bootstrap: parse bootstrap-template-file: boom")
        await shard.wait_until(lambda s: s.machines_by_state() == {"FREE": 3})
        assert hooks.configured == []
        assert [e.fields["reason"] for e in shard.engine.shortfalls] == [
            "bootstrap: parse bootstrap-template-file: boom"]


async def test_invalid_rollup_gets_no_ack(autojump_clock: trio.abc.Clock) -> None:
    async with running() as (shard, nursery):
        op = await open_session(shard, nursery)
        await recv_until(op, lambda k, v: k == "available_capacity")
        await op.send(rollup_msg("a-lot"))
        await op.send(rollup_msg("1"))
        kind, ack = await recv(op)
        assert (kind, ack.echo) == ("ack", "rollup")
        assert shard.engine.rollups_rejected == 1 and shard.engine.rollups_accepted == 1


# ------------------------------------------------------------------ reconnect, replacement


async def test_reconnect_replays_current_node_state(autojump_clock: trio.abc.Clock) -> None:
    async with running() as (shard, nursery):
        op, node = await configured_session(shard, nursery)
        await op.aclose()
        await shard.wait_until(lambda s: not s.connected)
        op2 = await open_session(shard, nursery)
        kind, ack = await recv(op2)
        assert (kind, ack.echo) == ("ack", "hello")
        kind, u = await recv(op2)
        assert (kind, u.state, u.node_name) == ("node_state_update", S.CONFIGURED, node)
        assert u.supersedes_key == f"node:{u.machine_id}"
        kind, ac = await recv(op2)
        assert (kind, ac.available_count) == ("available_capacity", 2)
        assert shard.sessions_started == 2


async def test_new_session_replaces_the_old_one(autojump_clock: trio.abc.Clock) -> None:
    async with running() as (shard, nursery):
        op1 = await open_session(shard, nursery)
        await recv_until(op1, lambda k, v: k == "available_capacity")
        op2 = await open_session(shard, nursery)
        await recv_until(op2, lambda k, v: k == "available_capacity")
        with pytest.raises(StreamClosed):
            await op1.receive()
        await op2.send(rollup_msg("1"))
        kind, ack = await recv(op2)
        assert (kind, ack.echo) == ("ack", "rollup")
        assert shard.connected and shard.sessions_started == 2


# ------------------------------------------------------------------ reclaim, hooks


async def test_reclaim_ack_drain_release(autojump_clock: trio.abc.Clock) -> None:
    hooks = RecordingHooks()
    async with running(hooks) as (shard, nursery):
        op, node = await configured_session(shard, nursery)
        await op.send(rollup_msg())  # no needs: withdraw everything
        got = await recv_until(op, lambda k, v: k == "reclaim_instruction")
        ri = got[-1][1]
        assert (ri.nodes, ri.grace_period_seconds) == ([node], 3)
        assert [r.node_name for r in shard.reclaims_issued] == [node]
        await op.send(pb.OperatorMessage(reclaim_ack=pb.ReclaimAck(ri.instruction_id, 1)))
        t0 = trio.current_time()
        kind, u = await recv(op)
        assert (kind, u.state) == ("node_state_update", S.DRAINING)
        assert trio.current_time() - t0 == pytest.approx(2.0)  # drain_wait
        kind, u = await recv(op)
        assert (kind, u.state) == ("node_state_update", S.IDLE)
        kind, ac = await recv(op)
        assert (kind, ac.available_count, ac.confidence) == (
            "available_capacity", 3, C.CONFIDENCE_HIGH)
        await shard.wait_until(lambda s: len(hooks.released) == 1)
        assert hooks.released[0].node_name == node
        assert [r.instruction_id for r in shard.reclaims_acked] == [ri.instruction_id]
        assert shard.machines_by_state() == {"FREE": 3}
        snap = shard.snapshot()
        assert (snap["reclaims_issued"], snap["reclaims_acked"], snap["released"]) == (1, 1, 1)
        assert snap["machines"] == {"FREE": 3} and snap["needs"] == 0 and snap["connected"]


async def test_stuck_hook_times_out(autojump_clock: trio.abc.Clock) -> None:
    class Stuck(RecordingHooks):
        async def on_machine_configured(self, machine: MachineInfo) -> None:
            await trio.sleep_forever()

    async with running(Stuck()) as (shard, nursery):
        shard.hook_timeout = 5.0
        t0 = trio.current_time()
        _, node = await configured_session(shard, nursery)
        assert shard.hook_errors == 1 and trio.current_time() - t0 >= 5.0


async def test_hook_failure_is_logged_and_the_machine_still_configures(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with running(RecordingHooks(fail=True)) as (shard, nursery):
        _, node = await configured_session(shard, nursery)
        assert node and shard.hook_errors == 1


async def test_serve_session_requires_run() -> None:
    shard = SimShard(catalog(), CFG)
    _, sh = memory_stream_pair()
    with pytest.raises(RuntimeError, match="run"):
        await shard.serve_session(sh)


async def test_events_log_records_decisions(autojump_clock: trio.abc.Clock) -> None:
    async with running() as (shard, nursery):
        await configured_session(shard, nursery)
        kinds = [e.kind for e in shard.events]
        for k in ("connected", "rollup", "bind", "bootstrap_requested", "bootstrap_ok"):
            assert k in kinds


async def test_a_slow_node_registration_holds_only_its_own_machines_frames(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The apiserver taking 20 s over one machine's Node must not hold the frames of others:
    the next machines' BootstrapRequests go out on time (a real shard does not wait on one
    kubelet to talk to the agent), while that machine's CONFIGURED still follows its Node."""
    class Slow(RecordingHooks):
        async def on_machine_configured(self, machine: MachineInfo) -> None:
            await trio.sleep(20)
            self.configured.append(machine)

    hooks = Slow()
    async with running(hooks) as (shard, nursery):
        op = await open_session(shard, nursery)
        await recv_until(op, lambda k, v: k == "available_capacity")
        t0 = trio.current_time()
        await op.send(rollup_msg("5"))  # the warm machine, then two speculative ones
        got = await recv_until(op, lambda k, v: k == "bootstrap_request")
        await op.send(pb.OperatorMessage(bootstrap_response=pb.BootstrapBlobResponse(
            request_id=got[-1][1].request_id, user_data=b"#cloud-config\n", ttl_seconds=600)))
        # the warm machine's Node registration starts at t0+1 and takes 20 s
        got = await recv_until(op, lambda k, v: k == "bootstrap_request"
                               and v.request_id == "bootstrap-000003")
        assert trio.current_time() - t0 < 5  # not behind the slow registration (t0+21)
        assert not any(k == "node_state_update" and v.state == S.CONFIGURED for k, v in got)
        got = await recv_until(op, is_state(S.CONFIGURED))
        assert [m.node_name for m in hooks.configured] == [got[-1][1].node_name]
        assert trio.current_time() - t0 >= 21  # and only after its Node


class ListingHooks(RecordingHooks):
    """Hooks that list the Nodes a shard process before this one registered."""

    def __init__(self, nodes: list[tuple[str, str]], fail: bool = False) -> None:
        super().__init__()
        self.nodes = nodes
        self.list_fails = fail

    async def existing_nodes(self, cluster_id: str) -> list[tuple[str, str]]:
        await trio.lowlevel.checkpoint()
        if self.list_fails:
            raise RuntimeError("apiserver down")
        return list(self.nodes)


async def test_a_restarted_shard_replays_the_clusters_nodes_as_configured(
        autojump_clock: trio.abc.Clock) -> None:
    async with running() as (shard, nursery):
        _, node = await configured_session(shard, nursery)
        provider = next(m.provider_id for m in shard.engine.machines if m.node_name == node)
    # a new process with the same seed: the machine is back in its pool until the Nodes say
    async with running(ListingHooks([(node, provider)])) as (shard, nursery):
        op = await open_session(shard, nursery)
        with trio.fail_after(30):
            assert (await recv(op))[0] == "ack"
            kind, u = await recv(op)
        assert (kind, u.node_name, u.state) == ("node_state_update", node, S.CONFIGURED)
        await op.send(rollup_msg("1"))  # the same demand: kept, nothing bound or reclaimed
        with trio.fail_after(30):
            got = await recv_until(op, lambda k, v: k == "ack" and v.echo == "rollup")
        await trio.sleep(5)
        assert shard.engine.binds == 0 and shard.reclaims_issued == []
        assert [k for k, _ in got if k == "bootstrap_request"] == []


async def test_a_restart_that_cannot_list_nodes_starts_with_no_bindings(
        autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture) -> None:
    async with running(ListingHooks([], fail=True)) as (shard, nursery):
        op = await open_session(shard, nursery)
        assert (await recv(op))[0] == "ack"
        assert (await recv(op))[0] == "available_capacity"
        assert "could not list the Nodes of cluster=c1" in caplog.text


async def test_two_clusters_are_served_at_once_from_one_pool(
        autojump_clock: trio.abc.Clock) -> None:
    async with running() as (shard, nursery):
        op1 = await open_session(shard, nursery)
        op2, sh2 = memory_stream_pair()
        nursery.start_soon(shard.serve_session, sh2)
        await op2.send(hello("c2"))
        assert (await recv(op2))[0] == "ack"
        await shard.wait_until(lambda s: s.clusters == ["c1", "c2"])
        with trio.fail_after(30):
            await op1.send(rollup_msg("2"))  # the warm one of the three 2-cpu machines
            await recv_until(op1, lambda k, v: k == "bootstrap_request")
            got = await recv_until(op2, lambda k, v: k == "available_capacity"
                                   and v.available_count == 2)
        # c2 sees what c1 took from the pool: two left, none of them created (MEDIUM)
        assert got[-1][1].confidence == pb.AvailableCapacityUpdateConfidence.CONFIDENCE_MEDIUM
