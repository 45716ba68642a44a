"""Profile keys: the canonical profile, its injective fingerprint, penalty buckets, co-location.

A profile is what makes two Pods interchangeable for provisioning (docs/rules.md#roll-up-profile);
CRs of one (fingerprint, co-location group) fold into one need. Pure; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from bigfleet_trio.quantity import Quantity, QuantityError

from .errors import InvalidCapacityRequest

__all__ = [
    "OP_DOES_NOT_EXIST",
    "OP_EXISTS",
    "OP_IN",
    "OP_NOT_IN",
    "OP_SAME",
    "PENALTY_HALF_DOLLAR",
    "PENALTY_PINNED",
    "PENALTY_UNSPECIFIED",
    "PENALTY_ZERO",
    "WHEN_DO_NOT_SCHEDULE",
    "WHEN_UNSPECIFIED",
    "Profile",
    "Requirement",
    "Spread",
    "bucket_for_dollars",
    "canonical_label_selector",
    "co_location_group",
    "penalty_bucket",
    "with_same_requirement",
]

# NodeSelectorRequirement operator enum numbers (wire + fingerprint).
OP_IN: Final = 1
OP_NOT_IN: Final = 2
OP_EXISTS: Final = 3
OP_DOES_NOT_EXIST: Final = 4
OP_SAME: Final = 5

WHEN_UNSPECIFIED: Final = 0
WHEN_DO_NOT_SCHEDULE: Final = 1

PENALTY_UNSPECIFIED: Final = 0
PENALTY_ZERO: Final = 1
PENALTY_HALF_DOLLAR: Final = 2
PENALTY_PINNED: Final = 27


# ---------------------------------------------------------------------------- profile
@dataclass(frozen=True, slots=True, order=True)
class Requirement:
    """One node-selector requirement: key, operator enum number (1..5), sorted values."""

    key: str
    operator: int
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, order=True)
class Spread:
    """One kept topology-spread term (whenUnsatisfiable: 0 unspecified, 1 DoNotSchedule)."""

    topology_key: str
    max_skew: int
    when_unsatisfiable: int


@dataclass(frozen=True, slots=True)
class Profile:
    """Profile identity: requirements, spread, priority and the two buckets.

    Build with :meth:`new`, which canonicalises (values sorted, requirements sorted by key,
    operator number, then values; spread sorted by key, then skew, then when — the tie-breaks
    beyond Go's key-only unstable sort make the fingerprint deterministic).
    """

    requirements: tuple[Requirement, ...]
    spread: tuple[Spread, ...]
    priority: int
    interruption_bucket: int
    reclamation_bucket: int
    fingerprint: str = field(compare=False, hash=False, repr=False, default="")

    @staticmethod
    def new(
        requirements: Iterable[Requirement],
        spread: Iterable[Spread],
        priority: int,
        interruption_bucket: int,
        reclamation_bucket: int,
    ) -> Profile:
        """Canonicalise and build a Profile (Go ``needs.NewProfile``)."""
        reqs = tuple(
            sorted(
                (Requirement(r.key, r.operator, tuple(sorted(r.values))) for r in requirements),
                key=_req_sort_key,
            )
        )
        spr = tuple(sorted(spread, key=_spread_sort_key))
        fp = _fingerprint(reqs, spr, priority, interruption_bucket, reclamation_bucket)
        return Profile(reqs, spr, priority, interruption_bucket, reclamation_bucket, fp)


def _req_sort_key(r: Requirement) -> tuple[str, int, tuple[str, ...]]:
    return (r.key, r.operator, r.values)


def _spread_sort_key(s: Spread) -> tuple[str, int, int]:
    return (s.topology_key, s.max_skew, s.when_unsatisfiable)


def _fingerprint(
    reqs: tuple[Requirement, ...], spr: tuple[Spread, ...], priority: int, ib: int, rb: int
) -> str:
    """``p=<prio>|ipb=<n>|rpb=<n>|reqs=<k:op:v,v;>...|spr=<tk:skew:when;>...``.

    Keys, values and topology keys are escaped (``\\`` and the delimiters ``, ; : |`` get a
    backslash), so the fingerprint is injective -- unlike the Go code, where ``In ["a,b"]`` and
    ``In ["a","b"]`` collided and their demand was merged. Text without those characters (every
    valid label key/value) is unchanged.
    """
    parts = [f"p={priority}|ipb={ib}|rpb={rb}|reqs="]
    parts.extend(
        f"{_esc(r.key)}:{r.operator}:{','.join(_esc(v) for v in r.values)};" for r in reqs
    )
    parts.append("|spr=")
    parts.extend(f"{_esc(s.topology_key)}:{s.max_skew}:{s.when_unsatisfiable};" for s in spr)
    return "".join(parts)


_ESCAPES: Final = str.maketrans({"\\": "\\\\", ",": "\\,", ";": "\\;", ":": "\\:", "|": "\\|"})


def _esc(text: str) -> str:
    """Backslash-escape the fingerprint delimiters (a no-op for ordinary label text)."""
    return text.translate(_ESCAPES)


def with_same_requirement(profile: Profile, key: str) -> Profile:
    """Add ``{key, Same}`` at its sorted position; unchanged if already present."""
    for r in profile.requirements:
        if r.operator == OP_SAME and r.key == key:
            return profile
    return Profile.new(
        (*profile.requirements, Requirement(key, OP_SAME, ())),
        profile.spread,
        profile.priority,
        profile.interruption_bucket,
        profile.reclamation_bucket,
    )


# ---------------------------------------------------------------------------- penalties
def bucket_for_dollars(d: float) -> int:
    """Go ``needs.BucketForDollars``.

    Args:
        d: dollars (float; NaN and infinities allowed).

    Returns:
        1 ZERO for d <= 0 (incl. -Inf); 2 HALF_DOLLAR for d <= 0.5; b in 3..26 for the first
        b with d <= 2^(b-3) (inclusive upper bounds); 27 PINNED above $8,388,608, +Inf, NaN.
    """
    if d <= 0:
        return PENALTY_ZERO
    if d <= 0.5:
        return PENALTY_HALF_DOLLAR
    if not d <= 8388608.0:  # also catches NaN
        return PENALTY_PINNED
    # smallest b with d <= 2^(b-3): 2^(b-3) >= d  <=>  b-3 >= ceil(log2 d)
    mantissa, exp = math.frexp(d)  # d = mantissa * 2^exp, 0.5 <= mantissa < 1
    k = exp - 1 if mantissa == 0.5 else exp  # ceil(log2(d)), exact
    return max(3, k + 3)


def penalty_bucket(value: object, *, cr: str = "?", field_path: str = "penalty") -> int:
    """Bucket a CR penalty (int-or-string quantity of dollars); None -> 0 UNSPECIFIED.

    Raises:
        InvalidCapacityRequest: the value is not a quantity.
    """
    if value is None:
        return PENALTY_UNSPECIFIED
    try:
        q = Quantity.parse(value)  # type: ignore[arg-type]
    except QuantityError as e:
        raise InvalidCapacityRequest(cr, field_path, str(e)) from None
    return bucket_for_dollars(q.as_float())


# ---------------------------------------------------------------------------- co-location
def canonical_label_selector(sel: Mapping[str, Any] | None) -> str:
    """Go ``canonicalLabelSelector``.

    ``None`` -> ``""``; otherwise sorted ``k=v,`` pairs, one ``;``, then the expressions
    (values sorted; sorted by key, operator, joined values) as ``key op v1,v2;``.
    ``{matchLabels:{x:y}, matchExpressions:[{key:k, operator:Exists}]}`` -> ``x=y,;k Exists ;``.

    Raises:
        InvalidCapacityRequest: ``sel`` (or its matchLabels / matchExpressions / an expression /
            its values) has the wrong JSON type (field path under ``labelSelector``; cr "?").
    """
    if sel is None:
        return ""
    if not isinstance(sel, Mapping):
        raise InvalidCapacityRequest("?", "labelSelector", "expected an object")
    labels = sel.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        raise InvalidCapacityRequest("?", "labelSelector.matchLabels", "expected a map")
    out = [f"{k}={labels[k]}," for k in sorted(str(k) for k in labels)]
    out.append(";")
    exprs = []
    raw_exprs = sel.get("matchExpressions") or ()
    if not isinstance(raw_exprs, (list, tuple)):
        raise InvalidCapacityRequest("?", "labelSelector.matchExpressions", "expected a list")
    for i, e in enumerate(raw_exprs):
        if not isinstance(e, Mapping):
            raise InvalidCapacityRequest(
                "?", f"labelSelector.matchExpressions[{i}]", "expected an object"
            )
        raw_vals = e.get("values") or ()
        if not isinstance(raw_vals, (list, tuple)):
            raise InvalidCapacityRequest(
                "?", f"labelSelector.matchExpressions[{i}].values", "expected a list"
            )
        vals = ",".join(sorted(str(v) for v in raw_vals))
        exprs.append((str(e.get("key", "")), str(e.get("operator", "")), vals))
    exprs.sort()
    out.extend(f"{k} {op} {vals};" for k, op, vals in exprs)
    return "".join(out)


def co_location_group(spec: Mapping[str, Any]) -> str:
    """``topologyKey + "\\x00" + canonical selector``; "" without coLocation/topologyKey."""
    col = spec.get("coLocation")
    if not col:
        return ""
    tk = col.get("topologyKey") or ""
    if not tk:
        return ""
    return f"{tk}\x00{canonical_label_selector(col.get('labelSelector'))}"
