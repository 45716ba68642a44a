"""Event-loop lag (bigfleet_trio.observability.looplag): a stall is measured and logged."""

from __future__ import annotations

import logging

import pytest
import trio
from prometheus_client import REGISTRY

from bigfleet_trio.observability.looplag import watch_loop_lag


def samples() -> tuple[float, float]:
    count = REGISTRY.get_sample_value("bigfleet_event_loop_lag_seconds_count") or 0.0
    total = REGISTRY.get_sample_value("bigfleet_event_loop_lag_seconds_sum") or 0.0
    return count, total


async def test_a_blocked_loop_is_measured_and_logged(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    clock = autojump_clock
    assert isinstance(clock, trio.testing.MockClock)
    count0, total0 = samples()
    with caplog.at_level(logging.WARNING, logger="bigfleet_trio.observability.looplag"):
        async with trio.open_nursery() as n:
            await n.start(watch_loop_lag)
            await trio.sleep(2)  # four on-time samples
            # A 3 s synchronous stretch: the clock moves while no task gets a turn; the watcher,
            # due at 2.5 s, wakes at 5.25 s.
            await trio.sleep(0.25)
            clock.jump(3.0)
            await trio.sleep(1)
            n.cancel_scope.cancel()
    count, total = samples()
    assert count - count0 >= 5
    assert total - total0 == pytest.approx(3.0 - 0.25, abs=1e-6)
    stalls = [r.getMessage() for r in caplog.records]
    assert stalls == [
        "event loop stalled for 2.8s (every task waited; CPU-bound work or CPU starvation)"
    ]


async def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        await watch_loop_lag(interval=0)
