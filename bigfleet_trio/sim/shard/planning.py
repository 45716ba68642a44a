"""Demand planning of the simulated shard: which machines serve a need, which to bootstrap.

Pure functions over :class:`~.model.Machine` lists (they read machines, never change them):
:func:`serves_memo` (can a machine serve a need), :func:`plan_need` (Same domains) and
:func:`fill` (cover an aggregate from supply, then from the free pool in pick order). The policy
they implement is in :mod:`.engine`'s docstring; :meth:`ShardEngine.on_rollup
<.engine.ShardEngine.on_rollup>` applies their :class:`Plan`.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from bigfleet_trio.proto import pb

from ._quantity import add_into, covers
from .catalog import LABEL_HOSTNAME, LABEL_ZONE
from .matching import labels_match, same_keys
from .model import ZERO, Machine, Op, State

SUPPLY_RANK = {
    State.CONFIGURED: 0,
    State.CONFIGURING: 1,
    State.IDLE: 2,
    State.CREATING: 3,
    State.SPECULATIVE: 4,
}


@dataclass
class Plan:
    """Machines a need takes: ``take`` already bound, ``new`` from the pool; ``short`` dims."""

    take: list[Machine]
    new: list[Machine]
    short: list[str]


_REPELLING = ("NoSchedule", "NoExecute")


def tolerated(m: Machine, need: pb.CapacityNeed) -> bool:
    """Whether ``need``'s Pods can be taken to tolerate every NoSchedule/NoExecute taint of
    ``m``: the roll-up carries no tolerations, so only a need that asks for the tainted machine
    does -- it requests the resource the taint is named after (a GPU taint, which Kubernetes'
    ExtendedResourceToleration admission tolerates for such Pods) or has an In/Exists
    requirement on the taint's key (the dedicated-pool pattern: taint and label share a key).
    docs/deviations.md#13-the-simulated-shard-bigfleet_triosimshard, item 4."""
    for t in m.shape.taints:
        if t.effect not in _REPELLING:
            continue
        if need.min_unit.get(t.key) not in (None, "", "0"):
            continue
        if any(r.key == t.key and r.operator in (Op.OPERATOR_IN, Op.OPERATOR_EXISTS)
               for r in need.requirements):
            continue
        return False
    return True


SPOT_MAX_INTERRUPTION_BUCKET = 5
"""The highest interruption penalty bucket a spot machine serves: 5 is "at most $4"."""


def spot_allowed(m: Machine, need: pb.CapacityNeed) -> bool:
    """Whether ``need`` may run on ``m`` as far as interruption goes: an on-demand machine serves
    any need; a spot machine only one whose interruption penalty bucket is 1..5 (ZERO up to $4).
    Unspecified (0) counts as sensitive: work that never said it tolerates interruption stays on
    on-demand machines, and cheap spot machines go to the work that said so
    (docs/rules.md#simulated-fleet)."""
    if not m.spot:
        return True
    return 1 <= int(need.interruption_penalty_bucket) <= SPOT_MAX_INTERRUPTION_BUCKET


def serves(m: Machine, need: pb.CapacityNeed, unit: Mapping[str, Fraction]) -> bool:
    """Whether ``m`` can serve ``need``: its labels match, its taints are :func:`tolerated`,
    it is :func:`spot_allowed` and its allocatable holds ``unit``."""
    return (labels_match(need.requirements, m.labels) and tolerated(m, need)
            and spot_allowed(m, need) and covers(m.alloc, unit))


def serves_memo(need: pb.CapacityNeed,
                unit: Mapping[str, Fraction]) -> Callable[[Machine], bool]:
    """:func:`serves` for one need, answered once per shape: machines of a shape share
    every label but the hostname, their taints and all their allocatable (a need naming the
    hostname label is checked per machine)."""
    reqs = list(need.requirements)
    if any(r.key == LABEL_HOSTNAME for r in reqs):
        return lambda m: serves(m, need, unit)
    memo: dict[str, bool] = {}

    def serves_shape(m: Machine) -> bool:
        hit = memo.get(m.shape.key)
        if hit is None:
            hit = memo[m.shape.key] = (labels_match(reqs, m.labels) and tolerated(m, need)
                                       and spot_allowed(m, need) and covers(m.alloc, unit))
        return hit

    return serves_shape


def whole_pods(alloc: Mapping[str, Fraction],
               unit: Mapping[str, Fraction] | None) -> dict[str, Fraction]:
    """What of ``alloc`` a need's Pods can use: in each dimension ``unit`` (the need's largest
    Pod) names, the most whole Pods of that size the machine holds, times the size; other
    dimensions whole. Why: kube-scheduler places whole Pods, so an 8-cpu machine holds 14
    Pods of 546m (7.64 cpu), not 8 cpu's worth; counting the remainder left the fleet bench's
    cluster short in slivers (65 of 76 Nodes without room for a 583m Pod, 26 cores free) and
    Pods of a group pinned to a full zone Pending."""
    if not unit:
        return dict(alloc)
    out = dict(alloc)
    for d, u in unit.items():
        if u > 0 and d in out:
            out[d] = (out[d] // u) * u
    return out


def plan_need(
    need: pb.CapacityNeed,
    key: str,
    agg: dict[str, Fraction],
    sup: list[Machine],
    free: list[Machine],
    unit: Mapping[str, Fraction] | None = None,
) -> Plan:
    """Plan one need over supply ``sup`` and free machines ``free``: without Same
    requirements :func:`fill`; with them, in one domain (docs/rules.md#roll-up-same).
    ``unit``: the need's parsed ``min_unit`` (a machine covers :func:`whole_pods` of it).

    A need that already holds machines in a domain (sticky) stays there, short if the domain
    cannot hold it. Otherwise the first domain that covers the whole need in the order: most
    room (free and unclaimed machines serving the need, in multiples of its aggregate), then
    existing supply, then cheapest free price, then value; else the best one, short.
    """
    skeys = same_keys(need.requirements)
    if not skeys:
        return fill(need, key, agg, sup, free, unit=unit)
    domains = [
        sorted({m.labels[k] for m in sup + free}) for k in skeys
    ]
    combos = list(itertools.product(*domains))
    if not combos:
        return Plan([], [], sorted(agg) or ["machines"])

    # One pass puts each machine in its domain (in list order, which fill relies on); every
    # figure below is then per domain. Scanning all machines per domain instead made a plan
    # O(machines x domains) per Same need: with a hostname Same over 5,000 machines, one
    # roll-up held the shard's event loop for seconds and its BootstrapRequests expired.
    in_sup: dict[tuple[str, ...], list[Machine]] = {}
    in_free: dict[tuple[str, ...], list[Machine]] = {}
    for ms, by in ((sup, in_sup), (free, in_free)):
        for m in ms:
            by.setdefault(tuple(m.labels.get(k, "") for k in skeys), []).append(m)
    dims = [d for d, v in agg.items() if v > 0]

    def room(combo: tuple[str, ...]) -> Fraction:
        # How many times the aggregate fits in what the need could take there (its bottleneck
        # dimension); a need without requests counts machines. Machines of a shape share
        # their allocatable: summed per shape.
        per_shape: Counter[str] = Counter()
        alloc_of: dict[str, Mapping[str, Fraction]] = {}
        for m in itertools.chain(in_sup.get(combo, ()), in_free.get(combo, ())):
            per_shape[m.shape.key] += 1
            alloc_of.setdefault(m.shape.key, m.alloc)
        if not dims:
            return Fraction(sum(per_shape.values()))
        total: dict[str, Fraction] = {}
        for shape_key, n in per_shape.items():
            usable = whole_pods(alloc_of[shape_key], unit)  # as fill counts it
            add_into(total, {d: v * n for d, v in usable.items()})
        return min(total.get(d, ZERO) / agg[d] for d in dims)

    def score(combo: tuple[str, ...]) -> tuple[int, Fraction, int, float, tuple[str, ...]]:
        here = in_sup.get(combo, [])
        sticky = sum(1 for m in here if m.need == key)
        prices = [m.shape.price_per_hour for m in in_free.get(combo, ())]
        return (-sticky, -room(combo), -len(here), min(prices) if prices else float("inf"),
                combo)

    ranked = sorted((score(c), c) for c in combos)
    if ranked[0][0][0] < 0:
        # The need's Pods run where its machines are, and kube-scheduler places the group's
        # later Pods only in a domain already running one of them (required pod affinity):
        # machines for the growth in another domain would be useless to it, and moving the
        # whole need would strand the running Pods. Grow in place, or be short there.
        combo = ranked[0][1]
        return fill(need, key, agg, in_sup.get(combo, []), in_free.get(combo, []), unit=unit)
    first: Plan | None = None
    for _, combo in ranked:
        plan = fill(need, key, agg, in_sup.get(combo, []), in_free.get(combo, []), unit=unit)
        if not plan.short:
            return plan
        if first is None:
            first = plan
    assert first is not None
    return first


def fill(
    need: pb.CapacityNeed,
    key: str,
    agg: dict[str, Fraction],
    sup: list[Machine],
    free: list[Machine],
    *,
    streams: list[list[Machine]] | None = None,
    skip: set[str] | None = None,
    unit: Mapping[str, Fraction] | None = None,
) -> Plan:
    """Cover ``agg``: ``sup`` first (own machines, then by supply rank), then new machines
    from ``free`` -- or from ``streams`` (lists each already in pick order and of one shape,
    machines in ``skip`` or no longer free passed over). A machine covers the
    :func:`whole_pods` of ``unit`` (the need's parsed ``min_unit``; None: its allocatable)."""
    covered: dict[str, Fraction] = {}
    take: list[Machine] = []
    usable_of: dict[str, dict[str, Fraction]] = {}  # per shape: machines of a shape share it

    def usable(m: Machine) -> dict[str, Fraction]:
        u = usable_of.get(m.shape.key)
        if u is None:
            u = usable_of[m.shape.key] = whole_pods(m.alloc, unit)
        return u

    def done() -> bool:
        return bool(take) and covers(covered, agg)

    spread_keys = [s.topology_key for s in need.spread
                   if s.when_unsatisfiable != pb.TopologySpreadWhenUnsatisfiable
                   .WHEN_UNSATISFIABLE_SCHEDULE_ANYWAY]
    # A machine's domains: the need's spread keys and the zone. A fresh machine's hostname
    # domain always has load 0 (its hostname is its own), so only the other spread keys split
    # machines into domains.
    dom_keys = [k for k in spread_keys if k != LABEL_HOSTNAME]
    if LABEL_ZONE not in dom_keys:
        # Zones are balanced even without a spread term: kube-scheduler spreads a workload's
        # Pods over the zones by default (soft), so the need's Pods land about evenly in every
        # zone whatever machines were bound for it; machines piled into one zone leave the
        # other zones' co-location groups to take the overflow (docs/rules.md#roll-up-same).
        dom_keys.append(LABEL_ZONE)
    counts: list[Counter[str | None]] = [Counter() for _ in dom_keys]

    def load(d: tuple[str | None, ...]) -> tuple[int, ...]:
        return tuple(c[v] for c, v in zip(counts, d, strict=True))

    def taken(m: Machine, d: tuple[str | None, ...]) -> None:
        for c, v in zip(counts, d, strict=True):
            c[v] += 1
        take.append(m)
        add_into(covered, usable(m))

    # Bound machines: the need's own first (sticky), then by supply rank (a Configured machine
    # before one still being created), then the domain with the fewest of the need's machines,
    # then the oldest. Balanced in what a need keeps, not only in what it buys: a need that
    # grew in one zone and shrinks keeps a machine in every zone its Pods run in and gives
    # back where it holds the most (as a cluster autoscaler balancing similar node groups
    # scales down); keeping its oldest machines instead emptied one zone of the fleet bench
    # to 12 machines, where 51 Pods of a group pinned there then found no room while 45 cores
    # stood free in the other two zones (docs/benchmarks/fleet-real.md).
    groups: dict[tuple[bool, int], dict[tuple[str | None, ...], list[Machine]]] = {}
    for m in sorted(sup, key=lambda m: (m.need != key, SUPPLY_RANK[m.state], m.seq, m.index)):
        groups.setdefault((m.need != key, SUPPLY_RANK[m.state]), {}).setdefault(
            tuple(m.labels.get(k) for k in dom_keys), []).append(m)
    for _group, by_domain in sorted(groups.items()):
        at = {d: 0 for d in by_domain}  # each domain's next machine
        while at and not done():
            d = min(at, key=lambda d: (load(d), by_domain[d][at[d]].seq,
                                       by_domain[d][at[d]].index))
            taken(by_domain[d][at[d]], d)
            at[d] += 1
            if at[d] >= len(by_domain[d]):
                del at[d]
    new: list[Machine] = []
    # The cheapest machine by (price, load of its domains, not Idle, inventory index).
    # Within a domain the load is the same, so each domain's best is the first in (price,
    # not Idle, index) order.
    lanes: list[tuple[tuple[str | None, ...], list[Machine]]] = []
    if streams is None:
        domains: dict[tuple[str | None, ...], list[Machine]] = {}
        for m in sorted(free, key=lambda m: (m.shape.price_per_hour, m.state != State.IDLE,
                                             m.index)):
            domains.setdefault(tuple(m.labels.get(k) for k in dom_keys), []).append(m)
        lanes = list(domains.items())
    else:
        lanes = [(tuple(lane[0].labels.get(k) for k in dom_keys), lane)
                 for lane in streams if lane]
    heads = [0] * len(lanes)
    while not done():
        best_i: int | None = None
        best_key: tuple[Any, ...] | None = None
        for li, (d, lst) in enumerate(lanes):
            i = heads[li]
            if skip is not None:
                while i < len(lst) and (lst[i].machine_id in skip or not lst[i].free):
                    i += 1
                heads[li] = i
            if i >= len(lst):
                continue
            m = lst[i]
            key_ = (m.shape.price_per_hour, load(d), m.state != State.IDLE, m.index)
            if best_key is None or key_ < best_key:
                best_key, best_i = key_, li
        if best_i is None:
            break
        best_d, lane = lanes[best_i]
        best = lane[heads[best_i]]
        heads[best_i] += 1
        new.append(best)
        taken(best, best_d)
    short: list[str] = []
    if not take:
        short = ["machines"]
    elif not covers(covered, agg):
        short = sorted(d for d, v in agg.items() if covered.get(d, ZERO) < v)
    new_ids = {m.machine_id for m in new}
    return Plan(take=[m for m in take if m.machine_id not in new_ids], new=new, short=short)
