"""NodeStateUpdate -> UpcomingNode (seed 000 "UpcomingNode: the engine's machine lifecycle made
observable"; ref §6; issue 5 "NodeStateUpdate -> UpcomingNode").

One cluster-scoped ``UpcomingNode`` named ``un-<machine_id>`` per machine. The pure part
(:func:`plan_node_state_update`) turns (update, existing object, drain memory) into a
:class:`UpcomingPlan`: ignore, delete, create, or merge-patch spec and/or status. The thin
:class:`UpcomingNodeHandler` performs it with the KubeClient and retries (the shard does not
resend a NodeStateUpdate, so a dropped write would strand the object).

Phase table (seed 000):

=========================  =================================================================
MachineState               UpcomingNode
=========================  =================================================================
SPECULATIVE, CREATING      Provisioning
IDLE                       Launched (or Drained, see below)
CONFIGURING                Registered
CONFIGURED                 Ready
DRAINING                   Draining
FAILED                     Failed (+ lastError)
DELETING                   *our choice*: the machine is going away, so the object is deleted
                           (it would otherwise linger as a stale record, the very growth the
                           reference's delete-at-Drained was added to stop).
UNSPECIFIED / unknown      *our choice*: no information, the update is ignored with a log line
                           (the reference wrote Provisioning, regressing a Ready object, §18.15).
=========================  =================================================================

Drained inference (fixes ref §18.5): an IDLE update means Drained -- and the object is deleted --
when the machine was seen leaving the cluster: its :class:`DrainMemory` records that a drain
began (a DRAINING update was applied, or the reclaim path walked it to Draining/Drained), or the
stored phase is Draining, Drained, Registered or Ready (a machine that was joining or serving this
cluster and is Idle again has left it; this covers DRAINING+IDLE coalesced into one frame with
no reclaim involved). After a Drained delete, the memory keeps a tombstone so that a replayed IDLE
(reconnect rebroadcast) does not recreate a stale Launched object; any non-Idle state clears it.

Status fields nodeRef/providerID/lastError are sticky (an empty incoming value never clears them);
provisioningStartTime is set on the first status write. Spec (labels, resources, taints) is
refreshed only when it changed. Both writes are JSON merge-patches carrying only changed fields,
with no resourceVersion guard; nothing is written when nothing changed.

Reading the stored object (our choice, for apiserver load): with a ``get_cached`` lookup (the
operator's UpcomingNode informer store) the handler plans from the cache instead of a live GET,
so a frame costs one request (the status PATCH) instead of two. The writes stay unguarded
merge-patches of the changed fields, so a slightly stale view is harmless for the status fields
it does write. What a stale view could get wrong, and how it is handled:

* the cache lagging OUR previous write for the same machine (the session runs one worker per
  machine, sequentially, so the next frame can arrive before the watch event): the handler keeps
  a per-machine :class:`LastWrite` overlay (the object the apiserver returned from our last
  create/patch, or a tombstone after our delete) and plans from whichever of cache and overlay
  has the larger resourceVersion (:func:`choose_view`); otherwise a lagging cache would turn a
  real change into a spurious no-op (e.g. Registered -> Idle must delete, not no-op against a
  cached Launched) or lose sticky fields and the Drained inference. A cache that caught up or
  saw a later write by someone else (the reclaim path) wins and the overlay entry is dropped.
  resourceVersions are compared as integers (what every real apiserver hands out); a
  non-integer one keeps our own write.
* the object created concurrently (cache says absent): create -> AlreadyExists -> re-plan from a
  live GET; deleted concurrently (cache still has it): patch -> NotFound -> live GET, re-plan.
* the no-op short-circuit then compares against the freshest object we know of; the residual
  risk is a write by another party that neither the cache nor our overlay has seen yet, the same
  race a live GET has, only a few milliseconds wider.

Without a lookup every attempt does the live GET (the original behaviour).

Metrics (ref §6): ``bigfleet_operator_upcoming_node_writes_total{op,outcome}`` counts every write
attempt, op in create|spec_update|status_update|delete, outcome success|conflict|error|noop:
conflict is AlreadyExists/Conflict (or a patch finding the object deleted: all resolved by
re-planning), noop is a status write skipped because nothing changed or a delete of an object
already gone. ``bigfleet_operator_node_state_update_duration_seconds{phase}`` observes each update
(retries included), labelled with the phase before Drained inference (``Deleting`` for DELETING,
``Unknown`` for UNSPECIFIED/unknown states).

Names: machine IDs that are not valid object names are sanitised (lower-cased, invalid characters
replaced by ``-``, plus an 8-hex sha256 suffix so two different IDs never collide) with a log
line; IDs with no usable character are rejected.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal, Protocol

import tenacity
import trio

from bigfleet_trio.kube.client import PatchType
from bigfleet_trio.kube.errors import (
    AlreadyExists,
    Conflict,
    KubeError,
    KubeTransportError,
    NotFound,
    ServerError,
    TooManyRequests,
)
from bigfleet_trio.kube.names import DNS1123_SUBDOMAIN_MAX, is_dns1123_subdomain
from bigfleet_trio.kube.resources import UPCOMING_NODES, Resource
from bigfleet_trio.observability import metrics
from bigfleet_trio.proto import pb
from bigfleet_trio.quantity import Quantity, QuantityError

__all__ = [
    "PHASE_PROVISIONING",
    "PHASE_LAUNCHED",
    "PHASE_REGISTERED",
    "PHASE_READY",
    "PHASE_DRAINING",
    "PHASE_DRAINED",
    "PHASE_FAILED",
    "DELETE",
    "PHASE_BY_STATE",
    "DRAIN_EVIDENCE_PHASES",
    "DrainMemory",
    "apply_memory",
    "UpcomingPlan",
    "UpcomingNodeHandler",
    "CachedLookup",
    "LastWrite",
    "choose_view",
    "KubeLike",
    "Replan",
    "is_transient",
    "kube_retrying",
    "merge_diff",
    "phase_for_state",
    "plan_node_state_update",
    "rfc3339",
    "spec_from_update",
    "spec_equal",
    "upcoming_node_name",
    "patch_upcoming_status",
    "delete_upcoming",
    "duration_phase_label",
]

log = logging.getLogger(__name__)

PHASE_PROVISIONING: Final = "Provisioning"
PHASE_LAUNCHED: Final = "Launched"
PHASE_REGISTERED: Final = "Registered"
PHASE_READY: Final = "Ready"
PHASE_DRAINING: Final = "Draining"
PHASE_DRAINED: Final = "Drained"
PHASE_FAILED: Final = "Failed"
DELETE: Final = "<delete>"
"""Pseudo-phase of MachineState DELETING: the object is deleted."""

MS = pb.MachineState
PHASE_BY_STATE: Final[Mapping[int, str]] = {
    MS.SPECULATIVE: PHASE_PROVISIONING,
    MS.CREATING: PHASE_PROVISIONING,
    MS.IDLE: PHASE_LAUNCHED,
    MS.CONFIGURING: PHASE_REGISTERED,
    MS.CONFIGURED: PHASE_READY,
    MS.DRAINING: PHASE_DRAINING,
    MS.DELETING: DELETE,
    MS.FAILED: PHASE_FAILED,
}
"""MachineState value -> phase (or :data:`DELETE`); UNSPECIFIED and unknown values are absent."""

DRAIN_EVIDENCE_PHASES: Final = frozenset(
    {PHASE_DRAINING, PHASE_DRAINED, PHASE_REGISTERED, PHASE_READY}
)
"""Stored phases after which an IDLE update means the machine left the cluster (Drained)."""

NEW_LIFECYCLE_PHASES: Final = frozenset({PHASE_PROVISIONING, PHASE_REGISTERED, PHASE_READY})
"""Phases that start a new life for the machine: they clear the drain memory."""

UN_PREFIX: Final = "un-"
_INVALID_CHARS = re.compile(r"[^a-z0-9.-]+")
_DOT_RUN = re.compile(r"[-.]*\.[-.]*")


def rfc3339(when: datetime) -> str:
    """RFC 3339 UTC, second precision, ``Z`` suffix (e.g. ``2026-03-01T12:00:05Z``)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def phase_for_state(state: int) -> str | None:
    """MachineState -> UpcomingNode phase, :data:`DELETE`, or None (UNSPECIFIED/unknown)."""
    return PHASE_BY_STATE.get(int(state))


def upcoming_node_name(machine_id: str, *, quiet: bool = False) -> str | None:
    """``un-<machine_id>``, sanitised if needed (see module docstring); None if unusable.

    Valid names (DNS-1123 subdomain, <= 253 chars) are used verbatim. Otherwise the ID is
    lower-cased, runs of invalid characters become ``-``, a run of ``-``/``.`` holding a dot
    becomes one ``.`` (every label then starts and ends alphanumeric), leading/trailing
    non-alphanumerics are stripped and ``-<first 8 hex of sha256(machine_id)>`` is appended
    (truncating to fit).
    A sanitised or rejected ID is logged unless ``quiet`` (a caller that already logged it).
    """
    if not machine_id:
        return None
    plain = UN_PREFIX + machine_id
    if is_dns1123_subdomain(plain):  # what the apiserver checks ("a..b", "a.-b" are not names)
        return plain
    suffix = hashlib.sha256(machine_id.encode("utf-8")).hexdigest()[:8]
    body = _DOT_RUN.sub(".", _INVALID_CHARS.sub("-", machine_id.lower()))
    body = re.sub(r"^[^a-z0-9]+|[^a-z0-9]+$", "", body)
    if not body:
        if quiet:
            return None
        log.warning(
            "upcoming: machine_id has no usable character, rejected machine_id=%r", machine_id
        )
        return None
    body = body[: DNS1123_SUBDOMAIN_MAX - len(UN_PREFIX) - len(suffix) - 1].rstrip(".-")
    name = f"{UN_PREFIX}{body}-{suffix}"
    if not quiet:
        log.info("upcoming: machine_id sanitised machine_id=%r name=%s", machine_id, name)
    return name


# --------------------------------------------------------------------------- drain memory

DrainMark = Literal["draining", "drained"]


class DrainMemory:
    """Per-UpcomingNode memory that a drain began ("draining") or ended ("drained", tombstone).

    Shared by the NodeStateUpdate handler and the reclaim path so the Drained inference survives
    coalescing. Bounded: the oldest entries are forgotten beyond ``capacity``.
    """

    def __init__(self, capacity: int = 65536) -> None:
        self._marks: OrderedDict[str, DrainMark] = OrderedDict()
        self._capacity = capacity

    def get(self, name: str) -> DrainMark | None:
        """The mark for ``name``, or None."""
        return self._marks.get(name)

    def set(self, name: str, mark: DrainMark) -> None:
        """Record ``mark`` for ``name`` (most recent)."""
        self._marks[name] = mark
        self._marks.move_to_end(name)
        while len(self._marks) > self._capacity:
            self._marks.popitem(last=False)

    def mark_draining(self, name: str) -> None:
        """A drain began (DRAINING applied, or reclaim walked the object to Draining)."""
        self.set(name, "draining")

    def mark_drained(self, name: str) -> None:
        """The object reached Drained and was deleted (tombstone against a replayed IDLE)."""
        self.set(name, "drained")

    def forget(self, name: str) -> None:
        """Drop any mark (the machine started a new life)."""
        self._marks.pop(name, None)

    def __len__(self) -> int:
        return len(self._marks)


# --------------------------------------------------------------------------- spec


def _canonical_resources(
    raw: Mapping[str, str], where: str, *, quiet: bool = False
) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in sorted(raw.items()):
        try:
            out[key] = str(Quantity.parse(value))
        except QuantityError as exc:
            if not quiet:
                log.warning(
                    "upcoming: malformed quantity skipped %s resource=%s error=%s",
                    where, key, exc,
                )
    return out


def spec_from_update(u: pb.NodeStateUpdate, *, quiet: bool = False) -> dict[str, Any]:
    """Desired ``spec`` for an update (ref §6 ``specFromUpdate``).

    Args:
        u: the update.
        quiet: skip malformed quantities without the log line (a caller that logs them once).

    Returns:
        ``{"resources": {name: canonical quantity}}`` (always present, possibly empty), plus
        ``"labels": {...}`` when the update has labels and ``"taints": [{key, value, effect}]``
        when it has taints. Malformed quantities are skipped with a log line unless ``quiet``.
    """
    resources = u.resources.resources if u.resources is not None else {}
    spec: dict[str, Any] = {
        "resources": _canonical_resources(
            resources, f"machine_id={u.machine_id}", quiet=quiet
        )
    }
    if u.labels:
        spec["labels"] = dict(u.labels)
    if u.taints:
        spec["taints"] = [{"key": t.key, "value": t.value, "effect": t.effect} for t in u.taints]
    return spec


def _quantity_or_none(value: Any) -> Quantity | None:
    try:
        return Quantity.parse(value)
    except QuantityError:
        return None


def _taint_view(t: Any) -> tuple[str, str, str] | None:
    if not isinstance(t, Mapping):
        return None
    return (str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))


def spec_equal(existing: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    """Whether the stored spec already matches ``desired`` (fixes ref §18.7).

    Labels compare as exact dicts (a missing key is not ""), resources numerically per key
    (``1024Mi == 1Gi``; an unparseable stored value differs), taints pairwise in order on
    (key, value, effect) (a stored ``timeAdded`` is ignored).
    """
    existing = existing or {}
    old_labels = existing.get("labels") or {}
    if not isinstance(old_labels, Mapping) or dict(old_labels) != dict(
        desired.get("labels") or {}
    ):
        return False  # a stored non-map (hand-edited, hostile) is simply "different"
    old_res = existing.get("resources") or {}
    new_res = desired.get("resources") or {}
    if not isinstance(old_res, Mapping) or set(old_res) != set(new_res):
        return False
    for key, value in new_res.items():
        old_q = _quantity_or_none(old_res[key])
        if old_q is None or old_q != Quantity.parse(value):
            return False
    old_taints = existing.get("taints") or []
    new_taints = desired.get("taints") or []
    if not isinstance(old_taints, list) or len(old_taints) != len(new_taints):
        return False
    return all(
        _taint_view(a) == _taint_view(b) for a, b in zip(old_taints, new_taints, strict=True)
    )


def merge_diff(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge-patch turning ``old`` into ``new`` (like Go's ``client.MergeFrom``).

    Keys of ``new`` that differ are set (nested mappings recursively), keys only in ``old`` become
    ``None`` (JSON null); lists are replaced wholesale. Equal inputs give ``{}``.
    """
    old = old or {}
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
            continue
        before = old[key]
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_diff(before, value)
            if sub:
                patch[key] = sub
        elif before != value:
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


def _spec_patch(existing: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> dict[str, Any]:
    """Changed spec fields only (``labels``/``resources``/``taints``; other fields untouched)."""
    existing = existing or {}
    owned_old = {k: existing[k] for k in ("labels", "resources", "taints") if k in existing}
    diff = merge_diff(owned_old, desired)
    if "resources" in diff and isinstance(diff["resources"], dict):
        # numerically equal quantities spelled differently are not a change
        old_res = existing.get("resources") or {}
        if not isinstance(old_res, Mapping):
            old_res = {}
        for key in [k for k, v in diff["resources"].items() if v is not None and k in old_res]:
            old_q = _quantity_or_none(old_res[key])
            if old_q is not None and old_q == Quantity.parse(diff["resources"][key]):
                del diff["resources"][key]
        if not diff["resources"]:
            del diff["resources"]
    return diff


# --------------------------------------------------------------------------- plan

PlanOp = Literal["ignore", "delete", "create", "update"]
MemoryOp = Literal["keep", "draining", "drained", "forget"]


@dataclass(frozen=True)
class UpcomingPlan:
    """What to do for one NodeStateUpdate (pure result of :func:`plan_node_state_update`).

    Attributes:
        op: "ignore" (nothing to write), "delete", "create" (then ``status_patch``), or
            "update" (``spec_patch`` and/or ``status_patch``; both None means a no-op).
        name: the UpcomingNode name ("" when the update was rejected).
        phase: the phase after inference (Drained included), or None when ignored/deleted for
            DELETING.
        reason: short explanation for the log line.
        spec: the full desired spec (body of a create).
        spec_patch: ``{"spec": {...changed fields...}}`` or None.
        status_patch: ``{"status": {...changed fields...}}`` or None.
        memory: how the drain memory changes once the write succeeded.
    """

    op: PlanOp
    name: str
    phase: str | None
    reason: str
    spec: dict[str, Any] = field(default_factory=dict)
    spec_patch: dict[str, Any] | None = None
    status_patch: dict[str, Any] | None = None
    memory: MemoryOp = "keep"


def _desired_status(
    u: pb.NodeStateUpdate, phase: str, existing_status: Mapping[str, Any], now: datetime
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    node_ref = existing_status.get("nodeRef")
    if u.node_name:
        node_ref = {"kind": "Node", "name": u.node_name}
    if node_ref:
        status["nodeRef"] = node_ref
    provider_id = u.provider_id or existing_status.get("providerID")
    if provider_id:
        status["providerID"] = provider_id
    last_error = u.last_error or existing_status.get("lastError")
    if last_error:
        status["lastError"] = last_error
    status["provisioningStartTime"] = existing_status.get("provisioningStartTime") or rfc3339(now)
    return status


def _status_patch(existing_status: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    patch: dict[str, Any] = {}
    for key, value in desired.items():
        before = existing_status.get(key)
        if key == "nodeRef" and isinstance(before, Mapping):
            same = before.get("kind") == value.get("kind") and before.get("name") == value.get(
                "name"
            )
            if not same:
                patch[key] = value
        elif before != value:
            patch[key] = value
    return patch


def plan_node_state_update(
    u: pb.NodeStateUpdate,
    existing: Mapping[str, Any] | None,
    memory: DrainMark | None,
    now: datetime,
) -> UpcomingPlan:
    """Decide the writes for one update (pure; seed 000 "UpcomingNode"; ref §6 steps 1-8).

    Args:
        u: the (latest, possibly coalesced) update.
        existing: the stored UpcomingNode, or None if it does not exist.
        memory: the :class:`DrainMemory` mark of this object.
        now: wall-clock time, used for ``provisioningStartTime`` on the first status write.

    Returns:
        The :class:`UpcomingPlan`.
    """
    if not u.machine_id:
        return UpcomingPlan("ignore", "", None, "empty machine_id")
    name = upcoming_node_name(u.machine_id, quiet=True)  # pure: the handler logs the naming
    if name is None:
        return UpcomingPlan("ignore", "", None, "invalid machine_id")
    phase = phase_for_state(u.state)
    if phase is None:
        return UpcomingPlan("ignore", name, None, f"machine state {int(u.state)} carries no phase")
    existing_status: Mapping[str, Any] = {}
    if existing is not None and isinstance(existing.get("status"), Mapping):
        existing_status = existing["status"]
    stored_phase = existing_status.get("phase")
    if phase == DELETE:
        if existing is None:
            return UpcomingPlan("ignore", name, None, "DELETING and no object", memory="forget")
        return UpcomingPlan("delete", name, None, "machine DELETING", memory="forget")
    if phase == PHASE_LAUNCHED:
        if memory is not None or stored_phase in DRAIN_EVIDENCE_PHASES:
            why = f"Idle after drain (memory={memory}, stored={stored_phase or '-'})"
            if existing is None:
                # the object is already gone (deleted at Drained): never recreate it as Launched
                return UpcomingPlan("ignore", name, PHASE_DRAINED, why + ", already deleted")
            return UpcomingPlan("delete", name, PHASE_DRAINED, why, memory="drained")
    if phase in NEW_LIFECYCLE_PHASES:
        mem_op: MemoryOp = "forget" if memory is not None else "keep"
    elif phase == PHASE_DRAINING:
        mem_op = "draining"
    else:
        mem_op = "keep"
    spec = spec_from_update(u, quiet=True)  # pure: the handler logs skipped quantities
    status = _desired_status(u, phase, existing_status, now)
    if existing is None:
        return UpcomingPlan(
            "create",
            name,
            phase,
            "new machine",
            spec=spec,
            status_patch={"status": status},
            memory=mem_op,
        )
    existing_spec = existing.get("spec") if isinstance(existing.get("spec"), Mapping) else None
    spec_patch = None
    if not spec_equal(existing_spec, spec):
        diff = _spec_patch(existing_spec, spec)
        spec_patch = {"spec": diff} if diff else None
    status_diff = _status_patch(existing_status, status)
    status_patch = {"status": status_diff} if status_diff else None
    reason = "changed" if (spec_patch or status_patch) else "no-op"
    return UpcomingPlan(
        "update",
        name,
        phase,
        reason,
        spec=spec,
        spec_patch=spec_patch,
        status_patch=status_patch,
        memory=mem_op,
    )


def apply_memory(memory: DrainMemory, plan: UpcomingPlan) -> None:
    """Apply ``plan.memory`` to ``memory`` (call after the plan's writes succeeded)."""
    if plan.memory == "draining":
        memory.mark_draining(plan.name)
    elif plan.memory == "drained":
        memory.mark_drained(plan.name)
    elif plan.memory == "forget":
        memory.forget(plan.name)


# --------------------------------------------------------------------------- I/O


class KubeLike(Protocol):
    """The KubeClient methods used here (docs/kube-api.md)."""

    async def get(
        self, res: Resource, name: str, namespace: str | None = None
    ) -> dict[str, Any]: ...

    async def create(
        self, res: Resource, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]: ...

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
    ) -> dict[str, Any]: ...

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        propagation_policy: str | None = None,
        preconditions: dict[str, Any] | None = None,
        grace_period_seconds: int | None = None,
    ) -> dict[str, Any] | None: ...


class Replan(Exception):
    """The object changed under us (created or deleted concurrently): fetch again and re-plan."""


WriteOp = Literal["create", "spec_update", "status_update", "delete"]
WriteOutcome = Literal["success", "conflict", "error", "noop"]


def _count_write(op: WriteOp, outcome: WriteOutcome) -> None:
    metrics.UPCOMING_NODE_WRITES.labels(op, outcome).inc()


def _failed_write_outcome(exc: BaseException) -> WriteOutcome:
    """conflict for AlreadyExists/Conflict/NotFound-on-patch (re-plan material), else error."""
    return "conflict" if isinstance(exc, (AlreadyExists, Conflict, NotFound)) else "error"


def duration_phase_label(state: int) -> str:
    """``phase`` label of the duration histogram: the phase before Drained inference,
    ``Deleting`` for DELETING and ``Unknown`` for UNSPECIFIED/unknown states."""
    phase = phase_for_state(state)
    if phase is None:
        return "Unknown"
    return "Deleting" if phase == DELETE else phase


def is_transient(exc: BaseException) -> bool:
    """Retryable Kubernetes failures: Conflict, 429, 5xx, transport errors, re-plan signals."""
    return isinstance(exc, (Conflict, TooManyRequests, ServerError, KubeTransportError, Replan))


def kube_retrying(
    attempts: int = 8, initial: float = 0.1, max_wait: float = 5.0
) -> tenacity.AsyncRetrying:
    """Tenacity policy for apiserver writes under Trio: transient errors only, exponential
    backoff with jitter from ``initial`` up to ``max_wait`` seconds, ``attempts`` tries, then
    the last error is re-raised."""
    return tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception(is_transient),
        stop=tenacity.stop_after_attempt(attempts),
        wait=tenacity.wait_exponential(multiplier=initial, max=max_wait)
        + tenacity.wait_random(0, initial),
        sleep=trio.sleep,
        reraise=True,
    )


async def patch_upcoming_status(
    client: KubeLike, name: str, status: dict[str, Any], *, attempts: int = 8
) -> bool:
    """Merge-patch ``{"status": status}`` on an UpcomingNode, retrying transient errors.

    Returns:
        True if written, False if the object does not exist.

    Raises:
        KubeError: a permanent failure, or the last transient one after ``attempts`` tries.
    """
    try:
        async for attempt in kube_retrying(attempts):
            with attempt:
                await client.patch(UPCOMING_NODES, name, {"status": status}, subresource="status")
    except NotFound:
        return False
    return True


async def delete_upcoming(client: KubeLike, name: str, *, attempts: int = 8) -> bool:
    """Delete an UpcomingNode, retrying transient errors. Returns False if it was already gone."""
    try:
        async for attempt in kube_retrying(attempts):
            with attempt:
                await client.delete(UPCOMING_NODES, name)
    except NotFound:
        return False
    return True


CachedLookup = Callable[[str], Mapping[str, Any] | None]
"""``get_cached(name) -> object | None``: an UpcomingNode from the informer cache (not mutated)."""


def _resource_version(obj: Mapping[str, Any] | None) -> int | None:
    """``metadata.resourceVersion`` as an int, or None (absent or not an integer)."""
    if not isinstance(obj, Mapping):
        return None
    meta = obj.get("metadata")
    raw = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    try:
        return int(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class LastWrite:
    """What our last write left on the apiserver for one UpcomingNode (the handler's overlay).

    Attributes:
        obj: the object the apiserver returned from our create/patch (or a live GET), or None
            after we deleted it (a tombstone).
        rv: its resourceVersion as an int (for a tombstone: that of the deleted object), or None
            when unknown / not an integer.
    """

    obj: Mapping[str, Any] | None
    rv: int | None

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> LastWrite:
        """The object we just wrote (or read live)."""
        return cls(obj, _resource_version(obj))

    @classmethod
    def deleted(cls, resource_version: Any) -> LastWrite:
        """A tombstone: we deleted the object whose last resourceVersion was this."""
        return cls(None, _resource_version({"metadata": {"resourceVersion": resource_version}}))


def choose_view(
    cached: Mapping[str, Any] | None, written: LastWrite | None
) -> tuple[Mapping[str, Any] | None, bool]:
    """The object to plan from: the informer cache or our last write, whichever is fresher.

    Pure (see the module docstring, "Reading the stored object").

    Args:
        cached: the object in the informer cache, or None (not there).
        written: our overlay entry for the same name, or None.

    Returns:
        ``(view, keep)``: ``view`` is the object to plan from (None = does not exist);
        ``keep`` is False when the overlay entry is superseded and can be dropped.

    Rules: no overlay -> the cache. Cache absent -> our object (cache lags our create; if someone
    deleted it the patch's NotFound re-plans), or None after our delete (tombstone dropped: the
    cache saw it). Both present -> the larger integer resourceVersion, the cache on a tie (it
    caught up; overlay dropped); a tombstone hides cached copies up to the deleted rv (stale
    pre-delete state) and yields to a larger one (a new object). A non-integer rv keeps ours.
    """
    if written is None:
        return cached, False
    if cached is None:
        return written.obj, written.obj is not None
    cached_rv = _resource_version(cached)
    if cached_rv is not None and written.rv is not None:
        if written.obj is None:
            return (cached, False) if cached_rv > written.rv else (None, True)
        return (cached, False) if cached_rv >= written.rv else (written.obj, True)
    return written.obj, True



def _once(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` wrapped to run on the first call only (later calls do nothing)."""
    done = False

    def call() -> None:
        nonlocal done
        if not done:
            done = True
            fn()

    return call

class UpcomingNodeHandler:
    """Applies NodeStateUpdates to UpcomingNode objects (the session's ``on_node_state_update``).

    Args:
        client: a KubeClient.
        memory: the :class:`DrainMemory` shared with the reclaim path.
        now: wall clock (aware datetime), injectable for tests.
        attempts: tries per update for transient errors (Conflict, 429, 5xx, transport).
        get_cached: optional :data:`CachedLookup` (the UpcomingNode informer store's ``get``):
            plan from it plus our :class:`LastWrite` overlay instead of a live GET, falling back
            to the live GET after AlreadyExists/NotFound/Conflict. None: always a live GET.
        overlay_capacity: most overlay entries kept (oldest forgotten first); entries are also
            dropped as soon as the cache catches up.
    """

    def __init__(
        self,
        client: KubeLike,
        memory: DrainMemory,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        attempts: int = 8,
        get_cached: CachedLookup | None = None,
        overlay_capacity: int = 65536,
    ) -> None:
        self._client = client
        self.memory = memory
        self._now = now
        self._attempts = attempts
        self._get_cached = get_cached
        self._written: OrderedDict[str, LastWrite] = OrderedDict()
        self._overlay_capacity = overlay_capacity

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> None:
        """Reflect one update; logs and gives up (never raises) on a permanent error."""
        started = trio.current_time()
        live = self._get_cached is None
        # Once per update, so retries repeat neither the naming nor its log lines (the planner
        # computes both again, quietly): the name here, malformed quantities on the first write.
        name = upcoming_node_name(u.machine_id) if u.machine_id else None
        warn_quantities = _once(lambda: spec_from_update(u))
        try:
            async for attempt in kube_retrying(self._attempts):
                with attempt:
                    try:
                        await self._apply_once(u, name, warn_quantities, live=live)
                    except (Replan, Conflict):
                        if not live:
                            log.info(
                                "upcoming: cached view out of date, re-reading live "
                                "machine_id=%s state=%s",
                                u.machine_id,
                                u.state,
                            )
                        live = True
                        raise
        except (KubeError, Replan) as exc:
            log.error(
                "upcoming: write failed, giving up machine_id=%s state=%s error=%s",
                u.machine_id,
                u.state,
                exc,
            )
        finally:
            metrics.NODE_STATE_UPDATE_DURATION.labels(duration_phase_label(u.state)).observe(
                trio.current_time() - started
            )

    async def _get(self, name: str) -> dict[str, Any] | None:
        try:
            return await self._client.get(UPCOMING_NODES, name)
        except NotFound:
            return None

    def _remember(self, name: str, entry: LastWrite | None) -> None:
        """Set (or with None drop) the overlay entry; only kept when a cache is in use."""
        if self._get_cached is None:
            return
        if entry is None:
            self._written.pop(name, None)
            return
        self._written[name] = entry
        self._written.move_to_end(name)
        while len(self._written) > self._overlay_capacity:
            self._written.popitem(last=False)

    def _remember_obj(self, name: str, obj: Any) -> None:
        """Overlay the object the apiserver returned from a write (ignored if not an object)."""
        if isinstance(obj, Mapping):
            self._remember(name, LastWrite.of(obj))

    async def _existing(self, name: str, live: bool) -> Mapping[str, Any] | None:
        """The object to plan from: live GET, or cache + overlay (:func:`choose_view`)."""
        if self._get_cached is None:
            return await self._get(name)
        if live:
            obj = await self._get(name)
            self._remember(name, LastWrite.of(obj) if obj is not None else None)
            return obj
        view, keep = choose_view(self._get_cached(name), self._written.get(name))
        if not keep:
            self._written.pop(name, None)
        return view

    async def _apply_once(
        self,
        u: pb.NodeStateUpdate,
        name: str | None,
        before_write: Callable[[], object],
        *,
        live: bool = True,
    ) -> None:
        """One attempt: plan from the current view of ``name`` (``upcoming_node_name`` of the
        update's machine_id, None if unusable) and write; ``before_write`` runs before a create
        or update (not for ignore/delete).

        Raises:
            Replan, KubeError: the attempt failed; the caller retries (see kube_retrying).
        """
        existing = await self._existing(name, live) if name else None
        plan = plan_node_state_update(
            u, existing, self.memory.get(name) if name else None, self._now()
        )
        if plan.op == "ignore":
            log.info(
                "upcoming: ignored machine_id=%r name=%s reason=%s",
                u.machine_id,
                plan.name,
                plan.reason,
            )
            apply_memory(self.memory, plan)
            return
        if plan.op == "delete":
            gone = not await self._delete(plan.name)
            meta = existing.get("metadata") if existing is not None else None
            last_rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
            self._remember(plan.name, LastWrite.deleted(last_rv))
            log.info(
                "upcoming: deleted name=%s phase=%s reason=%s already_gone=%s",
                plan.name,
                plan.phase,
                plan.reason,
                gone,
            )
            apply_memory(self.memory, plan)
            return
        before_write()
        if plan.op == "create":
            body = {
                "apiVersion": UPCOMING_NODES.api_version,
                "kind": UPCOMING_NODES.kind,
                "metadata": {"name": plan.name},
                "spec": plan.spec,
            }
            try:
                created = await self._client.create(UPCOMING_NODES, body)
            except AlreadyExists as exc:
                _count_write("create", "conflict")
                raise Replan(f"UpcomingNode {plan.name} created concurrently") from exc
            except KubeError as exc:
                _count_write("create", _failed_write_outcome(exc))
                raise
            _count_write("create", "success")
            self._remember_obj(plan.name, created)
            log.info("upcoming: created name=%s phase=%s", plan.name, plan.phase)
        elif plan.spec_patch is not None:
            await self._patch(plan.name, plan.spec_patch, None)
            log.info(
                "upcoming: spec updated name=%s fields=%s",
                plan.name,
                sorted(plan.spec_patch["spec"]),
            )
        if plan.status_patch is not None:
            await self._patch(plan.name, plan.status_patch, "status")
            log.info(
                "upcoming: status written name=%s phase=%s fields=%s",
                plan.name,
                plan.phase,
                sorted(plan.status_patch["status"]),
            )
        else:
            _count_write("status_update", "noop")
            if plan.spec_patch is None:
                log.debug("upcoming: no-op name=%s phase=%s", plan.name, plan.phase)
        apply_memory(self.memory, plan)

    async def _patch(self, name: str, body: dict[str, Any], subresource: str | None) -> None:
        op: WriteOp = "status_update" if subresource == "status" else "spec_update"
        try:
            written = await self._client.patch(UPCOMING_NODES, name, body, subresource=subresource)
        except NotFound as exc:
            _count_write(op, "conflict")
            raise Replan(f"UpcomingNode {name} deleted concurrently") from exc
        except KubeError as exc:
            _count_write(op, _failed_write_outcome(exc))
            raise
        _count_write(op, "success")
        self._remember_obj(name, written)

    async def _delete(self, name: str) -> bool:
        try:
            await self._client.delete(UPCOMING_NODES, name)
        except NotFound:
            _count_write("delete", "noop")
            return False
        except KubeError as exc:
            _count_write("delete", _failed_write_outcome(exc))
            raise
        _count_write("delete", "success")
        return True
