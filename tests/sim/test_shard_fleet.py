"""The simulated shard as a fleet: one pool, one engine per cluster (sans-IO, deterministic).

Expected values are worked out by hand from the tiny catalogs below and the rules in
``bigfleet_trio/sim/shard/fleet.py``'s docstring (docs/rules.md#simulated-fleet).
"""

from __future__ import annotations

from fractions import Fraction

import betterproto
import pytest

from bigfleet_trio.proto import pb
from bigfleet_trio.sim.shard.catalog import LABEL_SPOT, Catalog, MachineShape
from bigfleet_trio.sim.shard.engine import EngineConfig, SendFrame
from bigfleet_trio.sim.shard.fleet import FleetEngine, pick_victims
from bigfleet_trio.sim.shard.model import build_inventory

Op = pb.NodeSelectorRequirementOperator
S = pb.MachineState
IT = "node.kubernetes.io/instance-type"

CFG = EngineConfig(seed=3, create_delay=1.0, boot_delay=1.0, configure_delay=1.0,
                   reclaim_grace_seconds=2, drain_wait=1.0, drain_step=0.5)


def one_shape(count: int = 2) -> Catalog:
    return Catalog([MachineShape("std", "z-a", {"cpu": "4"}, 0.20, count=count, warm=count)])


def need(cpu: str, *, priority: int = 0, interruption: int = 0, reclamation: int = 0,
         unit: str = "1") -> pb.CapacityNeed:
    return pb.CapacityNeed(
        requirements=[pb.NodeSelectorRequirement(key=IT, operator=Op.OPERATOR_EXISTS)],
        aggregate_resources={"cpu": cpu}, min_unit={"cpu": unit}, priority=priority,
        interruption_penalty_bucket=pb.PenaltyBucket(interruption),
        reclamation_penalty_bucket=pb.PenaltyBucket(reclamation))


def rollup(cluster: str, *needs: pb.CapacityNeed) -> pb.ClusterCapacityNeeds:
    return pb.ClusterCapacityNeeds(cluster_id=cluster, timestamp_unix_nanos=1, needs=list(needs))


def payloads(tagged: list, cluster: str, kind: str) -> list:
    out = []
    for cid, eff in tagged:
        if cid == cluster and isinstance(eff, SendFrame):
            name, val = betterproto.which_one_of(eff.frame, "payload")
            if name == kind:
                out.append(val)
    return out


class Driver:
    """Plays the agents of every cluster: answers each BootstrapRequest and ReclaimInstruction
    at once and advances the fleet clock a step at a time."""

    def __init__(self, fleet: FleetEngine) -> None:
        self.fleet = fleet
        self.now = 0.0
        self.instructions: list[tuple[str, pb.ReclaimInstruction]] = []

    def feed(self, tagged: list) -> None:
        pending = list(tagged)
        while pending:
            cid, eff = pending.pop(0)
            if not isinstance(eff, SendFrame):
                continue
            name, val = betterproto.which_one_of(eff.frame, "payload")
            if name == "bootstrap_request":
                pending += self.fleet.on_bootstrap_response(cid, pb.BootstrapBlobResponse(
                    request_id=val.request_id, user_data=b"x"), self.now)
            elif name == "reclaim_instruction":
                self.instructions.append((cid, val))
                pending += self.fleet.on_reclaim_ack(cid, pb.ReclaimAck(
                    instruction_id=val.instruction_id, nodes_started=1), self.now)

    def run(self, until: float) -> None:
        while self.now < until:
            self.now = round(self.now + 0.5, 3)
            self.feed(self.fleet.advance(self.now))

    def rollup(self, cluster: str, *needs: pb.CapacityNeed) -> None:
        self.feed(self.fleet.on_rollup(cluster, rollup(cluster, *needs), self.now))


def connected(catalog: Catalog, *clusters: str) -> Driver:
    fleet = FleetEngine(catalog, CFG)
    for c in clusters:
        fleet.on_connect(c, 0.0)
    return Driver(fleet)


def states(fleet: FleetEngine, cluster: str) -> dict[str, int]:
    return fleet.engine(cluster).machines_by_state()


def test_clusters_share_one_pool_and_each_sees_only_its_machines() -> None:
    d = connected(one_shape(3), "a", "b")
    d.rollup("a", need("8"))  # two 4-cpu machines
    d.rollup("b", need("4"))
    d.run(5)
    assert states(d.fleet, "a") == {"CONFIGURED": 2}
    assert states(d.fleet, "b") == {"CONFIGURED": 1}
    assert {m.cluster for m in d.fleet.machines} == {"a", "b"}


def test_a_machine_reclaimed_from_one_cluster_is_bootstrapped_into_another() -> None:
    d = connected(one_shape(2), "a", "b")
    d.rollup("a", need("8"))
    d.run(5)
    d.rollup("b", need("4"))  # the pool is empty: b is short
    assert d.fleet.engine("b").needs[0].short == ("machines",)  # none at all
    d.rollup("a", need("4"))  # a gives one back (surplus)
    d.run(15)
    assert states(d.fleet, "a") == {"CONFIGURED": 1}
    assert states(d.fleet, "b") == {"CONFIGURED": 1}
    [move] = d.fleet.moves
    assert (move.from_cluster, move.to_cluster, move.why) == ("a", "b", "surplus")
    # b got it without sending another roll-up: the fleet planned b again when it came back
    assert d.fleet.engine("b").rollups_accepted == 1


def test_higher_priority_demand_preempts_lower_priority_work_of_another_cluster() -> None:
    d = connected(one_shape(2), "a", "b")
    d.rollup("a", need("8", priority=10))
    d.run(5)
    d.rollup("b", need("4", priority=1000))
    [(victim_cluster, instr)] = d.instructions
    assert victim_cluster == "a" and instr.preemptor_priority == 1000
    d.run(15)
    assert states(d.fleet, "b") == {"CONFIGURED": 1}
    assert states(d.fleet, "a") == {"CONFIGURED": 1}
    [move] = d.fleet.moves
    assert (move.from_cluster, move.to_cluster, move.why) == ("a", "b", "preempted")
    [rec] = d.fleet.engine("a").reclaims
    assert (rec.reason, rec.for_need.split("/")[0]) == ("preempted", "b")


def test_equal_or_higher_priority_work_is_never_preempted() -> None:
    d = connected(one_shape(2), "a", "b")
    d.rollup("a", need("8", priority=1000))
    d.run(5)
    d.rollup("b", need("4", priority=1000))
    d.run(10)
    assert d.instructions == []
    assert d.fleet.engine("b").needs[0].short


def test_preemption_takes_the_lowest_reclamation_penalty_bucket_first() -> None:
    d = connected(one_shape(3), "a", "b")
    # a: two needs of one priority; the first costly to reclaim (bucket 20), the second cheap (3)
    d.rollup("a", need("4", priority=5, reclamation=20), need("8", priority=5, reclamation=3))
    d.run(5)
    costly = d.fleet.engine("a").needs[0].machines
    d.rollup("b", need("4", priority=100))
    [(_, instr)] = d.instructions
    victim = d.fleet.engine("a").reclaims[0].machine_id
    assert victim not in costly and instr.nodes
    assert d.fleet.machine(victim).reclamation_bucket == 3  # type: ignore[union-attr]


def test_preemption_frees_only_what_the_short_need_lacks() -> None:
    d = connected(one_shape(4), "a", "b")
    d.rollup("a", need("16", priority=0))
    d.run(5)
    d.rollup("b", need("8", priority=50))  # two machines' worth
    assert len(d.instructions) == 2
    d.rollup("b", need("8", priority=50))  # the same roll-up again: the two coming count
    assert len(d.instructions) == 2


def spot_catalog() -> Catalog:
    return Catalog([
        MachineShape("od", "z-a", {"cpu": "4"}, 0.20, count=2, warm=2),
        MachineShape("spot", "z-a", {"cpu": "4"}, 0.06, count=2, warm=2,
                     extra_labels={LABEL_SPOT: "true"}),
    ])


@pytest.mark.parametrize(("bucket", "shape"), [
    (0, "od"),  # unspecified: sensitive
    (1, "spot"),  # ZERO
    (2, "spot"),  # at most $0.50
    (5, "spot"),  # at most $4
    (6, "od"),  # more than $4
    (27, "od"),  # pinned
])
def test_spot_machines_serve_only_demand_with_a_low_interruption_penalty(
        bucket: int, shape: str) -> None:
    d = connected(spot_catalog(), "a")
    d.rollup("a", need("4", interruption=bucket))
    [mid] = d.fleet.engine("a").needs[0].machines
    assert d.fleet.machine(mid).shape.instance_type == shape  # type: ignore[union-attr]


def test_sensitive_demand_is_short_rather_than_put_on_spot() -> None:
    d = connected(spot_catalog(), "a")
    d.rollup("a", need("12"))  # three machines, two on-demand exist
    status = d.fleet.engine("a").needs[0]
    assert status.short and len(status.machines) == 2


def test_a_restarted_shard_rebuilds_bindings_from_the_clusters_nodes() -> None:
    d = connected(one_shape(3), "a", "b")
    d.rollup("a", need("8"))
    d.rollup("b", need("4"))
    d.run(5)
    nodes = {c: [(m.node_name, m.provider_id) for m in d.fleet.machines if m.cluster == c]
             for c in ("a", "b")}
    # a new process, same seed: the same inventory, nothing bound
    fresh = FleetEngine(one_shape(3), CFG)
    assert fresh.adopt("a", nodes["a"] + [("stranger", "sim://x/y/i-unknown")], 0.0)
    fresh.adopt("b", nodes["b"], 0.0)
    replay = fresh.on_connect("a", 0.0)
    replayed = payloads(replay, "a", "node_state_update")
    assert sorted(u.node_name for u in replayed) == sorted(n for n, _ in nodes["a"])
    assert {u.state for u in replayed} == {S.CONFIGURED}  # never Idle
    fresh.on_connect("b", 0.0)
    out = fresh.on_rollup("a", rollup("a", need("8")), 1.0)
    assert fresh.engine("a").binds == 0 and not payloads(out, "a", "reclaim_instruction")
    assert fresh.moves == []


def test_adopt_leaves_a_node_of_another_provider_id_alone() -> None:
    fleet = FleetEngine(one_shape(1), CFG)
    m = fleet.machines[0]
    assert fleet.adopt("a", [(m.node_name, "sim://elsewhere/i-0")], 0.0) == []
    assert not m.bound


def test_pick_victims_takes_the_fewest_in_order() -> None:
    inv = build_inventory(one_shape(4), seed=1)
    agg, unit = {"cpu": Fraction(8)}, {"cpu": Fraction(1)}
    assert pick_victims(agg, unit, [], inv) == inv[:2]
    assert pick_victims(agg, unit, inv[:1], inv[1:]) == inv[1:2]
    assert pick_victims(agg, unit, inv[:2], inv[2:]) == []
    assert pick_victims({"cpu": Fraction(40)}, unit, [], inv) == inv  # all, still short


def test_the_fleet_is_deterministic() -> None:
    def play() -> list:
        d = connected(one_shape(3), "a", "b", "c")
        d.rollup("a", need("8", priority=1))
        d.rollup("c", need("4", priority=1, interruption=2))
        d.run(5)
        d.rollup("b", need("8", priority=100))
        d.run(20)
        return [(m.machine_id, m.cluster, m.state) for m in d.fleet.machines] + d.fleet.moves

    assert play() == play()
