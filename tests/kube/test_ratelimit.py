"""Token bucket bookkeeping (the client's ``qps``/``burst``)."""

import pytest

from bigfleet_trio.kube.ratelimit import TokenBucket


def test_burst_then_rate() -> None:
    b = TokenBucket(qps=2, burst=3, now=0.0)
    assert [b.reserve(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.reserve(0.0) == pytest.approx(0.5)
    assert b.reserve(0.0) == pytest.approx(1.0)  # queued behind the previous reservation
    # 10 s later the bucket is full again (capped at burst), reservations repaid.
    assert b.reserve(10.0) == 0.0
    assert b.tokens == pytest.approx(2.0)


def test_disabled() -> None:
    b = TokenBucket(qps=0, burst=0)
    assert all(b.reserve(0.0) == 0.0 for _ in range(1000))


def test_bad_burst() -> None:
    with pytest.raises(ValueError):
        TokenBucket(qps=1, burst=0)


async def test_acquire_returns_what_the_hold_and_the_bucket_imposed(autojump_clock: object) -> None:
    import trio

    from bigfleet_trio.kube.ratelimit import AsyncRateLimiter

    lim = AsyncRateLimiter(qps=2, burst=1)
    assert await lim.acquire() == 0.0  # the banked token
    assert await lim.acquire() == pytest.approx(0.5)  # the bucket's wait
    lim.hold_until(trio.current_time() + 3)
    assert await lim.acquire() == pytest.approx(3.0)  # the hold; the bucket refilled meanwhile
