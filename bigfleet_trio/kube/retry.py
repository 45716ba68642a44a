"""The one retry policy of the Kubernetes layer: :class:`Backoff` and :class:`RetryPolicy`.

:class:`Backoff` is the delay arithmetic every retry loop uses (the client, informers, the pod
controller's work queue; the shard reconnect loop can use it too). :class:`RetryPolicy` is the
one place that retries *transient* apiserver failures (429, 5xx, transport errors) of a request;
:func:`write_retry_on` says which of them a given write may repeat. Above the client, a handler's
read-plan-write loop runs under the one re-plan policy, :func:`conflict_retrying` (the operator's
shard-frame handlers also re-plan after a transient failure). Both loops are our own, with no
retry library: docs/kube-api.md#retries.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import trio

from .errors import (
    AlreadyExists,
    Conflict,
    KubeTransportError,
    ServerError,
    TooManyRequests,
)

__all__ = [
    "Backoff",
    "RetryPolicy",
    "TRANSIENT",
    "NOT_PROCESSED",
    "Replan",
    "ConflictRetrying",
    "conflict_retrying",
    "write_retry_on",
    "RECONCILE_RETRIABLE",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

JitterMode = Literal["up", "down"]

TRANSIENT: tuple[type[Exception], ...] = (TooManyRequests, ServerError, KubeTransportError)
"""Failures worth repeating: throttled (429), apiserver-side (5xx), no answer (transport)."""
NOT_PROCESSED: tuple[type[Exception], ...] = (TooManyRequests,)
"""Failures that prove the apiserver did not act on the request (429: rejected before it ran)."""


class Backoff:
    """Exponential backoff with jitter, as a pure object driven by the caller's clock.

    The nominal delay of failure ``n`` (0-based) is ``min(cap, initial * factor**n)``; the
    delay returned is the nominal one jittered:

    * ``jitter_mode="up"`` (client-go's ``wait.Jitter``, the reflector's backoff):
      ``nominal * (1 + jitter * U[0,1))``, then capped at ``cap``; ``jitter`` may be >= 1.
    * ``jitter_mode="down"``: ``nominal * (1 - jitter * U[0,1))`` with ``0 <= jitter < 1``;
      jitter only shortens a wait, so the cap is never exceeded and a crowd of clients
      spreads out below it. (This is the shard reconnect loop's rule: nominal 0.5, 1, 2, ...
      30 s, up to 20 % shorter.)

    ``n`` goes back to 0 on :meth:`reset`, and, with ``reset_after``, when :meth:`next_delay`
    is called ``reset_after`` seconds or more after the previous failure (a healthy period).
    A caller whose rule is "reset after a session that stayed up long enough" calls
    :meth:`reset` itself and passes no ``now``.

    Args:
        initial: nominal delay of the first failure, seconds (> 0).
        factor: growth per failure (>= 1).
        cap: largest nominal delay, seconds (>= initial).
        jitter: jitter fraction (see the modes above).
        jitter_mode: "up" or "down".
        reset_after: seconds without a failure after which the count restarts (None: never).
        rng: ``() -> float`` in [0, 1) (e.g. ``random.Random(1).random`` in tests).

    Raises:
        ValueError: a parameter out of range.
    """

    __slots__ = ("initial", "factor", "cap", "jitter", "jitter_mode", "reset_after", "_rng",
                 "_n", "_last")

    def __init__(
        self,
        initial: float = 0.8,
        factor: float = 2.0,
        cap: float = 30.0,
        jitter: float = 1.0,
        jitter_mode: JitterMode = "up",
        reset_after: float | None = 120.0,
        rng: Callable[[], float] | None = None,
    ) -> None:
        if not 0 < initial <= cap:
            raise ValueError(f"need 0 < initial <= cap, got {initial}, {cap}")
        if factor < 1:
            raise ValueError(f"factor must be >= 1, got {factor}")
        if jitter < 0 or (jitter_mode == "down" and jitter >= 1):
            raise ValueError(f"jitter {jitter} out of range for jitter_mode={jitter_mode!r}")
        if jitter_mode not in ("up", "down"):
            raise ValueError(f"jitter_mode must be 'up' or 'down', got {jitter_mode!r}")
        self.initial = initial
        self.factor = factor
        self.cap = cap
        self.jitter = jitter
        self.jitter_mode: JitterMode = jitter_mode
        self.reset_after = reset_after
        self._rng = rng or random.random
        self._n = 0
        self._last: float | None = None

    def nominal(self, failures: int) -> float:
        """Un-jittered delay after ``failures`` earlier failures (seconds; overflow-safe)."""
        if failures <= 0:
            return self.initial
        if self.factor == 1 or failures >= 1100:
            return self.cap if self.factor > 1 else self.initial
        try:
            return min(self.cap, self.initial * self.factor**failures)
        except OverflowError:
            return self.cap

    def delay(self, failures: int) -> float:
        """Jittered delay after ``failures`` earlier failures (pure apart from the rng)."""
        base = self.nominal(failures)
        if not self.jitter:
            return base
        if self.jitter_mode == "down":
            return base * (1.0 - self.jitter * self._rng())
        return min(self.cap, base * (1.0 + self.jitter * self._rng()))

    def next_delay(self, now: float | None = None) -> float:
        """Count one failure (observed at ``now``, seconds on any clock) and return its delay."""
        if (
            now is not None
            and self.reset_after is not None
            and self._last is not None
            and now - self._last >= self.reset_after
        ):
            self._n = 0
        if now is not None:
            self._last = now
        out = self.delay(self._n)
        self._n += 1
        return out

    @property
    def failures(self) -> int:
        """Failures counted since the last reset."""
        return self._n

    def reset(self) -> None:
        """Forget past failures."""
        self._n = 0
        self._last = None


def write_retry_on(
    *, idempotent: bool
) -> tuple[type[Exception], ...]:
    """Which transient failures a write may be repeated after.

    A 429 means the apiserver refused the request before running it, so any write is repeated.
    After a 5xx or a transport error the write may or may not have happened; only a write whose
    repetition gives the same result is repeated: one guarded by a precondition (PUT carrying
    ``metadata.resourceVersion``, DELETE with ``preconditions``) or a merge/apply PATCH (applying
    it twice is applying it once). A POST, an unconditional PUT or DELETE and a deletecollection
    (which may have removed part of the set) are not: the caller decides, and its re-plan sees
    AlreadyExists / NotFound if the first attempt landed.

    Args:
        idempotent: the write is guarded or idempotent, as above.
    """
    return TRANSIENT if idempotent else NOT_PROCESSED


def _default_backoff() -> Backoff:
    return Backoff(initial=0.2, factor=2.0, cap=10.0, jitter=0.5, jitter_mode="down",
                   reset_after=None)


@dataclass(frozen=True)
class RetryPolicy:
    """How the client repeats a request that failed transiently.

    Attempt ``k`` (1-based) that fails with one of the caller's ``retry_on`` classes waits
    ``backoff.delay(k - 1)`` (default: 0.2 s doubling to 10 s, up to 50 % shorter) or, for a
    429 with ``Retry-After``, at least the server's figure (capped at ``max_retry_after``),
    then tries again, ``max_attempts`` attempts in all; the last error is re-raised. (The
    client also holds its other requests for a 429's ``Retry-After``: :mod:`.request`.)

    Our own loop, not tenacity's: this runs around every request, and the success path costs
    one ``try`` (tenacity's ``AsyncRetrying`` about 60 us and a reference cycle per call,
    measured with tenacity 9.2; see :class:`ConflictRetrying`). Only the caller's exception
    classes are caught, so ``trio.Cancelled`` is never retried.

    Attributes:
        max_attempts: attempts per call (1 = no retry).
        max_retry_after: cap on a server-requested wait, seconds.
        backoff: the delay arithmetic (only :meth:`Backoff.delay` is used: stateless).
    """

    max_attempts: int = 5
    max_retry_after: float = 60.0
    backoff: Backoff = field(default_factory=_default_backoff)

    def wait(self, attempt: int, exc: BaseException) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based) with ``exc``.

        A 429's ``Retry-After`` (capped at ``max_retry_after``) is a floor under the backoff,
        as in client-go: ``Retry-After: 0`` or a server repeating ``1`` must not turn the
        retries into a tight loop while the backoff has grown past it.
        """
        delay = self.backoff.delay(attempt - 1)
        if isinstance(exc, TooManyRequests) and exc.retry_after is not None:
            return max(min(exc.retry_after, self.max_retry_after), delay)
        return delay

    async def call(
        self,
        fn: Callable[[], Awaitable[T]],
        retry_on: tuple[type[BaseException], ...],
        what: str = "",
    ) -> T:
        """``await fn()``, repeating it after a ``retry_on`` failure (see the class docstring).

        Raises:
            Whatever ``fn`` raises last (or at once, for a class not in ``retry_on``).
        """
        attempt = 1
        while True:
            try:
                return await fn()
            except retry_on as exc:
                if attempt >= self.max_attempts:
                    raise
                delay = self.wait(attempt, exc)
                log.info("kube retry what=%s attempt=%d wait=%.2fs err=%s", what, attempt,
                         delay, exc, extra={"attempt": attempt, "request": what})
                await trio.sleep(delay)
                attempt += 1


class Replan(Exception):
    """The object changed under us (created or deleted concurrently): read it again and re-plan.

    A handler raises it from inside a :func:`conflict_retrying` attempt, which repeats it.
    """


def _reconcile_retriable() -> tuple[type[Exception], ...]:
    from .errors import Forbidden
    return (*TRANSIENT, Forbidden, Conflict, AlreadyExists, Replan)


RECONCILE_RETRIABLE: tuple[type[Exception], ...] = _reconcile_retriable()
"""What a level-triggered reconcile of a shard frame repeats, with per-key backoff, until it
lands or a newer frame replaces it (docs/rules.md#level-triggered-operator): the transient
failures, a conflict the handler's own re-plans did not resolve, and 403, which kube-apiserver
answers after a (re)start until its RBAC authorizer's caches are synced (seen on the real control
plane). Anything else (422 Invalid, 400, 404 on a path) is permanent for that frame."""


def conflict_retrying(
    attempts: int = 8,
    *,
    backoff: Backoff | None = None,
    also: tuple[type[Exception], ...] = (),
) -> ConflictRetrying:
    """Retry policy for a handler's read-plan-write loop: the one handler retry policy.

    The client already repeated transient failures (:class:`RetryPolicy`); what is left for a
    handler is "the object changed under us": 409 Conflict / AlreadyExists and :class:`Replan`,
    plus the caller's classes in ``also``. Waits follow ``backoff`` (default 0.1 s doubling to
    5 s, up to 50 % shorter); after ``attempts`` tries the last error is re-raised.

    The operator's handlers (UpcomingNode, AvailableCapacity, reclaim) pass ``also=TRANSIENT``:
    the client does not repeat a non-idempotent write (a create) after a 5xx or a transport
    error, and gives up after its own attempts; the shard never resends the update, so the
    handler re-plans from a fresh read instead (AlreadyExists / NotFound there tell it the first
    attempt landed). See docs/reference.md#retry-budget.

    Usage::

        async for attempt in conflict_retrying():
            with attempt:
                await plan_and_write()

    Raises:
        ValueError: ``attempts`` < 1.
    """
    b = backoff or Backoff(initial=0.1, cap=5.0, jitter=0.5, jitter_mode="down",
                           reset_after=None)
    return ConflictRetrying(attempts, (Conflict, AlreadyExists, Replan, *also), b)


class ConflictRetrying:
    """The attempts of one re-plan loop, as ``async for attempt in ...: with attempt:``.

    A failure of a ``retry_on`` class in attempt ``k`` < ``attempts`` is swallowed and attempt
    ``k + 1`` starts after ``backoff.delay(k - 1)`` seconds (``trio.sleep``, so a cancellation
    ends the wait); any other exception, and the last attempt's, leaves the ``with`` block as
    raised. A block that completes ends the loop. Only ``Exception`` subclasses can be in
    ``retry_on``, so ``trio.Cancelled`` is never retried.

    Our own loop, not tenacity's ``AsyncRetrying``: that keeps its call state on itself and
    the state refers back to it, so each loop is a reference cycle (34 objects, measured with
    tenacity 9.2, on success too) that only the cyclic collector frees, and the binaries
    freeze the heap (docs/kube-api.md#garbage-collector). Here an attempt refers to its loop,
    never the other way, and no exception is kept once judged.
    """

    __slots__ = ("attempts", "retry_on", "backoff", "attempt_number", "_again", "__weakref__")

    def __init__(
        self,
        attempts: int,
        retry_on: tuple[type[Exception], ...],
        backoff: Backoff,
    ) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.attempts = attempts
        self.retry_on = retry_on
        self.backoff = backoff
        self.attempt_number = 0  # attempts started so far
        self._again = True

    def __aiter__(self) -> ConflictRetrying:
        return self

    async def __anext__(self) -> _Attempt:
        if not self._again:
            raise StopAsyncIteration
        self._again = False
        if self.attempt_number:
            await trio.sleep(self.backoff.delay(self.attempt_number - 1))
        self.attempt_number += 1
        return _Attempt(self)

    def _failed(self, exc: BaseException) -> bool:
        """Judge ``exc`` from the current attempt: True to swallow it and go again."""
        self._again = isinstance(exc, self.retry_on) and self.attempt_number < self.attempts
        return self._again


class _Attempt:
    """One attempt of a :class:`ConflictRetrying` loop (a context manager)."""

    __slots__ = ("_loop",)

    def __init__(self, loop: ConflictRetrying) -> None:
        self._loop = loop

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> bool:
        return exc is not None and self._loop._failed(exc)
