"""Sans-IO queue rules: the two send queues (docs/wire.md#send-queues) and NodeStateUpdate
coalescing (docs/wire.md#the-session)."""

from __future__ import annotations

import betterproto
import pytest

from bigfleet_trio.operator.session.queues import (
    NODE_STATE_PENDING_CAP,
    OUTBOX_CAPACITY,
    KeyedCoalescer,
    Outbox,
    PendingRollupSlot,
    SendQueues,
)
from bigfleet_trio.proto import pb


def test_rollup_slot_keeps_only_newest() -> None:
    slot: PendingRollupSlot[str] = PendingRollupSlot()
    assert slot.take() is None
    assert slot.put("a") is False
    assert slot.put("b") is True
    assert slot.put("c") is True
    assert slot.replaced == 2
    assert bool(slot)
    assert slot.take() == "c"
    assert slot.take() is None
    assert not slot


def test_outbox_drops_newest_when_full() -> None:
    box: Outbox[int] = Outbox(3)
    assert [box.offer(i) for i in range(5)] == [True, True, True, False, False]
    assert box.dropped == 2
    assert len(box) == 3
    assert [box.pop(), box.pop(), box.pop(), box.pop()] == [0, 1, 2, None]
    assert box.offer(9) is True


def test_outbox_default_capacity_is_256() -> None:
    box: Outbox[int] = Outbox()
    assert OUTBOX_CAPACITY == 256
    for i in range(256):
        assert box.offer(i)
    assert box.offer(256) is False
    assert box.dropped == 1


def test_outbox_rejects_bad_capacity() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Outbox(0)


def _label(m: pb.OperatorMessage | None) -> str | None:
    if m is None:
        return None
    name, value = betterproto.which_one_of(m, "payload")
    return value.cluster_id if name == "rollup" else value.request_id


def _roll(n: int) -> pb.OperatorMessage:
    return pb.OperatorMessage(rollup=pb.ClusterCapacityNeeds(cluster_id=f"r{n}"))


def _resp(n: int) -> pb.OperatorMessage:
    return pb.OperatorMessage(bootstrap_response=pb.BootstrapBlobResponse(request_id=f"b{n}"))


def test_send_queues_alternate_between_sources() -> None:
    q = SendQueues()
    assert q.next_frame() is None and not q
    for i in range(3):
        q.outbox.offer(_resp(i))
    q.rollup.put(_roll(1))
    # Nothing sent yet: the roll-up first, then the outbox in FIFO order.
    order = [_label(q.next_frame()) for _ in range(5)]
    assert order == ["r1", "b0", "b1", "b2", None]


def test_send_queues_rollup_alone_and_after_outbox() -> None:
    q = SendQueues()
    q.rollup.put(_roll(1))
    q.rollup.put(_roll(2))
    assert _label(q.next_frame()) == "r2"
    assert q.next_frame() is None
    q.outbox.offer(_resp(0))
    q.rollup.put(_roll(3))
    # Last served was the roll-up, so the outbox goes first.
    assert [_label(q.next_frame()), _label(q.next_frame())] == ["b0", "r3"]


def test_coalescer_one_worker_per_key_and_latest_wins() -> None:
    c: KeyedCoalescer[str, int] = KeyedCoalescer()
    assert c.offer("m1", 1) is True  # m1 becomes ready: wake a worker
    assert c.in_flight("m1")
    assert c.claim() == "m1"
    assert c.claim() is None  # one owner per key
    assert c.take_next("m1") == 1  # worker takes frame 1 and "handles" it
    for v in range(2, 101):  # 99 frames arrive meanwhile
        assert c.offer("m1", v) is False
    assert c.coalesced == 98  # frames 2..99 overwritten by later ones
    assert c.claim() is None  # the owner is still there: m1 is not queued again
    assert c.take_next("m1") == 100  # worker's second round sees only the latest
    assert c.take_next("m1") is None  # drained: ownership released
    assert not c.in_flight("m1")
    assert c.offer("m1", 101) is True  # the next frame queues m1 again
    assert c.claim() == "m1"


def test_coalescer_frames_for_a_queued_key_coalesce_before_any_worker() -> None:
    # The fleet-scale burst: every key's frames arrive while it waits in the ready queue.
    c: KeyedCoalescer[str, str] = KeyedCoalescer()
    for wave in ("idle", "configuring", "configured"):
        for m in ("a", "b", "c"):
            assert c.offer(m, f"{m}-{wave}") is (wave == "idle")
    assert c.ready == 3 and c.pending == 3 and c.workers == 0
    assert c.coalesced == 6  # 9 frames, 3 kept
    got = []
    while (key := c.claim()) is not None:  # FIFO by first arrival
        while (item := c.take_next(key)) is not None:
            got.append(item)
    assert got == ["a-configured", "b-configured", "c-configured"]
    assert c.workers == 0 and c.pending == 0 and c.ready == 0


def test_coalescer_keys_are_independent() -> None:
    c: KeyedCoalescer[str, str] = KeyedCoalescer()
    assert c.offer("a", "a1") is True
    assert c.offer("b", "b1") is True
    assert c.claim() == "a"
    assert c.claim() == "b"
    assert c.offer("a", "a2") is False
    assert c.workers == 2 and c.pending == 2  # b1, and a2 (which replaced a1)
    assert c.take_next("b") == "b1"
    assert c.take_next("b") is None
    assert c.take_next("a") == "a2"
    assert c.workers == 1


def test_coalescer_full_at_max_pending_keys() -> None:
    c: KeyedCoalescer[str, int] = KeyedCoalescer(max_pending=2)
    c.offer("a", 1)
    assert not c.full
    c.offer("a", 2)  # same key: no more memory
    assert not c.full
    c.offer("b", 1)
    assert c.full and c.pending == 2
    key = c.claim()
    assert key == "a"
    assert c.full  # claimed but its frame is not taken yet
    assert c.take_next("a") == 2
    assert not c.full


def test_coalescer_default_cap_and_validation() -> None:
    assert KeyedCoalescer().max_pending == NODE_STATE_PENDING_CAP == 100_000
    with pytest.raises(ValueError):
        KeyedCoalescer(max_pending=0)


def test_coalescer_abandon_allows_restart() -> None:
    c: KeyedCoalescer[str, str] = KeyedCoalescer()
    c.offer("a", "x")
    assert c.claim() == "a"
    c.offer("a", "x2")
    c.abandon("a")
    assert not c.in_flight("a") and c.pending == 0 and c.workers == 0
    assert c.offer("a", "y") is True
    assert c.claim() == "a"


def test_coalescer_claim_skips_abandoned_queued_key() -> None:
    c: KeyedCoalescer[str, str] = KeyedCoalescer()
    c.offer("a", "x")
    c.offer("b", "y")
    c.abandon("a")  # never claimed: its ready entry is stale
    assert c.claim() == "b"
    assert c.claim() is None


def test_bootstrap_lane_keeps_answers_until_their_deadline() -> None:
    from bigfleet_trio.operator.session.queues import BootstrapLane

    lane: BootstrapLane[str] = BootstrapLane()
    for i in range(300):  # no count cap: a burst beyond the outbox's 256 is kept whole
        lane.offer(f"a{i}", deadline=10.0 + i)
    assert len(lane) == 300
    assert lane.pop(now=10.0) == "a0"  # exactly at the deadline: still on time
    assert lane.pop(now=15.5) == "a6"  # a1..a5 expired while waiting
    assert lane.expired == 5
    assert lane.pop(now=1000.0) is None and lane.expired == 298 and len(lane) == 0


def test_send_queues_serve_bootstrap_answers_first() -> None:
    q = SendQueues(outbox_capacity=4)
    ack = pb.OperatorMessage(reclaim_ack=pb.ReclaimAck(instruction_id="r"))
    boot = pb.OperatorMessage(bootstrap_response=pb.BootstrapBlobResponse(request_id="b"))
    q.outbox.offer(ack)
    q.rollup.put(pb.OperatorMessage(rollup=pb.ClusterCapacityNeeds()))
    q.bootstrap.offer(boot, deadline=10.0)
    assert q.next_frame(now=0.0) is boot
    assert betterproto.which_one_of(q.next_frame(now=0.0), "payload")[0] == "rollup"
    assert q.next_frame(now=0.0) is ack
    assert q.next_frame(now=0.0) is None and not q


def test_coalescer_retry_parks_the_failed_frame_with_per_key_backoff() -> None:
    c: KeyedCoalescer[str, str] = KeyedCoalescer(base_delay=0.5, max_delay=4.0)
    c.offer("m", "ready")
    assert c.claim() == "m" and c.take_next("m") == "ready"
    assert c.retry("m", "ready", now=10.0) == 0.5  # the write failed: parked, not lost
    assert c.release("m") is False  # parked frames wait for their moment
    assert c.is_parked("m") and c.pending == 1 and c.claim() is None
    assert c.next_deadline() == 10.5
    assert c.promote(10.4) == []
    assert c.promote(10.5) == ["m"]
    for n, delay in enumerate([1.0, 2.0, 4.0, 4.0]):  # doubling, capped; never given up
        assert c.claim() == "m" and c.take_next("m") == "ready"
        assert c.retry("m", "ready", now=float(n)) == delay
        c.release("m")
        assert c.promote(n + delay) == ["m"]
    assert c.failures("m") == 5 and c.retries == 5
    assert c.claim() == "m" and c.take_next("m") == "ready"
    c.forget("m")  # written: the backoff starts again
    c.release("m")
    assert c.failures("m") == 0 and not c.in_flight("m")


def test_coalescer_a_newer_frame_replaces_a_parked_one_and_goes_at_once() -> None:
    c: KeyedCoalescer[str, str] = KeyedCoalescer()
    c.offer("m", "launched")
    assert c.claim() == "m" and c.take_next("m") == "launched"
    c.retry("m", "launched", now=0.0)
    c.release("m")
    assert c.offer("m", "ready") is True  # a newer desired state: ready now, not at the moment
    assert not c.is_parked("m") and c.next_deadline() == float("inf")
    assert c.claim() == "m" and c.take_next("m") == "ready"
    assert c.promote(100.0) == []  # the stale parking is gone


def test_coalescer_retry_yields_to_a_newer_frame_that_came_while_writing() -> None:
    c: KeyedCoalescer[str, str] = KeyedCoalescer()
    c.offer("m", "launched")
    assert c.claim() == "m" and c.take_next("m") == "launched"
    assert c.offer("m", "ready") is False  # arrives while the failing write runs
    assert c.retry("m", "launched", now=0.0) is None  # the newer one replaces it
    assert c.release("m") is True  # and goes to the ready queue's tail
    assert c.claim() == "m" and c.take_next("m") == "ready"


def test_coalescer_release_requeues_behind_other_machines() -> None:
    # a machine whose frames keep coming holds a worker for one frame at a time
    c: KeyedCoalescer[str, int] = KeyedCoalescer()
    c.offer("busy", 1)
    c.offer("other", 1)
    assert c.claim() == "busy" and c.take_next("busy") == 1
    c.offer("busy", 2)
    assert c.release("busy") is True
    assert c.claim() == "other"  # the other machine goes first
    assert c.claim() == "busy"


def test_coalescer_abandon_forgets_a_parking() -> None:
    c: KeyedCoalescer[str, str] = KeyedCoalescer()
    c.offer("m", "x")
    assert c.claim() == "m" and c.take_next("m") == "x"
    c.retry("m", "x", now=0.0)
    c.abandon("m")
    assert not c.in_flight("m") and c.promote(100.0) == [] and c.failures("m") == 0
    with pytest.raises(ValueError):
        KeyedCoalescer(base_delay=0)
