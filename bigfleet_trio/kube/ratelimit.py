"""Client-side token-bucket rate limiter on the Trio clock (client-go ``rest`` QPS/burst).

Pure bookkeeping lives in :class:`TokenBucket` (``reserve(now)`` returns how long to wait);
:class:`AsyncRateLimiter` adds the Trio wait and the client-wide hold after a 429
(docs/kube-api.md#retries).
"""

from __future__ import annotations

import math

import trio

__all__ = ["TokenBucket", "AsyncRateLimiter"]


class TokenBucket:
    """Token bucket: ``qps`` tokens per second, at most ``burst`` banked; starts full.

    ``qps <= 0`` disables limiting (every reservation is free).
    """

    def __init__(self, qps: float, burst: int, now: float = 0.0):
        if burst < 1 and qps > 0:
            raise ValueError("burst must be >= 1")
        self.qps = float(qps)
        self.burst = float(burst)
        self._tokens = float(burst)
        self._last = now

    def reserve(self, now: float) -> float:
        """Take one token (possibly going negative = a reservation in the future).

        Returns:
            Seconds the caller must wait before acting (0.0 if a token was available).
        """
        if self.qps <= 0:
            return 0.0
        elapsed = max(0.0, now - self._last)
        self._last = max(self._last, now)
        self._tokens = min(self.burst, self._tokens + elapsed * self.qps)
        self._tokens -= 1.0
        if self._tokens >= 0:
            return 0.0
        return -self._tokens / self.qps

    @property
    def tokens(self) -> float:
        """Tokens currently banked (negative when reservations are outstanding)."""
        return self._tokens


class AsyncRateLimiter:
    """Trio wrapper: ``await limiter.acquire()`` before each request.

    Besides the bucket it keeps a *hold*: :meth:`hold_until` stops every acquisition until a
    Trio time (the apiserver's ``Retry-After`` on a 429), whether the bucket is on or not.
    """

    def __init__(self, qps: float = 50.0, burst: int = 100):
        # Starts full: the first reservation refills from -inf, capped at burst.
        self._bucket = TokenBucket(qps, burst, now=-math.inf)
        self._hold = -math.inf

    def hold_until(self, deadline: float) -> None:
        """No acquisition completes before ``deadline`` (Trio time); a later hold extends it."""
        self._hold = max(self._hold, deadline)

    @property
    def held_until(self) -> float:
        """The current hold's end (Trio time; -inf: none was set)."""
        return self._hold

    async def acquire(self) -> float:
        """Wait out any hold, then for a token (cancellable; a cancelled wait for a token still
        consumed its reservation).

        Returns:
            Seconds the hold and the bucket imposed (0.0 when neither did; the scheduling
            latency of the checkpoint is not counted).
        """
        imposed = 0.0
        start = trio.current_time()
        if self._hold > start:
            # one wait: a hold extended meanwhile is met by this request's own 429
            imposed = self._hold - start
            await trio.sleep_until(self._hold)
        now = trio.current_time()
        delay = self._bucket.reserve(now)
        if delay > 0:
            await trio.sleep(delay)
        else:
            await trio.lowlevel.checkpoint()
        return imposed + delay
