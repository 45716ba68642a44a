"""Session tasks over the in-memory stream (docs/wire.md#the-session).

All tests use the autojump clock: times asserted are virtual seconds worked out from the rules.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import betterproto
import pytest
import trio
import trio.testing
from prometheus_client import REGISTRY

from bigfleet_trio.operator.session.core import Session, current_session
from bigfleet_trio.operator.session.types import Reply, SendStalled, SessionConfig
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.transport import ShardStream, StreamClosed, memory_stream_pair


class FakeSource:
    """Roll-up n carries timestamp_unix_nanos=n so tests can tell roll-ups apart."""

    def __init__(self) -> None:
        self.built = 0
        self.after = 0
        self.after_block: trio.Event | None = None
        self.fail_build = False

    async def build(self) -> pb.ClusterCapacityNeeds:
        self.built += 1
        if self.fail_build:
            raise RuntimeError("informer not synced")
        return pb.ClusterCapacityNeeds(timestamp_unix_nanos=self.built)

    async def after_enqueue(self) -> None:
        self.after += 1
        if self.after_block is not None:
            await self.after_block.wait()


class FakeHandlers:
    def __init__(self) -> None:
        self.block = trio.Event()  # never set unless a test does
        self.block_bounded = False
        self.node_delay = 0.0
        self.node_calls: list[tuple[float, str, str]] = []
        self.bounded_started = 0
        self.cancelled = 0
        self.fail_kinds: set[str] = set()

    async def _maybe_block(self) -> None:
        if self.block_bounded:
            try:
                await self.block.wait()
            except trio.Cancelled:
                self.cancelled += 1
                raise

    async def on_bootstrap_request(self, req: pb.BootstrapRequest) -> pb.BootstrapBlobResponse:
        if "bootstrap" in self.fail_kinds:
            raise ValueError("template exploded")
        return pb.BootstrapBlobResponse(user_data=b"#cloud-config " + req.request_id.encode())

    async def on_reclaim_instruction(self, instr: pb.ReclaimInstruction, reply: Reply) -> None:
        self.bounded_started += 1
        if "reclaim" in self.fail_kinds:
            raise RuntimeError("cordon failed")
        await self._maybe_block()
        reply(
            pb.OperatorMessage(
                reclaim_ack=pb.ReclaimAck(
                    instruction_id=instr.instruction_id, nodes_started=len(instr.nodes)
                )
            )
        )

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> None:
        self.bounded_started += 1
        self.node_calls.append((trio.current_time(), u.machine_id, u.supersedes_key))
        await self._maybe_block()
        await trio.sleep(self.node_delay)

    async def on_available_capacity(self, u: pb.AvailableCapacityUpdate) -> None:
        self.bounded_started += 1
        await self._maybe_block()


def payload(msg: Any) -> tuple[str, Any]:
    return betterproto.which_one_of(msg, "payload")


def cfg(**kw: Any) -> SessionConfig:
    return SessionConfig(cluster_id="c1", **kw)


async def start_session(
    nursery: trio.Nursery,
    *,
    buffer: float = math.inf,
    source: FakeSource | None = None,
    handlers: FakeHandlers | None = None,
    **kw: Any,
) -> tuple[Session, ShardStream, FakeSource, FakeHandlers]:
    op, shard = memory_stream_pair(buffer)
    source = source or FakeSource()
    handlers = handlers or FakeHandlers()
    session = Session(op, cfg(**kw), source, handlers)
    nursery.start_soon(session.run)
    return session, shard, source, handlers


def dropped_metric() -> float:
    return REGISTRY.get_sample_value("bigfleet_operator_outbox_dropped_total") or 0.0


async def test_hello_is_first_frame_then_rollup_at_once(autojump_clock: Any) -> None:
    async with trio.open_nursery() as n:
        _, shard, _, _ = await start_session(n)
        kind, hello = payload(await shard.receive())
        assert kind == "hello"
        assert hello.cluster_id == "c1"
        assert hello.protocol_version == "v1alpha1"
        t0 = trio.current_time()
        kind, rollup = payload(await shard.receive())
        assert kind == "rollup"
        assert rollup.timestamp_unix_nanos == 1
        assert rollup.cluster_id == "c1"  # filled in from the config when the source leaves it ""
        assert trio.current_time() == t0
        n.cancel_scope.cancel()


async def test_rollup_at_once_then_every_interval(autojump_clock: Any) -> None:
    async with trio.open_nursery() as n:
        _, shard, _, _ = await start_session(n, rollup_interval=10.0)
        t0 = trio.current_time()
        await shard.receive()  # hello
        seen = []
        for _ in range(4):
            kind, r = payload(await shard.receive())
            assert kind == "rollup"
            seen.append((trio.current_time() - t0, r.timestamp_unix_nanos))
        assert seen == [(0.0, 1), (10.0, 2), (20.0, 3), (30.0, 4)]
        n.cancel_scope.cancel()


async def test_three_rollups_behind_blocked_send_only_last_is_sent(autojump_clock: Any) -> None:
    async with trio.open_nursery() as n:
        # buffer=0: every send waits for the shard to read (a stalled HTTP/2 window) -- here for
        # 35 s, so the send-progress watchdog is set above that.
        session, shard, _, _ = await start_session(
            n, buffer=0, rollup_interval=10.0, send_timeout=40.0
        )
        t0 = trio.current_time()
        await shard.receive()  # hello; roll-up 1 (t=0) is now stuck in stream.send
        await trio.sleep(35)  # roll-ups 2, 3, 4 at t=10, 20, 30 queue behind it
        assert session.stats.rollups_replaced == 2  # 2 replaced by 3, 3 replaced by 4
        first = payload(await shard.receive())[1].timestamp_unix_nanos
        second = payload(await shard.receive())[1].timestamp_unix_nanos
        assert (first, second) == (1, 4)
        assert trio.current_time() - t0 == 35
        with trio.move_on_after(4.9):  # nothing else until roll-up 5 at t=40
            await shard.receive()
            pytest.fail("a stale roll-up was sent")
        assert payload(await shard.receive())[1].timestamp_unix_nanos == 5
        n.cancel_scope.cancel()


async def test_257th_outbox_item_dropped_and_counted_session_lives(autojump_clock: Any) -> None:
    before = dropped_metric()
    async with trio.open_nursery() as n:
        session, shard, _, _ = await start_session(n, buffer=0)
        await shard.receive()  # hello; roll-up 1 now blocks the send task
        for i in range(257):
            await shard.send(
                pb.ShardMessage(
                    reclaim_instruction=pb.ReclaimInstruction(instruction_id=f"r{i}", nodes=["n"])
                )
            )
        await trio.testing.wait_all_tasks_blocked()
        assert len(session.queues.outbox) == 256
        assert session.stats.outbox_dropped == 1
        assert dropped_metric() - before == 1
        # The session is alive: roll-up 1, then the 256 acks (one was dropped).
        assert payload(await shard.receive())[0] == "rollup"
        ids = set()
        for _ in range(256):
            kind, ack = payload(await shard.receive())
            assert kind == "reclaim_ack"
            ids.add(ack.instruction_id)
        assert len(ids) == 256 and ids < {f"r{i}" for i in range(257)}
        # ...and keeps going: the next roll-up and a new request's answer arrive.
        await shard.send(pb.ShardMessage(bootstrap_request=pb.BootstrapRequest(request_id="late")))
        got = {payload(await shard.receive())[0] for _ in range(2)}
        assert got == {"rollup", "bootstrap_response"}
        n.cancel_scope.cancel()


async def test_a_bootstrap_burst_beyond_the_outbox_is_answered_in_full(autojump_clock: Any) -> None:
    """300 pulls while the shard is not reading: none is dropped for being behind the others
    (docs/wire.md#send-queues); all are sent, in order, once the shard reads again."""
    before = dropped_metric()
    async with trio.open_nursery() as n:
        session, shard, _, _ = await start_session(n, buffer=0)
        await shard.receive()  # hello; roll-up 1 now blocks the send task
        for i in range(300):
            await shard.send(
                pb.ShardMessage(bootstrap_request=pb.BootstrapRequest(request_id=f"b{i}"))
            )
        await trio.testing.wait_all_tasks_blocked()
        assert len(session.queues.bootstrap) == 300
        assert session.stats.outbox_dropped == 0 and dropped_metric() == before
        assert payload(await shard.receive())[0] == "rollup"
        ids = []
        for _ in range(300):
            kind, resp = payload(await shard.receive())
            assert kind == "bootstrap_response"
            ids.append(resp.request_id)
        assert ids == [f"b{i}" for i in range(300)]
        n.cancel_scope.cancel()


async def test_a_bootstrap_answer_past_its_deadline_is_dropped_unsent(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async with trio.open_nursery() as n:
        # The send watchdog above the stall, so the session outlives it.
        session, shard, _, _ = await start_session(n, buffer=0, send_timeout=60.0)
        await shard.receive()  # hello; roll-up 1 now blocks the send task
        await shard.send(pb.ShardMessage(bootstrap_request=pb.BootstrapRequest(request_id="old")))
        await trio.sleep(6)
        await shard.send(pb.ShardMessage(bootstrap_request=pb.BootstrapRequest(request_id="new")))
        await trio.sleep(5)  # "old" is 11 s old, "new" 5 s: only "new" is still worth sending
        with caplog.at_level(logging.WARNING, logger="bigfleet_trio.operator.session"):
            assert payload(await shard.receive())[0] == "rollup"
            kind, resp = payload(await shard.receive())
        assert (kind, resp.request_id) == ("bootstrap_response", "new")
        assert session.stats.bootstrap_answers_expired == 1
        assert any("1 bootstrap answer(s) dropped unsent" in r.getMessage() for r in caplog.records)
        n.cancel_scope.cancel()


async def test_32_stuck_handlers_bootstrap_still_answered(autojump_clock: Any) -> None:
    async with trio.open_nursery() as n:
        session, shard, _, h = await start_session(n)
        h.block_bounded = True
        await shard.receive()  # hello
        await shard.receive()  # roll-up 1
        for i in range(32):
            await shard.send(
                pb.ShardMessage(node_state_update=pb.NodeStateUpdate(machine_id=f"m{i}"))
            )
        # the 32 machines start once the recv pump waits for frames (read-ahead gate)
        await trio.testing.wait_all_tasks_blocked()
        # a 33rd apiserver-writing frame must wait for a slot
        await shard.send(
            pb.ShardMessage(reclaim_instruction=pb.ReclaimInstruction(instruction_id="r"))
        )
        await shard.send(pb.ShardMessage(bootstrap_request=pb.BootstrapRequest(request_id="boot")))
        with trio.fail_after(1):
            kind, resp = payload(await shard.receive())
        assert kind == "bootstrap_response"
        assert resp.request_id == "boot"
        assert resp.user_data == b"#cloud-config boot"
        assert h.bounded_started == 32  # the reclaim is still waiting for a slot
        h.block.set()  # release: the reclaim runs and its ack goes out
        kind, ack = payload(await shard.receive())
        assert (kind, ack.instruction_id) == ("reclaim_ack", "r")
        assert h.bounded_started == 33
        n.cancel_scope.cancel()


async def test_dispatch_concurrency_is_configurable(autojump_clock: Any) -> None:
    async with trio.open_nursery() as n:
        _, shard, _, h = await start_session(n, dispatch_concurrency=2)
        h.block_bounded = True
        for i in range(5):
            await shard.send(
                pb.ShardMessage(
                    available_capacity=pb.AvailableCapacityUpdate(supersedes_key=f"p{i}")
                )
            )
        await trio.testing.wait_all_tasks_blocked()
        assert h.bounded_started == 2
        n.cancel_scope.cancel()


async def test_recv_pump_blocks_when_admission_backlog_full(autojump_clock: Any) -> None:
    async with trio.open_nursery() as n:
        # 1 slot + 1 backlog: the third bounded frame blocks the recv pump, so a bootstrap
        # request behind it is not read until a slot frees (backpressure, bounded memory).
        _, shard, _, h = await start_session(n, dispatch_concurrency=1, dispatch_backlog=1)
        h.block_bounded = True
        await shard.receive()  # hello
        await shard.receive()  # roll-up
        for i in range(3):
            await shard.send(
                pb.ShardMessage(reclaim_instruction=pb.ReclaimInstruction(instruction_id=f"r{i}"))
            )
        await shard.send(pb.ShardMessage(bootstrap_request=pb.BootstrapRequest(request_id="b")))
        with trio.move_on_after(5):
            await shard.receive()
            pytest.fail("recv pump should be blocked")
        h.block.set()
        kinds = [payload(await shard.receive())[0] for _ in range(4)]
        assert sorted(kinds) == ["bootstrap_response"] + ["reclaim_ack"] * 3
        n.cancel_scope.cancel()


async def test_100_frames_one_machine_slow_write_at_most_two_calls(autojump_clock: Any) -> None:
    async with trio.open_nursery() as n:
        session, shard, _, h = await start_session(n)
        h.node_delay = 1.0  # a slow apiserver write
        t0 = trio.current_time()
        for i in range(100):
            await shard.send(
                pb.ShardMessage(
                    node_state_update=pb.NodeStateUpdate(
                        machine_id="m1", supersedes_key=f"s{i}", state=pb.MachineState.CONFIGURING
                    )
                )
            )
            if i == 0:
                await trio.testing.wait_all_tasks_blocked()  # the first write is in progress
        await trio.sleep(10)
        # call 1 takes frame 0 at t=0; frames 1..99 coalesce; call 2 takes frame 99 at t=1.
        assert [(t - t0, key) for t, _, key in h.node_calls] == [(0.0, "s0"), (1.0, "s99")]
        assert session.stats.node_states_coalesced == 98
        assert not session.node_states.in_flight("m1")
        n.cancel_scope.cancel()


async def test_burst_for_one_machine_last_state_wins(autojump_clock: Any) -> None:
    async with trio.open_nursery() as n:
        _, shard, _, h = await start_session(n)
        h.node_delay = 1.0
        for i in range(100):  # back to back, no pause: however the reads interleave...
            await shard.send(
                pb.ShardMessage(
                    node_state_update=pb.NodeStateUpdate(machine_id="m1", supersedes_key=f"s{i}")
                )
            )
        await trio.sleep(10)
        assert 1 <= len(h.node_calls) <= 2  # ...at most one running + one pending call
        assert h.node_calls[-1][2] == "s99"  # and the last state wins
        n.cancel_scope.cancel()


async def test_machines_are_handled_concurrently(autojump_clock: Any) -> None:
    async with trio.open_nursery() as n:
        _, shard, _, h = await start_session(n)
        h.node_delay = 1.0
        t0 = trio.current_time()
        for i, m in enumerate(("a", "b", "a", "b")):
            await shard.send(pb.ShardMessage(node_state_update=pb.NodeStateUpdate(machine_id=m)))
            if i == 1:
                await trio.testing.wait_all_tasks_blocked()  # both first writes in progress
        await trio.sleep(5)
        starts = sorted((t - t0, m) for t, m, _ in h.node_calls)
        assert starts == [(0.0, "a"), (0.0, "b"), (1.0, "a"), (1.0, "b")]
        n.cancel_scope.cancel()


async def _fleet_burst(machines: int, **kw: Any) -> tuple[Session, list[Any], dict[str, Any]]:
    """Send ``machines`` x 3 transitions in waves through a session whose writes take 10 ms."""
    states = (pb.MachineState.IDLE, pb.MachineState.CONFIGURING, pb.MachineState.CONFIGURED)
    last: dict[str, pb.MachineState] = {}

    class Recording(FakeHandlers):
        async def on_node_state_update(self, u: pb.NodeStateUpdate) -> None:
            last[u.machine_id] = u.state
            await super().on_node_state_update(u)

    h = Recording()
    h.node_delay = 0.010
    async with trio.open_nursery() as n:
        session, shard, _, _ = await start_session(n, handlers=h, **kw)
        for state in states:
            for i in range(machines):
                await shard.send(
                    pb.ShardMessage(
                        node_state_update=pb.NodeStateUpdate(machine_id=f"m{i:04d}", state=state)
                    )
                )
        await trio.sleep(5)  # 2,000 machines / 32 slots x 10 ms = 0.63 s of draining
        n.cancel_scope.cancel()
    return session, h.node_calls, last


async def test_fleet_burst_coalesces_and_last_state_wins(autojump_clock: Any) -> None:
    # The nodestate bench's burst (docs/benchmarks/in-process.md) at test scale: 2,000 machines
    # x 3 transitions in waves (all IDLE, then all CONFIGURING, then all CONFIGURED = frames
    # 4,001..6,000), each handler call a 10 ms write.
    # The sender and the recv pump stay runnable until every frame is read, so no virtual time
    # passes meanwhile and the pump reads one frame per scheduler batch: it is backlogged, and
    # the read-ahead gate lets one new machine start per 256 frames read. Machine k (the FIFO
    # head) starts after read ~256(k+1), before its CONFIGURED frame (read 4,001+k) only while
    # 256(k+1) < 4,001+k, i.e. k <= 14: at most 16 machines (a margin of one) cost an extra
    # call. Every other frame only replaces its machine's pending one, and each machine is then
    # handled once with CONFIGURED: 2,000 <= calls <= 2,016 for 6,000 frames (<= 0.336).
    machines = 2000
    session, calls, last = await _fleet_burst(machines)
    frames = 3 * machines
    assert machines <= len(calls) <= machines + 16
    assert len(calls) / frames <= 0.4
    assert last == {f"m{i:04d}": pb.MachineState.CONFIGURED for i in range(machines)}
    assert session.stats.node_states_coalesced == frames - len(calls)
    assert session.node_states.pending == 0 and session.node_states.workers == 0


async def test_fleet_burst_without_read_ahead_gate(autojump_clock: Any) -> None:
    # node_state_read_ahead=0: a worker starts a machine as soon as it is ready. The 32 pool
    # workers take the first 32 machines' IDLE frames at t=0 and hold every slot for 10 ms,
    # during which (no virtual time passes) all 6,000 frames are read and coalesce; then every
    # machine is handled once with CONFIGURED: 32 + 2,000 = 2,032 calls (0.339 per frame).
    machines = 2000
    session, calls, last = await _fleet_burst(machines, node_state_read_ahead=0)
    assert len(calls) == 32 + machines
    assert last == {f"m{i:04d}": pb.MachineState.CONFIGURED for i in range(machines)}
    assert session.stats.node_states_coalesced == 3 * machines - len(calls)


async def test_recv_pump_reads_node_states_while_all_slots_busy(autojump_clock: Any) -> None:
    async with trio.open_nursery() as n:
        session, shard, _, h = await start_session(n)
        h.block_bounded = True  # every apiserver write hangs: the 32 slots stay taken
        await shard.receive()  # hello
        await shard.receive()  # roll-up
        for i in range(5000):
            await shard.send(
                pb.ShardMessage(node_state_update=pb.NodeStateUpdate(machine_id=f"m{i}"))
            )
        await shard.send(pb.ShardMessage(bootstrap_request=pb.BootstrapRequest(request_id="b")))
        with trio.fail_after(1):
            kind, resp = payload(await shard.receive())
        assert (kind, resp.request_id) == ("bootstrap_response", "b")
        await trio.testing.wait_all_tasks_blocked()  # the pump waits: the gate lets all start
        assert h.bounded_started == 32  # the first 32 machines hold the slots
        assert session.node_states.workers == 32
        assert session.node_states.pending == 5000 - 32  # the rest wait, one frame each
        n.cancel_scope.cancel()


async def test_node_state_pending_cap_pauses_recv_pump(autojump_clock: Any) -> None:
    async with trio.open_nursery() as n:
        # 1 slot, cap 10: m0 is taken by the worker (which hangs), m1..m10 wait -> 10 pending =
        # the cap, so the pump stops before reading the bootstrap request behind them.
        session, shard, _, h = await start_session(
            n, dispatch_concurrency=1, node_state_pending_cap=10
        )
        h.block_bounded = True
        await shard.receive()  # hello
        await shard.receive()  # roll-up
        for i in range(11):
            await shard.send(
                pb.ShardMessage(node_state_update=pb.NodeStateUpdate(machine_id=f"m{i}"))
            )
        await shard.send(pb.ShardMessage(bootstrap_request=pb.BootstrapRequest(request_id="b")))
        with trio.move_on_after(5):
            await shard.receive()
            pytest.fail("recv pump should be paused at the node-state cap")
        assert session.node_states.pending == 10
        assert h.bounded_started == 1
        h.block.set()  # m0 finishes, the worker takes m1's frame: 9 pending, the pump resumes
        with trio.fail_after(1):
            kind, resp = payload(await shard.receive())
        assert (kind, resp.request_id) == ("bootstrap_response", "b")
        await trio.sleep(1)
        assert [m for _, m, _ in h.node_calls] == [f"m{i}" for i in range(11)]  # FIFO
        n.cancel_scope.cancel()


async def test_node_state_workers_share_slots_with_reclaim(autojump_clock: Any) -> None:
    async with trio.open_nursery() as n:
        # 2 slots shared: a reclaim queued behind two busy machines runs before a third machine
        # that became ready later (the semaphore is FIFO), and never more than 2 run at once.
        _, shard, _, h = await start_session(n, dispatch_concurrency=2)
        h.block_bounded = True
        await shard.receive()  # hello
        await shard.receive()  # roll-up
        for m in ("a", "b"):
            await shard.send(pb.ShardMessage(node_state_update=pb.NodeStateUpdate(machine_id=m)))
        await trio.testing.wait_all_tasks_blocked()
        await shard.send(
            pb.ShardMessage(reclaim_instruction=pb.ReclaimInstruction(instruction_id="r"))
        )
        await trio.testing.wait_all_tasks_blocked()
        await shard.send(pb.ShardMessage(node_state_update=pb.NodeStateUpdate(machine_id="c")))
        await trio.testing.wait_all_tasks_blocked()
        assert h.bounded_started == 2
        h.block_bounded = False
        h.block.set()
        kind, ack = payload(await shard.receive())
        assert (kind, ack.instruction_id) == ("reclaim_ack", "r")
        await trio.sleep(1)
        assert [m for _, m, _ in h.node_calls] == ["a", "b", "c"]
        assert h.bounded_started == 4
        n.cancel_scope.cancel()


async def test_handler_errors_are_counted_and_session_goes_on(autojump_clock: Any) -> None:
    async with trio.open_nursery() as n:
        session, shard, _, h = await start_session(n)
        h.fail_kinds = {"reclaim", "bootstrap"}
        await shard.receive()  # hello
        await shard.receive()  # roll-up
        await shard.send(
            pb.ShardMessage(reclaim_instruction=pb.ReclaimInstruction(instruction_id="r"))
        )
        await shard.send(pb.ShardMessage(bootstrap_request=pb.BootstrapRequest(request_id="b")))
        await shard.send(pb.ShardMessage())  # no payload: logged and ignored
        await shard.send(pb.ShardMessage(ack=pb.Acknowledgement(echo="rollup", coordinator_term=3)))
        kind, resp = payload(await shard.receive())
        # a failing bootstrap handler still answers, with the error echoed (shard falls back now)
        assert (kind, resp.request_id) == ("bootstrap_response", "b")
        assert "template exploded" in resp.error
        await trio.testing.wait_all_tasks_blocked()
        assert session.stats.handler_errors == 2
        assert session.stats.frames_in == 4
        kind, _ = payload(await shard.receive())  # next tick: still alive
        assert kind == "rollup"
        n.cancel_scope.cancel()


async def test_rollup_build_error_keeps_session(autojump_clock: Any) -> None:
    async with trio.open_nursery() as n:
        src = FakeSource()
        src.fail_build = True
        session, shard, _, _ = await start_session(n, source=src, rollup_interval=10.0)
        await shard.receive()  # hello
        await trio.sleep(15)  # builds at t=0 and t=10 fail
        assert session.stats.rollup_errors == 2
        src.fail_build = False
        t0 = trio.current_time()
        kind, r = payload(await shard.receive())
        assert (kind, r.timestamp_unix_nanos, trio.current_time() - t0) == ("rollup", 3, 5.0)
        n.cancel_scope.cancel()


async def test_after_enqueue_never_delays_ticks_nor_overlaps(autojump_clock: Any) -> None:
    async with trio.open_nursery() as n:
        src = FakeSource()
        src.after_block = trio.Event()
        _, shard, _, _ = await start_session(n, source=src, rollup_interval=10.0)
        t0 = trio.current_time()
        await shard.receive()  # hello
        times = []
        for _ in range(3):
            await shard.receive()
            times.append(trio.current_time() - t0)
        assert times == [0.0, 10.0, 20.0]  # the hook (still blocked) did not delay the ticks
        assert src.after == 1  # and did not run concurrently with itself
        src.after_block.set()
        await trio.testing.wait_all_tasks_blocked()
        assert src.after == 2  # one catch-up run for the roll-ups enqueued meanwhile
        n.cancel_scope.cancel()


async def test_recv_error_cancels_send_rollup_and_handlers(autojump_clock: Any) -> None:
    op, shard = memory_stream_pair()
    h = FakeHandlers()
    h.block_bounded = True
    session = Session(op, cfg(), FakeSource(), h)
    seen_session: list[Session | None] = []

    async def shard_side() -> None:
        await shard.receive()
        await shard.send(
            pb.ShardMessage(reclaim_instruction=pb.ReclaimInstruction(instruction_id="x"))
        )
        await trio.sleep(3)
        await shard.aclose()  # the peer goes away: recv raises StreamClosed

    orig = h.on_reclaim_instruction

    async def spy(instr: pb.ReclaimInstruction, reply: Reply) -> None:
        seen_session.append(current_session())
        await orig(instr, reply)

    h.on_reclaim_instruction = spy  # type: ignore[method-assign]
    t0 = trio.current_time()
    async with trio.open_nursery() as n:
        n.start_soon(shard_side)
        with pytest.raises(StreamClosed):
            await session.run()
    # run() returning at all means send and roll-up (infinite loops) were cancelled.
    assert trio.current_time() - t0 == 3
    assert h.cancelled == 1  # the stuck handler was cancelled with the session
    assert session.closing.is_set()
    assert seen_session == [session]  # handlers can find their session
    assert current_session() is None
    # a late reply (e.g. from work handed to a longer-lived nursery) is refused, not queued
    late = pb.OperatorMessage(reclaim_ack=pb.ReclaimAck(instruction_id="x"))
    assert session.enqueue(late) is False


async def test_send_error_ends_session(autojump_clock: Any) -> None:
    op, shard = memory_stream_pair()
    session = Session(op, cfg(), FakeSource(), FakeHandlers())
    await shard.aclose()
    with pytest.raises(StreamClosed):
        await session.run()  # Hello cannot be sent


def test_session_config_validation() -> None:
    with pytest.raises(ValueError, match="rollup_interval"):
        SessionConfig(cluster_id="c", rollup_interval=0)
    with pytest.raises(ValueError, match="dispatch_concurrency"):
        SessionConfig(cluster_id="c", dispatch_concurrency=0)
    with pytest.raises(ValueError, match="outbox_capacity"):
        SessionConfig(cluster_id="c", outbox_capacity=0)
    with pytest.raises(ValueError, match="node_state_pending_cap"):
        SessionConfig(cluster_id="c", node_state_pending_cap=0)
    assert SessionConfig(cluster_id="c").node_state_pending_cap == 100_000
    with pytest.raises(ValueError, match="node_state_read_ahead"):
        SessionConfig(cluster_id="c", node_state_read_ahead=-1)
    assert SessionConfig(cluster_id="c").node_state_read_ahead == 256


# ---- send-progress watchdog (FAULTS.md "accepts and never reads") -----------------------------


async def test_shard_that_never_reads_hello_ends_session_after_send_timeout(
    autojump_clock: Any,
) -> None:
    # buffer=0 and the shard never receives: Hello can never be handed over.
    op, _shard = memory_stream_pair(0)
    session = Session(op, cfg(send_timeout=7.0), FakeSource(), FakeHandlers())
    t0 = trio.current_time()
    with pytest.raises(SendStalled) as info:
        await session.run()
    assert trio.current_time() - t0 == 7.0
    assert isinstance(info.value, StreamClosed)  # the agent's "stream ended" path
    assert "hello" in info.value.reason and "7s" in info.value.reason
    assert session.closing.is_set()


async def test_send_task_stall_after_hello_ends_session(autojump_clock: Any) -> None:
    op, shard = memory_stream_pair(0)
    session = Session(op, cfg(send_timeout=5.0), FakeSource(), FakeHandlers())
    got: list[BaseException] = []

    async def run() -> None:
        try:
            await session.run()
        except SendStalled as exc:
            got.append(exc)

    async with trio.open_nursery() as n:
        n.start_soon(run)
        await shard.receive()  # hello; roll-up 1 is now blocked in send, nobody reads again
        t0 = trio.current_time()
        await session.closing.wait()
    assert trio.current_time() - t0 == 5.0
    assert len(got) == 1 and "rollup" in str(got[0])


async def test_slow_but_progressing_shard_is_not_killed(autojump_clock: Any) -> None:
    # every frame waits 4 s for the shard (< send_timeout 5 s), for 60 s in a row
    async with trio.open_nursery() as n:
        session, shard, _, _ = await start_session(
            n, buffer=0, send_timeout=5.0, rollup_interval=1.0
        )
        t0 = trio.current_time()
        frames = 0
        while trio.current_time() - t0 < 60:
            await trio.sleep(4)
            await shard.receive()
            frames += 1
        assert frames == 15
        assert not session.closing.is_set()
        n.cancel_scope.cancel()


def test_send_timeout_default_and_validation() -> None:
    assert cfg().send_timeout == 30.0
    with pytest.raises(ValueError, match="send_timeout"):
        SessionConfig(cluster_id="c", send_timeout=0)
    with pytest.raises(ValueError, match="drop_log_interval"):
        SessionConfig(cluster_id="c", drop_log_interval=-1)


# ---- rate-limited drop warnings --------------------------------------------------------------


async def test_outbox_drops_log_first_then_one_summary_per_interval(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bigfleet_trio.operator.session")
    before = dropped_metric()
    async with trio.open_nursery() as n:
        session, shard, _, _ = await start_session(
            n, buffer=0, outbox_capacity=1, drop_log_interval=10.0, send_timeout=1000.0
        )
        await shard.receive()  # hello; roll-up 1 blocks the send task from here on
        t0 = trio.current_time()

        async def burst(tag: str, count: int) -> None:
            for i in range(count):
                await shard.send(
                    pb.ShardMessage(
                        reclaim_instruction=pb.ReclaimInstruction(
                            instruction_id=f"{tag}{i}", nodes=["n"]
                        )
                    )
                )
            await trio.testing.wait_all_tasks_blocked()

        await burst("a", 101)  # t=0: 1 fills the outbox, 100 dropped
        await trio.sleep(4)
        await burst("b", 50)  # t=4: 50 more dropped
        await trio.sleep(30)  # summary at t=10 (149 since the first); quiet afterwards
        await burst("c", 3)  # t=34: a new episode: one WARNING, then a summary at t=44 (2)
        await trio.sleep(20)
        drops = [r for r in caplog.records if "dropped" in r.getMessage()]
        assert [r.levelno for r in drops] == [logging.WARNING] * 4
        msgs = [r.getMessage() for r in drops]
        assert "kind=reclaim_ack id=a" in msgs[0]
        assert "149 more" in msgs[1] and "in the last 10s" in msgs[1]
        assert "kind=reclaim_ack id=c" in msgs[2]
        assert "2 more" in msgs[3]
        assert session.stats.outbox_dropped == 100 + 50 + 3
        assert dropped_metric() - before == 153
        assert trio.current_time() - t0 == 54
        n.cancel_scope.cancel()


async def test_drops_not_yet_summarised_are_logged_when_the_session_ends(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bigfleet_trio.operator.session")
    async with trio.open_nursery() as n:
        session, shard, _, _ = await start_session(
            n, buffer=0, outbox_capacity=1, drop_log_interval=10.0, send_timeout=1000.0
        )
        await shard.receive()  # hello
        for i in range(6):  # 1 queued, 5 dropped: first logged, 4 pending a summary
            await shard.send(
                pb.ShardMessage(
                    reclaim_instruction=pb.ReclaimInstruction(instruction_id=f"x{i}", nodes=["n"])
                )
            )
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(3)
        n.cancel_scope.cancel()
    msgs = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(msgs) == 2
    assert "4 more" in msgs[1]
    assert session.stats.outbox_dropped == 5


def _histogram(name: str, **labels: str) -> tuple[float, float]:
    """(count, sum) of a histogram in the default registry (0, 0 before its first sample)."""
    get = REGISTRY.get_sample_value
    return (get(f"{name}_count", labels) or 0.0, get(f"{name}_sum", labels) or 0.0)


async def test_node_state_queue_time_is_measured_from_ready_to_claimed(
    autojump_clock: Any,
) -> None:
    """One worker: machine a is claimed at once, b waits the 1 s of a's handling for it; the
    wait shows in the queue histogram, and as neither the read-ahead gate's nor a slot's."""
    queue = "bigfleet_operator_node_state_queue_seconds"
    wait = "bigfleet_operator_node_state_worker_wait_seconds"
    before = (_histogram(queue), _histogram(wait, waited_for="slot"),
              _histogram(wait, waited_for="read_ahead"))
    async with trio.open_nursery() as n:
        _, shard, _, h = await start_session(n, dispatch_concurrency=1)
        h.node_delay = 1.0
        for m in ("a", "b"):
            await shard.send(pb.ShardMessage(node_state_update=pb.NodeStateUpdate(machine_id=m)))
        await trio.sleep(5)
        assert [(m, t) for t, m, _ in h.node_calls] == [("a", 0.0), ("b", 1.0)]
        n.cancel_scope.cancel()
    count, total = (a - b for a, b in zip(_histogram(queue), before[0], strict=True))
    assert (count, total) == (2, pytest.approx(1.0))
    assert _histogram(wait, waited_for="slot") == (before[1][0] + 2, pytest.approx(before[1][1]))
    assert _histogram(wait, waited_for="read_ahead")[0] == before[2][0] + 2


async def test_node_state_wait_for_a_slot_held_by_another_handler(autojump_clock: Any) -> None:
    """The one slot is held by a reclaim for 2 s: the machine's worker waits for it, and that
    wait is counted as ``slot``."""
    wait = "bigfleet_operator_node_state_worker_wait_seconds"
    before = _histogram(wait, waited_for="slot")
    async with trio.open_nursery() as n:
        _, shard, _, h = await start_session(n, dispatch_concurrency=1)
        h.block_bounded = True
        await shard.send(pb.ShardMessage(reclaim_instruction=pb.ReclaimInstruction(
            instruction_id="r1", nodes=["n1"])))
        await trio.testing.wait_all_tasks_blocked()
        assert h.bounded_started == 1
        h.block_bounded = False
        await shard.send(pb.ShardMessage(node_state_update=pb.NodeStateUpdate(machine_id="a")))
        await trio.sleep(2)
        h.block.set()
        await trio.sleep(1)
        assert [m for _t, m, _ in h.node_calls] == ["a"]
        n.cancel_scope.cancel()
    count, total = (a - b for a, b in zip(_histogram(wait, waited_for="slot"), before,
                                           strict=True))
    assert (count, total) == (1, pytest.approx(2.0))


async def test_the_session_traces_the_frames_its_pump_reads(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch, autojump_clock: Any) -> None:
    """With the frame trace on, each NodeStateUpdate and ReclaimInstruction the operator's
    receive pump hands on is one line ``[read, kind, key]``: the bench's split of a latency at
    the moment the operator had the frame (docs/kube-api.md#request-trace)."""
    from pathlib import Path

    import orjson

    from bigfleet_trio.kube import reqtrace

    out = Path(str(tmp_path)) / "frames.jsonl"
    trace = reqtrace.FrameTrace(str(out))
    monkeypatch.setattr(reqtrace, "frames", trace)
    async with trio.open_nursery() as n:
        _, shard, _, _ = await start_session(n)
        await shard.send(pb.ShardMessage(node_state_update=pb.NodeStateUpdate(machine_id="m1")))
        await shard.send(pb.ShardMessage(reclaim_instruction=pb.ReclaimInstruction(
            instruction_id="r1", nodes=["n1"])))
        await shard.send(pb.ShardMessage(bootstrap_request=pb.BootstrapRequest(request_id="b")))
        await trio.sleep(1)
        n.cancel_scope.cancel()
    trace.close()
    lines = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert [x[1:] for x in lines] == [["node_state_update", "m1"],
                                      ["reclaim_instruction", "r1"]]
    assert all(isinstance(x[0], float) for x in lines)


class _Outage(FakeHandlers):
    """Handlers whose writes fail retriably (503) until ``up_at``; record what landed."""

    def __init__(self, up_at: float, error: Exception | None = None) -> None:
        super().__init__()
        self.up_at = up_at
        self.error = error
        self.node_written: dict[str, int] = {}
        self.available_written: dict[str, int] = {}
        self.attempts = 0

    def _write(self) -> None:
        self.attempts += 1
        if self.error is not None:
            raise self.error
        if trio.current_time() < self.up_at:
            from bigfleet_trio.kube.errors import ServerError

            raise ServerError(503, "ServiceUnavailable", "apiserver away")

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> None:
        self._write()
        self.node_written[u.machine_id] = u.state

    async def on_available_capacity(self, u: pb.AvailableCapacityUpdate) -> None:
        self._write()
        self.available_written[u.supersedes_key] = u.available_count


async def test_frames_sent_during_an_apiserver_outage_all_land_after_it(
    autojump_clock: Any,
) -> None:
    """The shard sends each frame once: frames read while every write fails (75 s) are kept
    as desired states and retried with per-key backoff, never given up; within 30 s of the
    server's return every key is at its latest frame, on the same session."""
    from bigfleet_trio.observability import metrics as m

    MS = pb.MachineState
    start = trio.current_time()
    h = _Outage(up_at=start + 75.0)
    retries_before = m.RECONCILE_RETRIES.labels("node_state_update")._value.get()
    async with trio.open_nursery() as n:
        session, shard, _, _ = await start_session(n, handlers=h)
        await shard.receive()  # hello
        await shard.receive()  # roll-up
        frames = [("m-1", MS.CREATING), ("m-2", MS.CONFIGURED), ("m-3", MS.IDLE)]
        for machine, state in frames:
            await shard.send(pb.ShardMessage(node_state_update=pb.NodeStateUpdate(
                machine_id=machine, supersedes_key=f"machine/{machine}", state=state)))
        await shard.send(pb.ShardMessage(available_capacity=pb.AvailableCapacityUpdate(
            supersedes_key="p/a", available_count=3)))
        await trio.sleep(40.0)
        # m-1 moves on while its first frame is still parked: the newer one wins
        await shard.send(pb.ShardMessage(node_state_update=pb.NodeStateUpdate(
            machine_id="m-1", supersedes_key="machine/m-1", state=MS.CONFIGURED)))
        await shard.send(pb.ShardMessage(available_capacity=pb.AvailableCapacityUpdate(
            supersedes_key="p/a", available_count=5)))
        await trio.sleep(30.0)
        assert h.node_written == {} and h.available_written == {}  # still away
        assert m.RECONCILE_FAILING_OLDEST._value.get() >= 60.0  # not converged for a minute
        await trio.sleep(5.0 + 30.0)  # back at 75 s; 30 s later everything is there
        assert h.node_written == {"m-1": MS.CONFIGURED, "m-2": MS.CONFIGURED, "m-3": MS.IDLE}
        assert h.available_written == {"p/a": 5}
        assert session.stats.handler_errors == 0  # one session throughout, nothing given up
        assert m.RECONCILE_RETRIES.labels("node_state_update")._value.get() > retries_before
        assert m.RECONCILE_FAILING_OLDEST._value.get() == 0.0
        attempts = h.attempts
        await trio.sleep(600.0)
        assert h.attempts == attempts  # converged: nothing is retried any more
        n.cancel_scope.cancel()


async def test_a_permanent_refusal_is_not_retried(autojump_clock: Any) -> None:
    from bigfleet_trio.kube.errors import ApiError

    h = _Outage(up_at=0.0, error=ApiError(422, "Invalid", "spec.resources: bad"))
    async with trio.open_nursery() as n:
        session, shard, _, _ = await start_session(n, handlers=h)
        await shard.receive()  # hello
        await shard.receive()  # roll-up
        await shard.send(pb.ShardMessage(node_state_update=pb.NodeStateUpdate(
            machine_id="m-1", supersedes_key="machine/m-1", state=pb.MachineState.CREATING)))
        await trio.sleep(300.0)
        assert h.attempts == 1 and session.stats.handler_errors == 1
        n.cancel_scope.cancel()
