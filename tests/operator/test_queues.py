"""Sans-IO queue rules (seed 000 "Two send queues, two drop policies"; "NodeStateUpdate
coalescing")."""

from __future__ import annotations

import betterproto
import pytest

from bigfleet_trio.operator.queues import (
    OUTBOX_CAPACITY,
    NodeStateCoalescer,
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
    c: NodeStateCoalescer[str, int] = NodeStateCoalescer()
    assert c.offer("m1", 1) is True  # start a worker
    assert c.in_flight("m1")
    assert c.take_next("m1") == 1  # worker takes frame 1 and "handles" it
    for v in range(2, 101):  # 99 frames arrive meanwhile
        assert c.offer("m1", v) is False
    assert c.coalesced == 98  # frames 2..99 overwritten by later ones
    assert c.take_next("m1") == 100  # worker's second round sees only the latest
    assert c.take_next("m1") is None  # drained: flag cleared
    assert not c.in_flight("m1")
    assert c.offer("m1", 101) is True  # next frame starts a new worker


def test_coalescer_keys_are_independent() -> None:
    c: NodeStateCoalescer[str, str] = NodeStateCoalescer()
    assert c.offer("a", "a1") is True
    assert c.offer("b", "b1") is True
    assert c.offer("a", "a2") is False
    assert c.workers == 2 and c.pending == 2
    assert c.take_next("b") == "b1"
    assert c.take_next("b") is None
    assert c.take_next("a") == "a2"
    assert c.workers == 1


def test_coalescer_abandon_allows_restart() -> None:
    c: NodeStateCoalescer[str, str] = NodeStateCoalescer()
    c.offer("a", "x")
    c.abandon("a")
    assert not c.in_flight("a") and c.pending == 0
    assert c.offer("a", "y") is True
