"""CapacityRequest -> :class:`Contribution` (its profile, co-location group and per-Pod demand).

Steps (docs/rules.md#roll-up-profile and the co-location rules after it): requirements
with sorted values (resources are not part of the profile, ADR-0027); DoNotSchedule spread only;
priority; the two penalty buckets; a co-location group adds a ``Same`` requirement on its
topology key. A CR that cannot be expressed raises a :class:`CapacityRequestError`. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from bigfleet_trio.quantity import Quantity, QuantityError

from .errors import InvalidCapacityRequest, UnsupportedRequirement
from .profile import (
    OP_DOES_NOT_EXIST,
    OP_EXISTS,
    OP_IN,
    OP_NOT_IN,
    WHEN_DO_NOT_SCHEDULE,
    WHEN_UNSPECIFIED,
    Profile,
    Requirement,
    Spread,
    co_location_group,
    penalty_bucket,
    with_same_requirement,
)

__all__ = ["Contribution", "contribution_from_cr", "cr_key", "is_pending"]

# Only these reach the roll-up: Gt, Lt, "" and anything else have no wire form, so such a CR is
# excluded and reported rather than silently dropped.
_CRD_OPERATORS: Final[dict[str, int]] = {
    "In": OP_IN,
    "NotIn": OP_NOT_IN,
    "Exists": OP_EXISTS,
    "DoesNotExist": OP_DOES_NOT_EXIST,
}
_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Contribution:
    """One CR's share of the roll-up: its Profile, group and per-Pod demand vector.

    Attributes:
        profile: the Profile (with Same when grouped).
        group: co-location group ("" when none).
        resources: resource name -> Quantity (non-negative), sorted by name.
    """

    profile: Profile
    group: str
    resources: Mapping[str, Quantity]

    @property
    def need_key(self) -> tuple[str, str]:
        """(fingerprint, group): the aggregation key."""
        return (self.profile.fingerprint, self.group)


def cr_key(cr: Mapping[str, Any]) -> str:
    """ "namespace/name" of a CR dict (the informer store key)."""
    md = cr.get("metadata")
    if not isinstance(md, Mapping):
        return ""
    ns = md.get("namespace") or ""
    name = md.get("name") or ""
    ns = ns if isinstance(ns, str) else ""
    name = name if isinstance(name, str) else ""
    return f"{ns}/{name}" if ns else name


def is_pending(cr: Mapping[str, Any]) -> bool:
    """True when ``status.phase`` is "" / absent / "Pending" (needs acknowledging)."""
    status = cr.get("status")
    phase = (status.get("phase") or "") if isinstance(status, Mapping) else ""
    return isinstance(phase, str) and phase in ("", "Pending")


def _list(value: object, cr: str, path: str) -> list[Any] | tuple[Any, ...]:
    """``value`` as a JSON list (None/empty -> ()); anything else is an InvalidCapacityRequest."""
    if not value:
        return ()
    if not isinstance(value, (list, tuple)):
        raise InvalidCapacityRequest(cr, path, f"expected a list, got {type(value).__name__}")
    return value


def _int32(value: object, cr: str, path: str, default: int | None = None) -> int:
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidCapacityRequest(cr, path, f"expected an int32, got {value!r}")
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise InvalidCapacityRequest(cr, path, f"{value} is outside int32")
    return value


def contribution_from_cr(cr: Mapping[str, Any]) -> Contribution:
    """Go ``profileFromCapacityRequest`` + ``coLocationGroup`` + ``withSameRequirement``.

    Args:
        cr: a CapacityRequest object (full or :func:`crview.slim` form).

    Returns:
        The CR's :class:`Contribution`.

    Raises:
        UnsupportedRequirement: an operator other than In/NotIn/Exists/DoesNotExist.
        InvalidCapacityRequest: malformed quantity (resources or penalties), negative resource,
            non-int32 priority/maxSkew, or a spec of the wrong shape.
    """
    name = cr_key(cr)
    spec = cr.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise InvalidCapacityRequest(name, "spec", f"expected an object, got {type(spec).__name__}")

    reqs = _requirements(spec, name)
    spread = _spreads(spec, name)
    priority = _int32(spec.get("priority"), name, "spec.priority", default=0)
    ib = penalty_bucket(
        spec.get("interruptionPenalty"), cr=name, field_path="spec.interruptionPenalty"
    )
    rb = penalty_bucket(
        spec.get("reclamationPenalty"), cr=name, field_path="spec.reclamationPenalty"
    )

    resources = _resources(spec, name)
    profile = Profile.new(reqs, spread, priority, ib, rb)
    col = spec.get("coLocation")
    if col is not None and not isinstance(col, Mapping):
        raise InvalidCapacityRequest(name, "spec.coLocation", "expected an object")
    sel = col.get("labelSelector") if col else None
    if sel is not None and not isinstance(sel, Mapping):
        raise InvalidCapacityRequest(name, "spec.coLocation.labelSelector", "expected an object")
    if col and not isinstance(col.get("topologyKey") or "", str):
        raise InvalidCapacityRequest(name, "spec.coLocation.topologyKey", "expected a string")
    try:
        group = co_location_group(spec)
    except InvalidCapacityRequest as e:
        raise InvalidCapacityRequest(name, f"spec.coLocation.{e.field}", e.message) from None
    if group:
        profile = with_same_requirement(profile, col["topologyKey"])  # type: ignore[index]
    return Contribution(profile, group, resources)



def _requirements(spec: Mapping[str, Any], name: str) -> list[Requirement]:
    """``spec.requirements`` as :class:`Requirement` values (errors name the CR and field)."""
    reqs: list[Requirement] = []
    for i, r in enumerate(_list(spec.get("requirements"), name, "spec.requirements")):
        path = f"spec.requirements[{i}]"
        if not isinstance(r, Mapping):
            raise InvalidCapacityRequest(name, path, "expected an object")
        op_str = r.get("operator")
        op = _CRD_OPERATORS.get(op_str) if isinstance(op_str, str) else None
        if op is None:
            raise UnsupportedRequirement(name, f"{path}.operator", op_str)
        values = r.get("values") or ()
        if not isinstance(values, (list, tuple)) or not all(isinstance(v, str) for v in values):
            raise InvalidCapacityRequest(name, f"{path}.values", "expected a list of strings")
        reqs.append(Requirement(str(r.get("key") or ""), op, tuple(values)))
    return reqs


def _spreads(spec: Mapping[str, Any], name: str) -> list[Spread]:
    """``spec.topologySpread``'s hard constraints (``ScheduleAnyway`` ones are dropped)."""
    spread: list[Spread] = []
    for i, s in enumerate(_list(spec.get("topologySpread"), name, "spec.topologySpread")):
        path = f"spec.topologySpread[{i}]"
        if not isinstance(s, Mapping):
            raise InvalidCapacityRequest(name, path, "expected an object")
        when = s.get("whenUnsatisfiable") or ""
        tk = s.get("topologyKey") or ""
        if not isinstance(tk, str):
            raise InvalidCapacityRequest(name, f"{path}.topologyKey", "expected a string")
        if when == "ScheduleAnyway":
            continue  # a preference only: soft spread never reaches the shard
        spread.append(
            Spread(
                str(s.get("topologyKey") or ""),
                _int32(s.get("maxSkew"), name, f"{path}.maxSkew", default=0),
                WHEN_DO_NOT_SCHEDULE if when == "DoNotSchedule" else WHEN_UNSPECIFIED,
            )
        )
    return spread


def _resources(spec: Mapping[str, Any], name: str) -> dict[str, Quantity]:
    """``spec.resources`` parsed, sorted by name; negative or malformed quantities raise."""
    raw_res = spec.get("resources") or {}
    if not isinstance(raw_res, Mapping):
        raise InvalidCapacityRequest(name, "spec.resources", "expected a map")
    resources: dict[str, Quantity] = {}
    for rname in sorted(raw_res):
        path = f"spec.resources[{rname}]"
        if not rname or not isinstance(rname, str):
            raise InvalidCapacityRequest(name, path, "empty resource name")
        try:
            q = Quantity.parse(raw_res[rname])
        except QuantityError as e:
            raise InvalidCapacityRequest(name, path, str(e)) from None
        if q.sign() < 0:  # negative demand would silently subtract other CRs' demand
            raise InvalidCapacityRequest(name, path, f"negative quantity {raw_res[rname]!r}")
        resources[str(rname)] = q
    return resources
