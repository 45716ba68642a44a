"""Event-loop lag: how late a task that asked to sleep is woken, as a metric and a log line.

One Trio loop runs every task of a binary, so a long synchronous stretch (a huge relist being
applied, a from-scratch roll-up, CPU starvation on a shared node) delays everything at once:
a BootstrapRequest answered after the shard's 10 s deadline, a keepalive missed. This task
makes such stalls visible: ``bigfleet_event_loop_lag_seconds`` (shared by both binaries) and a
WARNING when one is long. Each binary's process nursery runs it.
"""

from __future__ import annotations

import logging
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


async def watch_loop_lag(
    *,
    interval: float = DEFAULT_INTERVAL,
    warn_after: float = DEFAULT_WARN_AFTER,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Sleep ``interval`` seconds in a loop and record how late each wake-up was.

    Args:
        interval: seconds between samples (> 0).
        warn_after: lag in seconds from which one WARNING per stall is logged (> 0).

    Raises:
        ValueError: a non-positive ``interval`` or ``warn_after``.
    """
    if not interval > 0 or not warn_after > 0:
        raise ValueError(f"interval and warn_after must be > 0, got {interval}, {warn_after}")
    task_status.started()
    while True:
        t0 = trio.current_time()
        await trio.sleep(interval)
        lag = max(0.0, trio.current_time() - t0 - interval)
        LOOP_LAG.observe(lag)
        if lag >= warn_after:
            log.warning(
                "event loop stalled for %.1fs (every task waited; CPU-bound work or "
                "CPU starvation)",
                lag,
                extra={"lag_s": round(lag, 3)},
            )
