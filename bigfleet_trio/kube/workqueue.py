"""De-duplicating work queue with per-key exponential backoff (client-go ``workqueue`` on Trio).

Generic (any hashable key); the pod controller's workers take keys from it (16 by default, like
controller-runtime's ``MaxConcurrentReconciles``).

Semantics (``k8s.io/client-go/util/workqueue``):

* A key is queued at most once. Adding a key that is already queued is a no-op; adding a key that
  a worker is processing marks it dirty, and :meth:`WorkQueue.done` re-queues it, so one key is
  never processed by two workers at once and no change is lost.
* :meth:`WorkQueue.add_after` parks a key until a moment; parking the same key twice keeps the
  earlier moment. :meth:`WorkQueue.add_rate_limited` parks it for
  ``base_delay * 2**failures`` (capped at ``max_delay``), counting one more failure;
  :meth:`WorkQueue.forget` resets the count after a success.
* FIFO order among ready keys; parked keys join the tail when their moment comes. Keys added
  with ``low=True`` wait in a second FIFO that workers drain only when the first is empty (the
  controller's cosmetic status writes and a co-location group's re-pins must not slow down CR
  creation under a burst); a normal add of a key waiting there moves it to the first.

The bookkeeping is pure (:class:`QueueCore`, explicit ``now``) and unit-tested without Trio;
:class:`WorkQueue` adds the blocking :meth:`~WorkQueue.get` on Trio's clock (no background task:
a waiting :meth:`~WorkQueue.get` sleeps until the earliest parked moment or the next add).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Generic, Protocol, TypeVar

import trio

from bigfleet_trio.kube.retry import Backoff

__all__ = [
    "ParkedKeys",
    "QueueCore",
    "QueueMetrics",
    "ShutDown",
    "WorkQueue",
    "backoff_delay",
    "in_flight_seconds",
]

K = TypeVar("K", bound=Hashable)

DEFAULT_BASE_DELAY = 0.005
"""Seconds of the first retry delay (client-go ``DefaultControllerRateLimiter``: 5 ms)."""
DEFAULT_MAX_DELAY = 300.0
"""Cap of the per-key retry delay in seconds (client-go uses 1000 s; 5 min suits a controller
whose resync is 5 min)."""


class ShutDown(Exception):
    """Raised by :meth:`WorkQueue.get` once the queue is shut down and drained."""


class QueueMetrics(Protocol):
    """Hooks a queue reports to (see :mod:`bigfleet_trio.podcontroller.metrics`)."""

    def added(self) -> None:
        """A key entered the ready queue (after de-duplication)."""

    def depth(self, n: int) -> None:
        """The ready queue now holds ``n`` keys."""

    def retried(self) -> None:
        """A key was parked by :meth:`WorkQueue.add_rate_limited`."""

    def waited(self, seconds: float) -> None:
        """A key waited ``seconds`` in the ready queue before a worker took it."""

    def worked(self, seconds: float) -> None:
        """A worker held a key for ``seconds`` (get → done)."""

    def watch(self, in_flight: Callable[[], tuple[float, float]]) -> None:
        """The queue's probe of its work in progress, handed over once by its constructor (a
        queue with a clock only): ``in_flight()`` is :func:`in_flight_seconds` of the keys
        workers hold now, for a gauge read at scrape time. It keeps no queue alive, and reads
        ``(0.0, 0.0)`` once the queue is gone or where its clock cannot be read (Trio's, outside
        the run)."""


def in_flight_seconds(starts: Iterable[float], now: float) -> tuple[float, float]:
    """Work in progress as client-go's queue reports it (docs/operate.md#standard-metric-names).

    Args:
        starts: when each key a worker holds was taken (seconds, the clock of ``now``).
        now: seconds.

    Returns:
        ``(unfinished, longest)``: the seconds of all of them summed
        (``workqueue_unfinished_work_seconds``) and the oldest one's
        (``workqueue_longest_running_processor_seconds``); ``(0.0, 0.0)`` for none. A start
        after ``now`` counts as 0 s.
    """
    unfinished = longest = 0.0
    for start in starts:
        held = now - start
        if held > 0:
            unfinished += held
            if held > longest:
                longest = held
    return unfinished, longest


def _probe(ref: weakref.ref[QueueCore[K]], clock: Callable[[], float]) -> tuple[float, float]:
    """:meth:`QueueMetrics.watch`'s probe: the queue behind ``ref`` at ``clock()``."""
    queue = ref()
    if queue is None or not queue.processing:
        return 0.0, 0.0  # no clock read: nothing in progress (or no queue) reads the same
    try:
        now = clock()
    except RuntimeError:  # Trio's clock outside its run (another thread, a run ended): no
        return 0.0, 0.0  # worker runs there, and a scrape must not fail
    return queue.in_flight(now)


def backoff_delay(failures: int, base_delay: float, max_delay: float) -> float:
    """``base_delay * 2**failures`` capped at ``max_delay`` (client-go
    ``ItemExponentialFailureRateLimiter``): :meth:`Backoff.nominal`, no jitter.

    Args:
        failures: failures counted before this one (0 for the first retry).
        base_delay, max_delay: seconds.

    Returns:
        Seconds to wait; overflow-safe for any ``failures``.
    """
    return Backoff(initial=base_delay, cap=max_delay, jitter=0.0).nominal(failures)


class ParkedKeys(Generic[K]):
    """Keys parked until a moment (seconds on the caller's clock): a dict of moments and a lazy
    min-heap, stale entries skipped. Pure; shared by :class:`QueueCore` and the operator's
    session queue (``operator/session/queues.py``)."""

    __slots__ = ("_when", "_heap", "_seq")

    def __init__(self) -> None:
        self._when: dict[K, float] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._seq = itertools.count()

    def park(self, key: K, when: float) -> bool:
        """Park ``key`` until ``when``; an earlier moment already set wins. Returns True if
        ``when`` is now the key's moment."""
        current = self._when.get(key)
        if current is not None and current <= when:
            return False
        self._when[key] = when
        heapq.heappush(self._heap, (when, next(self._seq), key))
        return True

    def pop_due(self, now: float) -> Iterator[K]:
        """Unpark and yield, earliest first, the keys whose moment is ``now`` or earlier."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            when, _, key = heapq.heappop(heap)
            if self._when.get(key) != when:
                continue  # stale: re-parked earlier, or discarded
            del self._when[key]
            yield key

    def next_deadline(self) -> float:
        """The earliest moment (``math.inf`` when nothing is parked)."""
        heap = self._heap
        while heap and self._when.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def discard(self, key: K) -> bool:
        """Unpark ``key`` (its heap entry goes stale). Returns True if it was parked."""
        return self._when.pop(key, None) is not None

    def shrink(self) -> None:
        """Give back the tables a burst grew, once nothing is parked."""
        if not self._when and (self._heap or sys.getsizeof(self._when) > _EMPTY_DICT):
            self._when = {}
            self._heap = []  # every entry left is stale once nothing is parked

    def __contains__(self, key: object) -> bool:
        return key in self._when

    def __len__(self) -> int:
        return len(self._when)


class QueueCore(Generic[K]):
    """The pure bookkeeping of :class:`WorkQueue`; every call takes the current time.

    Args:
        base_delay, max_delay: per-key backoff (seconds), see :func:`backoff_delay`.
        metrics: optional :class:`QueueMetrics`.
        clock: ``() -> seconds`` on the clock of the ``now`` arguments, for the metrics'
            in-flight probe (:meth:`QueueMetrics.watch`); default :attr:`clock` (None here:
            no probe; Trio's for :class:`WorkQueue`).
    """

    clock: Callable[[], float] | None = None

    def __init__(
        self,
        *,
        base_delay: float = DEFAULT_BASE_DELAY,
        max_delay: float = DEFAULT_MAX_DELAY,
        metrics: QueueMetrics | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if base_delay <= 0 or max_delay < base_delay:
            raise ValueError(f"bad backoff: base_delay={base_delay} max_delay={max_delay}")
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._backoff = Backoff(initial=base_delay, cap=max_delay, jitter=0.0)
        self.metrics = metrics
        self._queue: deque[K] = deque()
        # low keys: (entry number, key); an entry is live while _low_live[key] is its number (a
        # normal add of a waiting low key moves it to _queue and leaves its entry here, stale)
        self._low: deque[tuple[int, K]] = deque()
        self._low_live: dict[K, int] = {}
        self._dirty: dict[K, float] = {}  # key -> when it became ready (queued or pending re-queue)
        self._processing: dict[K, float] = {}  # key -> when a worker took it
        self._parked: ParkedKeys[K] = ParkedKeys()
        self._seq = itertools.count()
        self._failures: dict[K, int] = {}
        self.shutting_down = False
        if clock is not None:
            self.clock = clock
        if metrics is not None and self.clock is not None:
            metrics.watch(functools.partial(_probe, weakref.ref(self), self.clock))

    # -- adding --------------------------------------------------------------------------------

    def add(self, key: K, now: float, *, low: bool = False) -> bool:
        """Make ``key`` ready (``low``: behind every normal key). A key waiting behind every
        normal key that is added without ``low`` moves to the normal queue's tail (it has a
        change of its own: docs/rules.md#pod-translation-co-location-zone-pin).

        Returns True if a worker can take it now (it joined a queue and was not ready before).
        """
        if self.shutting_down:
            return False
        if key in self._dirty:
            if not low and self._low_live.pop(key, None) is not None:
                self._queue.append(key)
            return False
        self._dirty[key] = now
        if key in self._processing:
            return False
        if low:
            n = next(self._seq)
            self._low.append((n, key))
            self._low_live[key] = n
        else:
            self._queue.append(key)
        if self.metrics is not None:
            self.metrics.added()
            self.metrics.depth(len(self))
        return True

    def add_at(self, key: K, when: float, now: float) -> bool:
        """Park ``key`` until ``when`` (an earlier parked moment wins); ``when <= now`` adds.

        Returns True if the key joined the ready queue at once.
        """
        if self.shutting_down:
            return False
        if when <= now:
            return self.add(key, now)
        self._parked.park(key, when)
        return False

    def add_rate_limited(self, key: K, now: float) -> float:
        """Park ``key`` for its backoff delay and count a failure. Returns the delay (seconds)."""
        failures = self._failures.get(key, 0)
        delay = self._backoff.nominal(failures)
        self._failures[key] = failures + 1
        if self.metrics is not None:
            self.metrics.retried()
        self.add_at(key, now + delay, now)
        return delay

    def forget(self, key: K) -> None:
        """Reset ``key``'s failure count (call after a successful reconcile)."""
        self._failures.pop(key, None)

    def num_requeues(self, key: K) -> int:
        """Failures counted for ``key`` since the last :meth:`forget`."""
        return self._failures.get(key, 0)

    # -- time ----------------------------------------------------------------------------------

    def promote(self, now: float) -> int:
        """Move parked keys whose moment has come into the ready queue. Returns how many."""
        return sum(1 for key in list(self._parked.pop_due(now)) if self.add(key, now))

    def next_deadline(self) -> float:
        """Earliest parked moment (``math.inf`` when nothing is parked)."""
        return self._parked.next_deadline()

    # -- workers -------------------------------------------------------------------------------

    def pop(self, now: float) -> K | None:
        """Take the next ready key (after :meth:`promote`), marking it processing; None if none."""
        self.promote(now)
        if self._queue:
            key = self._queue.popleft()
        else:
            low, live = self._low, self._low_live
            while low:
                n, key = low.popleft()
                if live.get(key) == n:
                    del live[key]
                    break
            else:
                return None
        ready_since = self._dirty.pop(key, now)
        self._processing[key] = now
        if self.metrics is not None:
            self.metrics.depth(len(self))
            self.metrics.waited(max(0.0, now - ready_since))
        return key

    def unpop(self, key: K, now: float) -> None:
        """Give back ``key`` just taken by :meth:`pop` and never worked: ready again at the head
        of the queue, not processing (a worker cancelled before it could call :meth:`done`)."""
        if self._processing.pop(key, None) is None:
            return
        self._dirty.setdefault(key, now)
        self._low_live.pop(key, None)
        self._queue.appendleft(key)
        if self.metrics is not None:
            self.metrics.depth(len(self))

    def done(self, key: K, now: float) -> bool:
        """A worker finished ``key``. Returns True if it was dirty and re-joined the queue."""
        started = self._processing.pop(key, None)
        if started is not None and self.metrics is not None:
            self.metrics.worked(max(0.0, now - started))
        if key in self._dirty and not self.shutting_down:
            self._queue.append(key)
            if self.metrics is not None:
                self.metrics.added()
                self.metrics.depth(len(self))
            return True
        if self.shutting_down:
            self._dirty.pop(key, None)
        if not self._processing:
            self._shrink()
        return False

    def _shrink(self) -> None:
        """Give back the tables a burst grew, once they are empty: a dict never shrinks as keys
        leave it (after a churn of 50,000 Pods the pod controller's queue kept 10 MiB)."""
        if not self._low_live and (self._low or sys.getsizeof(self._low_live) > _EMPTY_DICT):
            self._low_live = {}
            self._low = deque()  # every entry left is stale once no low key waits
        if not self._processing and sys.getsizeof(self._processing) > _EMPTY_DICT:
            self._processing = {}
        if not self._dirty and sys.getsizeof(self._dirty) > _EMPTY_DICT:
            self._dirty = {}
        self._parked.shrink()

    # -- introspection -------------------------------------------------------------------------

    def __len__(self) -> int:
        """Keys ready to be taken, both priorities (not counting parked or processing ones)."""
        return len(self._queue) + len(self._low_live)

    @property
    def parked(self) -> int:
        """Keys waiting for their moment."""
        return len(self._parked)

    @property
    def processing(self) -> int:
        """Keys held by workers."""
        return len(self._processing)

    def in_flight(self, now: float) -> tuple[float, float]:
        """:func:`in_flight_seconds` of the keys workers hold at ``now``: (sum, longest) s."""
        return in_flight_seconds(self._processing.values(), now)

    def is_queued(self, key: K) -> bool:
        """True if ``key`` is ready or will be re-queued when its worker finishes."""
        return key in self._dirty

    def is_parked(self, key: K) -> bool:
        """True if ``key`` waits for a moment."""
        return key in self._parked


_EMPTY_DICT = sys.getsizeof({})

GET_HOLD = 0.01
"""Seconds :meth:`WorkQueue.get` hands out keys without the loop turning before each worker
yields to it once (docs/kube-api.md#relist-apply)."""


class WorkQueue(QueueCore[K]):
    """:class:`QueueCore` on Trio's clock with a blocking :meth:`get`.

    Usage (one owner nursery, N workers)::

        q = WorkQueue()
        q.add("ns/name")
        key = await q.get()
        try:
            ok = await reconcile(key)
        except Exception:
            q.add_rate_limited(key)
        else:
            q.forget(key)
        finally:
            q.done(key)

    All methods but :meth:`get` are synchronous and safe to call from informer handlers.
    """

    # The constructor is QueueCore's; the one thing added, the workers' parking lot, is made on
    # first use.
    clock: Callable[[], float] | None = staticmethod(trio.current_time)
    held_clock: Callable[[], float] = staticmethod(time.perf_counter)
    """Wall-clock seconds for :data:`GET_HOLD` (tests pass their own)."""
    _since: float | None = None  # when the loop last turned, as get() saw it
    _turns = 0  # loop turns get() saw: only the first worker back from a yield restarts _since

    @functools.cached_property
    def _lot(self) -> trio.lowlevel.ParkingLot:
        return trio.lowlevel.ParkingLot()

    def _wake(self, n: int = 1) -> None:
        if self._lot.statistics().tasks_waiting:
            self._lot.unpark(count=n)

    def add(self, key: K, now: float | None = None, *, low: bool = False) -> bool:
        """Make ``key`` ready now (de-duplicated; ``low``: after every normal key)."""
        added = super().add(key, trio.current_time() if now is None else now, low=low)
        if added:
            self._wake()
        return added

    def add_after(self, key: K, delay: float) -> None:
        """Make ``key`` ready after ``delay`` seconds (an earlier parking wins)."""
        now = trio.current_time()
        if not self.add_at(key, now + delay, now):
            self._wake()  # a waiting get() recomputes its deadline

    def add_rate_limited(self, key: K, now: float | None = None) -> float:
        """Park ``key`` for its backoff delay (counts a failure). Returns the delay."""
        delay = super().add_rate_limited(key, trio.current_time() if now is None else now)
        self._wake()
        return delay

    def done(self, key: K, now: float | None = None) -> bool:
        """Release ``key``; re-queues it if it was added while processing."""
        again = super().done(key, trio.current_time() if now is None else now)
        if again:
            self._wake()
        return again

    async def get(self) -> K:
        """Wait for and take the next ready key.

        Raises:
            ShutDown: :meth:`shut_down` was called and no key is ready.
        """
        while True:
            key = self.pop(trio.current_time())
            if key is not None:
                # A backlog of keys whose reconciles never wait (a cache in sync) would hold the
                # loop for the whole backlog. Once GET_HOLD seconds passed since the loop last
                # turned, every worker yields once: a yield lets the other ready tasks run but
                # not the loop's timers and I/O, which come only when all of them have yielded
                # (counting keys per worker instead let 16 workers x 64 keys hold it 0.5-1 s in
                # the 5,000-machine soak). A yield per key costs more than many a reconcile.
                now = self.held_clock()
                if self._since is None:
                    self._since = now
                elif now - self._since >= GET_HOLD:
                    turn = self._turns
                    try:
                        await trio.lowlevel.checkpoint()
                    except BaseException:
                        # cancelled before the caller holds the key: it would never be done
                        self.unpop(key, trio.current_time())
                        self._wake()
                        raise
                    if self._turns == turn:  # the first worker back since the loop turned
                        self._turns += 1
                        self._since = self.held_clock()
                return key
            if self.shutting_down:
                raise ShutDown
            with trio.move_on_at(self.next_deadline()):
                await self._lot.park()
            self._turns += 1  # the loop turned while this worker waited
            self._since = self.held_clock()

    def shut_down(self) -> None:
        """Stop accepting keys; waiting :meth:`get` calls raise :class:`ShutDown` once drained."""
        self.shutting_down = True
        self._lot.unpark_all()
