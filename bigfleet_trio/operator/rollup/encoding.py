"""CapacityNeed and roll-up frames on the wire: betterproto objects and a direct encoder.

:func:`encode_need` / :func:`encode_operator_rollup` write the same bytes as betterproto, about
50x faster, so the aggregator can cache each need's encoding (docs/wire.md#roll-up-encoding).
Quantity strings are canonical, their format chosen order-independently (:func:`pick_format`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from bigfleet_trio.proto import pb
from bigfleet_trio.quantity import BINARY_SI, DECIMAL_EXPONENT, DECIMAL_SI, Format

from .profile import Profile

__all__ = [
    "build_rollup_message",
    "encode_need",
    "encode_operator_rollup",
    "encode_rollup",
    "need_to_wire",
]

FORMAT_RANK: Final[dict[str, int]] = {BINARY_SI: 0, DECIMAL_SI: 1, DECIMAL_EXPONENT: 2}
FORMATS_BY_RANK: Final[tuple[Format, ...]] = (BINARY_SI, DECIMAL_SI, DECIMAL_EXPONENT)


def pick_format(formats: Iterable[str]) -> Format:
    """Order-independent format: BinarySI > DecimalSI > DecimalExponent; none -> DecimalSI."""
    best = 3
    for f in formats:
        r = FORMAT_RANK[f]
        if r < best:
            best = r
    return FORMATS_BY_RANK[best] if best < 3 else DECIMAL_SI


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
