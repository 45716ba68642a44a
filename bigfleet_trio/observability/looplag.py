"""Event-loop lag: how late a task that asked to sleep is woken, as a metric and a log line.

One Trio loop runs every task of a binary, so a long synchronous stretch (a huge relist being
applied, a from-scratch roll-up, CPU starvation on a shared node) delays everything at once:
a BootstrapRequest answered after the shard's 10 s deadline, a keepalive missed. This task
makes such stalls visible: ``bigfleet_event_loop_lag_seconds`` (shared by both binaries), a
WARNING when one is long that says whether the loop was busy or waiting, and a WARNING from a
watchdog thread, while the loop is still held, with the loop thread's stack
(docs/operate.md#bigfleeteventlooplag). Each binary's process nursery runs it.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

import trio
from prometheus_client import Histogram

from bigfleet_trio.observability.metrics import exponential_buckets

log = logging.getLogger(__name__)

LOOP_LAG = Histogram(
    "bigfleet_event_loop_lag_seconds",
    "How late the event loop woke a task sleeping for a fixed interval (seconds).",
    buckets=exponential_buckets(0.001, 2, 16),  # 1 ms .. ~33 s
)

#: Default sampling interval, in seconds.
DEFAULT_INTERVAL = 0.5
#: Default lag, in seconds, from which a WARNING is logged.
DEFAULT_WARN_AFTER = 1.0
#: Innermost frames of the loop thread's stack a watchdog report keeps.
STACK_FRAMES = 20


def stall_cause(lag: float, window: float, loop_cpu: float) -> str:
    """Why the loop was late, from the CPU its thread used over the sampled window.

    Args:
        lag: seconds the wake-up was late.
        window: seconds the sample took in all (the interval slept plus ``lag``).
        loop_cpu: CPU seconds the loop's thread used over ``window``.

    Returns:
        A clause for the WARNING. A thread that ran for at least half the window was busy with
        synchronous work on the loop (the watchdog's stack says which); one that ran less was
        not given the CPU (starvation: a CPU limit, a crowded node) or sat in a blocking call
        (a full log pipe, a synchronous file read).
    """
    if loop_cpu >= 0.5 * window:
        return (f"the loop's thread ran {loop_cpu:.1f}s of CPU in {window:.1f}s: synchronous "
                "work on the loop")
    return (f"the loop's thread ran {loop_cpu:.1f}s of CPU in {window:.1f}s: the process "
            "waited (CPU starvation or a blocking call)")


class StallWatch:
    """A watchdog for the loop thread: reports its stack once per stall, while the stall lasts.

    The loop task calls :meth:`beat` on every wake-up; a plain thread calls :meth:`check` every
    ``period`` seconds. A stall the loop task only measures after it ended says how long it
    was, not where the loop was; this says where. It reads the stack of a running thread
    (``sys._current_frames``), which costs nothing while the loop is on time.

    Args:
        held_after: seconds since the last beat from which a stall is reported (> 0).
        loop_thread: ``threading.get_ident()`` of the loop's thread.
        now: a monotonic clock in seconds (the thread's; tests pass their own).
        frames: the running threads' current frames (tests pass their own).
    """

    def __init__(
        self,
        held_after: float,
        loop_thread: int,
        *,
        now: Callable[[], float] = time.monotonic,
        frames: Callable[[], dict[int, FrameType]] = sys._current_frames,
    ) -> None:
        self.held_after = held_after
        self.loop_thread = loop_thread
        self._now = now
        self._frames = frames
        self._beat = now()
        self._reported: float | None = None
        self.reports = 0

    def beat(self) -> None:
        """The loop is turning (called on the loop's thread)."""
        self._beat = self._now()

    def check(self) -> str | None:
        """A report if the loop has been held ``held_after`` seconds and this stall has none yet.

        Returns:
            The WARNING's text with the innermost :data:`STACK_FRAMES` frames of the loop
            thread's stack, or None.
        """
        beat = self._beat
        held = self._now() - beat
        if held < self.held_after or self._reported == beat:
            return None
        self._reported = beat
        self.reports += 1
        frame = self._frames().get(self.loop_thread)
        stack = (
            "".join(traceback.format_list(traceback.extract_stack(frame)[-STACK_FRAMES:]))
            if frame is not None
            else "  (the loop's thread has no frame)\n"
        )
        return f"event loop held for {held:.1f}s so far; the loop's thread is at:\n{stack}"

    def run(self, stop: threading.Event, period: float) -> None:
        """Check every ``period`` seconds until ``stop`` is set (runs on its own thread)."""
        while not stop.wait(period):
            report = self.check()
            if report is not None:
                log.warning(report.rstrip("\n"))


async def watch_loop_lag(
    *,
    interval: float = DEFAULT_INTERVAL,
    warn_after: float = DEFAULT_WARN_AFTER,
    watchdog: bool = True,
    loop_cpu: Callable[[], float] = time.thread_time,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Sleep ``interval`` seconds in a loop and record how late each wake-up was.

    With ``watchdog``, a :class:`StallWatch` thread (its own one-thread limiter, so it never
    takes a slot of ``trio.to_thread``'s default) reports the loop thread's stack while a stall
    lasts; it stops when this task is cancelled, within ``interval / 2`` seconds.

    Args:
        interval: seconds between samples (> 0).
        warn_after: lag in seconds from which one WARNING per stall is logged (> 0).
        watchdog: run the watchdog thread.
        loop_cpu: CPU seconds used by the calling thread so far (tests pass their own).

    Raises:
        ValueError: a non-positive ``interval`` or ``warn_after``.
    """
    if not interval > 0 or not warn_after > 0:
        raise ValueError(f"interval and warn_after must be > 0, got {interval}, {warn_after}")
    # a beat is one interval old when on time: a stall of warn_after is interval + warn_after
    watch = StallWatch(interval + warn_after, threading.get_ident())
    stop = threading.Event()
    async with trio.open_nursery() as nursery:
        if watchdog:
            nursery.start_soon(_run_watchdog, watch, stop, interval / 2)
        task_status.started()
        try:
            while True:
                t0, cpu0 = trio.current_time(), loop_cpu()
                await trio.sleep(interval)
                watch.beat()
                lag = max(0.0, trio.current_time() - t0 - interval)
                LOOP_LAG.observe(lag)
                if lag >= warn_after:
                    cause = stall_cause(lag, interval + lag, loop_cpu() - cpu0)
                    log.warning(
                        "event loop stalled for %.1fs (every task waited; %s)",
                        lag,
                        cause,
                        extra={"lag_s": round(lag, 3)},
                    )
        finally:
            stop.set()  # before the nursery waits for the thread
    raise AssertionError("unreachable: the loop above only ends by an exception")


async def _run_watchdog(watch: StallWatch, stop: threading.Event, period: float) -> None:
    await trio.to_thread.run_sync(watch.run, stop, period, limiter=trio.CapacityLimiter(1))
