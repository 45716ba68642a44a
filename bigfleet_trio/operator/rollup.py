"""Roll-up pure core: CapacityRequest -> Profile/group/demand -> aggregated CapacityNeeds.

Builds the roll-up the way the Go agent does (``pkg/operator/rollup.go``, ``pkg/needs``), minus
its known bugs (``docs/deviations.md``, section 2). No I/O here; the Trio task that lists/acks
lives elsewhere and drives :class:`RollupAggregator` from informer events.

Pipeline per CR (:func:`contribution_from_cr`):

1. Profile (ADR-0027: resources are NOT part of it): requirements with sorted values, sorted
   by (key, operator enum number, values); DoNotSchedule spread only (ScheduleAnyway dropped,
   ""/unknown kept as 0); priority; interruption and reclamation penalty buckets.
2. Co-location group: ``topologyKey + "\\x00" + canonical_label_selector(labelSelector)``;
   a non-empty group adds a ``Same`` requirement on the topologyKey at its sorted
   position, idempotently.
3. The CR's ``spec.resources`` is its per-Pod demand vector.

Aggregation by (fingerprint, group): aggregate_resources = per-resource sum, min_unit =
per-resource max, canonical quantity strings; needs ordered by (fingerprint, group).

Deviations from the Go reference (all deliberate):

* Needs are sorted by (fingerprint, group) instead of the first-seen order of an unordered
  cache list, so equal inputs give byte-identical roll-ups.
* Quantity strings are always canonical. Go keeps a single-CR need's raw ``String()`` form,
  which is canonical except for a few cached spellings (``+1``, ``1E3``); values are equal.
* Go's sum keeps the format of whichever CR the (random-order) list yields first, and max keeps
  the first of equal maxima, so mixed formats (``1Gi`` and ``1073741824``) print
  order-dependently there. Here the format is chosen order-independently: among the non-zero
  contributors (sum) or the contributors holding the maximum (max), BinarySI wins over
  DecimalSI, which wins over DecimalExponent. Values are identical either way.
* A CR whose requirements use an operator the wire cannot carry (Gt, Lt, "", anything else)
  raises :class:`UnsupportedRequirement`; the Go code drops it silently and forever. The
  aggregator records it in :meth:`RollupAggregator.excluded` so the task can emit an Event,
  a log line and a metric.
* Malformed quantities raise :class:`InvalidCapacityRequest` naming the CR and field (Go turns
  an unparseable quantity into 0). Negative resource quantities are rejected the same way:
  negative demand would silently subtract from other CRs' demand.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from bigfleet_trio.proto import pb
from bigfleet_trio.quantity import (
    BINARY_SI,
    DECIMAL_EXPONENT,
    DECIMAL_SI,
    EXACT_CONTEXT,
    Format,
    Quantity,
    QuantityError,
)
from bigfleet_trio.shard.codec import EncodedFrame

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
    "CapacityRequestError",
    "Contribution",
    "InvalidCapacityRequest",
    "Profile",
    "Requirement",
    "RollupAggregator",
    "Spread",
    "UnsupportedRequirement",
    "bucket_for_dollars",
    "build_from_scratch",
    "build_rollup_message",
    "canonical_label_selector",
    "co_location_group",
    "contribution_from_cr",
    "encode_need",
    "encode_operator_rollup",
    "encode_rollup",
    "cr_key",
    "is_pending",
    "need_to_wire",
    "penalty_bucket",
    "with_same_requirement",
]

# NodeSelectorRequirement operator enum numbers (wire + fingerprint).
OP_IN: Final = 1
OP_NOT_IN: Final = 2
OP_EXISTS: Final = 3
OP_DOES_NOT_EXIST: Final = 4
OP_SAME: Final = 5
_CRD_OPERATORS: Final[dict[str, int]] = {
    "In": OP_IN,
    "NotIn": OP_NOT_IN,
    "Exists": OP_EXISTS,
    "DoesNotExist": OP_DOES_NOT_EXIST,
}

WHEN_UNSPECIFIED: Final = 0
WHEN_DO_NOT_SCHEDULE: Final = 1

PENALTY_UNSPECIFIED: Final = 0
PENALTY_ZERO: Final = 1
PENALTY_HALF_DOLLAR: Final = 2
PENALTY_PINNED: Final = 27

_SPEC_CACHE_LIMIT: Final = 20_000
_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1


# ---------------------------------------------------------------------------- errors
class CapacityRequestError(ValueError):
    """A CapacityRequest that cannot contribute to the roll-up.

    Attributes:
        cr: "namespace/name" of the CR.
        field: the offending field path (e.g. ``spec.resources[cpu]``).
        message: what is wrong with it.
        reason: short machine-friendly reason (Event reason / metric label).
    """

    reason = "InvalidCapacityRequest"

    def __init__(self, cr: str, field_path: str, message: str) -> None:
        super().__init__(f"CapacityRequest {cr}: {field_path}: {message}")
        self.cr = cr
        self.field = field_path
        self.message = message


class UnsupportedRequirement(CapacityRequestError):
    """A requirement operator the wire cannot carry (Gt, Lt, "", anything else).

    Attributes:
        operator: the operator string as written in the CR.
    """

    reason = "UnsupportedRequirement"

    def __init__(self, cr: str, field_path: str, operator: object) -> None:
        super().__init__(
            cr,
            field_path,
            f"unsupported NodeSelectorOperator {operator!r} "
            "(only In, NotIn, Exists, DoesNotExist reach the roll-up)",
        )
        self.operator = operator


class InvalidCapacityRequest(CapacityRequestError):
    """A malformed field: bad quantity, negative resource, wrong type."""


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


# ---------------------------------------------------------------------------- contribution
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
            continue  # M68b: soft spread never reaches the engine
        spread.append(
            Spread(
                str(s.get("topologyKey") or ""),
                _int32(s.get("maxSkew"), name, f"{path}.maxSkew", default=0),
                WHEN_DO_NOT_SCHEDULE if when == "DoNotSchedule" else WHEN_UNSPECIFIED,
            )
        )

    priority = _int32(spec.get("priority"), name, "spec.priority", default=0)
    ib = penalty_bucket(
        spec.get("interruptionPenalty"), cr=name, field_path="spec.interruptionPenalty"
    )
    rb = penalty_bucket(
        spec.get("reclamationPenalty"), cr=name, field_path="spec.reclamationPenalty"
    )

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
        if q.sign() < 0:
            raise InvalidCapacityRequest(name, path, f"negative quantity {raw_res[rname]!r}")
        resources[str(rname)] = q

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


# ---------------------------------------------------------------------------- wire
_FORMAT_RANK: Final[dict[str, int]] = {BINARY_SI: 0, DECIMAL_SI: 1, DECIMAL_EXPONENT: 2}
_FORMATS_BY_RANK: Final[tuple[Format, ...]] = (BINARY_SI, DECIMAL_SI, DECIMAL_EXPONENT)


def _pick_format(formats: Iterable[str]) -> Format:
    """Order-independent format: BinarySI > DecimalSI > DecimalExponent; none -> DecimalSI."""
    best = 3
    for f in formats:
        r = _FORMAT_RANK[f]
        if r < best:
            best = r
    return _FORMATS_BY_RANK[best] if best < 3 else DECIMAL_SI


def need_to_wire(
    profile: Profile, group: str, aggregate: Mapping[str, str], min_unit: Mapping[str, str]
) -> pb.CapacityNeed:
    """Go ``needToCapacityNeed``: every CapacityNeed field from a profile + sums.

    Args:
        profile: the need's Profile (requirements already sorted, Same included).
        group: co-location group (field 9).
        aggregate: name -> canonical quantity string (field 2), sorted by name.
        min_unit: name -> canonical quantity string (field 8), sorted by name.
    """
    return pb.CapacityNeed(
        requirements=[
            pb.NodeSelectorRequirement(
                key=r.key,
                operator=pb.NodeSelectorRequirementOperator(r.operator),
                values=list(r.values),
            )
            for r in profile.requirements
        ],
        aggregate_resources=dict(aggregate),
        priority=profile.priority,
        spread=[
            pb.TopologySpread(
                topology_key=s.topology_key,
                max_skew=s.max_skew,
                when_unsatisfiable=pb.TopologySpreadWhenUnsatisfiable(s.when_unsatisfiable),
            )
            for s in profile.spread
        ],
        interruption_penalty_bucket=pb.PenaltyBucket(profile.interruption_bucket),
        reclamation_penalty_bucket=pb.PenaltyBucket(profile.reclamation_bucket),
        min_unit=dict(min_unit),
        group=group,
    )


def build_rollup_message(
    cluster_id: str, needs: Iterable[pb.CapacityNeed], now_ns: int
) -> pb.ClusterCapacityNeeds:
    """The roll-up frame: ``ClusterCapacityNeeds{cluster_id, timestamp_unix_nanos, needs}``.

    Zero needs is a valid roll-up (withdrawal of all demand).
    """
    return pb.ClusterCapacityNeeds(
        cluster_id=cluster_id, timestamp_unix_nanos=now_ns, needs=list(needs)
    )


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(tag: int, body: bytes) -> bytes:
    return bytes((tag,)) + _varint(len(body)) + body


def _int_field(tag: int, n: int) -> bytes:
    return bytes((tag,)) + _varint(n & 0xFFFFFFFFFFFFFFFF)  # int32/enum: negative -> 10 bytes


def _map_entries(tag: int, m: Mapping[str, str]) -> list[bytes]:
    # betterproto (Rust codec) omits an empty key or value inside an entry; an entry with both
    # empty is written as an empty entry (tag, length 0).
    out = []
    for k, v in m.items():
        body = (_len_field(0x0A, k.encode()) if k else b"") + (
            _len_field(0x12, v.encode()) if v else b""
        )
        out.append(_len_field(tag, body))
    return out


def encode_need(
    profile: Profile, group: str, aggregate: Mapping[str, str], min_unit: Mapping[str, str]
) -> bytes:
    """``bytes(need_to_wire(...))`` without betterproto (same bytes, ~50x faster)."""
    parts: list[bytes] = []
    for r in profile.requirements:
        body = [_len_field(0x0A, r.key.encode())] if r.key else []
        if r.operator:
            body.append(_int_field(0x10, r.operator))
        body.extend(_len_field(0x1A, v.encode()) for v in r.values)
        parts.append(_len_field(0x0A, b"".join(body)))
    parts.extend(_map_entries(0x12, aggregate))
    if profile.priority:
        parts.append(_int_field(0x18, profile.priority))
    for sp in profile.spread:
        body = [_len_field(0x0A, sp.topology_key.encode())] if sp.topology_key else []
        if sp.max_skew:
            body.append(_int_field(0x10, sp.max_skew))
        if sp.when_unsatisfiable:
            body.append(_int_field(0x18, sp.when_unsatisfiable))
        parts.append(_len_field(0x2A, b"".join(body)))
    if profile.interruption_bucket:
        parts.append(_int_field(0x30, profile.interruption_bucket))
    if profile.reclamation_bucket:
        parts.append(_int_field(0x38, profile.reclamation_bucket))
    parts.extend(_map_entries(0x42, min_unit))
    if group:
        parts.append(_len_field(0x4A, group.encode()))
    return b"".join(parts)


def encode_rollup(cluster_id: str, now_ns: int, encoded_needs: Iterable[bytes]) -> bytes:
    """Serialized ``ClusterCapacityNeeds`` from pre-encoded needs (byte-identical to betterproto).

    Args:
        cluster_id: field 1.
        now_ns: field 2 (``timestamp_unix_nanos``).
        encoded_needs: serialized CapacityNeeds (field 3), e.g.
            :meth:`RollupAggregator.needs_encoded`.
    """
    head = bytes(pb.ClusterCapacityNeeds(cluster_id=cluster_id, timestamp_unix_nanos=now_ns))
    parts = [head]
    for nb in encoded_needs:
        parts.append(b"\x1a")
        parts.append(_varint(len(nb)))
        parts.append(nb)
    return b"".join(parts)


def encode_operator_rollup(cluster_id: str, now_ns: int, encoded_needs: Iterable[bytes]) -> bytes:
    """Serialized ``OperatorMessage{rollup=...}`` (oneof field 2) from pre-encoded needs."""
    body = encode_rollup(cluster_id, now_ns, encoded_needs)
    return b"\x12" + _varint(len(body)) + body


# ---------------------------------------------------------------------------- from scratch
def build_from_scratch(crs: Iterable[Mapping[str, Any]]) -> list[pb.CapacityNeed]:
    """Aggregate a full CR list (tests + periodic consistency check of the aggregator).

    Excluded CRs (any :class:`CapacityRequestError`) are skipped.

    Returns:
        CapacityNeeds sorted by (fingerprint, group).
    """
    groups: dict[tuple[str, str], list[Contribution]] = {}
    seen: dict[int, tuple[object, Contribution]] = {}  # shared (slim) specs: parse once
    for cr in crs:
        spec = cr.get("spec")
        hit = seen.get(id(spec))
        if hit is not None and hit[0] is spec:
            c = hit[1]
        else:
            try:
                c = contribution_from_cr(cr)
            except CapacityRequestError:
                continue
            if isinstance(spec, dict):
                seen[id(spec)] = (spec, c)
        groups.setdefault(c.need_key, []).append(c)
    out = []
    for key in sorted(groups):
        members = groups[key]
        names = sorted({n for c in members for n in c.resources})
        agg: dict[str, str] = {}
        mins: dict[str, str] = {}
        for n in names:
            qs = [c.resources[n] for c in members if n in c.resources]
            total = Decimal(0)
            for q in qs:
                total = EXACT_CONTEXT.add(total, q.value)
            agg[n] = str(Quantity(total, _pick_format(q.format for q in qs if not q.is_zero())))
            top = max(q.value for q in qs)
            mins[n] = str(Quantity(top, _pick_format(q.format for q in qs if q.value == top)))
        out.append(need_to_wire(members[0].profile, members[0].group, agg, mins))
    return out


# ---------------------------------------------------------------------------- incremental
class _Need:
    """Running sums for one (fingerprint, group)."""

    __slots__ = (
        "profile",
        "group",
        "members",
        "count",
        "sums",
        "fmts",
        "values",
        "wire",
        "encoded",
    )

    def __init__(self, profile: Profile, group: str) -> None:
        self.profile = profile
        self.group = group
        self.members = 0
        self.count: dict[str, int] = {}  # members carrying the name
        self.sums: dict[str, Decimal] = {}
        self.fmts: dict[str, list[int]] = {}  # non-zero contributors per format rank
        self.values: dict[str, Counter[tuple[Decimal, int]]] = {}  # (value, rank) multiset
        self.wire: pb.CapacityNeed | None = None
        self.encoded: bytes | None = None

    def add(self, res: Mapping[str, Quantity]) -> None:
        self.members += 1
        for n, q in res.items():
            v = q.value
            rank = _FORMAT_RANK[q.format]
            if n in self.count:
                self.count[n] += 1
                self.sums[n] = EXACT_CONTEXT.add(self.sums[n], v)
            else:
                self.count[n] = 1
                self.sums[n] = v
                self.fmts[n] = [0, 0, 0]
                self.values[n] = Counter()
            if v:
                self.fmts[n][rank] += 1
            self.values[n][(v, rank)] += 1
        self.wire = None
        self.encoded = None

    def remove(self, res: Mapping[str, Quantity]) -> None:
        self.members -= 1
        for n, q in res.items():
            v = q.value
            rank = _FORMAT_RANK[q.format]
            c = self.count[n] - 1
            if c == 0:
                del self.count[n], self.sums[n], self.fmts[n], self.values[n]
                continue
            self.count[n] = c
            self.sums[n] = EXACT_CONTEXT.subtract(self.sums[n], v)
            if v:
                self.fmts[n][rank] -= 1
            vals = self.values[n]
            k = (v, rank)
            if vals[k] <= 1:
                del vals[k]
            else:
                vals[k] -= 1
        self.wire = None
        self.encoded = None

    def build(self) -> pb.CapacityNeed:
        if self.wire is None:
            agg, mins = self._resources()
            self.wire = need_to_wire(self.profile, self.group, agg, mins)
        return self.wire

    def _resources(self) -> tuple[dict[str, str], dict[str, str]]:
        agg: dict[str, str] = {}
        mins: dict[str, str] = {}
        for n in sorted(self.count):
            f = self.fmts[n]
            fmt = _FORMATS_BY_RANK[0 if f[0] else 1 if f[1] else 2 if f[2] else 1]
            agg[n] = str(Quantity(self.sums[n], fmt))
            top = max(v for v, _ in self.values[n])
            rank = min(r for v, r in self.values[n] if v == top)
            mins[n] = str(Quantity(top, _FORMATS_BY_RANK[rank]))
        return agg, mins

    def build_encoded(self) -> bytes:
        if self.encoded is None:
            agg, mins = self._resources()
            self.encoded = encode_need(self.profile, self.group, agg, mins)
        return self.encoded


def _signature(c: Contribution) -> list[tuple[str, Decimal, str]]:
    return [(n, q.value, q.format) for n, q in c.resources.items()]


class RollupAggregator:
    """Incremental roll-up maintained from informer events.

    ``upsert``/``delete`` adjust exactly one need (two when a CR moves between needs) in
    O(resources of the CR); ``needs()`` costs O(needs), rebuilding only needs that changed since
    the last call. ``needs()`` must agree with :func:`build_from_scratch` over the same CRs.

    Keys are informer store keys ("namespace/name"). Not thread-safe (one Trio task owns it).
    The returned wire objects are cached and shared: treat them as read-only.
    """

    def __init__(self) -> None:
        self._contrib: dict[str, Contribution] = {}
        self._needs: dict[tuple[str, str], _Need] = {}
        self._order: list[_Need] | None = []
        self._excluded: dict[str, CapacityRequestError] = {}
        self._pending: set[str] = set()
        self._pending_shared = False  # handed out by pending_snapshot(): copy before mutating
        self._spec_cache: dict[int, tuple[dict[str, Any], Contribution]] = {}

    def __len__(self) -> int:
        """Number of CRs contributing (excluded ones not counted)."""
        return len(self._contrib)

    def upsert(self, key: str, cr: Mapping[str, Any]) -> CapacityRequestError | None:
        """Add or replace CR ``key``'s contribution.

        Args:
            key: store key ("namespace/name").
            cr: the CR object (full or slim).

        Returns:
            None when the CR contributes; the :class:`CapacityRequestError` when it is excluded
            (its old contribution, if any, is withdrawn). Compare with :meth:`excluded` before
            the call to detect a *new* exclusion (emit the Event/log/metric once).
        """
        try:
            c = self._contribution(cr)
        except CapacityRequestError as e:
            self._withdraw(key)
            self._excluded[key] = e
            self._pending_discard(key)
            return e
        self._excluded.pop(key, None)
        old = self._contrib.get(key)
        if old is not None:
            if old.need_key == c.need_key and _signature(old) == _signature(c):
                self._track_pending(key, cr)
                return None
            self._withdraw(key)
        need = self._needs.get(c.need_key)
        if need is None:
            need = self._needs[c.need_key] = _Need(c.profile, c.group)
            self._order = None
        need.add(c.resources)
        self._contrib[key] = c
        self._track_pending(key, cr)
        return None

    def delete(self, key: str) -> None:
        """Withdraw CR ``key`` (no-op if unknown)."""
        self._withdraw(key)
        self._excluded.pop(key, None)
        self._pending_discard(key)

    def needs(self) -> list[pb.CapacityNeed]:
        """The aggregated CapacityNeeds, sorted by (fingerprint, group). O(needs)."""
        if self._order is None:
            self._order = [self._needs[k] for k in sorted(self._needs)]
        return [n.build() for n in self._order]

    def needs_encoded(self) -> list[bytes]:
        """The serialized CapacityNeeds in :meth:`needs` order, cached per need. O(needs).

        Feed to :func:`encode_rollup`; betterproto encoding is the dominant cycle cost otherwise.
        """
        if self._order is None:
            self._order = [self._needs[k] for k in sorted(self._needs)]
        return [n.build_encoded() for n in self._order]

    def encoded_rollup(self, cluster_id: str, now_ns: int) -> EncodedFrame:
        """The whole roll-up as a serialized ``OperatorMessage{rollup}``, from the cached
        per-need encodings: O(needs), no betterproto encoding. Byte-identical to
        ``bytes(OperatorMessage(rollup=build_rollup_message(cluster_id, self.needs(), now_ns)))``
        (docs/wire.md#roll-up-encoding).
        """
        return EncodedFrame(
            "rollup", encode_operator_rollup(cluster_id, now_ns, self.needs_encoded())
        )

    @property
    def need_count(self) -> int:
        """Number of CapacityNeeds the next roll-up holds."""
        return len(self._needs)

    def excluded(self) -> dict[str, str]:
        """CRs left out of the roll-up: key -> human-readable reason."""
        return {k: str(e) for k, e in self._excluded.items()}

    def excluded_errors(self) -> dict[str, CapacityRequestError]:
        """CRs left out of the roll-up: key -> the error (``.reason``, ``.field``)."""
        return dict(self._excluded)

    def pending(self) -> set[str]:
        """Keys of contributing CRs whose phase is ""/Pending (to acknowledge). O(pending)."""
        return set(self._pending)

    def pending_snapshot(self) -> frozenset[str] | set[str]:
        """The keys :meth:`pending` returns, in O(1): the set itself, copied by the aggregator
        before its next change (so a roll-up at 100K Pending CRs does not pay for a copy).
        Treat it as read-only."""
        self._pending_shared = True
        return self._pending

    def rebuild(self, items: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
        """Reset and re-add every (key, CR) (after a failed consistency check or a relist)."""
        self.__init__()  # type: ignore[misc]
        for key, cr in items:
            self.upsert(key, cr)

    def keys(self) -> Iterator[str]:
        """Keys of contributing CRs."""
        return iter(self._contrib)

    def _contribution(self, cr: Mapping[str, Any]) -> Contribution:
        # A contribution depends on spec only; crview.slim shares equal (read-only) spec dicts,
        # so most CRs hit this identity cache. The entry keeps the spec alive, so its id is
        # never reused while cached.
        spec = cr.get("spec")
        if not isinstance(spec, dict):
            return contribution_from_cr(cr)
        hit = self._spec_cache.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1]
        c = contribution_from_cr(cr)
        if len(self._spec_cache) >= _SPEC_CACHE_LIMIT:
            self._spec_cache.clear()
        self._spec_cache[id(spec)] = (spec, c)
        return c

    def _track_pending(self, key: str, cr: Mapping[str, Any]) -> None:
        if is_pending(cr):
            if key not in self._pending:
                self._own_pending().add(key)
        else:
            self._pending_discard(key)

    def _pending_discard(self, key: str) -> None:
        if key in self._pending:
            self._own_pending().discard(key)

    def _own_pending(self) -> set[str]:
        if self._pending_shared:
            self._pending = set(self._pending)
            self._pending_shared = False
        return self._pending

    def _withdraw(self, key: str) -> None:
        old = self._contrib.pop(key, None)
        if old is None:
            return
        need = self._needs[old.need_key]
        need.remove(old.resources)
        if need.members == 0:
            del self._needs[old.need_key]
            self._order = None
