"""Reconnect loop (docs/reference.md#session-and-reconnect).

Backoff reset: docs/reference.md#backoff-never-resets.
"""

from __future__ import annotations

import random
from typing import Any

import betterproto
import pytest
import trio
import trio.testing

from bigfleet_trio.operator.agent import Agent, AgentConfig, Backoff, SessionChange
from bigfleet_trio.operator.session.types import Reply, SessionConfig
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.transport import MemoryConnector, ShardStream, StreamClosed
from tests.support.rollup import EmptyRollupSource


class Handlers:
    def __init__(self) -> None:
        self.entered = 0
        self.cancelled = 0

    async def on_bootstrap_request(self, req: pb.BootstrapRequest) -> pb.BootstrapBlobResponse:
        return pb.BootstrapBlobResponse()

    async def on_reclaim_instruction(self, instr: pb.ReclaimInstruction, reply: Reply) -> None:
        self.entered += 1
        try:
            await trio.sleep_forever()
        finally:
            self.cancelled += 1

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> None:
        pass

    async def on_available_capacity(self, u: pb.AvailableCapacityUpdate) -> None:
        pass


def make_agent(
    connector: MemoryConnector, jitter: float = 0.2, **kw: Any
) -> tuple[Agent, Handlers]:
    h = Handlers()
    cfg = AgentConfig(session=SessionConfig(cluster_id="c1"), backoff_jitter=jitter, **kw)
    return Agent(connector, EmptyRollupSource(), h, cfg, rng=random.Random(7)), h


def test_agent_refuses_a_session_without_cluster_id() -> None:
    # The operator's settings nest a SessionConfig whose cluster_id the composition fills in.
    assert AgentConfig().session.cluster_id == ""
    with pytest.raises(ValueError, match="cluster_id is required"):
        Agent(MemoryConnector(), EmptyRollupSource(), Handlers(), AgentConfig())


# ---- Backoff (pure) --------------------------------------------------------------------------


def test_backoff_nominal_sequence_without_jitter() -> None:
    b = Backoff(0.5, 30.0, jitter=0.0, healthy_after=60.0)
    got = [b.next_delay(None) for _ in range(9)]
    assert got == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]


def test_backoff_jitter_only_shortens() -> None:
    b = Backoff(0.5, 30.0, jitter=0.2, rng=random.Random(1))
    for nominal in [0.5, 1, 2, 4, 8, 16, 30, 30]:
        d = b.next_delay(None)
        assert 0.8 * nominal <= d <= nominal


def test_backoff_resets_only_after_healthy_session() -> None:
    b = Backoff(0.5, 30.0, jitter=0.0, healthy_after=60.0)
    assert [b.next_delay(None), b.next_delay(5.0), b.next_delay(59.9)] == [0.5, 1, 2]
    assert b.next_delay(60.0) == 0.5  # the session that just ended was up >= 60 s
    assert b.next_delay(None) == 1


def test_backoff_is_the_kube_retry_rule_in_down_mode() -> None:
    # one delay rule in the package (docs/kube-api.md): the agent adapts kube.retry.Backoff,
    # jitter down (never above the cap), reset only by a healthy session, not by the clock
    from bigfleet_trio.kube import retry

    b = Backoff(0.5, 30.0, jitter=0.2, healthy_after=60.0)
    assert isinstance(b.policy, retry.Backoff)
    assert (b.policy.initial, b.policy.cap, b.policy.factor) == (0.5, 30.0, 2.0)
    assert (b.policy.jitter, b.policy.jitter_mode, b.policy.reset_after) == (0.2, "down", None)


def test_backoff_validation() -> None:
    with pytest.raises(ValueError):
        Backoff(0, 30)
    with pytest.raises(ValueError):
        Backoff(1, 0.5)
    with pytest.raises(ValueError):
        Backoff(0.5, 30, jitter=1.0)


# ---- Agent.run ------------------------------------------------------------------------------


async def test_recv_error_reconnects_with_growing_jittered_backoff(autojump_clock: Any) -> None:
    conn = MemoryConnector()
    agent, _ = make_agent(conn)
    connect_times: list[float] = []

    async def shard() -> None:
        async for end in conn.accepted:
            connect_times.append(trio.current_time())
            hello = await end.receive()
            assert betterproto.which_one_of(hello, "payload")[0] == "hello"
            await end.aclose()  # recv error on the agent side ends the session at once
            if len(connect_times) == 5:
                return

    async with trio.open_nursery() as n:
        n.start_soon(agent.run)
        await shard()
        n.cancel_scope.cancel()
    gaps = [b - a for a, b in zip(connect_times, connect_times[1:], strict=False)]
    for gap, nominal in zip(gaps, [0.5, 1, 2, 4], strict=True):
        assert 0.8 * nominal <= gap <= nominal
    assert agent.stats.reconnects == 5  # the 5th session was closed too
    assert agent.stats.sessions == 5
    assert "peer closed" in agent.last_error


async def test_backoff_resets_after_long_healthy_session(autojump_clock: Any) -> None:
    conn = MemoryConnector()
    conn.fail_next = 3  # three refused connects: waits ~0.5, ~1, ~2
    agent, _ = make_agent(conn, jitter=0.0)
    up_for = [61.0, 5.0, 0.0]  # 1st session long & healthy, 2nd short
    accepted_at: list[float] = []

    async def shard() -> None:
        async for end in conn.accepted:
            accepted_at.append(trio.current_time())
            await end.receive()
            if not up_for:
                return
            await trio.sleep(up_for.pop(0))
            await end.aclose()

    t0 = trio.current_time()
    async with trio.open_nursery() as n:
        n.start_soon(agent.run)
        await shard()
        n.cancel_scope.cancel()
    # refused at 0, 0.5, 1.5; session 1 at 3.5 up 61 s -> ends 64.5; reset -> wait 0.5 -> 65;
    # session 2 up 5 s -> ends 70; no reset -> wait 1 -> 71; session 3 up 0 s -> ...
    assert [t - t0 for t in accepted_at] == [3.5, 65.0, 71.0, 73.0]
    assert conn.connects == 7


async def test_session_up_tracks_the_stream(autojump_clock: Any) -> None:
    conn = MemoryConnector()
    agent, _ = make_agent(conn)
    async with trio.open_nursery() as n:
        n.start_soon(agent.run)
        end: ShardStream = await conn.accepted.receive()
        await end.receive()
        await trio.testing.wait_all_tasks_blocked()
        assert agent.session_up and agent.state().session_up
        await end.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert not agent.session_up
        n.cancel_scope.cancel()


def _count_tasks() -> int:
    def walk(task: trio.lowlevel.Task) -> int:
        return 1 + sum(walk(t) for nursery in task.child_nurseries for t in nursery.child_tasks)

    return walk(trio.lowlevel.current_root_task())


async def test_cancelling_run_leaves_no_task_and_closes_transport(autojump_clock: Any) -> None:
    conn = MemoryConnector()
    agent, h = make_agent(conn)
    before = _count_tasks()
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as n:
            n.start_soon(agent.run)
            end: ShardStream = await conn.accepted.receive()
            await end.receive()  # hello
            await end.send(
                pb.ShardMessage(reclaim_instruction=pb.ReclaimInstruction(instruction_id="r"))
            )
            await trio.testing.wait_all_tasks_blocked()
            assert h.entered == 1 and agent.session_up
            during = _count_tasks()
            assert during > before + 3  # agent + send/recv/rollup + handler are alive
            scope.cancel()
    assert scope.cancelled_caught
    await trio.testing.wait_all_tasks_blocked()
    assert _count_tasks() == before
    assert h.cancelled == 1
    assert not agent.session_up and agent.session is None
    # The transport is closed: the shard end sees end-of-stream after buffered frames.
    with pytest.raises(StreamClosed):
        while True:
            await end.receive()


# ---- send-progress watchdog and the session-change hook -------------------------------------


async def test_shard_that_never_reads_session_ends_after_send_timeout_then_backoff(
    autojump_clock: Any,
) -> None:
    conn = MemoryConnector(buffer=0)  # Hello can only go out if the shard receives it
    changes: list[SessionChange] = []
    cfg = AgentConfig(session=SessionConfig(cluster_id="c1", send_timeout=5.0),
                      backoff_jitter=0.0)
    agent = Agent(conn, EmptyRollupSource(), Handlers(), cfg, on_session_change=changes.append)
    accepted_at: list[float] = []
    held: list[ShardStream] = []  # accepted, never read
    t0 = trio.current_time()
    async with trio.open_nursery() as n:
        n.start_soon(agent.run)
        async for end in conn.accepted:
            accepted_at.append(trio.current_time() - t0)
            held.append(end)
            if len(accepted_at) == 3:
                break
        n.cancel_scope.cancel()
    # Hello stalls 5 s -> SendStalled; waits 0.5 then 1 (nominal, no jitter)
    assert accepted_at == [0.0, 5.5, 11.5]
    assert agent.stats.sessions == 0 and agent.stats.reconnects == 2
    assert "send stalled: hello frame not accepted within 5s" in agent.last_error
    assert [(c.up, c.retry_in, c.uptime) for c in changes] == [
        (False, 0.5, None), (False, 1.0, None)
    ]
    assert changes[0].error.startswith("stream closed: send stalled")


async def test_on_session_change_reports_up_and_down_with_error_and_delay(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    conn = MemoryConnector()
    changes: list[tuple[float, SessionChange]] = []

    def hook(change: SessionChange) -> None:
        changes.append((trio.current_time(), change))
        if len(changes) == 1:
            raise RuntimeError("hook bug")  # logged, never ends the agent

    cfg = AgentConfig(session=SessionConfig(cluster_id="c1"), backoff_jitter=0.0)
    agent = Agent(conn, EmptyRollupSource(), Handlers(), cfg, on_session_change=hook)
    t0 = trio.current_time()
    async with trio.open_nursery() as n:
        n.start_soon(agent.run)
        end: ShardStream = await conn.accepted.receive()
        await end.receive()  # hello -> up at t=0
        await trio.sleep(3)
        await end.aclose()  # down at t=3 after 3 s up, retry in 0.5
        end = await conn.accepted.receive()
        await end.receive()  # up again at t=3.5
        await trio.testing.wait_all_tasks_blocked()
        n.cancel_scope.cancel()
    got = [(t - t0, c.up, c.cluster_id, c.error, c.retry_in, c.uptime) for t, c in changes]
    assert got == [
        (0.0, True, "c1", "", None, None),
        (3.0, False, "c1", "stream closed: peer closed", 0.5, 3.0),
        (3.5, True, "c1", "", None, None),
        (3.5, False, "c1", "operator stopping", None, 0.0),  # cancelled while up
    ]
    assert any("session-change hook failed" in r.getMessage() for r in caplog.records)
