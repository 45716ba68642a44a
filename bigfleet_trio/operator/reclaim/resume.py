"""Resuming drains after an operator restart (docs/rules.md#reclaim-resume-after-restart).

A drain's deadline lives in the operator's memory, and the shard re-issues a ReclaimInstruction
only when its ack never arrived, so a drain cut off by a crash would never run again. So the
reclaim handler records the deadline (wall clock, RFC 3339 UTC) and the Node it drains as
annotations on the UpcomingNode (:func:`drain_annotations`) before the ack, and at start-up the
operator plans from its UpcomingNode informer cache (:func:`plan_resume`, pure) and hands the
plan to the :class:`~.drain.DrainManager` (:func:`apply_resume`, thin).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from bigfleet_trio.kube.client import parse_rfc3339
from bigfleet_trio.operator.upcoming.plan import PHASE_DRAINING, rfc3339

from .plan import MAX_LAST_ERROR

if TYPE_CHECKING:
    from .drain import DrainManager

__all__ = [
    "DRAIN_DEADLINE_ANNOTATION",
    "DRAIN_NODE_ANNOTATION",
    "RESUMED_INSTRUCTION_ID",
    "ResumePlan",
    "ResumedDrain",
    "apply_resume",
    "drain_annotations",
    "expired_drain_message",
    "parse_deadline",
    "plan_resume",
    "resumed_failure_message",
    "utc_now",
]

log = logging.getLogger(__package__)

DRAIN_DEADLINE_ANNOTATION: Final = "bigfleet.lucy.sh/drain-deadline"
"""UpcomingNode annotation: when its drain must end (RFC 3339 UTC, e.g. 2026-03-01T12:00:05Z)."""
DRAIN_NODE_ANNOTATION: Final = "bigfleet.lucy.sh/drain-node"
"""UpcomingNode annotation: the Node its drain evicts (also when status.nodeRef is unset)."""
RESUMED_INSTRUCTION_ID: Final = "<resumed>"
"""``instruction_id`` of a resumed drain in log lines (the instruction itself is long gone)."""


def drain_annotations(node: str, deadline: datetime) -> dict[str, str]:
    """The annotations recording a drain of ``node`` that must end at ``deadline``."""
    return {DRAIN_DEADLINE_ANNOTATION: rfc3339(deadline), DRAIN_NODE_ANNOTATION: node}


parse_deadline = parse_rfc3339
"""A drain deadline annotation read back (:func:`~bigfleet_trio.kube.client.parse_rfc3339`)."""


@dataclass(frozen=True)
class ResumedDrain:
    """One drain to take up again.

    Attributes:
        un_name: the UpcomingNode (phase Draining).
        node: the Node to drain.
        deadline: the recorded deadline, as written.
        remaining: seconds from ``now`` to the deadline; <= 0 for :attr:`ResumePlan.expired`.
    """

    un_name: str
    node: str
    deadline: str
    remaining: float


@dataclass
class ResumePlan:
    """What :func:`plan_resume` decided.

    Attributes:
        resume: drains whose deadline is still ahead, by UpcomingNode name.
        expired: drains whose deadline passed while no operator ran: Failed at once.
        skipped: ``(UpcomingNode name, reason)`` for Draining objects not resumed.
    """

    resume: list[ResumedDrain] = field(default_factory=list)
    expired: list[ResumedDrain] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _str_at(obj: Mapping[str, Any], *path: str) -> str | None:
    cur: Any = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur if isinstance(cur, str) and cur else None


def plan_resume(upcoming: Iterable[Mapping[str, Any]], now: datetime) -> ResumePlan:
    """Drains to resume at start-up, from the cached UpcomingNodes and the wall clock.

    Only phase Draining with a :data:`DRAIN_DEADLINE_ANNOTATION` counts (other phases are not
    draining; a Draining object without it was marked by a handler that started no drain here,
    e.g. its machine had no Node). The Node is :data:`DRAIN_NODE_ANNOTATION`, else
    ``status.nodeRef.name``. One drain per Node: if several objects name the same Node, the
    first by name is resumed and the others skipped.

    Args:
        upcoming: UpcomingNode objects (e.g. the informer cache); not mutated.
        now: the current wall-clock time (aware).

    Returns:
        A :class:`ResumePlan`; every list sorted by UpcomingNode name.
    """
    plan = ResumePlan()
    nodes: dict[str, str] = {}
    named = [(name, obj) for obj in upcoming if (name := _str_at(obj, "metadata", "name"))]
    for name, obj in sorted(named, key=lambda item: item[0]):
        if _str_at(obj, "status", "phase") != PHASE_DRAINING:
            continue
        raw = _str_at(obj, "metadata", "annotations", DRAIN_DEADLINE_ANNOTATION)
        if raw is None:
            plan.skipped.append((name, "no drain-deadline annotation"))
            continue
        deadline = parse_deadline(raw)
        if deadline is None:
            plan.skipped.append((name, f"drain-deadline {raw!r} is not RFC 3339 with an offset"))
            continue
        node = _str_at(obj, "metadata", "annotations", DRAIN_NODE_ANNOTATION) or _str_at(
            obj, "status", "nodeRef", "name"
        )
        if node is None:
            plan.skipped.append((name, "no node: neither drain-node annotation nor nodeRef"))
            continue
        if node in nodes:
            plan.skipped.append((name, f"node {node} is already drained for {nodes[node]}"))
            continue
        nodes[node] = name
        item = ResumedDrain(name, node, raw, (deadline - now).total_seconds())
        (plan.resume if item.remaining > 0 else plan.expired).append(item)
    return plan


def expired_drain_message(node: str, deadline: str) -> str:
    """``lastError`` of a drain whose deadline passed while no operator was running."""
    return (
        f"drain of node {node} did not finish by its deadline {deadline}: "
        "the deadline passed while the operator was not running"
    )


def resumed_failure_message(node: str, deadline: str, pods_left: Mapping[str, str]) -> str:
    """``lastError`` of a resumed drain that hit its recorded deadline; names each Pod left."""
    parts = [f"{key} ({why})" for key, why in sorted(pods_left.items())]
    msg = (
        f"drain of node {node} (resumed after an operator restart) did not finish by its "
        f"deadline {deadline}; pods left: " + (", ".join(parts) if parts else "none listed")
    )
    return msg if len(msg) <= MAX_LAST_ERROR else msg[: MAX_LAST_ERROR - 3] + "..."


def apply_resume(drains: DrainManager, plan: ResumePlan) -> int:
    """Hand ``plan`` to the running ``drains`` (no I/O here; the drains write the outcome).

    Returns:
        How many drains were started (resumed or failed at once).
    """
    for name, reason in plan.skipped:
        log.warning("drain: not resumed upcoming=%s reason=%s", name, reason)
    started = 0
    for item in [*plan.resume, *plan.expired]:
        if drains.resume(item.node, un_name=item.un_name, remaining=item.remaining,
                         deadline=item.deadline):
            started += 1
    return started


def utc_now() -> datetime:
    """The wall clock (aware, UTC): the default of every ``wall_clock`` parameter."""
    return datetime.now(UTC)
