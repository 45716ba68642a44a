"""A client-go style work queue for Trio: deduplicated keys, one worker per key at a time, delayed
re-adds. Used by the simulated workload controllers and the binder service.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Generic, TypeVar

import trio

K = TypeVar("K", bound=Hashable)

__all__ = ["WorkQueue"]


class WorkQueue(Generic[K]):
    """Keys waiting for a reconcile.

    A key added while queued is queued once; a key added while a worker holds it is queued again
    when the worker calls :meth:`done` (so no two workers reconcile one key at once and no change
    is lost). :meth:`add_after` re-adds a key after a delay (Trio clock).
    """

    def __init__(self) -> None:
        self._send, self._recv = trio.open_memory_channel[K](math.inf)
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._dirty_while_processing: set[K] = set()
        self._nursery: trio.Nursery | None = None

    def __len__(self) -> int:
        return len(self._queued)

    def add(self, key: K) -> None:
        """Queue ``key`` (no-op when already queued)."""
        if key in self._processing:
            self._dirty_while_processing.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._send.send_nowait(key)

    def add_after(self, key: K, seconds: float) -> None:
        """Queue ``key`` after ``seconds`` (needs :meth:`run` to be running)."""
        if self._nursery is None:
            self.add(key)
            return

        async def later() -> None:
            await trio.sleep(seconds)
            self.add(key)

        self._nursery.start_soon(later)

    async def get(self) -> K:
        """The next key; the caller owns it until :meth:`done`."""
        key = await self._recv.receive()
        self._queued.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        """The worker finished ``key``; re-queue it if it changed meanwhile."""
        self._processing.discard(key)
        if key in self._dirty_while_processing:
            self._dirty_while_processing.discard(key)
            self.add(key)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the timers of :meth:`add_after` until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()
