"""Aggregation by (fingerprint, group): from scratch, and incrementally from informer events.

A need's ``aggregate_resources`` is the per-resource sum over its CRs and ``min_unit`` the
per-resource maximum (docs/rules.md#roll-up-capacityneed-shape); needs are sorted by
(fingerprint, group) so equal inputs give byte-identical roll-ups. Pure; one Trio task owns a
:class:`RollupAggregator`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from decimal import Decimal
from typing import Any, Final

from bigfleet_trio.proto import pb
from bigfleet_trio.quantity import EXACT_CONTEXT, Quantity
from bigfleet_trio.shard.codec import EncodedFrame

from .encoding import (
    FORMAT_RANK,
    FORMATS_BY_RANK,
    encode_need,
    encode_operator_rollup,
    need_to_wire,
    pick_format,
)
from .errors import CapacityRequestError
from .profile import Profile
from .translate import Contribution, contribution_from_cr, is_pending

__all__ = ["RollupAggregator", "ScratchBuild", "build_from_scratch"]

_SPEC_CACHE_LIMIT: Final = 20_000


# ---------------------------------------------------------------------------- from scratch
def build_from_scratch(crs: Iterable[Mapping[str, Any]]) -> list[pb.CapacityNeed]:
    """Aggregate a full CR list (tests + periodic consistency check of the aggregator).

    Excluded CRs (any :class:`CapacityRequestError`) are skipped.

    Returns:
        CapacityNeeds sorted by (fingerprint, group).
    """
    build = ScratchBuild()
    build.add(crs)
    return list(build.needs())


class ScratchBuild:
    """:func:`build_from_scratch` in steps, so a caller can yield to its event loop between
    them: :meth:`add` CRs in chunks, then take :meth:`needs` one CapacityNeed at a time."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, str], list[Contribution]] = {}
        self._seen: dict[int, tuple[object, Contribution]] = {}  # shared (slim) specs: once

    def add(self, crs: Iterable[Mapping[str, Any]]) -> None:
        """Add CRs (an excluded one, any :class:`CapacityRequestError`, is skipped)."""
        groups, seen = self._groups, self._seen
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

    def needs(self) -> Iterator[pb.CapacityNeed]:
        """The CapacityNeeds of the CRs added, sorted by (fingerprint, group)."""
        for key in sorted(self._groups):
            members = self._groups[key]
            names = sorted({n for c in members for n in c.resources})
            agg: dict[str, str] = {}
            mins: dict[str, str] = {}
            for n in names:
                qs = [c.resources[n] for c in members if n in c.resources]
                total = Decimal(0)
                for q in qs:
                    total = EXACT_CONTEXT.add(total, q.value)
                agg[n] = str(Quantity(total, pick_format(q.format for q in qs if not q.is_zero())))
                top = max(q.value for q in qs)
                mins[n] = str(Quantity(top, pick_format(q.format for q in qs if q.value == top)))
            yield need_to_wire(members[0].profile, members[0].group, agg, mins)


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
            rank = FORMAT_RANK[q.format]
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
            rank = FORMAT_RANK[q.format]
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
            fmt = FORMATS_BY_RANK[0 if f[0] else 1 if f[1] else 2 if f[2] else 1]
            agg[n] = str(Quantity(self.sums[n], fmt))
            top = max(v for v, _ in self.values[n])
            rank = min(r for v, r in self.values[n] if v == top)
            mins[n] = str(Quantity(top, FORMATS_BY_RANK[rank]))
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
