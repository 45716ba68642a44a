"""Sans-IO queue and coalescing state of one shard session.

Seed 000 "The single outbound stream" ("Two send queues, two drop policies" and
"NodeStateUpdate coalescing"); facts in reference-behavior.md §3 and §4. Nothing here awaits or
touches Trio: the Trio tasks in :mod:`bigfleet_trio.operator.session` call these objects and do
the waking/sleeping themselves, so every rule below is unit-tested without an event loop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

from bigfleet_trio.proto import pb

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

#: Capacity of the outbox (reference stream.go ``outboxCap``).
OUTBOX_CAPACITY = 256


class PendingRollupSlot(Generic[T]):
    """Single-slot holder for the newest roll-up (coalesce by replace).

    Roll-ups are full replacements, so a newer roll-up makes any older one still queued
    worthless: :meth:`put` overwrites it (seed 000, reference §3 "Pending roll-up slot").

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
    its own timeout, so a late response is worthless (seed 000, reference §3 "Outbox").

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


class SendQueues:
    """The send task's two sources (roll-up slot + outbox) and the order it drains them in.

    Go's ``select`` picks randomly among ready cases; we alternate deterministically instead: when
    both have something, the source not served last goes first (the roll-up before anything was
    served), so neither can starve the other.
    """

    def __init__(self, outbox_capacity: int = OUTBOX_CAPACITY) -> None:
        self.rollup: PendingRollupSlot[pb.OperatorMessage] = PendingRollupSlot()
        self.outbox: Outbox[pb.OperatorMessage] = Outbox(outbox_capacity)
        self._last_was_rollup = False

    def next_frame(self) -> pb.OperatorMessage | None:
        """Pop the next frame to send, or None when both queues are empty."""
        if self._last_was_rollup or not self.rollup:
            msg = self.outbox.pop()
            if msg is not None:
                self._last_was_rollup = False
                return msg
        msg = self.rollup.take()
        if msg is not None:
            self._last_was_rollup = True
            return msg
        return self.outbox.pop()

    def __bool__(self) -> bool:
        return bool(self.rollup) or len(self.outbox) > 0


class NodeStateCoalescer(Generic[K, T]):
    """Latest-pending-per-key plus in-flight flags: at most one worker per machine.

    Protocol (seed 000 "NodeStateUpdate coalescing", reference §4):

    * the receiver calls :meth:`offer` for every frame; it stores the frame as the key's pending
      one (overwriting an unprocessed older frame, counted in :attr:`coalesced`) and returns True
      only when no worker exists for the key — the caller must then start exactly one worker;
    * the worker loops ``while (item := take_next(key)) is not None: handle(item)``;
      :meth:`take_next` returns None and clears the in-flight flag when nothing is pending, so a
      frame offered after that starts a new worker.

    A worker that dies without draining must call :meth:`abandon` so the key can start again.

    Attributes:
        coalesced: frames overwritten before a worker took them.
    """

    def __init__(self) -> None:
        self._pending: dict[K, T] = {}
        self._in_flight: set[K] = set()
        self.coalesced = 0

    def offer(self, key: K, item: T) -> bool:
        """Record ``item`` as ``key``'s latest frame. Returns True if a worker must be started."""
        if key in self._pending:
            self.coalesced += 1
        self._pending[key] = item
        if key in self._in_flight:
            return False
        self._in_flight.add(key)
        return True

    def take_next(self, key: K) -> T | None:
        """Pop ``key``'s pending frame; None (and the in-flight flag cleared) when there is none."""
        item = self._pending.pop(key, None)
        if item is None:
            self._in_flight.discard(key)
        return item

    def abandon(self, key: K) -> None:
        """Forget ``key`` entirely (its worker was cancelled or crashed)."""
        self._pending.pop(key, None)
        self._in_flight.discard(key)

    def in_flight(self, key: K) -> bool:
        """True while a worker owns ``key``."""
        return key in self._in_flight

    @property
    def workers(self) -> int:
        """Number of keys with a live worker."""
        return len(self._in_flight)

    @property
    def pending(self) -> int:
        """Number of keys with a frame waiting for their worker."""
        return len(self._pending)
