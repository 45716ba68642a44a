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


class KeyedCoalescer(Generic[K, T]):
    """Latest-pending-frame-per-key, a FIFO ready queue of keys, and at most one owner per key.

    Protocol (the ready queue and the cap are ours, see ``docs/wire.md#the-session``):

    * the receiver calls :meth:`offer` for every frame and never waits for a worker: the frame
      becomes the key's pending one (overwriting an unprocessed older frame, counted in
      :attr:`coalesced`). If the key had no pending frame and no owner, it is appended to the
      ready queue and :meth:`offer` returns True (the caller wakes one worker);
    * a worker calls :meth:`claim` to take the oldest ready key (it becomes the key's only
      owner), then loops ``while (item := take_next(key)) is not None: handle(item)``;
      :meth:`take_next` returns None and releases ownership when nothing is pending, so a frame
      offered after that queues the key again. Per key, frames are handled in arrival order,
      intermediate ones may be skipped, and the last one offered is always handled;
    * frames for a key that waits in the ready queue or whose owner is busy just replace its
      pending frame: memory is one frame per key, i.e. bounded by the number of machines, and
      :attr:`full` tells the receiver to stop reading while :attr:`pending` >= ``max_pending``.

    An owner that dies without draining must call :meth:`abandon` so the key can start again.

    Args:
        max_pending: the cap behind :attr:`full` (>= 1). Default :data:`NODE_STATE_PENDING_CAP`.

    Attributes:
        coalesced: frames overwritten before a worker took them.
    """

    def __init__(self, max_pending: int = NODE_STATE_PENDING_CAP) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.max_pending = max_pending
        self._pending: dict[K, T] = {}
        self._owned: set[K] = set()
        self._ready: deque[K] = deque()
        self.coalesced = 0

    def offer(self, key: K, item: T) -> bool:
        """Record ``item`` as ``key``'s latest frame. Returns True when ``key`` became ready."""
        if key in self._pending:
            self.coalesced += 1
            self._pending[key] = item
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
            if key in self._pending and key not in self._owned:
                self._owned.add(key)
                return key
        return None

    def take_next(self, key: K) -> T | None:
        """Pop owned ``key``'s pending frame; None (and ownership released) when there is none."""
        item = self._pending.pop(key, None)
        if item is None:
            self._owned.discard(key)
        return item

    def abandon(self, key: K) -> None:
        """Forget ``key`` entirely (its owner was cancelled or crashed)."""
        self._pending.pop(key, None)
        self._owned.discard(key)

    def in_flight(self, key: K) -> bool:
        """True while ``key`` has an owner or waits in the ready queue."""
        return key in self._owned or key in self._pending

    @property
    def workers(self) -> int:
        """Number of keys with an owner (a worker draining them)."""
        return len(self._owned)

    @property
    def pending(self) -> int:
        """Number of keys with a frame waiting (for their owner, or in the ready queue)."""
        return len(self._pending)

    @property
    def ready(self) -> int:
        """Number of keys waiting for a worker."""
        return len(self._ready)

    @property
    def full(self) -> bool:
        """True while :attr:`pending` >= ``max_pending`` (the receiver should stop reading)."""
        return len(self._pending) >= self.max_pending
