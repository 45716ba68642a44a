"""Sans-IO queue and coalescing state of one shard session.

Three send queues with their drop policies, and NodeStateUpdate coalescing
(``docs/wire.md#the-session``). Nothing here awaits or touches Trio: the Trio tasks in
:mod:`bigfleet_trio.operator.session` call these objects and do the waking/sleeping themselves,
so every rule below is unit-tested without an event loop.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

from bigfleet_trio.kube.workqueue import ParkedKeys, backoff_delay
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.codec import EncodedFrame

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

#: Capacity of the outbox (the Go agent's ``outboxCap``).
OUTBOX_CAPACITY = 256


class PendingRollupSlot(Generic[T]):
    """Single-slot holder for the newest roll-up (coalesce by replace).

    Roll-ups are full replacements, so a newer roll-up makes any older one still queued
    worthless: :meth:`put` overwrites it.

    Attributes:
        replaced: how many queued roll-ups were overwritten before being sent.
    """

    def __init__(self) -> None:
        self._item: T | None = None
        self.replaced = 0

    def put(self, item: T) -> bool:
        """Store ``item``, replacing any pending one. Never fails.

        Returns:
            True when an older, unsent item was replaced (dropped).
        """
        replaced = self._item is not None
        if replaced:
            self.replaced += 1
        self._item = item
        return replaced

    def take(self) -> T | None:
        """Remove and return the pending item, or None when the slot is empty."""
        item, self._item = self._item, None
        return item

    def __bool__(self) -> bool:
        return self._item is not None


class Outbox(Generic[T]):
    """Bounded FIFO for RPC responses (BootstrapBlobResponse, ReclaimAck) with drop-newest.

    When full, :meth:`offer` refuses the new item and counts it: the shard re-issues requests on
    its own timeout, so a late response is worthless.

    Args:
        capacity: maximum queued items (default 256). Must be >= 1.

    Attributes:
        dropped: items refused because the outbox was full.
    """

    def __init__(self, capacity: int = OUTBOX_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"outbox capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._items: deque[T] = deque()
        self.dropped = 0

    def offer(self, item: T) -> bool:
        """Append ``item`` unless full. Returns False (and counts a drop) when full."""
        if len(self._items) >= self.capacity:
            self.dropped += 1
            return False
        self._items.append(item)
        return True

    def pop(self) -> T | None:
        """Remove and return the oldest item, or None when empty."""
        return self._items.popleft() if self._items else None

    def __len__(self) -> int:
        return len(self._items)


#: How long a bootstrap answer is worth sending, in seconds after its request was read: the
#: shard waits one scheduling cycle (docs/rules.md#bootstrap-one-cycle-deadline).
BOOTSTRAP_ANSWER_DEADLINE = 10.0


class BootstrapLane(Generic[T]):
    """FIFO of bootstrap answers, each dropped only once it is too late to matter.

    The outbox's count cap is the wrong rule for these: a burst of a few hundred machines pulls
    its blobs at once, and a response refused for being the 257th is a machine sure to fail,
    while one that waits a little is still on time. So answers are kept until their deadline
    (request read + :data:`BOOTSTRAP_ANSWER_DEADLINE`) and dropped when popped after it. The
    lane cannot grow without bound: expired answers are dropped on every offer too, so it holds
    at most the answers to the requests read in the last deadline's worth of seconds.

    Attributes:
        expired: answers dropped because their deadline had passed when their turn came.
    """

    def __init__(self) -> None:
        self._items: deque[tuple[float, T]] = deque()
        self.expired = 0

    def offer(self, item: T, deadline: float, now: float = -math.inf) -> None:
        """Append ``item``, worth sending until ``deadline`` (the session's clock, seconds).

        Answers already past their deadline at ``now`` are dropped from the head first, so a
        shard that stops reading altogether holds the lane to one deadline's worth of answers
        (the send task, stuck on the stalled stream, is not there to pop them).
        """
        while self._items and self._items[0][0] < now:
            self._items.popleft()
            self.expired += 1
        self._items.append((deadline, item))

    def pop(self, now: float) -> T | None:
        """The oldest answer still on time at ``now``; the expired ones before it are dropped."""
        while self._items:
            deadline, item = self._items.popleft()
            if now <= deadline:
                return item
            self.expired += 1
        return None

    def __len__(self) -> int:
        return len(self._items)


class SendQueues:
    """The send task's three sources and the order it drains them in.

    Bootstrap answers go first (they have a deadline measured in seconds and are tiny in number
    against the stream's rate). Between the roll-up slot and the outbox, Go's ``select`` picks
    randomly among ready cases; we alternate deterministically instead: when both have
    something, the source not served last goes first (the roll-up before anything was served),
    so neither can starve the other.
    """

    def __init__(self, outbox_capacity: int = OUTBOX_CAPACITY) -> None:
        self.rollup: PendingRollupSlot[pb.OperatorMessage | EncodedFrame] = PendingRollupSlot()
        self.outbox: Outbox[pb.OperatorMessage] = Outbox(outbox_capacity)
        self.bootstrap: BootstrapLane[pb.OperatorMessage] = BootstrapLane()
        self._last_was_rollup = False

    def next_frame(self, now: float = -math.inf) -> pb.OperatorMessage | EncodedFrame | None:
        """Pop the next frame to send at time ``now`` (seconds), or None when all are empty."""
        answer = self.bootstrap.pop(now)
        if answer is not None:
            return answer
        if self._last_was_rollup or not self.rollup:
            msg = self.outbox.pop()
            if msg is not None:
                self._last_was_rollup = False
                return msg
        frame = self.rollup.take()
        if frame is not None:
            self._last_was_rollup = True
            return frame
        return self.outbox.pop()

    def __bool__(self) -> bool:
        return bool(self.rollup) or len(self.outbox) > 0 or len(self.bootstrap) > 0


#: Default bound on machines with a frame waiting for a worker (see :class:`KeyedCoalescer`).
NODE_STATE_PENDING_CAP = 100_000

#: Per-key retry delay of a frame whose write failed retriably: the first retry after this many
#: seconds, doubling per failure (client-go's ``ItemExponentialFailureRateLimiter``)...
RETRY_BASE_DELAY = 0.5
#: ... up to this many seconds. Small against client-go's 1000 s on purpose: the shard sends a
#: frame once, so after an apiserver outage every key must be retried within seconds of the
#: server's return (docs/rules.md#level-triggered-operator); the client's QPS limiter, not this
#: delay, keeps a fleet of retrying keys from flooding a recovering server.
RETRY_MAX_DELAY = 15.0


class KeyedCoalescer(Generic[K, T]):
    """Latest-pending-frame-per-key, a FIFO ready queue of keys, at most one owner per key, and
    per-key retry with exponential backoff: the session's work queue of desired states.

    Protocol (client-go ``workqueue`` semantics over values; ``docs/wire.md#the-session``):

    * the receiver calls :meth:`offer` for every frame and never waits for a worker: the frame
      becomes the key's pending one (overwriting an unprocessed older frame, counted in
      :attr:`coalesced`). If the key had no pending frame and no owner, or its pending frame
      was parked for a retry, it is appended to the ready queue and :meth:`offer` returns True
      (the caller wakes one worker): a newer desired state is tried at once;
    * a worker calls :meth:`claim` to take the oldest ready key (it becomes the key's only
      owner), :meth:`take_next` to take its pending frame, handles it, and calls
      :meth:`release`. A frame offered meanwhile is pending again: :meth:`release` puts the key
      at the ready queue's tail and returns True (the caller wakes a worker), so a machine whose
      frames keep coming holds a worker for one frame at a time, never for as long as they come;
    * a worker whose write failed retriably calls :meth:`retry` before :meth:`release`: the
      frame is parked for the key's backoff delay unless a newer one is already pending (that
      one replaces it). :meth:`promote` (driven by the caller's timer at :meth:`next_deadline`)
      makes parked keys ready again. :meth:`forget` after a success resets the backoff;
    * frames for a key that waits in the ready queue or whose owner is busy just replace its
      pending frame: memory is one frame per key, i.e. bounded by the number of machines, and
      :attr:`full` tells the receiver to stop reading while :attr:`pending` >= ``max_pending``
      (parked frames count: they are desired states not reached yet).

    An owner that dies without releasing must call :meth:`abandon` so the key can start again.

    Args:
        max_pending: the cap behind :attr:`full` (>= 1). Default :data:`NODE_STATE_PENDING_CAP`.
        base_delay, max_delay: the retry backoff, seconds (:func:`~bigfleet_trio.kube.workqueue.
            backoff_delay`). Defaults :data:`RETRY_BASE_DELAY`, :data:`RETRY_MAX_DELAY`.

    Attributes:
        coalesced: frames overwritten before a worker took them.
        retries: frames parked for a retry.
    """

    def __init__(self, max_pending: int = NODE_STATE_PENDING_CAP, *,
                 base_delay: float = RETRY_BASE_DELAY,
                 max_delay: float = RETRY_MAX_DELAY) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        if not 0 < base_delay <= max_delay:
            raise ValueError(f"bad backoff: base_delay={base_delay} max_delay={max_delay}")
        self.max_pending = max_pending
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._pending: dict[K, T] = {}
        self._owned: set[K] = set()
        self._ready: deque[K] = deque()
        self._parked: ParkedKeys[K] = ParkedKeys()  # keys whose frame waits out a retry
        self._failures: dict[K, int] = {}
        self.coalesced = 0
        self.retries = 0

    def offer(self, key: K, item: T) -> bool:
        """Record ``item`` as ``key``'s latest frame. Returns True when ``key`` became ready."""
        if key in self._pending:
            self.coalesced += 1
            self._pending[key] = item
            if self._parked.discard(key) and key not in self._owned:
                self._ready.append(key)
                return True
            return False
        self._pending[key] = item
        if key in self._owned:
            return False
        self._ready.append(key)
        return True

    def claim(self) -> K | None:
        """Take ownership of the oldest ready key; None when no key is ready."""
        while self._ready:
            key = self._ready.popleft()
            if key in self._pending and key not in self._owned and key not in self._parked:
                self._owned.add(key)
                return key
        return None

    def take_next(self, key: K) -> T | None:
        """Pop owned ``key``'s pending frame; None (and ownership released) when there is none."""
        item = self._pending.pop(key, None)
        if item is None:
            self._owned.discard(key)
        return item

    def retry(self, key: K, item: T, now: float) -> float | None:
        """Park the failed ``item`` of owned ``key`` for its backoff delay (counting a failure),
        unless a newer frame is pending (then that one goes next and None is returned).

        Returns:
            The delay in seconds, or None when a newer frame replaced ``item``.
        """
        if key in self._pending:
            return None
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = backoff_delay(failures, self.base_delay, self.max_delay)
        self._pending[key] = item
        self._parked.park(key, now + delay)
        self.retries += 1
        return delay

    def forget(self, key: K) -> None:
        """Reset ``key``'s failure count (its frame was written)."""
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        """Retriable failures of ``key`` since its last :meth:`forget`."""
        return self._failures.get(key, 0)

    def release(self, key: K) -> bool:
        """The owner of ``key`` is done with the frame it took. Returns True when a newer frame
        is pending (not parked): the key joined the ready queue's tail."""
        self._owned.discard(key)
        if key in self._pending and key not in self._parked:
            self._ready.append(key)
            return True
        return False

    def promote(self, now: float) -> list[K]:
        """Make the keys parked until ``now`` or earlier ready; returns those that joined the
        ready queue (an owned one joins when its owner releases it)."""
        out = [key for key in self._parked.pop_due(now) if key not in self._owned]
        self._ready.extend(out)
        return out

    def next_deadline(self) -> float:
        """The earliest parked moment (``math.inf`` when nothing is parked)."""
        return self._parked.next_deadline()

    def abandon(self, key: K) -> None:
        """Forget ``key`` entirely (its owner was cancelled or crashed)."""
        self._pending.pop(key, None)
        self._owned.discard(key)
        self._parked.discard(key)
        self._failures.pop(key, None)

    def in_flight(self, key: K) -> bool:
        """True while ``key`` has an owner, waits in the ready queue or is parked."""
        return key in self._owned or key in self._pending

    def is_parked(self, key: K) -> bool:
        """True while ``key``'s frame waits out a retry delay."""
        return key in self._parked

    @property
    def workers(self) -> int:
        """Number of keys with an owner (a worker handling them)."""
        return len(self._owned)

    @property
    def pending(self) -> int:
        """Number of keys with a frame waiting (for their owner, the ready queue or a retry)."""
        return len(self._pending)

    @property
    def parked(self) -> int:
        """Number of keys whose frame waits out a retry delay."""
        return len(self._parked)

    @property
    def ready(self) -> int:
        """Number of keys waiting for a worker."""
        return len(self._ready)

    @property
    def full(self) -> bool:
        """True while :attr:`pending` >= ``max_pending`` (the receiver should stop reading)."""
        return len(self._pending) >= self.max_pending
