"""Work queue: de-duplication, dirty re-queue, parking, per-key exponential backoff."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import trio
import trio.testing

from bigfleet_trio.kube.workqueue import (
    QueueCore,
    ShutDown,
    WorkQueue,
    backoff_delay,
    in_flight_seconds,
)


class Recorder:
    def __init__(self) -> None:
        self.adds = 0
        self.depths: list[int] = []
        self.retries = 0
        self.waits: list[float] = []
        self.works: list[float] = []
        self.probes: list[Callable[[], tuple[float, float]]] = []

    def added(self) -> None:
        self.adds += 1

    def depth(self, n: int) -> None:
        self.depths.append(n)

    def retried(self) -> None:
        self.retries += 1

    def waited(self, seconds: float) -> None:
        self.waits.append(seconds)

    def worked(self, seconds: float) -> None:
        self.works.append(seconds)

    def watch(self, in_flight: Callable[[], tuple[float, float]]) -> None:
        self.probes.append(in_flight)


# -- pure core --------------------------------------------------------------------------------


@pytest.mark.parametrize(("starts", "now", "expected"), [
    ([], 10.0, (0.0, 0.0)),  # nothing in flight
    ([10.0], 10.0, (0.0, 0.0)),  # just taken
    ([4.0], 10.0, (6.0, 6.0)),
    ([4.0, 7.0, 9.5], 10.0, (6.0 + 3.0 + 0.5, 6.0)),  # sum of all; the longest is the oldest
    ([7.0, 4.0], 10.0, (9.0, 6.0)),  # in any order
    ([12.0, 4.0], 10.0, (6.0, 6.0)),  # a start after now (another clock's) counts as 0
])
def test_in_flight_seconds_is_client_gos_unfinished_and_longest(
        starts: list[float], now: float, expected: tuple[float, float]) -> None:
    assert in_flight_seconds(starts, now) == pytest.approx(expected)


def test_core_hands_its_metrics_a_probe_of_work_in_progress_on_its_clock() -> None:
    now = [0.0]
    rec = Recorder()
    q: QueueCore[str] = QueueCore(metrics=rec, clock=lambda: now[0])
    (probe,) = rec.probes  # once, at construction
    assert probe() == (0.0, 0.0)
    for key in "abc":
        q.add(key, 0)
    assert probe() == (0.0, 0.0)  # queued is not in progress
    assert q.pop(1) == "a"
    assert q.pop(3) == "b"
    now[0] = 4.0
    assert probe() == pytest.approx((3.0 + 1.0, 3.0))
    q.done("a", 4)
    now[0] = 6.0
    assert probe() == pytest.approx((3.0, 3.0))
    q.add("b", 6)  # dirty while processing: still in progress
    assert probe() == pytest.approx((3.0, 3.0))
    q.done("b", 6)  # re-queued: waiting, not in progress
    assert probe() == (0.0, 0.0)
    assert q.pop(7) == "c"
    q.unpop("c", 7)  # given back unworked
    now[0] = 9.0
    assert probe() == (0.0, 0.0)


def test_core_without_a_clock_hands_no_probe() -> None:
    rec = Recorder()
    QueueCore(metrics=rec)
    assert rec.probes == []


def test_add_deduplicates_and_keeps_fifo_order() -> None:
    q: QueueCore[str] = QueueCore()
    assert q.add("a", 0) is True
    assert q.add("b", 0) is True
    assert q.add("a", 0) is False
    assert len(q) == 2
    assert q.pop(0) == "a"
    assert q.pop(0) == "b"
    assert q.pop(0) is None


def test_key_added_while_processing_is_requeued_once_on_done() -> None:
    q: QueueCore[str] = QueueCore()
    q.add("a", 0)
    assert q.pop(0) == "a"
    assert q.add("a", 1) is False  # processing: only marked dirty
    assert q.add("a", 2) is False
    assert len(q) == 0
    assert q.is_queued("a")
    assert q.done("a", 3) is True
    assert len(q) == 1
    assert q.pop(3) == "a"
    assert q.done("a", 4) is False
    assert len(q) == 0


def test_processing_key_is_not_handed_to_a_second_worker() -> None:
    q: QueueCore[str] = QueueCore()
    q.add("a", 0)
    q.add("b", 0)
    assert q.pop(0) == "a"
    q.add("a", 0)
    assert q.pop(0) == "b"
    assert q.pop(0) is None  # "a" waits for done
    q.done("a", 0)
    assert q.pop(0) == "a"


def test_backoff_delay_doubles_from_base_and_caps() -> None:
    assert backoff_delay(0, 0.005, 300) == 0.005
    assert backoff_delay(1, 0.005, 300) == 0.01
    assert backoff_delay(3, 0.005, 300) == 0.04
    # 0.005 * 2**16 = 327.68 > 300
    assert backoff_delay(16, 0.005, 300) == 300
    assert backoff_delay(10_000, 0.005, 300) == 300
    assert backoff_delay(-1, 0.005, 300) == 0.005


def test_rate_limited_parks_with_growing_delay_and_forget_resets() -> None:
    rec = Recorder()
    q: QueueCore[str] = QueueCore(base_delay=1.0, max_delay=5.0, metrics=rec)
    assert q.add_rate_limited("a", 10.0) == 1.0
    assert q.num_requeues("a") == 1
    assert q.is_parked("a") and len(q) == 0
    assert q.next_deadline() == 11.0
    assert q.pop(10.999) is None
    assert q.pop(11.0) == "a"
    q.done("a", 11.0)
    assert q.add_rate_limited("a", 20.0) == 2.0
    assert q.add_rate_limited("b", 20.0) == 1.0
    assert q.next_deadline() == 21.0
    assert q.pop(21.0) == "b"
    assert q.pop(21.0) is None
    assert q.pop(22.0) == "a"
    q.done("a", 22.0)
    assert q.add_rate_limited("a", 30.0) == 4.0
    assert q.add_rate_limited("a", 30.0) == 5.0  # capped (8 > 5); earlier parking (34) kept
    assert q.next_deadline() == 34.0
    q.forget("a")
    assert q.num_requeues("a") == 0
    assert rec.retries == 5


def test_parking_keeps_the_earlier_moment_and_skips_stale_entries() -> None:
    q: QueueCore[str] = QueueCore()
    q.add_at("a", 10.0, 0.0)
    q.add_at("a", 5.0, 0.0)  # earlier wins
    q.add_at("a", 20.0, 0.0)  # later ignored
    assert q.parked == 1
    assert q.next_deadline() == 5.0
    assert q.pop(5.0) == "a"
    q.done("a", 5.0)
    assert q.pop(10.0) is None  # the stale 10.0 heap entry does not re-add it
    assert q.next_deadline() == math.inf


def test_parked_key_already_queued_is_not_duplicated() -> None:
    q: QueueCore[str] = QueueCore()
    q.add("a", 0)
    q.add_at("a", 1.0, 0)
    assert q.promote(1.0) == 0
    assert len(q) == 1


def test_add_at_in_the_past_is_an_add() -> None:
    q: QueueCore[str] = QueueCore()
    assert q.add_at("a", 1.0, 2.0) is True
    assert q.pop(2.0) == "a"


def test_metrics_record_adds_depth_wait_and_work() -> None:
    rec = Recorder()
    q: QueueCore[str] = QueueCore(metrics=rec)
    q.add("a", 1.0)
    q.add("a", 1.5)  # de-duplicated: not counted
    q.add("b", 2.0)
    assert q.pop(4.0) == "a"
    q.done("a", 4.5)
    assert rec.adds == 2
    assert rec.depths == [1, 2, 1]
    assert rec.waits == [3.0]
    assert rec.works == [0.5]


def test_bad_backoff_is_rejected() -> None:
    with pytest.raises(ValueError):
        QueueCore(base_delay=0)
    with pytest.raises(ValueError):
        QueueCore(base_delay=2, max_delay=1)


def test_shut_down_refuses_adds() -> None:
    q: QueueCore[str] = QueueCore()
    q.shutting_down = True
    assert q.add("a", 0) is False
    assert len(q) == 0


# -- trio -------------------------------------------------------------------------------------


async def test_get_blocks_until_add(autojump_clock: trio.testing.MockClock) -> None:
    q: WorkQueue[str] = WorkQueue()
    got: list[tuple[str, float]] = []

    async def worker() -> None:
        key = await q.get()
        got.append((key, trio.current_time()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker)
        await trio.sleep(3)
        q.add("x")
    assert got == [("x", 3.0)]


async def test_get_wakes_for_parked_key_at_its_moment(
    autojump_clock: trio.testing.MockClock,
) -> None:
    q: WorkQueue[str] = WorkQueue(base_delay=0.5, max_delay=10)
    seen: list[tuple[str, float]] = []

    async def worker() -> None:
        for _ in range(3):
            key = await q.get()
            seen.append((key, trio.current_time()))
            q.done(key)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker)
        await trio.sleep(1)
        q.add_after("late", 10)  # the waiter is parked with no deadline; must recompute
        q.add_after("early", 2)
        q.add_rate_limited("retry")  # 0.5 s
    assert seen == [("retry", 1.5), ("early", 3.0), ("late", 11.0)]


async def test_workers_never_share_a_key_and_no_add_is_lost(
    autojump_clock: trio.testing.MockClock,
) -> None:
    q: WorkQueue[str] = WorkQueue()
    active: set[str] = set()
    runs: dict[str, int] = {"a": 0, "b": 0}

    async def worker() -> None:
        while True:
            try:
                key = await q.get()
            except ShutDown:
                return
            assert key not in active
            active.add(key)
            runs[key] += 1
            await trio.sleep(1)
            active.discard(key)
            q.done(key)

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(worker)
        q.add("a")
        q.add("b")
        await trio.sleep(0.5)
        q.add("a")  # while "a" is processing: exactly one more run later
        q.add("a")
        await trio.sleep(5)
        q.shut_down()
    assert runs == {"a": 2, "b": 1}


async def test_failures_back_off_exponentially_until_success(
    autojump_clock: trio.testing.MockClock,
) -> None:
    q: WorkQueue[str] = WorkQueue(base_delay=1.0, max_delay=100)
    attempts: list[float] = []

    async def worker() -> None:
        while True:
            key = await q.get()
            attempts.append(trio.current_time())
            try:
                if len(attempts) < 4:
                    q.add_rate_limited(key)
                else:
                    q.forget(key)
                    return
            finally:
                q.done(key)

    q.add("k")
    await worker()
    assert attempts == [0.0, 1.0, 3.0, 7.0]
    assert q.num_requeues("k") == 0


async def test_shut_down_wakes_waiters() -> None:
    q: WorkQueue[str] = WorkQueue()

    async def waiter() -> None:
        with pytest.raises(ShutDown):
            await q.get()

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            q.shut_down()


def test_low_priority_keys_wait_for_normal_ones() -> None:
    q: QueueCore[str] = QueueCore()
    q.add("s1", 0, low=True)
    q.add("a", 1)
    q.add("s2", 2, low=True)
    q.add("b", 3)
    q.add("s2", 4, low=True)  # already queued (low): de-duplicated, keeps its place
    assert len(q) == 4
    assert [q.pop(5) for _ in range(4)] == ["a", "b", "s1", "s2"]
    assert q.pop(5) is None


def test_a_normal_add_moves_a_low_key_up_once() -> None:
    """A key waiting behind every normal key (a co-location group's re-reconcile) that gets a
    change of its own joins the normal queue's tail, and is handed out once."""
    q: QueueCore[str] = QueueCore()
    q.add("g1", 0, low=True)
    q.add("g2", 0, low=True)
    q.add("a", 1)
    assert q.add("g2", 2) is False  # ready already: no new key for the workers
    assert len(q) == 3
    assert [q.pop(3) for _ in range(3)] == ["a", "g2", "g1"]
    assert q.pop(3) is None and len(q) == 0
    for key in ("a", "g2", "g1"):
        assert q.done(key, 3) is False
    # taken from the normal queue, then added low again: once, in the low queue's order
    q.add("g3", 4, low=True)
    q.add("g2", 4, low=True)
    assert [q.pop(5), q.pop(5), q.pop(5)] == ["g3", "g2", None]


class _Ticks:
    """A clock that moves 1 ms each time it is read: one reconcile per read of it."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.001
        return self.t


async def test_a_backlog_taken_without_waiting_still_yields_to_the_loop() -> None:
    """A worker whose reconciles need no I/O (a cache in sync: 50,000 Pods at start-up) takes
    key after key without ever waiting: ``get`` yields once GET_HOLD seconds passed anyway, so
    the rest of the process (Lease renewals, probes) runs meanwhile
    (docs/kube-api.md#relist-apply). Before: a 50,000-key backlog held the loop for 2.1 s."""
    n = 1000
    q: WorkQueue[int] = WorkQueue()
    q.held_clock = _Ticks()
    for i in range(n):
        q.add(i)
    others = 0

    async def other_task() -> None:
        nonlocal others
        while True:
            await trio.lowlevel.checkpoint()
            others += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_task)
        before = others
        for _ in range(n):
            await q.get()  # a reconcile with no await: nothing else yields
        ran = others - before
        nursery.cancel_scope.cancel()
    # one yield per GET_HOLD (10 ms: every 10 keys here), about one turn of the other task each
    # (Trio's scheduler order is randomised, so not exactly); before: 0
    assert ran >= 50, ran


async def test_many_workers_give_the_loop_back_within_the_hold_budget() -> None:
    """16 workers with reconciles that never wait: the loop turns (its timers and I/O) again
    after GET_HOLD plus a key or two per worker, not after each worker's own quota (the counted
    rule, 64 keys a worker)."""
    q: WorkQueue[int] = WorkQueue()
    ticks = _Ticks()
    q.held_clock = ticks
    for i in range(5000):
        q.add(i)
    taken = 0
    worst = 0
    drained = trio.Event()

    async def worker() -> None:
        nonlocal taken
        while True:
            await q.get()
            taken += 1
            if taken == 5000:
                drained.set()

    async def turns() -> None:
        # Trio runs the ready tasks in batches and looks at its timers and I/O between two
        # batches; a task that only yields runs once a batch, so it counts the keys per batch.
        nonlocal worst
        while True:
            before = taken
            await trio.lowlevel.checkpoint()
            worst = max(worst, taken - before)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(turns)
        for _ in range(16):
            nursery.start_soon(worker)
        await drained.wait()
        nursery.cancel_scope.cancel()
    # a batch: GET_HOLD (10 ms: 10 keys here) for the first worker back, then up to two keys
    # for each other worker (the one it held while it yielded, one more); ``turns`` sits at a
    # random place in each batch, so one count can span parts of two. Before: 1,728.
    assert worst <= 2 * (10 + 2 * 16), worst


def test_a_drained_queue_gives_its_burst_sized_tables_back() -> None:
    """A burst of 20,000 keys grows the queue's dicts, and a dict never shrinks as keys leave:
    once the queue is empty they are rebuilt (the pod controller kept 10 MiB after a churn of
    50,000 Pods)."""
    import sys

    q: QueueCore[int] = QueueCore()
    for i in range(20_000):
        q.add(i, 0.0)
        q.add_at(100_000 + i, 5.0, 0.0)
    small = sys.getsizeof({})
    while (key := q.pop(10.0)) is not None:
        q.done(key, 10.0)
    assert len(q) == 0
    assert sys.getsizeof(q._dirty) == small
    assert sys.getsizeof(q._processing) == small
    assert sys.getsizeof(q._parked._when) == small
    assert q._parked._heap == []


async def test_a_get_cancelled_at_its_yield_hands_the_key_out_again() -> None:
    """A worker cancelled while ``get`` yields (GET_HOLD passed) after taking a key never calls
    ``done``: the key goes back to the head of the ready queue, not processing, so the next
    ``get`` takes it (the pod controller cancels its workers when it loses its Lease and
    campaigns again in the same process). Before: the key stayed processing, and every later
    add only marked it dirty."""
    q: WorkQueue[str] = WorkQueue()
    ticks = _Ticks()
    q.held_clock = ticks
    q.add("first")
    q.add("held")
    q.add("later")
    assert await q.get() == "first"  # starts the hold: the loop turned just now
    q.done("first")
    ticks.t += 1.0  # well past GET_HOLD: the next get yields after taking its key
    with trio.CancelScope() as scope:
        scope.cancel()  # the yield raises Cancelled
        await q.get()
    assert scope.cancelled_caught
    assert q.processing == 0
    assert q.is_queued("held")
    assert len(q) == 2
    assert await q.get() == "held"
    q.done("held")
    q.add("held")  # a later add queues it again (it is not stuck processing)
    assert await q.get() == "later"
    q.done("later")
    assert await q.get() == "held"
