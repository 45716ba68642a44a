"""Shard faults: the stream dies after each frame kind, mid bootstrap
pull, mid reclaim and mid NodeStateUpdate burst; a shard that never reads; a shard that sends
garbage, unknown oneofs, empty ids and huge frames.

After every fault: the agent reconnects with backoff; the first roll-up of every later session is
complete and current; no drain was cancelled by the reconnect (drains are owned by the operator's
DrainManager, outside the session); cancelling the operator leaves no task behind.

Expected values, worked out by hand (``docs/rules.md#roll-up``):
CRs w and v (priority 100, cpu 3 each, no requirements) share one profile, so while both exist
the roll-up is one need: aggregate cpu "6", min_unit cpu "3". Four 4-cpu machines exist; 6 cpu of
demand needs two. After both CRs are deleted the complete roll-up is empty.
"""

from __future__ import annotations

import logging
import math
import tracemalloc
from typing import Any

import pytest
import trio
import trio.testing

from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, NODES, PODS
from bigfleet_trio.operator.session.core import Session
from bigfleet_trio.operator.session.types import SessionConfig
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.transport import StreamClosed, memory_stream_pair
from bigfleet_trio.sim.shard.engine import EngineConfig
from tests.support.capacity import cr

from ._harness import Harness, TaskTracker, Trigger, harness, kind_of, needs_of

FULL = [(100, {"cpu": "6"}, {"cpu": "3"})]
HALF = [(100, {"cpu": "3"}, {"cpu": "3"})]
EMPTY: list[Any] = []

TRIGGERS = [
    pytest.param(Trigger("up", "hello"), id="after-hello"),
    pytest.param(Trigger("down", "ack", 1), id="after-hello-ack"),
    pytest.param(Trigger("up", "rollup"), id="after-rollup"),
    pytest.param(Trigger("down", "ack", 2), id="after-rollup-ack"),
    pytest.param(Trigger("down", "bootstrap_request"), id="during-bootstrap-pull"),
    pytest.param(Trigger("up", "bootstrap_response"), id="after-bootstrap-response"),
    pytest.param(Trigger("down", "node_state_update", 3), id="during-node-state-burst"),
    pytest.param(Trigger("down", "reclaim_instruction"), id="during-reclaim"),
    pytest.param(Trigger("up", "reclaim_ack"), id="after-reclaim-ack"),
]


async def _lifecycle(h: Harness) -> tuple[float, float]:
    """Demand -> two Ready machines -> a Pod on one -> demand withdrawn -> drained and gone.

    Returns (time the first CR delete was sent, time the operator had seen both deletes).
    """
    await h.wait(lambda: h.shard.machines_by_state().get("CONFIGURED") == 2)

    async def two_ready() -> bool:
        uns = await h.upcoming()
        return len(uns) == 2 and all(
            (u.get("status") or {}).get("phase") == "Ready" for u in uns.values()
        )

    await h.wait_async(two_ready)
    nodes = sorted(n["metadata"]["name"] for n in (await h.client.list(NODES)).items)
    await h.client.create(PODS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"nodeName": nodes[0], "containers": [{"name": "c", "image": "x"}]},
    }, "default")
    deleting_at = trio.current_time()
    await h.client.delete(CAPACITY_REQUESTS, "w", "default")
    await h.client.delete(CAPACITY_REQUESTS, "v", "default")
    await h.wait(lambda: h.operator.statistics().crs_contributing == 0)
    observed_at = trio.current_time()

    async def all_gone() -> bool:
        return await h.upcoming() == {}

    await h.wait_async(all_gone)
    await h.wait(lambda: h.shard.engine.released == 2)
    await h.wait(lambda: h.operator.statistics().drains_active == 0)
    return deleting_at, observed_at


@pytest.mark.parametrize("trigger", TRIGGERS)
async def test_stream_reset_recovers_without_losing_demand_or_drains(
    trigger: Trigger, autojump_clock: trio.testing.MockClock,
) -> None:
    tracker = TaskTracker()
    trio.lowlevel.add_instrument(tracker)
    try:
        async with harness(trigger=trigger,
                           engine=EngineConfig(seed=3, reclaim_grace_seconds=10)) as h:
            await h.client.create(CAPACITY_REQUESTS, cr("w", 100, {"cpu": "3"}), "default")
            await h.client.create(CAPACITY_REQUESTS, cr("v", 100, {"cpu": "3"}), "default")
            host: list[trio.lowlevel.Task] = []

            async def host_operator(task_status: trio.TaskStatus[None]) -> None:
                host.append(trio.lowlevel.current_task())
                await h.operator.run(task_status=task_status)

            async with trio.open_nursery() as run:
                await run.start(host_operator)
                deleting_at, observed_at = await _lifecycle(h)
                stats = h.operator.statistics()
                run.cancel_scope.cancel()

            # the fault fired, and the agent came back on a new stream after a backoff
            assert trigger.fired_at is not None, "the fault never fired"
            assert len(h.sessions) >= 2
            assert stats.reconnects >= 1 and stats.sessions >= 2
            later = [s for s in h.sessions if s.started_at > trigger.fired_at]
            assert later, "no session after the fault"
            assert later[0].started_at - trigger.fired_at >= 0.5 * 0.8  # backoff, jittered
            # every session's first roll-up is complete and current (never partial/stale)
            for s in h.sessions:
                if s.first_rollup_at is None:
                    continue
                got = needs_of(s.first_rollup)
                if s.first_rollup_at < deleting_at:
                    assert got == FULL, (s.first_rollup_at, got)
                elif s.first_rollup_at > observed_at + 0.01:
                    assert got == EMPTY, (s.first_rollup_at, got)
                else:
                    assert got in (FULL, HALF, EMPTY)
            assert needs_of(h.shard.last_rollup) == EMPTY
            # no drain was cancelled by the reconnect: both finished, none failed or abandoned
            assert stats.drains_completed == 2
            assert stats.drains_failed == 0 and stats.drains_abandoned == 0
            assert (await h.client.list(PODS, "default")).items == []
            # no task outlived the operator
            assert tracker.descendants(host[0]) == []
    finally:
        trio.lowlevel.remove_instrument(tracker)


async def test_flapping_shard_backoff_grows_then_recovers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Five refused connects in a row: waits ~0.5, 1, 2, 4, 4 (cap 4 here), then a session."""
    async with harness() as h:
        await h.client.create(CAPACITY_REQUESTS, cr("w", 100, {"cpu": "3"}), "default")
        h.connector.fail_next = 5
        async with trio.open_nursery() as run:
            started = trio.current_time()
            await run.start(h.operator.run)
            await h.wait(lambda: h.shard.last_rollup is not None)
            elapsed = trio.current_time() - started
            # nominal 0.5+1+2+4+4 = 11.5 s; jitter only shortens each wait by up to 20 %
            assert 11.5 * 0.8 <= elapsed <= 11.5 + 1.5
            assert h.connector.connects == 6
            assert needs_of(h.shard.last_rollup) == [(100, {"cpu": "3"}, {"cpu": "3"})]
            run.cancel_scope.cancel()


# ------------------------------------------------------------------ scripted shard, session level


class _Source:
    def __init__(self) -> None:
        self.built = 0

    async def build(self) -> pb.ClusterCapacityNeeds:
        self.built += 1
        return pb.ClusterCapacityNeeds(timestamp_unix_nanos=self.built)

    async def after_enqueue(self) -> None:
        return None


class _Handlers:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    async def on_bootstrap_request(self, req: pb.BootstrapRequest) -> pb.BootstrapBlobResponse:
        self.seen.append(("bootstrap", req.request_id))
        return pb.BootstrapBlobResponse(user_data=b"x" * 1024)

    async def on_reclaim_instruction(self, instr: pb.ReclaimInstruction, reply: Any) -> None:
        self.seen.append(("reclaim", instr.instruction_id))
        reply(pb.OperatorMessage(reclaim_ack=pb.ReclaimAck(instruction_id=instr.instruction_id)))

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> None:
        self.seen.append(("node", u.machine_id))

    async def on_available_capacity(self, u: pb.AvailableCapacityUpdate) -> None:
        self.seen.append(("available", u.supersedes_key))


async def test_shard_that_never_reads_outbox_bounded_memory_flat(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
) -> None:
    """The shard accepts, sends 1 000 BootstrapRequests every 5 s for 40 s and never reads: the
    send task blocks on the stalled stream; bootstrap answers wait in their lane only until
    their 10 s deadline (docs/wire.md#send-queues), so the lane holds at most the last ~10 s of
    answers and the memory the session holds stops growing once that window is full."""
    # one summary line per interval at most, but keep captured records out of the measurement
    caplog.set_level(logging.CRITICAL, logger="bigfleet_trio.operator.session")
    op_end, shard_end = memory_stream_pair(1)  # Hello fits in the "window", then it stalls
    handlers = _Handlers()
    session = Session(op_end, SessionConfig(cluster_id="c1", rollup_interval=1.0,
                                            send_timeout=1000.0), _Source(), handlers)
    peaks: list[int] = []
    sizes: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.run)
        await trio.lowlevel.checkpoint()  # Hello goes into the 1-frame "window"
        tracemalloc.start()
        try:
            for burst in range(8):
                for i in range(1000):
                    await shard_end.send(pb.ShardMessage(
                        bootstrap_request=pb.BootstrapRequest(request_id=f"r{burst}-{i}")))
                await trio.testing.wait_all_tasks_blocked()
                sizes.append(len(session.queues.bootstrap))
                handlers.seen.clear()  # the test's own record of requests is not the session's
                await trio.sleep(5)  # five roll-up ticks, all coalesced into one slot
                cur, _ = tracemalloc.get_traced_memory()
                peaks.append(cur)
        finally:
            tracemalloc.stop()
        # Bursts 5 s apart, a 10 s deadline: at most three bursts' answers are ever held.
        assert sizes[:3] == [1000, 2000, 3000]
        assert max(sizes) <= 3000 and sizes[-1] <= 3000
        assert session.stats.bootstrap_answers_expired == 8000 - sizes[-1]
        assert session.stats.outbox_dropped == 0
        assert session.stats.rollups_replaced >= 10
        assert not session.closing.is_set()
        # memory flat once the window is full: the last bursts add < 256 KiB over burst 3's
        assert peaks[-1] - peaks[2] < 256 << 10, (peaks, sizes)
        nursery.cancel_scope.cancel()


def _frames() -> list[pb.ShardMessage]:
    return [
        pb.ShardMessage(),  # no oneof set (an unknown/newer payload decodes to this)
        pb.ShardMessage(bootstrap_request=pb.BootstrapRequest()),  # empty request_id
        pb.ShardMessage(reclaim_instruction=pb.ReclaimInstruction()),  # empty instruction_id
        pb.ShardMessage(node_state_update=pb.NodeStateUpdate()),  # empty machine_id
        pb.ShardMessage(available_capacity=pb.AvailableCapacityUpdate()),
        pb.ShardMessage(ack=pb.Acknowledgement()),
        pb.ShardMessage(node_state_update=pb.NodeStateUpdate(
            machine_id="m" * 100_000, labels={f"k{i}": "v" * 100 for i in range(2000)})),
        pb.ShardMessage(bootstrap_request=pb.BootstrapRequest(request_id="ok")),
    ]


async def test_garbage_unknown_oneof_empty_ids_and_huge_frames_do_not_end_the_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each odd frame is handled or ignored (logged), never a crash; the last, normal request is
    still answered on the same session."""
    op_end, shard_end = memory_stream_pair(math.inf)
    handlers = _Handlers()
    session = Session(op_end, SessionConfig(cluster_id="c1", rollup_interval=1.0), _Source(),
                      handlers)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.run)
        for frame in _frames():
            await shard_end.send(frame)
        answered: list[str] = []
        with trio.fail_after(5):
            while "ok" not in answered:
                msg = await shard_end.receive()
                if kind_of(msg) == "bootstrap_response":
                    answered.append(msg.bootstrap_response.request_id)
        # the empty-id request was answered too (with its empty id echoed), before "ok"
        assert answered == ["", "ok"]
        assert not session.closing.is_set()
        assert session.stats.frames_in == len(_frames())
        nursery.cancel_scope.cancel()


async def test_undecodable_bytes_on_the_wire_end_only_the_stream() -> None:
    """Bytes that are not a ShardMessage fail the grpclib decode (covered in tests/shard); on the
    session seam the transport raises StreamClosed and the session ends with it, so the agent
    reconnects -- never a crash of the operator."""

    class Broken:
        async def send(self, msg: Any) -> None:
            return None

        async def receive(self) -> Any:
            raise StreamClosed("grpc: INTERNAL: failed to decode ShardMessage")

        async def aclose(self) -> None:
            return None

    session = Session(Broken(), SessionConfig(cluster_id="c1"), _Source(),  # type: ignore[arg-type]
                      _Handlers())
    with pytest.raises(StreamClosed, match="decode"):
        await session.run()
    assert session.closing.is_set()
