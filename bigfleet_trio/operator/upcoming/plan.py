"""UpcomingNode planning: NodeStateUpdate + stored object + drain memory -> :class:`UpcomingPlan`.

Pure (no I/O): object naming, the phase table, the desired spec and its comparison, the drain
memory shared with the reclaim path, and :func:`plan_node_state_update`, which decides whether
to ignore, delete, create, or merge-patch spec and/or status. The I/O that carries a plan out is
:mod:`.handler`; the rules are docs/rules.md#upcomingnode-phases.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal

from bigfleet_trio.kube.mergepatch import merge_diff
from bigfleet_trio.kube.names import DNS1123_SUBDOMAIN_MAX, is_dns1123_subdomain
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
    "DrainMark",
    "DrainMemory",
    "UpcomingPlan",
    "apply_memory",
    "phase_for_state",
    "plan_node_state_update",
    "rfc3339",
    "spec_equal",
    "spec_from_update",
    "upcoming_node_name",
]

# The package's logger: log lines keep the logger name they had before the package was split.
log = logging.getLogger(__package__)

PHASE_PROVISIONING: Final = "Provisioning"
PHASE_LAUNCHED: Final = "Launched"
PHASE_REGISTERED: Final = "Registered"
PHASE_READY: Final = "Ready"
PHASE_DRAINING: Final = "Draining"
PHASE_DRAINED: Final = "Drained"
PHASE_FAILED: Final = "Failed"
DELETE: Final = "<delete>"
"""Pseudo-phase of MachineState DELETING: the object is deleted."""

# Two choices of ours in this table (the reference mapped both to Provisioning, regressing a Ready
# object: docs/reference.md#deleting-and-unspecified-become-provisioning):
# * DELETING -> DELETE: the machine is going away, so the object is deleted; it would otherwise
#   linger as a stale record, the very growth deleting at Drained exists to stop.
# * UNSPECIFIED / unknown values are absent: no information, the update is ignored with a log line.
# IDLE maps to Launched here; plan_node_state_update turns it into Drained after a drain.
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
    """``un-<machine_id>``, sanitised if needed; None if unusable.

    Valid names (DNS-1123 subdomain, <= 253 chars) are used verbatim. Otherwise the ID is
    lower-cased, runs of invalid characters become ``-``, a run of ``-``/``.`` holding a dot
    becomes one ``.`` (every label then starts and ends alphanumeric), leading/trailing
    non-alphanumerics are stripped and ``-<first 8 hex of sha256(machine_id)>`` is appended
    (truncating to fit), so two different IDs never collide. An ID with no usable character is
    rejected (None). A sanitised or rejected ID is logged unless ``quiet`` (a caller that
    already logged it).
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
    coalescing: frames for one machine are coalesced, so DRAINING and the IDLE after it can arrive
    as one IDLE, and the reclaim path may have written Drained and deleted the object already
    (docs/reference.md#drained-lost-to-coalescing). The "drained" tombstone keeps a replayed IDLE
    (a reconnect rebroadcast) from recreating a stale Launched object; a new life
    (Provisioning/Registered/Ready) clears it. Bounded: the oldest entries are forgotten beyond
    ``capacity``.
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
                    where,
                    key,
                    exc,
                )
    return out


def spec_from_update(u: pb.NodeStateUpdate, *, quiet: bool = False) -> dict[str, Any]:
    """Desired ``spec`` for an update (the reference's ``specFromUpdate``).

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
        "resources": _canonical_resources(resources, f"machine_id={u.machine_id}", quiet=quiet)
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
    """Whether the stored spec already matches ``desired``.

    Spec is refreshed only when it changed, so this decides whether a spec PATCH is sent at all
    (the reference took a missing label for "": docs/reference.md#missing-label-equals-empty-label).

    Labels compare as exact dicts (a missing key is not ""), resources numerically per key
    (``1024Mi == 1Gi``; an unparseable stored value differs), taints pairwise in order on
    (key, value, effect) (a stored ``timeAdded`` is ignored).
    """
    existing = existing or {}
    old_labels = existing.get("labels") or {}
    if not isinstance(old_labels, Mapping) or dict(old_labels) != dict(desired.get("labels") or {}):
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
    """Decide the writes for one update (pure; docs/rules.md#upcomingnode-phases).

    Drained inference: an IDLE update means Drained -- and the object is deleted -- when the
    machine was seen leaving the cluster: ``memory`` says a drain began (a DRAINING update was
    applied, or the reclaim path walked the object to Draining/Drained), or the stored phase is
    Draining, Drained, Registered or Ready (a machine that was joining or serving this cluster and
    is Idle again has left it; this covers DRAINING+IDLE coalesced into one frame with no reclaim
    involved). After a Drained delete, an IDLE with no object is ignored, never recreated.

    Phase order: a Draining object is never taken back to Provisioning/Registered/Ready (the
    update's other fields still apply); it leaves Draining only forward (IDLE -> Drained,
    FAILED, DELETING).

    Status fields nodeRef/providerID/lastError are sticky (an empty incoming value never clears
    them); provisioningStartTime is set on the first status write. Both writes are JSON
    merge-patches carrying only changed fields (the handler guards a phase change with the
    resourceVersion planned from): the plan is "update" with both patches None when nothing
    changed.

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
    if phase == PHASE_DRAINING and existing is None and memory == "drained":
        # Our drain finished and deleted the object before the shard's own DRAINING arrived
        # (the shard moves the machine to Draining only after the ack): mirroring it would
        # create the object again just for the IDLE after it to delete it a second time.
        return UpcomingPlan(
            "ignore", name, None, "DRAINING after our drain finished and deleted it"
        )
    phase, mem_op, held = _phase_and_memory(phase, stored_phase, memory)
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
    if held:
        reason += f", phase kept at Draining (update said {phase_for_state(u.state)})"
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


def _phase_and_memory(
    phase: str, stored_phase: object, memory: DrainMark | None
) -> tuple[str, MemoryOp, bool]:
    """The phase to write, the drain-memory change, and whether a Draining phase was held."""
    if stored_phase == PHASE_DRAINING and phase in NEW_LIFECYCLE_PHASES:
        # Draining is only left forward (Drained, Failed, deleted), never back: a Provisioning/
        # Registered/Ready frame here was sent before the reclaim (a retried write, a replay, a
        # frame coalesced behind it), and taking the phase back mid-drain would hide the drain
        # from a restarted operator, which resumes only Draining objects with the record.
        return PHASE_DRAINING, "keep", True
    if phase in NEW_LIFECYCLE_PHASES:
        return phase, "forget" if memory is not None else "keep", False
    if phase == PHASE_DRAINING:
        return phase, "draining", False
    return phase, "keep", False


def apply_memory(memory: DrainMemory, plan: UpcomingPlan) -> None:
    """Apply ``plan.memory`` to ``memory`` (call after the plan's writes succeeded)."""
    if plan.memory == "draining":
        memory.mark_draining(plan.name)
    elif plan.memory == "drained":
        memory.mark_drained(plan.name)
    elif plan.memory == "forget":
        memory.forget(plan.name)


def converges_back(obj: Mapping[str, Any] | None, memory: DrainMemory) -> str | None:
    """The name of a deleted UpcomingNode that must come back, or None (controller-runtime's
    ``Owns()``; docs/rules.md#level-triggered-operator).

    ``obj``: the object as the informer last held it (a DELETED event's object, or a relist's
    tombstone). Comes back: one whose last phase was before Drained, of a machine no drain
    recorded as drained. Stays gone: one last seen Drained (the drain path deletes it there
    itself) or Failed (failed-object retention deletes those), one ``memory`` marks drained,
    and anything without a name.
    """
    if not isinstance(obj, Mapping):
        return None
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        return None
    status = obj.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    if phase in (PHASE_DRAINED, PHASE_FAILED) or memory.get(name) == "drained":
        return None
    return name
