"""CauseLimiter: one line per cause per interval, counting what it held back."""

from __future__ import annotations

from bigfleet_trio.observability.ratelog import CauseLimiter


def test_first_then_one_per_interval_with_the_count_held_back() -> None:
    now = [0.0]
    lim = CauseLimiter(30.0, clock=lambda: now[0])
    assert lim.admit("a") == 0
    assert [lim.admit("a") for _ in range(5)] == [None] * 5
    assert lim.admit("b") == 0  # another cause has its own line
    now[0] = 30.0
    assert lim.admit("a") == 5
    assert lim.admit("a") is None
    lim.clear("a")
    assert lim.admit("a") == 0


def test_causes_are_bounded_oldest_first() -> None:
    lim = CauseLimiter(30.0, max_causes=2, clock=lambda: 0.0)
    for c in ("a", "b", "c"):
        assert lim.admit(c) == 0
    assert lim.admit("a") == 0  # forgotten: logs again
    assert lim.admit("c") is None
