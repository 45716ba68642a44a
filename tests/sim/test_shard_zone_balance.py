"""The sim shard keeps a need's machines spread over the zones as kube-scheduler spreads its Pods:
in what a need keeps and takes of bound machines, not only in what it buys
(docs/rules.md#roll-up-same; docs/deviations.md, the simulated shard, item 3)."""

from __future__ import annotations

from fractions import Fraction

from bigfleet_trio.proto import pb
from bigfleet_trio.sim.shard.catalog import LABEL_ZONE, parse_catalog
from bigfleet_trio.sim.shard.model import Machine, Op, State, build_inventory
from bigfleet_trio.sim.shard.planning import fill

CATALOG = {
    "zones": ["z-a", "z-b", "z-c"],
    "shapes": [{"instanceType": "small", "pricePerHour": 0.2, "count": 6,
                "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"}}],
}


def inventory() -> dict[str, list[Machine]]:
    by_zone: dict[str, list[Machine]] = {}
    for m in build_inventory(parse_catalog(CATALOG), 1):
        by_zone.setdefault(m.labels[LABEL_ZONE], []).append(m)
    return by_zone


def bind(ms: list[Machine], need: str, seq: int, state: State = State.CONFIGURED) -> int:
    for m in ms:
        seq += 1
        m.bound, m.need, m.state, m.seq = True, need, state, seq
    return seq


UNPINNED = pb.CapacityNeed(requirements=[pb.NodeSelectorRequirement(
    key="node.kubernetes.io/instance-type", operator=Op.OPERATOR_EXISTS)])


def zones(ms: list[Machine]) -> list[str]:
    return sorted(m.labels[LABEL_ZONE] for m in ms)


def test_a_shrinking_need_keeps_one_machine_per_zone_not_its_oldest() -> None:
    # The need grew in z-a first (4 machines), then once in z-b and z-c. Shrunk to 3 machines'
    # worth, it keeps one per zone: the three oldest, all in z-a, would leave the Pods
    # kube-scheduler keeps in z-b and z-c without the machines the shard counts for them.
    z = inventory()
    seq = bind(z["z-a"][:4], "u", 0)
    seq = bind(z["z-b"][:1] + z["z-c"][:1], "u", seq)
    sup = z["z-a"][:4] + z["z-b"][:1] + z["z-c"][:1]
    plan = fill(UNPINNED, "u", {"cpu": Fraction(12)}, sup, [])
    assert zones(plan.take) == ["z-a", "z-b", "z-c"] and not plan.new and not plan.short


def test_machines_other_needs_gave_up_are_taken_balanced_across_zones() -> None:
    z = inventory()
    seq = bind(z["z-a"][:3], "gone-1", 0)
    bind(z["z-b"][:3], "gone-2", seq)
    plan = fill(UNPINNED, "u", {"cpu": Fraction(16)}, z["z-a"][:3] + z["z-b"][:3], [])
    assert zones(plan.take) == ["z-a", "z-a", "z-b", "z-b"]


def test_a_configured_machine_is_kept_before_an_unfinished_one_in_an_emptier_zone() -> None:
    # Balance does not reclaim a running machine to keep one still being created.
    z = inventory()
    seq = bind(z["z-a"][:2], "u", 0)
    bind(z["z-b"][:1], "u", seq, State.CREATING)
    plan = fill(UNPINNED, "u", {"cpu": Fraction(8)}, z["z-a"][:2] + z["z-b"][:1], [])
    assert zones(plan.take) == ["z-a", "z-a"]


def test_new_machines_continue_the_balance_of_what_the_need_holds() -> None:
    z = inventory()
    bind(z["z-a"][:2], "u", 0)
    free = [m for ms in z.values() for m in ms if not m.bound]
    plan = fill(UNPINNED, "u", {"cpu": Fraction(16)}, z["z-a"][:2], free)
    assert zones(plan.take) == ["z-a", "z-a"] and zones(plan.new) == ["z-b", "z-c"]
