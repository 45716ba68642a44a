"""Node registration of the simulated shard retried as a kubelet retries it: capped exponential
backoff until the apiserver accepts, the machine leaves the state, or the shard stops.

The apiserver is the embedded sim apiserver (a real ``KubeClient`` in-process) refusing the
first N requests; the shard is :class:`SimShard` with :class:`KubeNodeHooks` over it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from bigfleet_trio.kube.resources import NODES
from bigfleet_trio.proto import pb
from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.shard.catalog import Catalog, MachineShape
from bigfleet_trio.sim.shard.model import Machine
from bigfleet_trio.sim.shard.noderetry import BACKOFF_CAP, node_hook_due, retry_delay
from bigfleet_trio.sim.shard.nodes import KubeNodeHooks
from bigfleet_trio.sim.shard.session import SimShard
from tests.sim.test_shard_session import CFG, configured_session, recv, recv_until, rollup_msg
from tests.support.kube import sim_kube

S = pb.MachineState
LOGGER = "bigfleet_trio.sim.shard.noderetry"


# ------------------------------------------------------------------ pure plan


def test_retry_delay_doubles_from_100ms_to_a_7s_cap() -> None:
    assert [retry_delay(n) for n in range(1, 10)] == [
        0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 7.0, 7.0]
    assert BACKOFF_CAP == 7.0
    assert retry_delay(10_000) == 7.0  # no overflow on a long outage
    with pytest.raises(ValueError):
        retry_delay(0)


def machine(state: int, bound: bool = True) -> Machine:
    shape = MachineShape("small", "z-a", {"cpu": "2"}, 0.1, count=1)
    return Machine("i-1", "n-1", "sim://i-1", shape, S(state), bound=bound)


@pytest.mark.parametrize(("m", "register", "deregister"), [
    (machine(S.CONFIGURED), True, False),
    (machine(S.DRAINING), True, False),       # still a Node until drained back to Idle
    (machine(S.IDLE, bound=False), False, True),
    (machine(S.CONFIGURING), False, True),    # rebound, not Configured yet
    (None, False, True),
])
def test_a_retry_is_due_only_while_the_machine_is_in_its_state(
    m: Machine | None, register: bool, deregister: bool,
) -> None:
    assert node_hook_due("register", m) is register
    assert node_hook_due("deregister", m) is deregister


# ------------------------------------------------------------------ over the sim apiserver


def catalog() -> Catalog:
    return Catalog([MachineShape("small", "z-a", {"cpu": "2", "memory": "4Gi"}, 0.10,
                                 count=3, warm=1)])


@asynccontextmanager
async def shard_over(api: ApiServer) -> AsyncIterator[tuple[SimShard, trio.Nursery]]:
    async with trio.open_nursery() as outer:
        _, client = sim_kube(outer, api)
        shard = SimShard(catalog(), CFG, hooks=KubeNodeHooks(client))
        async with trio.open_nursery() as nursery:
            await nursery.start(shard.run)
            yield shard, nursery
            nursery.cancel_scope.cancel()
        outer.cancel_scope.cancel()


def node_exists(api: ApiServer, name: str) -> bool:
    return api.store.get(api.find(NODES.plural), None, name) is not None


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.levelno == logging.WARNING]


@pytest.mark.parametrize("code", [403, 429, 503])
async def test_registration_refused_n_times_is_retried_until_the_node_exists(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture, code: int,
) -> None:
    caplog.set_level(logging.DEBUG)
    api = ApiServer()
    api.faults.fail_next(4, code=code, verb="create", resource="nodes")
    async with shard_over(api) as (shard, nursery):
        _, node = await configured_session(shard, nursery)
        assert not node_exists(api, node)  # the first attempt was refused
        await shard.wait_until(lambda s: s.snapshot()["node_hooks_pending"] == 0)
        assert node_exists(api, node)
        ready = api.store.get(api.find(NODES.plural), None, node)
        assert ready is not None and ready["status"]["conditions"][0]["status"] == "True"
        snap = shard.snapshot()
        assert (snap["hook_errors"], snap["node_hook_retries"]) == (4, 4)
    # one WARNING for the streak of four failures, naming the node and the answer
    (warning,) = warnings(caplog)
    assert node in warning and str(code) in warning


async def test_deregistration_refused_n_times_is_retried_until_the_node_is_gone(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture,
) -> None:
    api = ApiServer()
    async with shard_over(api) as (shard, nursery):
        op, node = await configured_session(shard, nursery)
        assert node_exists(api, node)
        api.faults.fail_next(3, code=503, verb="delete", resource="nodes")
        await op.send(rollup_msg())  # no needs: the machine is reclaimed
        got = await recv_until(op, lambda k, v: k == "reclaim_instruction")
        ri = got[-1][1]
        await op.send(pb.OperatorMessage(reclaim_ack=pb.ReclaimAck(ri.instruction_id, 1)))
        await recv_until(op, lambda k, v: k == "node_state_update" and v.state == S.IDLE)
        # the Idle frame goes out before the deregistration's first attempt
        await shard.wait_until(lambda s: s.hook_errors == 3
                               and s.snapshot()["node_hooks_pending"] == 0)
        assert not node_exists(api, node)
        assert shard.snapshot()["node_hook_retries"] == 3
    assert len(warnings(caplog)) == 1


async def test_registration_retry_stops_when_the_machine_is_released(
    autojump_clock: trio.abc.Clock,
) -> None:
    api = ApiServer()
    api.faults.fail_next(10**9, code=403, verb="create", resource="nodes")  # never accepted
    async with shard_over(api) as (shard, nursery):
        op, node = await configured_session(shard, nursery)
        await trio.sleep(30)
        assert shard.snapshot()["node_hooks_pending"] == 1
        await op.send(rollup_msg())
        got = await recv_until(op, lambda k, v: k == "reclaim_instruction")
        ri = got[-1][1]
        await op.send(pb.OperatorMessage(reclaim_ack=pb.ReclaimAck(ri.instruction_id, 1)))
        await recv_until(op, lambda k, v: k == "node_state_update" and v.state == S.IDLE)
        await shard.wait_until(lambda s: s.engine.released == 1
                               and s.snapshot()["node_hooks_pending"] == 0)
        creates = api.counters[("create", "nodes")]
        await trio.sleep(60)  # nothing retries any more
        assert api.counters[("create", "nodes")] == creates
        assert not node_exists(api, node)


async def test_retries_outlive_the_agent_session_and_end_with_the_shard(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The Node belongs to the machine, not to the agent's stream: a dropped session does not
    stop the retry; stopping the shard (SIGTERM: its nursery cancelled) does, leaving no task."""
    api = ApiServer()
    api.faults.fail_next(10**9, code=503, verb="create", resource="nodes")
    async with trio.open_nursery() as outer:
        _, client = sim_kube(outer, api)
        shard = SimShard(catalog(), CFG, hooks=KubeNodeHooks(client))
        async with trio.open_nursery() as nursery:
            await nursery.start(shard.run)
            op, _ = await configured_session(shard, nursery)
            await op.aclose()
            await shard.wait_until(lambda s: not s.connected)
            before = api.counters[("create", "nodes")]
            await trio.sleep(30)
            assert api.counters[("create", "nodes")] > before
            assert shard.snapshot()["node_hooks_pending"] == 1
            nursery.cancel_scope.cancel()
        # run() returned: its nursery, owner of the retry task, is closed
        stopped = api.counters[("create", "nodes")]
        await trio.sleep(60)
        assert api.counters[("create", "nodes")] == stopped
        outer.cancel_scope.cancel()


async def test_each_failure_streak_logs_one_warning(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture,
) -> None:
    """A streak ends when the hook succeeds; the next streak (another machine) warns again."""
    api = ApiServer()
    api.faults.fail_next(2, code=429, verb="create", resource="nodes")
    async with shard_over(api) as (shard, nursery):
        op, node = await configured_session(shard, nursery)
        await shard.wait_until(lambda s: s.snapshot()["node_hooks_pending"] == 0)
        api.faults.fail_next(2, code=429, verb="create", resource="nodes")
        await op.send(rollup_msg("1", "1"))  # a second machine
        got = await recv_until(op, lambda k, v: k == "bootstrap_request")
        br = got[-1][1]
        await op.send(pb.OperatorMessage(bootstrap_response=pb.BootstrapBlobResponse(
            request_id=br.request_id, user_data=b"#cloud-config\n", ttl_seconds=600)))
        while True:
            kind, u = await recv(op)
            if kind == "node_state_update" and u.state == S.CONFIGURED and u.node_name != node:
                break
        await shard.wait_until(lambda s: s.snapshot()["node_hooks_pending"] == 0)
        assert sum(node_exists(api, n.node_name) for n in shard.engine.machines) == 2
    got_warnings = warnings(caplog)
    assert len(got_warnings) == 2 and node in got_warnings[0] and node not in got_warnings[1]
