"""Enum values on the downlink that this build does not know (a newer shard's additions).

Protobuf decoding keeps an unknown enum value as a plain ``int``; handlers must not turn it into
a wrong known value (``docs/wire.md#unknown-enum-values``). :func:`unknown_enum_values` finds
them in one decoded frame (pure); :class:`UnknownEnumReporter` logs each (enum, value) once and
counts every occurrence. The session calls both before it dispatches a frame.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bigfleet_trio.observability import metrics
from bigfleet_trio.proto import pb

log = logging.getLogger(__name__)

_KNOWN: dict[str, frozenset[int]] = {
    "MachineState": frozenset(int(v) for v in pb.MachineState),
    "Confidence": frozenset(int(v) for v in pb.AvailableCapacityUpdateConfidence),
    "Operator": frozenset(int(v) for v in pb.NodeSelectorRequirementOperator),
}


@dataclass(frozen=True)
class UnknownEnum:
    """One unknown value: the enum's name, the value, and the field path in the frame."""

    enum: str
    value: int
    field: str


def _check(enum: str, value: Any, path: str) -> UnknownEnum | None:
    v = int(value)
    return None if v in _KNOWN[enum] else UnknownEnum(enum, v, path)


def _requirements(reqs: Iterable[pb.NodeSelectorRequirement]) -> list[UnknownEnum]:
    out = []
    for i, r in enumerate(reqs):
        bad = _check("Operator", r.operator, f"requirements[{i}].operator")
        if bad is not None:
            out.append(bad)
    return out


def unknown_enum_values(kind: str, payload: Any) -> list[UnknownEnum]:
    """Every enum field of one ShardMessage payload whose value this build does not know.

    Args:
        kind: the payload's oneof field name (``"node_state_update"``, ...).
        payload: the decoded payload message.

    Returns:
        The unknown values in field order; empty for a frame without enums or with none unknown.
    """
    out: list[UnknownEnum] = []
    if kind == "node_state_update":
        bad = _check("MachineState", payload.state, "state")
        if bad is not None:
            out.append(bad)
    elif kind == "available_capacity":
        out.extend(_requirements(payload.requirements))
        bad = _check("Confidence", payload.confidence, "confidence")
        if bad is not None:
            out.append(bad)
    elif kind == "bootstrap_request":
        out.extend(_requirements(payload.requirements))
    return out


def describe(unknown: Iterable[UnknownEnum]) -> str:
    """``"state=MachineState(42), ..."``: the unknown values for a log line or an error text."""
    return ", ".join(f"{u.field}={u.enum}({u.value})" for u in unknown)


class UnknownEnumReporter:
    """Logs each (frame kind, enum, value) once per process and counts every occurrence.

    The counter is ``bigfleet_operator_unknown_enum_values_total{enum}``; the log line is a
    WARNING naming the frame kind, the field and the value, the first time it is seen.
    """

    def __init__(self) -> None:
        self._seen: set[tuple[str, str, int]] = set()

    def report(self, kind: str, unknown: Iterable[UnknownEnum], action: str) -> None:
        """Record the unknown values of one frame of ``kind``; ``action`` says what was done."""
        for u in unknown:
            metrics.UNKNOWN_ENUM_VALUES.labels(enum=u.enum).inc()
            key = (kind, u.enum, u.value)
            if key in self._seen:
                continue
            self._seen.add(key)
            log.warning(
                "unknown enum value on the downlink kind=%s field=%s enum=%s value=%d: %s "
                "(logged once per value; a newer shard?)",
                kind,
                u.field,
                u.enum,
                u.value,
                action,
                extra={"kind": kind, "field": u.field, "enum": u.enum, "value": u.value},
            )


#: The process's reporter (one log line per value for the whole process, across sessions).
REPORTER = UnknownEnumReporter()
