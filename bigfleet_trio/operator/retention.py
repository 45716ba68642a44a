"""Retention of Failed UpcomingNodes: delete them once they have been Failed for a while.

A task in the operator's nursery (:mod:`bigfleet_trio.operator.app`) that sweeps the
UpcomingNode informer's cache; the decision is the pure :func:`plan_retention`. The rule and its
reason: ``docs/rules.md#upcomingnode-retention``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from bigfleet_trio.kube.api import KubeAPI
from bigfleet_trio.kube.errors import Conflict, KubeError, NotFound
from bigfleet_trio.kube.resources import UPCOMING_NODES
from bigfleet_trio.observability import metrics

log = logging.getLogger(__name__)

PHASE_FAILED = "Failed"

#: Default time a Failed UpcomingNode is kept, in seconds.
DEFAULT_FAILED_RETENTION = 600.0
#: Default time between sweeps, in seconds.
DEFAULT_SWEEP_INTERVAL = 30.0


@dataclass(frozen=True)
class FailedRecord:
    """One Failed UpcomingNode as the sweep sees it (from the informer cache)."""

    name: str
    uid: str
    resource_version: str


@dataclass
class RetentionPlan:
    """What one sweep decided.

    Attributes:
        first_seen: name -> (uid, time in seconds on the sweep's clock) for every record
            Failed now, due or not: the next sweep's memory (a delete that fails is due again
            at once; one that succeeds drops out because the record is gone).
        delete: records Failed for at least the retention period, oldest first.
    """

    first_seen: dict[str, tuple[str, float]] = field(default_factory=dict)
    delete: list[FailedRecord] = field(default_factory=list)


def failed_records(objects: Iterable[Mapping[str, Any]]) -> list[FailedRecord]:
    """The UpcomingNodes in ``objects`` whose ``status.phase`` is Failed.

    Objects without a name are skipped (they cannot be deleted by name anyway).
    """
    out = []
    for obj in objects:
        status = obj.get("status")
        if not isinstance(status, Mapping) or status.get("phase") != PHASE_FAILED:
            continue
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping) or not meta.get("name"):
            continue
        out.append(
            FailedRecord(
                str(meta["name"]),
                str(meta.get("uid") or ""),
                str(meta.get("resourceVersion") or ""),
            )
        )
    return out


def plan_retention(
    first_seen: Mapping[str, tuple[str, float]],
    failed: Iterable[FailedRecord],
    now: float,
    retention: float,
) -> RetentionPlan:
    """Decide which Failed UpcomingNodes to delete.

    The clock starts when a sweep first sees a record Failed (the CRD has no "Failed since"
    timestamp; after an operator restart every Failed record starts a fresh period, so nothing
    is deleted earlier than the retention promises). A record that left Failed, went away, or
    came back as a new object (another uid) forgets its start.

    Args:
        first_seen: the previous plan's ``first_seen``.
        failed: every record Failed now.
        now: the sweep's time in seconds (any monotonic clock, same as ``first_seen``).
        retention: seconds a record stays Failed before it is deleted; > 0.

    Returns:
        The next memory and the records to delete (longest Failed first, then by name).
    """
    plan = RetentionPlan()
    due: list[tuple[float, FailedRecord]] = []
    for rec in failed:
        prev = first_seen.get(rec.name)
        since = prev[1] if prev is not None and prev[0] == rec.uid else now
        plan.first_seen[rec.name] = (rec.uid, since)
        if now - since >= retention:
            due.append((since, rec))
    due.sort(key=lambda d: (d[0], d[1].name))
    plan.delete = [rec for _, rec in due]
    return plan


class FailedRetention:
    """Periodically deletes UpcomingNodes that have stayed Failed for ``retention`` seconds.

    Args:
        kube: the client (only ``delete`` is used).
        cached: returns the UpcomingNodes in the informer cache (called once per sweep).
        retention: seconds a record stays Failed before deletion; 0 disables the task.
        interval: seconds between sweeps (> 0).
        cluster: cluster id, for log keys.
    """

    def __init__(
        self,
        kube: KubeAPI,
        cached: Callable[[], Iterable[Mapping[str, Any]]],
        *,
        retention: float = DEFAULT_FAILED_RETENTION,
        interval: float = DEFAULT_SWEEP_INTERVAL,
        cluster: str = "",
    ) -> None:
        if retention < 0:
            raise ValueError(f"retention must be >= 0 seconds, got {retention}")
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        self._kube = kube
        self._cached = cached
        self.retention = retention
        self.interval = interval
        self._cluster = cluster
        self._first_seen: dict[str, tuple[str, float]] = {}
        self.deleted = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sweep every ``interval`` seconds until cancelled (returns at once when disabled)."""
        task_status.started()
        if self.retention == 0:
            return
        while True:
            await self.sweep_once()
            await trio.sleep(self.interval)

    async def sweep_once(self) -> None:
        """One sweep: plan over the cache, then delete what is due (never raises KubeError)."""
        plan = plan_retention(
            self._first_seen, failed_records(self._cached()), trio.current_time(), self.retention
        )
        self._first_seen = plan.first_seen
        for rec in plan.delete:
            await self._delete(rec)

    async def _delete(self, rec: FailedRecord) -> None:
        # Preconditions: a record that changed since the cache saw it (the machine came back
        # and a new state was written) is not ours to delete; the next sweep re-plans.
        pre = {"uid": rec.uid, "resourceVersion": rec.resource_version}
        keys = {"cluster": self._cluster, "upcoming_node": rec.name}
        try:
            await self._kube.delete(
                UPCOMING_NODES, rec.name, preconditions={k: v for k, v in pre.items() if v}
            )
        except NotFound:
            return
        except Conflict:
            log.debug(
                "retention: upcoming node changed before delete name=%s", rec.name, extra=keys
            )
            return
        except KubeError as exc:
            metrics.UPCOMING_NODE_WRITES.labels(op="retention_delete", outcome="error").inc()
            log.warning("retention: delete failed name=%s error=%s", rec.name, exc, extra=keys)
            return
        self.deleted += 1
        metrics.UPCOMING_NODE_WRITES.labels(op="retention_delete", outcome="ok").inc()
        log.info(
            "retention: deleted failed upcoming node name=%s failed_for_s=%.0f",
            rec.name,
            self.retention,
            extra={**keys, "retention_s": self.retention},
        )
