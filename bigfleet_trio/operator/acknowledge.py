"""CapacityRequest acknowledgement: Pending CRs of an enqueued roll-up become Acknowledged.

Each CR gets one JSON merge-patch on its ``status`` subresource::

    {"status": {"acknowledgedAt": "<RFC 3339 UTC, second precision, Z>", "phase": "Acknowledged"}}

"Acknowledged" means "included in a roll-up built by the operator", not "received by the shard"
(docs/rules.md#acknowledgement). No resourceVersion precondition, so no conflict loop. Metric
names as in docs/reference.md#metric-names: ``bigfleet_operator_acknowledged_total`` (successful
patches), ``bigfleet_operator_acknowledge_duration_seconds`` (one ``Acknowledger.submit`` batch,
from its submission to its last key's patch).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import trio

from bigfleet_trio.kube.api import KubeAPI
from bigfleet_trio.kube.errors import KubeError, NotFound
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS
from bigfleet_trio.observability import events as kinds
from bigfleet_trio.observability import metrics
from bigfleet_trio.observability.events import EventFeed

__all__ = [
    "DEFAULT_ACK_CONCURRENCY",
    "Acknowledger",
    "acknowledge_patch",
    "format_acknowledged_at",
    "needs_acknowledgement",
]

log = logging.getLogger(__name__)

DEFAULT_ACK_CONCURRENCY = 16
"""At most this many acknowledgement patches in flight (``--ack-concurrency``)."""

CRKey = tuple[str, str]
"""(namespace, name) of a CapacityRequest."""

FEED_SAMPLE = 20
"""At most this many ``ns/name`` keys listed in one ``cr_acknowledged`` feed event."""


def format_acknowledged_at(when: datetime) -> str:
    """RFC 3339 UTC timestamp with second precision and a ``Z`` suffix.

    Always UTC, whatever the process time zone (docs/reference.md#acknowledgedat-in-local-time).

    Args:
        when: an aware datetime (naive values are taken as UTC).

    Returns:
        e.g. ``"2026-03-01T12:00:05Z"`` (sub-second part truncated, like Go's ``time.RFC3339``).
    """
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def acknowledge_patch(when: datetime) -> dict[str, Any]:
    """Merge-patch body for the ``status`` subresource (keys in Go's sorted order)."""
    return {"status": {"acknowledgedAt": format_acknowledged_at(when), "phase": "Acknowledged"}}


def needs_acknowledgement(cr: Mapping[str, Any]) -> bool:
    """True if the CR's ``status.phase`` is missing, "" or "Pending" (not yet acknowledged)."""
    status = cr.get("status")
    phase = status.get("phase", "") if isinstance(status, Mapping) else ""
    return phase in ("", "Pending", None)


def _key(cr: Mapping[str, Any]) -> CRKey | None:
    meta = cr.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    name, ns = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name or not isinstance(ns, str) or not ns:
        return None
    return (ns, name)


@dataclass
class _Batch:
    """One :meth:`Acknowledger.submit_keys` call: timed and reported when its last key is done."""

    started: float
    remaining: int
    outcomes: dict[CRKey, str] = field(default_factory=dict)


class Acknowledger:
    """Background acknowledgement of CapacityRequests by a fixed pool of ``concurrency`` workers.

    A task of its own, not a step of the roll-up loop, so a slow apiserver never delays the next
    roll-up tick; an in-flight set keeps a CR out of two batches at once
    (docs/deviations.md#2-roll-up-and-acknowledgement-operatorrollup-wiringpy-acknowledgepy).
    Submitted keys wait in one FIFO queue that ``concurrency`` workers pull from: a backlog of
    100K Pending CRs is 100K queue entries (about a hundred bytes each), not 100K tasks.
    Failures other than NotFound are logged and not retried here: the CR stays Pending in the
    informer, so the next roll-up submits it again.

    Usage::

        ack = Acknowledger(client)
        await operator_nursery.start(ack.run)
        ...
        ack.submit(crs_seen_in_this_rollup)   # after the roll-up is enqueued; never blocks

    Args:
        client: a KubeClient (anything with its ``patch``).
        concurrency: workers, i.e. maximum patches in flight (default 16, ``--ack-concurrency``).
        now: wall clock returning an aware datetime (injectable for tests).
        feed: optional :class:`EventFeed`: one ``cr_acknowledged`` per batch (count, failed,
            crs: the first :data:`FEED_SAMPLE` acknowledged keys, sorted), when it did anything.
    """

    def __init__(
        self,
        client: KubeAPI,
        *,
        concurrency: int = DEFAULT_ACK_CONCURRENCY,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        feed: EventFeed | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"ack concurrency must be >= 1, got {concurrency}")
        self._client = client
        self._now = now
        self._feed = feed
        self._concurrency = concurrency
        self._in_flight: set[CRKey] = set()  # queued or being patched
        self._queue: deque[tuple[CRKey, _Batch]] = deque()
        self._queued = trio.Semaphore(0)  # one token per queue entry
        self._running = False
        self.acknowledged_total = 0
        self.failed_total = 0

    @property
    def in_flight(self) -> frozenset[CRKey]:
        """Keys submitted and not finished yet (queued or being patched)."""
        return frozenset(self._in_flight)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the worker pool until cancelled (start with ``nursery.start``).

        Keys still queued when it is cancelled are forgotten (their CRs stay Pending, so the
        next run's roll-ups submit them again).
        """
        try:
            async with trio.open_nursery() as nursery:
                for i in range(self._concurrency):
                    nursery.start_soon(self._worker, name=f"acknowledge-{i}")
                self._running = True
                task_status.started()
        finally:
            self._running = False
            self._queue.clear()
            self._queued = trio.Semaphore(0)
            self._in_flight.clear()

    def submit(self, crs: Iterable[Mapping[str, Any]]) -> int:
        """Schedule acknowledgement of every CR in ``crs`` that needs it (non-blocking).

        CRs whose phase is not ""/Pending, without namespace/name, or already in flight are
        skipped.

        Returns:
            The number of CRs newly scheduled.

        Raises:
            RuntimeError: :meth:`run` is not running.
        """
        keys = []
        for cr in crs:
            if not needs_acknowledgement(cr):
                continue
            key = _key(cr)
            if key is None:
                log.warning("acknowledge: skipping a CapacityRequest without namespace/name")
                continue
            keys.append(key)
        return self.submit_keys(keys)

    def submit_keys(self, keys: Iterable[CRKey]) -> int:
        """Queue acknowledgement of ``(namespace, name)`` keys already known to be Pending.

        Returns:
            The number of keys newly queued (keys already in flight are skipped).

        Raises:
            RuntimeError: :meth:`run` is not running.
        """
        if not self._running:
            raise RuntimeError("Acknowledger.run is not running")
        fresh = [key for key in dict.fromkeys(keys) if key not in self._in_flight]
        if fresh:
            batch = _Batch(trio.current_time(), len(fresh))
            for key in fresh:
                self._in_flight.add(key)
                self._queue.append((key, batch))
                self._queued.release()
            log.debug("acknowledge: scheduled=%d in_flight=%d", len(fresh), len(self._in_flight))
        return len(fresh)

    async def _worker(self) -> None:
        while True:
            await self._queued.acquire()
            key, batch = self._queue.popleft()
            try:
                await self._acknowledge_one(key, batch.outcomes)
            finally:
                self._in_flight.discard(key)
            batch.remaining -= 1
            if batch.remaining == 0:
                self._batch_done(batch)

    def _batch_done(self, batch: _Batch) -> None:
        """Time the batch and publish its feed event."""
        metrics.ACKNOWLEDGE_DURATION.observe(trio.current_time() - batch.started)
        outcomes = batch.outcomes
        done = sorted(f"{ns}/{name}" for (ns, name), o in outcomes.items() if o == "acknowledged")
        failed = sum(1 for o in outcomes.values() if o == "failed")
        if self._feed is not None and (done or failed):
            self._feed.publish(
                kinds.CR_ACKNOWLEDGED, count=len(done), failed=failed, crs=done[:FEED_SAMPLE]
            )

    async def _acknowledge_one(self, key: CRKey, outcomes: dict[CRKey, str]) -> None:
        ns, name = key
        outcomes[key] = "failed"  # until the patch says otherwise (cancelled included)
        try:
            await self._client.patch(
                CAPACITY_REQUESTS,
                name,
                acknowledge_patch(self._now()),
                ns,
                patch_type="merge",
                subresource="status",
            )
        except NotFound:
            outcomes[key] = "gone"
            log.debug("acknowledge: CapacityRequest gone namespace=%s name=%s", ns, name)
        except KubeError as exc:
            self.failed_total += 1
            log.warning(
                "acknowledge: patch failed, retry next cycle namespace=%s name=%s error=%s",
                ns,
                name,
                exc,
            )
        else:
            outcomes[key] = "acknowledged"
            self.acknowledged_total += 1
            metrics.ACKNOWLEDGED.inc()
            log.debug("acknowledge: acknowledged namespace=%s name=%s", ns, name)
