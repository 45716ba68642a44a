"""Event-loop lag (bigfleet_trio.observability.looplag): a stall is measured and logged, with
whether the loop was busy, and the watchdog says where the loop's thread is while it is held."""

from __future__ import annotations

import logging
import os
import sys
import threading
from types import FrameType

import pytest
import trio
from prometheus_client import REGISTRY

from bigfleet_trio.observability.looplag import StallWatch, stall_cause, watch_loop_lag


def samples() -> tuple[float, float]:
    count = REGISTRY.get_sample_value("bigfleet_event_loop_lag_seconds_count") or 0.0
    total = REGISTRY.get_sample_value("bigfleet_event_loop_lag_seconds_sum") or 0.0
    return count, total


async def test_a_blocked_loop_is_measured_and_logged_with_its_cause(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    clock = autojump_clock
    assert isinstance(clock, trio.testing.MockClock)
    cpu = [0.0]
    count0, total0 = samples()
    with caplog.at_level(logging.WARNING, logger="bigfleet_trio.observability.looplag"):
        async with trio.open_nursery() as n:
            await n.start(lambda task_status: watch_loop_lag(
                watchdog=False, loop_cpu=lambda: cpu[0], task_status=task_status))
            await trio.sleep(2)  # four on-time samples
            # A 3 s synchronous stretch: the clock moves while no task gets a turn; the watcher,
            # due at 2.5 s, wakes at 5.25 s. The loop's thread ran for 2.9 s of it.
            await trio.sleep(0.25)
            clock.jump(3.0)
            cpu[0] += 2.9
            await trio.sleep(1)
            # A 2 s stretch the process spent off the CPU.
            await trio.sleep(0.25)
            clock.jump(2.0)
            cpu[0] += 0.1
            await trio.sleep(1)
            n.cancel_scope.cancel()
    count, total = samples()
    assert count - count0 >= 7
    assert total - total0 == pytest.approx(3.0 - 0.25 + 2.0 - 0.25, abs=1e-6)
    assert [r.getMessage() for r in caplog.records] == [
        "event loop stalled for 2.8s (every task waited; the loop's thread ran 2.9s of CPU in "
        "3.2s: synchronous work on the loop)",
        "event loop stalled for 1.8s (every task waited; the loop's thread ran 0.1s of CPU in "
        "2.2s: the process waited (CPU starvation or a blocking call))",
    ]


@pytest.mark.parametrize(
    ("cpu", "busy"), [(0.0, False), (0.99, False), (1.0, True), (2.0, True)]
)
def test_a_stall_is_synchronous_work_from_half_the_window_on_cpu(cpu: float, busy: bool) -> None:
    assert ("synchronous work" in stall_cause(1.5, 2.0, cpu)) is busy
    assert ("the process waited" in stall_cause(1.5, 2.0, cpu)) is not busy


def _held_here(event: threading.Event) -> None:
    event.wait()


def test_the_watchdog_reports_the_loop_threads_stack_once_per_stall() -> None:
    now = [100.0]
    held = threading.Event()
    loop = threading.Thread(target=_held_here, args=(held,))
    loop.start()
    try:
        assert loop.ident is not None
        watch = StallWatch(1.0, loop.ident, now=lambda: now[0])
        now[0] += 0.9
        assert watch.check() is None  # not held long enough
        now[0] += 0.2
        report = watch.check()
        assert report is not None
        assert report.startswith("event loop held for 1.1s so far; the loop's thread is at:\n")
        assert "_held_here" in report and "event.wait()" in report
        now[0] += 5.0
        assert watch.check() is None  # the same stall is reported once
        watch.beat()
        assert watch.check() is None
        now[0] += 1.5
        assert watch.check() is not None  # a new stall is reported again
        assert watch.reports == 2
    finally:
        held.set()
        loop.join()


def test_a_report_keeps_the_innermost_frames_and_survives_a_missing_thread() -> None:
    def deep(n: int) -> dict[int, FrameType]:
        return deep(n - 1) if n else {1: sys._getframe()}

    now = [0.0]
    watch = StallWatch(1.0, 1, now=lambda: now[0], frames=lambda: deep(50))
    now[0] = 2.0
    report = watch.check()
    assert report is not None
    # STACK_FRAMES (20) innermost frames: three printed, the rest folded as repeats
    assert report.count("in deep") == 3
    assert "[Previous line repeated 17 more times]" in report
    gone = StallWatch(1.0, 2, now=lambda: now[0], frames=dict)
    now[0] = 4.0
    assert gone.check() == (
        "event loop held for 2.0s so far; the loop's thread is at:\n"
        "  (the loop's thread has no frame)\n"
    )


def _innermost_run_frames() -> list[FrameType]:
    found = []
    for frame in sys._current_frames().values():
        f: FrameType | None = frame
        while f is not None:
            if f.f_code is StallWatch.run.__code__:
                found.append(f)
            f = f.f_back
    return found


async def test_the_watchdog_thread_ends_with_its_task(autojump_clock: trio.abc.Clock) -> None:
    assert not _innermost_run_frames()
    async with trio.open_nursery() as n:
        await n.start(watch_loop_lag)
        # the watchdog is a real thread: give it real moments to start (bounded, not timed)
        for _ in range(2000):
            if _innermost_run_frames():
                break
            await trio.to_thread.run_sync(os.sched_yield)
        assert len(_innermost_run_frames()) == 1  # the watchdog's thread runs
        n.cancel_scope.cancel()
    assert not _innermost_run_frames()  # and is gone with its task


async def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        await watch_loop_lag(interval=0)


async def test_the_watchdog_reports_only_a_wake_up_late_by_warn_after(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The loop task beats once per interval, so a beat is interval + lag old when it is late:
    # in the 5,000-machine soak a watchdog at warn_after alone reported 0.5 s lags as stalls.
    from bigfleet_trio.observability import looplag

    made: list[float] = []

    class Recorded(StallWatch):
        def __init__(self, held_after: float, loop_thread: int, **kw: object) -> None:
            made.append(held_after)
            super().__init__(held_after, loop_thread)

    monkeypatch.setattr(looplag, "StallWatch", Recorded)
    async with trio.open_nursery() as n:
        await n.start(lambda task_status: watch_loop_lag(
            interval=0.5, warn_after=1.0, watchdog=False, task_status=task_status))
        n.cancel_scope.cancel()
    assert made == [1.5]
