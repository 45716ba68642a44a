"""The Same planner's per-domain bookkeeping (one pass over the machines) against the plain
definition it replaced (each domain scanned over every machine), on random inventories: same
Plan for every need, bound or not, sticky or not, zone or hostname Same."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest

from bigfleet_trio.proto import pb
from bigfleet_trio.sim.shard._quantity import add_into
from bigfleet_trio.sim.shard.catalog import LABEL_HOSTNAME, LABEL_ZONE, parse_catalog
from bigfleet_trio.sim.shard.matching import same_keys
from bigfleet_trio.sim.shard.model import ZERO, Machine, Op, State, build_inventory
from bigfleet_trio.sim.shard.planning import Plan, fill, plan_need


def reference_plan_need(need: pb.CapacityNeed, key: str, agg: dict[str, Fraction],
                        sup: list[Machine], free: list[Machine]) -> Plan:
    """The definition: every figure of a domain from a scan of all machines."""
    skeys = same_keys(need.requirements)
    if not skeys:
        return fill(need, key, agg, sup, free)
    domains = [sorted({m.labels[k] for m in sup + free}) for k in skeys]
    combos = list(itertools.product(*domains))
    if not combos:
        return Plan([], [], sorted(agg) or ["machines"])

    def in_domain(m: Machine, combo: tuple[str, ...]) -> bool:
        return all(m.labels.get(k) == v for k, v in zip(skeys, combo, strict=True))

    def room(combo: tuple[str, ...]) -> Fraction:
        total: dict[str, Fraction] = {}
        n = 0
        for m in itertools.chain(sup, free):
            if in_domain(m, combo):
                add_into(total, m.alloc)
                n += 1
        dims = [d for d, v in agg.items() if v > 0]
        if not dims:
            return Fraction(n)
        return min(total.get(d, ZERO) / agg[d] for d in dims)

    def score(combo: tuple[str, ...]) -> tuple[int, Fraction, int, float, tuple[str, ...]]:
        sticky = sum(1 for m in sup if m.need == key and in_domain(m, combo))
        existing = sum(1 for m in sup if in_domain(m, combo))
        prices = [m.shape.price_per_hour for m in free if in_domain(m, combo)]
        return (-sticky, -room(combo), -existing, min(prices) if prices else float("inf"),
                combo)

    ranked = sorted((score(c), c) for c in combos)
    if ranked[0][0][0] < 0:
        combo = ranked[0][1]
        return fill(need, key, agg, [m for m in sup if in_domain(m, combo)],
                    [m for m in free if in_domain(m, combo)])
    first: Plan | None = None
    for _, combo in ranked:
        plan = fill(need, key, agg, [m for m in sup if in_domain(m, combo)],
                    [m for m in free if in_domain(m, combo)])
        if not plan.short:
            return plan
        if first is None:
            first = plan
    assert first is not None
    return first


CATALOG = {
    "zones": ["z-a", "z-b", "z-c"],
    "shapes": [
        {"instanceType": "small", "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
         "count": 7, "warm": 2, "pricePerHour": 0.2},
        {"instanceType": "big", "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
         "count": 4, "pricePerHour": 0.7},
    ],
}


def ids(plan: Plan) -> tuple[list[str], list[str], list[str]]:
    return ([m.machine_id for m in plan.take], [m.machine_id for m in plan.new], plan.short)


@pytest.mark.parametrize("seed", range(40))
def test_one_pass_domains_plan_as_the_definition(seed: int) -> None:
    rng = random.Random(seed)
    machines = build_inventory(parse_catalog(CATALOG), seed)
    keys = ["need-a", "need-b", "need-c"]
    for m in machines:  # a random cluster: some bound, to one need or another, in any state
        if rng.random() < 0.4:
            m.bound = True
            m.need = rng.choice(keys)
            m.state = rng.choice([State.CONFIGURED, State.CONFIGURING, State.IDLE,
                                  State.CREATING])
    sup = [m for m in machines if m.bound]
    free = [m for m in machines if m.free]
    for same in ([LABEL_ZONE], [LABEL_HOSTNAME], [LABEL_ZONE, LABEL_HOSTNAME]):
        reqs = [pb.NodeSelectorRequirement(key=k, operator=Op.OPERATOR_SAME) for k in same]
        need = pb.CapacityNeed(requirements=reqs)
        for key in keys + ["need-new"]:
            agg = rng.choice([{}, {"cpu": Fraction(rng.randint(1, 40))},
                              {"cpu": Fraction(rng.randint(1, 20)),
                               "memory": Fraction(rng.randint(1, 80) * 2**30)}])
            assert ids(plan_need(need, key, agg, sup, free)) == ids(
                reference_plan_need(need, key, agg, sup, free)), (same, key, agg)
