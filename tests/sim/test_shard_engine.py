"""Unit tests of the simulated shard's sans-IO engine.

Expected values are worked out by hand from the test catalog below and the rules in
``bigfleet_trio/sim/shard/engine.py``'s docstring (cheapest price first, then spread load, then
warm Idle first, then catalog order).
"""

from __future__ import annotations

import pytest

from bigfleet_trio.proto import pb
from bigfleet_trio.sim.shard.catalog import Catalog, MachineShape, ShapeTaint
from bigfleet_trio.sim.shard.engine import (
    EngineConfig,
    InvalidRollup,
    MachineConfigured,
    MachineReleased,
    SendFrame,
    ShardEngine,
    grace_for_priority,
    labels_match,
    profile_fingerprint,
    requirement_matches,
    same_satisfied,
)

Op = pb.NodeSelectorRequirementOperator
S = pb.MachineState
C = pb.AvailableCapacityUpdateConfidence
IT = "node.kubernetes.io/instance-type"
ZONE = "topology.kubernetes.io/zone"

CFG = EngineConfig(
    seed=7,
    create_delay=1.0,
    boot_delay=2.0,
    configure_delay=3.0,
    bootstrap_timeout=10.0,
    reclaim_grace_seconds=7,
    reclaim_ack_timeout=5.0,
    drain_wait=4.0,
    drain_step=0.5,
)


def catalog() -> Catalog:
    # index 0: small/sim-a (3, none warm); 1: small/sim-b (3, one warm); 2: big/sim-a (2);
    # 3: gpu/sim-b (1, tainted, accel label)
    small = {"cpu": "2", "memory": "4Gi"}
    return Catalog([
        MachineShape("small", "sim-a", small, 0.10, count=3, warm=0),
        MachineShape("small", "sim-b", small, 0.10, count=3, warm=1),
        MachineShape("big", "sim-a", {"cpu": "8", "memory": "32Gi"}, 0.40, count=2),
        MachineShape("gpu", "sim-b", {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "4"}, 3.0,
                     count=1, extra_labels={"accel": "l4"},
                     taints=(ShapeTaint("nvidia.com/gpu", "present", "NoSchedule"),)),
    ])


def req(key: str, op: pb.NodeSelectorRequirementOperator,
        *values: str) -> pb.NodeSelectorRequirement:
    return pb.NodeSelectorRequirement(key=key, operator=op, values=list(values))


def need(aggregate: dict[str, str], min_unit: dict[str, str] | None = None, *reqs:
         pb.NodeSelectorRequirement, priority: int = 0, group: str = "",
         spread: list[pb.TopologySpread] | None = None) -> pb.CapacityNeed:
    return pb.CapacityNeed(
        requirements=list(reqs) or [req(IT, Op.OPERATOR_EXISTS)],
        aggregate_resources=aggregate,
        min_unit=min_unit if min_unit is not None else dict(aggregate),
        priority=priority,
        group=group,
        spread=spread or [],
    )


def rollup(*needs: pb.CapacityNeed) -> pb.ClusterCapacityNeeds:
    return pb.ClusterCapacityNeeds(cluster_id="c1", timestamp_unix_nanos=1, needs=list(needs))


def frames(effects: list) -> list[tuple[str, object]]:
    import betterproto

    return [betterproto.which_one_of(e.frame, "payload")
            for e in effects if isinstance(e, SendFrame)]


def nsus(effects: list) -> list[pb.NodeStateUpdate]:
    return [v for k, v in frames(effects) if k == "node_state_update"]


def of_kind(effects: list, kind: str) -> list:
    return [v for k, v in frames(effects) if k == kind]


def engine() -> ShardEngine:
    e = ShardEngine(catalog(), CFG)
    e.on_connect("c1", 0.0)
    return e


def ids(e: ShardEngine, shape_key: str) -> list[str]:
    return [m.machine_id for m in e.machines if m.shape.key == shape_key]


def run_to_configured(e: ShardEngine, effects: list, now: float) -> float:
    """Answer every bootstrap pull and advance until nothing is provisioning; returns the time."""
    pending = [b.request_id for b in of_kind(effects, "bootstrap_request")]
    while True:
        for rid in pending:
            e.on_bootstrap_response(pb.BootstrapBlobResponse(request_id=rid, user_data=b"x"), now)
        pending = []
        busy = [m for m in e.machines if m.bound and m.state != S.CONFIGURED]
        if not busy:
            return now
        now = e.next_deadline()
        assert now is not None
        pending = [b.request_id for b in of_kind(e.advance(now), "bootstrap_request")]


# ------------------------------------------------------------------ matching


@pytest.mark.parametrize(
    ("r", "labels", "expected"),
    [
        (req("a", Op.OPERATOR_IN, "x", "y"), {"a": "y"}, True),
        (req("a", Op.OPERATOR_IN, "x", "y"), {"a": "z"}, False),
        (req("a", Op.OPERATOR_IN, "x"), {}, False),
        (req("a", Op.OPERATOR_NOT_IN, "x"), {"a": "z"}, True),
        (req("a", Op.OPERATOR_NOT_IN, "x"), {"a": "x"}, False),
        (req("a", Op.OPERATOR_NOT_IN, "x"), {}, True),  # absent key satisfies NotIn
        (req("a", Op.OPERATOR_EXISTS), {"a": ""}, True),
        (req("a", Op.OPERATOR_EXISTS), {"b": "1"}, False),
        (req("a", Op.OPERATOR_DOES_NOT_EXIST), {"b": "1"}, True),
        (req("a", Op.OPERATOR_DOES_NOT_EXIST), {"a": "1"}, False),
        (req("a", Op.OPERATOR_SAME), {"a": "1"}, True),
        (req("a", Op.OPERATOR_SAME), {}, False),
        (req("a", Op.OPERATOR_UNSPECIFIED, "1"), {"a": "1"}, False),
    ],
)
def test_requirement_operators(r: pb.NodeSelectorRequirement, labels: dict[str, str],
                               expected: bool) -> None:
    assert requirement_matches(r, labels) is expected


def test_labels_match_is_a_conjunction_and_empty_matches_all() -> None:
    labels = {"a": "1", "b": "2"}
    assert labels_match([], labels)
    assert labels_match([req("a", Op.OPERATOR_IN, "1"), req("b", Op.OPERATOR_EXISTS)], labels)
    assert not labels_match([req("a", Op.OPERATOR_IN, "1"), req("c", Op.OPERATOR_EXISTS)], labels)


def test_same_requires_one_shared_value_across_the_set() -> None:
    reqs = [req(ZONE, Op.OPERATOR_SAME)]
    assert same_satisfied(reqs, [{ZONE: "a"}, {ZONE: "a"}])
    assert not same_satisfied(reqs, [{ZONE: "a"}, {ZONE: "b"}])
    assert not same_satisfied(reqs, [{ZONE: "a"}, {}])
    assert same_satisfied([req(ZONE, Op.OPERATOR_EXISTS)], [{ZONE: "a"}, {ZONE: "b"}])


def test_profile_fingerprint_matches_reference_format() -> None:
    # the Go reference's format (docs/rules.md#roll-up-profile), on one of its own examples
    assert profile_fingerprint([req(IT, Op.OPERATOR_IN, "a3-highgpu-8g")], priority=1000000,
                               interruption_bucket=16) == (
        "p=1000000|ipb=16|rpb=0|reqs=node.kubernetes.io/instance-type:1:a3-highgpu-8g;|spr=")
    # sorted by key then operator number, values sorted, Exists/Same render with no values
    fp = profile_fingerprint(
        [req("z", Op.OPERATOR_SAME), req("a", Op.OPERATOR_NOT_IN, "y", "x"),
         req("a", Op.OPERATOR_IN, "q")],
        priority=-5,
        spread=[pb.TopologySpread("zone", 2, pb.TopologySpreadWhenUnsatisfiable(1)),
                pb.TopologySpread("host", 1, pb.TopologySpreadWhenUnsatisfiable(0))],
    )
    assert fp == "p=-5|ipb=0|rpb=0|reqs=a:1:q;a:2:x,y;z:5:;|spr=host:1:0;zone:2:1;"


# ------------------------------------------------------------------ deficit planning


def test_deficit_uses_cheapest_machines_warm_first() -> None:
    e = engine()
    fx = e.on_rollup(rollup(need({"cpu": "5"}, {"cpu": "1"})), 1.0)
    # 5 cpu / 2 cpu per small -> 3 smalls (6 >= 5); warm small/sim-b first, then small/sim-a x2.
    warm = ids(e, "small/sim-b")[0]
    a0, a1 = ids(e, "small/sim-a")[:2]
    assert [(u.machine_id, u.state) for u in nsus(fx)] == [
        (warm, S.IDLE), (a0, S.SPECULATIVE), (a1, S.SPECULATIVE)]
    [br] = of_kind(fx, "bootstrap_request")
    assert br.request_id == "bootstrap-000001" and br.cluster_id == "c1"
    assert br.requirements == [req(IT, Op.OPERATOR_EXISTS)]
    [status] = e.needs
    assert status.machines == (warm, a0, a1) and status.new == 3 and status.short == ()


def test_min_unit_must_fit_one_machine() -> None:
    e = engine()
    e.on_rollup(rollup(need({"cpu": "3"}, {"cpu": "3"})), 1.0)
    # small has 2 cpu < 3 -> the cheapest machine that fits is big (8 cpu), one is enough.
    assert e.needs[0].machines == (ids(e, "big/sim-a")[0],)


def test_every_dimension_of_the_aggregate_is_covered() -> None:
    e = engine()
    e.on_rollup(rollup(need({"cpu": "1", "memory": "9Gi"}, {"cpu": "100m", "memory": "1Gi"})), 1.0)
    # memory rules: 4Gi per small -> 3 smalls (12Gi >= 9Gi)
    assert len(e.needs[0].machines) == 3


def test_a_machine_covers_whole_pods_of_the_need() -> None:
    # Five Pods of 750m: a 2-cpu small holds two of them (1.5 cpu), not 2 cpu's worth. Two
    # smalls (4 cpu >= 3.75) would leave one Pod Pending; three hold all five.
    e = engine()
    e.on_rollup(rollup(need({"cpu": "3750m"}, {"cpu": "750m"},
                            req(IT, Op.OPERATOR_IN, "small"))), 1.0)
    assert len(e.needs[0].machines) == 3 and not e.needs[0].short
    # a dimension the unit does not name counts whole
    e = engine()
    e.on_rollup(rollup(need({"cpu": "3750m", "memory": "1Gi"}, {"cpu": "750m"},
                            req(IT, Op.OPERATOR_IN, "small"))), 1.0)
    assert len(e.needs[0].machines) == 3


def test_need_without_requests_still_gets_one_machine() -> None:
    e = engine()
    e.on_rollup(rollup(need({}, {})), 1.0)
    assert e.needs[0].machines == (ids(e, "small/sim-b")[0],)


def test_existing_supply_counts_and_only_the_deficit_is_bootstrapped() -> None:
    e = engine()
    fx = e.on_rollup(rollup(need({"cpu": "5"}, {"cpu": "1"})), 1.0)
    now = run_to_configured(e, fx, 1.0)
    assert e.machines_by_state()["CONFIGURED"] == 3
    # same demand again: nothing new
    fx = e.on_rollup(rollup(need({"cpu": "5"}, {"cpu": "1"})), now)
    assert nsus(fx) == [] and of_kind(fx, "reclaim_instruction") == []
    # 7 cpu: 6 configured + one more small (cheapest; sim-b holds one of the need's three
    # machines, sim-a two: the second small/sim-b, zones balanced)
    fx = e.on_rollup(rollup(need({"cpu": "7"}, {"cpu": "1"})), now)
    expected = [(ids(e, "small/sim-b")[1], S.SPECULATIVE)]
    assert [(u.machine_id, u.state) for u in nsus(fx)] == expected


def test_a_tainted_machine_serves_only_a_need_that_asks_for_it() -> None:
    # docs/deviations.md 13.4: the roll-up carries no tolerations, so a machine tainted
    # NoSchedule/NoExecute serves a need only when the need requests the resource the taint is
    # named after (the GPU) or selects the taint's key as a label.
    e = engine()
    gpu = need({"cpu": "2", "nvidia.com/gpu": "1"}, {"cpu": "2", "nvidia.com/gpu": "1"})
    e.on_rollup(rollup(gpu), 1.0)
    assert [e.machine(i).shape.key for i in e.needs[0].machines] == ["gpu/sim-b"]
    # The GPU demand goes; plain demand of 4 cpu must not count the GPU machine's 16 cpu (its
    # Pods do not tolerate the taint): two smalls, the GPU machine surplus.
    e.on_rollup(rollup(need({"cpu": "4"}, {"cpu": "1"})), 2.0)
    assert [e.machine(i).shape.key for i in e.needs[0].machines] == ["small/sim-b",
                                                                      "small/sim-a"]
    # Selecting the shape by another label is not asking for the taint.
    e.on_rollup(rollup(need({"cpu": "4"}, {"cpu": "1"}, req("accel", Op.OPERATOR_IN, "l4"))), 3.0)
    assert e.needs[0].machines == () and e.needs[0].short == ("machines",)


def test_a_dedicated_pool_serves_a_need_that_selects_its_taint_key() -> None:
    # The dedicated-pool pattern: taint and label share a key, the Pods select the label.
    ded = MachineShape("ded", "sim-a", {"cpu": "4"}, 0.10, count=1,
                       extra_labels={"dedicated": "ml"},
                       taints=(ShapeTaint("dedicated", "ml", "NoSchedule"),))
    e = ShardEngine(Catalog([ded]), CFG)
    e.on_connect("c1", 0.0)
    e.on_rollup(rollup(need({"cpu": "2"}, {"cpu": "1"})), 1.0)
    assert e.needs[0].machines == ()
    e.on_rollup(rollup(need({"cpu": "2"}, {"cpu": "1"},
                            req("dedicated", Op.OPERATOR_IN, "ml"))), 2.0)
    assert len(e.needs[0].machines) == 1


def test_in_flight_machines_count_as_supply() -> None:
    e = engine()
    e.on_rollup(rollup(need({"cpu": "5"}, {"cpu": "1"})), 1.0)
    fx = e.on_rollup(rollup(need({"cpu": "5"}, {"cpu": "1"})), 1.5)  # nothing Configured yet
    assert nsus(fx) == []


def test_unfittable_min_unit_is_a_shortfall() -> None:
    e = engine()
    fx = e.on_rollup(rollup(need({"example.com/dongle": "3"})), 1.0)
    assert nsus(fx) == []
    assert e.needs[0].short == ("machines",)
    assert [ev.kind for ev in e.shortfalls] == ["shortfall"]
    # the same shortfall on the next roll-up is not logged again
    e.on_rollup(rollup(need({"example.com/dongle": "3"})), 2.0)
    assert len(e.shortfalls) == 1


def test_exhausted_pool_is_a_partial_shortfall() -> None:
    e = engine()
    e.on_rollup(rollup(need({"cpu": "100"}, {"cpu": "1"}, req(IT, Op.OPERATOR_IN, "small"))), 1.0)
    assert len(e.needs[0].machines) == 6  # all smalls, 12 cpu
    assert e.needs[0].short == ("cpu",)


def test_higher_priority_need_is_planned_first() -> None:
    e = engine()
    low = need({"cpu": "2"}, {"cpu": "2"}, req(IT, Op.OPERATOR_IN, "big"), priority=1)
    high = need({"cpu": "16"}, {"cpu": "8"}, req(IT, Op.OPERATOR_IN, "big"), priority=100)
    e.on_rollup(rollup(low, high), 1.0)
    assert len(e.needs[1].machines) == 2 and e.needs[1].short == ()
    assert e.needs[0].machines == () and e.needs[0].short == ("machines",)


def test_same_picks_one_domain_for_all_machines() -> None:
    e = engine()
    e.on_rollup(rollup(need({"cpu": "6"}, {"cpu": "1"}, req(ZONE, Op.OPERATOR_SAME),
                            group="zone\x00app=x,;")), 1.0)
    # zones tie on price (0.10): sim-a first; its 3 smalls give 6 cpu.
    ms = [e.machine(i) for i in e.needs[0].machines]
    assert {m.shape.zone for m in ms} == {"sim-a"} and len(ms) == 3


def test_same_skips_a_domain_that_cannot_hold_the_need() -> None:
    e = engine()
    e.on_rollup(rollup(need({"cpu": "10"}, {"cpu": "1"}, req(ZONE, Op.OPERATOR_SAME))), 1.0)
    # sim-b: only 3 smalls (6 cpu; the GPU machine's taint is not asked for) -> infeasible.
    # sim-a: 3 smalls + 2 bigs = 22 cpu; cheapest first: the smalls, then one big.
    ms = [e.machine(i) for i in e.needs[0].machines]
    assert [m.shape.key for m in ms] == ["small/sim-a"] * 3 + ["big/sim-a"]
    assert e.needs[0].short == ()


def test_same_stays_in_the_domain_it_already_uses() -> None:
    e = engine()
    reqs = (req(ZONE, Op.OPERATOR_SAME), req(IT, Op.OPERATOR_IN, "small"))
    pin = need({"cpu": "2"}, {"cpu": "2"}, req(IT, Op.OPERATOR_IN, "small"),
               req(ZONE, Op.OPERATOR_IN, "sim-a"), priority=100)
    # sim-a has 4 cpu of smalls left for the group, sim-b 6: sim-b.
    e.on_rollup(rollup(pin, need({"cpu": "4"}, {"cpu": "1"}, *reqs)), 1.0)
    assert {e.machine(i).shape.zone for i in e.needs[1].machines} == {"sim-b"}
    # Demand shrinks to 2 cpu and the pinned need goes: sim-a would win on name, but the need's
    # machines are in sim-b.
    fx = e.on_rollup(rollup(need({"cpu": "2"}, {"cpu": "1"}, *reqs)), 2.0)
    assert nsus(fx) == []
    assert [e.machine(i).shape.key for i in e.needs[0].machines] == ["small/sim-b"]


def test_same_growth_stays_in_the_domain_the_group_runs_in_and_is_short_there() -> None:
    # docs/rules.md#roll-up-same: kube-scheduler keeps a group's later Pods in the domain its
    # running Pods hold, so machines for its growth elsewhere would be useless to it.
    e = engine()
    pin = need({"cpu": "6"}, {"cpu": "2"}, req(IT, Op.OPERATOR_IN, "small"),
               req(ZONE, Op.OPERATOR_IN, "sim-a"), priority=100)
    bigs = need({"cpu": "16"}, {"cpu": "8"}, req(IT, Op.OPERATOR_IN, "big"), priority=100)
    group = (req(ZONE, Op.OPERATOR_SAME), req(IT, Op.OPERATOR_NOT_IN, "gpu"))
    e.on_rollup(rollup(pin, bigs, need({"cpu": "2"}, {"cpu": "1"}, *group, group="g")), 1.0)
    assert {e.machine(i).shape.zone for i in e.needs[2].machines} == {"sim-b"}  # sim-a is full
    fx = e.on_rollup(rollup(pin, need({"cpu": "10"}, {"cpu": "1"}, *group, group="g")), 2.0)
    # sim-b holds 6 cpu of smalls; sim-a's two bigs, now no need's, would hold all 10, but
    # not next to the group's running Pods: the need stays in sim-b and is short there
    assert {e.machine(i).shape.zone for i in e.needs[1].machines} == {"sim-b"}
    assert len(e.needs[1].machines) == 3 and e.needs[1].short == ("cpu",)
    assert [e.machine(u.machine_id).shape.zone for u in nsus(fx)] == ["sim-b", "sim-b"]


def test_new_same_groups_take_the_domain_with_the_most_room() -> None:
    # docs/rules.md#roll-up-same: two groups of one roll-up that both fit sim-a do not both
    # go there; the second takes sim-b, which has more room left for it to grow into.
    e = engine()
    smalls = (req(ZONE, Op.OPERATOR_SAME), req(IT, Op.OPERATOR_IN, "small"))
    e.on_rollup(rollup(need({"cpu": "2"}, {"cpu": "1"}, *smalls, group="g1"),
                       need({"cpu": "2"}, {"cpu": "1"}, *smalls, group="g2")), 1.0)
    assert [{e.machine(i).shape.zone for i in s.machines} for s in e.needs] == [
        {"sim-a"}, {"sim-b"}]


def test_new_machines_of_a_need_without_spread_are_balanced_across_zones() -> None:
    # docs/rules.md#roll-up-same: kube-scheduler spreads a workload's Pods over the zones by
    # default, so a need's machines piled into one zone leave the others' co-location groups to
    # take the overflow. 8 cpu = 4 smalls: warm sim-b first, then a (fewer), then a (tie: index),
    # then b.
    e = engine()
    e.on_rollup(rollup(need({"cpu": "8"}, {"cpu": "1"}, req(IT, Op.OPERATOR_IN, "small"))), 1.0)
    zones = [e.machine(i).shape.zone for i in e.needs[0].machines]
    assert zones == ["sim-b", "sim-a", "sim-a", "sim-b"]


def test_spread_balances_new_machines_across_domains() -> None:
    e = engine()
    spread = [pb.TopologySpread(ZONE, 1, pb.TopologySpreadWhenUnsatisfiable(1))]
    e.on_rollup(rollup(need({"cpu": "6"}, {"cpu": "1"}, req(IT, Op.OPERATOR_IN, "small"),
                            spread=spread)), 1.0)
    zones = [e.machine(i).shape.zone for i in e.needs[0].machines]
    # warm b (Idle first), then a (b has 1), then tie 1/1 -> catalog order -> a
    assert zones == ["sim-b", "sim-a", "sim-a"]


def test_invalid_rollup_is_rejected_whole_and_keeps_the_last_demand() -> None:
    e = engine()
    good = rollup(need({"cpu": "1"}))
    e.on_rollup(good, 1.0)
    with pytest.raises(InvalidRollup, match="cpu"):
        e.on_rollup(rollup(need({"cpu": "1"}), need({"cpu": "lots"})), 2.0)
    bad_bucket = need({"cpu": "1"})
    bad_bucket.reclamation_penalty_bucket = 28  # type: ignore[assignment]
    with pytest.raises(InvalidRollup, match="bucket 28"):
        e.on_rollup(rollup(bad_bucket), 2.0)
    assert e.last_rollup is good and e.rollups_rejected == 2 and len(e.needs) == 1


# ------------------------------------------------------------------ lifecycle


def test_lifecycle_frames_in_order_with_fields() -> None:
    e = engine()
    fx = e.on_rollup(rollup(need({"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "1"},
                                 req("accel", Op.OPERATOR_IN, "l4"))), 1.0)
    m = e.machine(e.needs[0].machines[0])
    assert m.shape.key == "gpu/sim-b"
    seen = [(1.0, u.state) for u in nsus(fx)]
    assert seen == [(1.0, S.SPECULATIVE)]
    assert e.next_deadline() == 2.0
    fx = e.advance(2.0)
    assert [u.state for u in nsus(fx)] == [S.CREATING]
    assert e.next_deadline() == 4.0
    fx = e.advance(4.0)
    assert [u.state for u in nsus(fx)] == [S.IDLE]
    [br] = of_kind(fx, "bootstrap_request")
    assert br.requirements == [req("accel", Op.OPERATOR_IN, "l4")]
    assert e.next_deadline() == 14.0  # bootstrap deadline: one cycle
    fx = e.on_bootstrap_response(pb.BootstrapBlobResponse(request_id=br.request_id,
                                                          user_data=b"#cloud-config\n"), 5.0)
    assert [u.state for u in nsus(fx)] == [S.CONFIGURING]
    assert e.next_deadline() == 8.0
    fx = e.advance(8.0)
    assert isinstance(fx[0], MachineConfigured) and fx[0].machine.node_name == m.node_name
    [u] = nsus(fx)
    assert u.state == S.CONFIGURED
    assert u.supersedes_key == f"node:{m.machine_id}"
    assert u.cluster_id == "c1"
    assert u.node_name == m.node_name and u.node_name.startswith("gpu-sim-b-")
    assert u.provider_id == f"sim://sim-region-1/sim-b/{m.machine_id}"
    assert u.labels[IT] == "gpu" and u.labels[ZONE] == "sim-b" and u.labels["accel"] == "l4"
    assert u.labels["kubernetes.io/hostname"] == m.node_name
    assert u.resources.resources == {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "4"}
    assert u.taints == [pb.Taint("nvidia.com/gpu", "present", "NoSchedule")]
    assert u.last_error == ""
    assert e.next_deadline() is None


def test_bootstrap_error_fails_the_machine_and_is_a_shortfall() -> None:
    e = engine()
    fx = e.on_rollup(rollup(need({"cpu": "1"})), 1.0)
    [br] = of_kind(fx, "bootstrap_request")
    mid = e.needs[0].machines[0]
    fx = e.on_bootstrap_response(pb.BootstrapBlobResponse(request_id=br.request_id,
                                                          error="template: boom"), 2.0)
    [u] = nsus(fx)
    assert (u.machine_id, u.state, u.last_error) == (mid, S.FAILED, "bootstrap: template: boom")
    assert not any(isinstance(x, MachineConfigured) for x in fx)
    m = e.machine(mid)
    assert not m.bound and m.state == S.IDLE and m.free
    assert e.shortfalls[-1].fields["reason"] == "bootstrap: template: boom"
    # the machine is warm again: AvailableCapacity for small/sim-b back to 3 HIGH
    [ac] = of_kind(fx, "available_capacity")
    assert (ac.available_count, ac.confidence) == (3, C.CONFIDENCE_HIGH)


def test_bootstrap_timeout_after_one_cycle() -> None:
    e = engine()
    e.on_rollup(rollup(need({"cpu": "1"})), 1.0)
    assert e.next_deadline() == 11.0
    fx = e.advance(11.0)
    [u] = nsus(fx)
    assert u.state == S.FAILED and u.last_error == "bootstrap: no response within 10s"


def test_late_or_unknown_bootstrap_response_is_dropped() -> None:
    e = engine()
    e.on_rollup(rollup(need({"cpu": "1"})), 1.0)
    e.advance(11.0)  # timed out
    late = pb.BootstrapBlobResponse(request_id="bootstrap-000001")
    assert e.on_bootstrap_response(late, 12.0) == []
    assert e.events[-1].kind == "bootstrap_response_dropped"


def test_same_seed_same_inventory_and_different_seed_differs() -> None:
    a, b, c = (ShardEngine(catalog(), EngineConfig(seed=s)) for s in (1, 1, 2))
    assert [(m.machine_id, m.node_name) for m in a.machines] == [
        (m.machine_id, m.node_name) for m in b.machines]
    assert [m.machine_id for m in a.machines] != [m.machine_id for m in c.machines]
    assert len({m.node_name for m in a.machines}) == len(a.machines)


# ------------------------------------------------------------------ reclaim


def _three_configured() -> tuple[ShardEngine, float, list[str]]:
    e = engine()
    fx = e.on_rollup(rollup(need({"cpu": "5"}, {"cpu": "1"})), 1.0)
    order = list(e.needs[0].machines)
    now = run_to_configured(e, fx, 1.0)
    return e, now, order


def test_surplus_configured_machines_are_reclaimed_one_instruction_each() -> None:
    e, now, order = _three_configured()
    fx = e.on_rollup(rollup(need({"cpu": "1"}, {"cpu": "1"})), now)
    # one machine covers 1 cpu; the first bound (warm small/sim-b) is kept
    assert e.needs[0].machines == (order[0],)
    ris = of_kind(fx, "reclaim_instruction")
    assert [(r.instruction_id, r.nodes, r.grace_period_seconds) for r in ris] == [
        ("reclaim-000001", [e.machine(order[1]).node_name], 7),
        ("reclaim-000002", [e.machine(order[2]).node_name], 7),
    ]
    assert [r.machine_id for r in e.reclaims] == order[1:]


def test_reclaim_ack_then_drain_wait_then_draining_then_idle() -> None:
    e, now, order = _three_configured()
    e.on_rollup(rollup(need({"cpu": "1"}, {"cpu": "1"})), now)
    m = e.machine(order[1])
    assert e.on_reclaim_ack(pb.ReclaimAck("reclaim-000001", 1), now + 1) == []
    assert e.reclaims[0].acked_at == now + 1 and e.reclaims[0].nodes_started == 1
    fx = e.advance(now + 1 + 4.0)  # drain_wait
    assert [(u.machine_id, u.state) for u in nsus(fx)] == [(m.machine_id, S.DRAINING)]
    fx = e.advance(now + 1 + 7.0)  # drain_step, held to the grace window's end (7 s)
    assert [(u.machine_id, u.state) for u in nsus(fx)] == [(m.machine_id, S.IDLE)]
    released = [x for x in fx if isinstance(x, MachineReleased)]
    assert [r.machine.node_name for r in released] == [m.node_name]
    assert not m.bound and m.free
    # small/sim-a had 3 -> 2 bound... now one is free again and Idle (warm): HIGH, cost 0.10
    [ac] = of_kind(fx, "available_capacity")
    assert "small;" in ac.supersedes_key and "sim-a;" in ac.supersedes_key
    assert (ac.available_count, ac.confidence, ac.cost_per_hour) == (2, C.CONFIDENCE_HIGH, 0.10)


def test_a_reclaimed_machine_is_released_no_earlier_than_its_grace_window_ends() -> None:
    """The grace period is the agent's window to drain: the shard takes the machine (Idle, its
    Node deleted) only when it is over, never while Pods may still be on their way out (a
    release 1.5 s after the ack left PodDisruptionBudget-guarded Pods on a deleted Node)."""
    e, now, order = _three_configured()
    e.on_rollup(rollup(need({"cpu": "1"}, {"cpu": "1"})), now)
    m = e.machine(order[1])
    e.on_reclaim_ack(pb.ReclaimAck("reclaim-000001", 1), now + 1)
    assert [u.state for u in nsus(e.advance(now + 1 + 4.0))] == [S.DRAINING]
    assert nsus(e.advance(now + 1 + 6.9)) == [] and m.bound  # drain_step passed, grace not
    fx = e.advance(now + 1 + 7.0)
    assert [u.state for u in nsus(fx)] == [S.IDLE]
    assert [r.machine.node_name for r in fx if isinstance(r, MachineReleased)] == [m.node_name]


def test_unacked_reclaim_is_reissued_after_the_ack_timeout() -> None:
    e, now, order = _three_configured()
    e.on_rollup(rollup(need({"cpu": "3"}, {"cpu": "1"})), now)  # 2 machines cover 3 cpu
    assert len(e.reclaims) == 1
    fx = e.advance(now + 5.0)
    assert [r.instruction_id for r in of_kind(fx, "reclaim_instruction")] == ["reclaim-000001"]


def test_reclaiming_machines_are_not_supply_and_unknown_acks_are_dropped() -> None:
    e, now, order = _three_configured()
    e.on_rollup(rollup(), now)  # empty roll-up: withdraw everything
    assert len(e.reclaims) == 3
    fx = e.on_rollup(rollup(need({"cpu": "1"})), now + 0.1)
    # the three are being reclaimed; a new machine is bound instead
    assert [u.state for u in nsus(fx)] == [S.SPECULATIVE]
    assert e.on_reclaim_ack(pb.ReclaimAck("nope", 1), now) == []


def test_surplus_rollups_delays_the_reclaim() -> None:
    e = ShardEngine(catalog(), EngineConfig(seed=7, surplus_rollups=2))
    e.on_connect("c1", 0.0)
    fx = e.on_rollup(rollup(need({"cpu": "1"})), 1.0)
    now = run_to_configured(e, fx, 1.0)
    assert of_kind(e.on_rollup(rollup(), now), "reclaim_instruction") == []
    assert len(of_kind(e.on_rollup(rollup(), now + 1), "reclaim_instruction")) == 1


def test_grace_ladder() -> None:
    assert [grace_for_priority(p) for p in (-1, 0, 999, 1000, 999_999, 1_000_000)] == [
        10, 30, 30, 120, 120, 600]
    e = ShardEngine(catalog(), EngineConfig(seed=7, reclaim_grace_seconds=None))
    e.on_connect("c1", 0.0)
    fx = e.on_rollup(rollup(need({"cpu": "1"}, priority=5000)), 1.0)
    now = run_to_configured(e, fx, 1.0)
    [ri] = of_kind(e.on_rollup(rollup(), now), "reclaim_instruction")
    assert ri.grace_period_seconds == 120


# ------------------------------------------------------------------ available capacity, replay


def test_available_capacity_on_connect_confidence_and_cost() -> None:
    e = ShardEngine(catalog(), CFG)
    fx = e.on_connect("c1", 0.0)
    acs = {(a.requirements[0].values[0], a.requirements[1].values[0]): a
           for a in of_kind(fx, "available_capacity")}
    assert {k: (a.available_count, a.confidence, a.cost_per_hour) for k, a in acs.items()} == {
        ("small", "sim-a"): (3, C.CONFIDENCE_MEDIUM, 0.0),   # only Speculative
        ("small", "sim-b"): (3, C.CONFIDENCE_HIGH, 0.10),    # one warm Idle
        ("big", "sim-a"): (2, C.CONFIDENCE_MEDIUM, 0.0),
        ("gpu", "sim-b"): (1, C.CONFIDENCE_MEDIUM, 0.0),
    }
    a = acs[("small", "sim-b")]
    assert a.supersedes_key == (
        "available:p=0|ipb=0|rpb=0|reqs=node.kubernetes.io/instance-type:1:small;"
        "topology.kubernetes.io/zone:1:sim-b;|spr=")
    assert a.requirements == [req(IT, Op.OPERATOR_IN, "small"), req(ZONE, Op.OPERATOR_IN, "sim-b")]
    assert a.resources.resources == {"cpu": "2", "memory": "4Gi"}


def test_available_capacity_only_on_change() -> None:
    e = engine()
    assert of_kind(e.advance(1.0), "available_capacity") == []
    fx = e.on_rollup(rollup(need({"cpu": "1"})), 1.0)  # takes the warm small/sim-b
    [ac] = of_kind(fx, "available_capacity")
    assert (ac.requirements[1].values, ac.available_count, ac.confidence, ac.cost_per_hour) == (
        ["sim-b"], 2, C.CONFIDENCE_MEDIUM, 0.0)
    assert of_kind(e.on_rollup(rollup(need({"cpu": "1"})), 2.0), "available_capacity") == []


def test_available_capacity_min_interval_defers_changes() -> None:
    e = ShardEngine(catalog(), EngineConfig(seed=7, available_min_interval=5.0))
    e.on_connect("c1", 0.0)
    assert of_kind(e.on_rollup(rollup(need({"cpu": "1"})), 1.0), "available_capacity") == []
    assert e.next_deadline() == 5.0
    [ac] = of_kind(e.advance(5.0), "available_capacity")
    assert ac.available_count == 2


def test_reconnect_replays_bound_machines_and_pending_work() -> None:
    e = engine()
    fx = e.on_rollup(rollup(need({"cpu": "5"}, {"cpu": "1"})), 1.0)
    warm, a0, a1 = e.needs[0].machines
    fx = e.on_connect("c1", 1.5)
    assert [(u.machine_id, u.state) for u in nsus(fx)] == [
        (a0, S.SPECULATIVE), (a1, S.SPECULATIVE), (warm, S.IDLE)]  # catalog order
    assert [b.request_id for b in of_kind(fx, "bootstrap_request")] == ["bootstrap-000001"]
    assert len(of_kind(fx, "available_capacity")) == 4  # change cache reset


def test_a_released_machine_is_reused_warm_in_a_new_binding_and_its_record_says_so() -> None:
    """A reclaimed machine back in the pool is Idle (created): the cheapest pick for demand that
    comes back (the drained Pods recreated by their controllers). The reclaim record names the
    binding it ended and when the machine was released; the reused machine is a later binding."""
    e, now, order = _three_configured()
    e.on_rollup(rollup(need({"cpu": "1"}, {"cpu": "1"})), now)
    m = e.machine(order[1])
    assert m.binding == 1
    rec = e.reclaims[0]
    assert (rec.machine_id, rec.binding, rec.released_at) == (m.machine_id, 1, None)
    e.on_reclaim_ack(pb.ReclaimAck("reclaim-000001", 1), now + 1)
    e.on_reclaim_ack(pb.ReclaimAck("reclaim-000002", 1), now + 1)
    e.advance(now + 1 + 4.0)  # drain_wait -> Draining
    e.advance(now + 1 + 7.0)  # the grace window (7 s) over -> Idle, released
    assert not m.bound and m.free and m.state == S.IDLE
    assert e.reclaims[0].released_at == now + 1 + 7.0 and e.reclaims[0].binding == 1
    # the demand comes back: the warm released machines are bound again, a new binding each
    fx = e.on_rollup(rollup(need({"cpu": "5"}, {"cpu": "1"})), now + 10)
    assert m.bound and m.binding == 2
    assert m.machine_id in e.needs[0].machines
    assert e.binds == 5
    run_to_configured(e, fx, now + 10)
    assert e.reclaims[0].binding == 1 and e.reclaims[0].released_at == now + 1 + 7.0


def test_a_shard_process_numbers_its_reclaims_under_a_prefix_of_its_own() -> None:
    """Two runs of ``sim shard`` (a restart) never issue the same instruction id for different
    reclaims (docs/rules.md#reclaim-instruction-ids): before, both started at reclaim-000001."""
    from bigfleet_trio.sim.shard.cli import with_process_prefix

    ids = []
    for _ in range(2):
        e = ShardEngine(catalog(), with_process_prefix(EngineConfig(seed=1)))
        fx = e.on_rollup(rollup(need({"cpu": "5"}, {"cpu": "1"})), 1.0)
        now = run_to_configured(e, fx, 1.0)
        ris = of_kind(e.on_rollup(rollup(need({"cpu": "1"}, {"cpu": "1"})), now),
                      "reclaim_instruction")
        ids.append(ris[0].instruction_id)
    assert ids[0] != ids[1]
    assert all(i.startswith("reclaim-") and i.endswith("-000001") for i in ids)
    assert with_process_prefix(None, "abc123").instruction_prefix == "reclaim-abc123"
