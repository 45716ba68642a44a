"""Roll-up pure core (docs/rules.md#roll-up).

Every expected value below is worked out by hand from those rules.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from bigfleet_trio.operator.rollup.aggregate import RollupAggregator, build_from_scratch
from bigfleet_trio.operator.rollup.encoding import build_rollup_message
from bigfleet_trio.operator.rollup.errors import (
    CapacityRequestError,
    InvalidCapacityRequest,
    UnsupportedRequirement,
)
from bigfleet_trio.operator.rollup.profile import (
    OP_EXISTS,
    OP_IN,
    OP_NOT_IN,
    OP_SAME,
    Profile,
    Requirement,
    Spread,
    bucket_for_dollars,
    canonical_label_selector,
    co_location_group,
    penalty_bucket,
    with_same_requirement,
)
from bigfleet_trio.operator.rollup.translate import contribution_from_cr, is_pending
from bigfleet_trio.proto import pb
from bigfleet_trio.quantity import Quantity
from tests.support import capacity

GPU = "nvidia.com/gpu"
ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def cr(
    name: str = "a",
    ns: str = "ns",
    *,
    phase: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    return capacity.cr(name, spec.pop("priority", 0), spec.pop("resources", {GPU: "8"}),
                       namespace=ns, phase=phase, **spec)


# ---------------------------------------------------------------------------- buckets
@pytest.mark.parametrize(
    ("dollars", "bucket"),
    [
        (0.0, 1),
        (-0.0, 1),
        (-1.0, 1),
        (-math.inf, 1),
        (1e-9, 2),
        (0.25, 2),
        (0.5, 2),
        (0.500001, 3),
        (1.0, 3),
        (1.0000001, 4),
        (1.5, 4),
        (2.0, 4),
        (2.0000001, 5),
        (3.0, 5),
        (4.0, 5),
        (1024.0, 13),
        (1025.0, 14),
        (8192.0, 16),
        (8192.5, 17),
        (4194304.0, 25),
        (8388608.0, 26),
        (8388608.5, 27),
        (8388609.0, 27),
        (1e300, 27),
        (math.nan, 27),
        (math.inf, 27),
    ],
)
def test_bucket_for_dollars(dollars: float, bucket: int) -> None:
    assert bucket_for_dollars(dollars) == bucket


@pytest.mark.parametrize(
    ("penalty", "bucket"),
    [
        (None, 0),  # absent -> UNSPECIFIED
        ("0", 1),
        (0, 1),
        ("-1", 1),
        ("500m", 2),  # $0.50 counts (M68b: AsApproximateFloat64, not AsInt64)
        ("0.5", 2),
        ("501m", 3),
        ("1500m", 4),
        ("1", 3),
        (2, 4),
        ("8k", 16),  # 8000 <= 8192
        ("8192", 16),
        ("8193", 17),
        ("8Mi", 26),  # 8388608 exactly
        ("8388609", 27),
        ("1e3", 13),  # 1000 <= 1024
        ("1Ki", 13),
    ],
)
def test_penalty_bucket(penalty: object, bucket: int) -> None:
    assert penalty_bucket(penalty) == bucket


def test_penalty_bucket_bad_quantity_names_cr_and_field() -> None:
    with pytest.raises(InvalidCapacityRequest) as exc:
        penalty_bucket("12 dollars", cr="team/x", field_path="spec.interruptionPenalty")
    assert "team/x" in str(exc.value) and "spec.interruptionPenalty" in str(exc.value)
    assert exc.value.field == "spec.interruptionPenalty" and exc.value.cr == "team/x"


# ---------------------------------------------------------------------------- fingerprint
def test_fingerprint_reference_example() -> None:
    c = contribution_from_cr(
        cr(
            priority=1000000,
            interruptionPenalty="8192",
            requirements=[
                {
                    "key": "node.kubernetes.io/instance-type",
                    "operator": "In",
                    "values": ["a3-highgpu-8g"],
                }
            ],
        )
    )
    assert c.profile.fingerprint == (
        "p=1000000|ipb=16|rpb=0|reqs=node.kubernetes.io/instance-type:1:a3-highgpu-8g;|spr="
    )
    assert c.group == ""


def test_fingerprint_sorting_spread_and_penalties() -> None:
    c = contribution_from_cr(
        cr(
            priority=-5,
            interruptionPenalty="500m",
            reclamationPenalty="0",
            requirements=[
                {"key": ZONE, "operator": "NotIn", "values": ["c"]},
                {"key": ZONE, "operator": "In", "values": ["b", "a"]},
                {"key": "kubernetes.io/arch", "operator": "Exists"},
            ],
            topologySpread=[
                {"topologyKey": ZONE, "maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"},
                {"topologyKey": HOST, "maxSkew": 2, "whenUnsatisfiable": "ScheduleAnyway"},
                {"topologyKey": "rack", "maxSkew": 3, "whenUnsatisfiable": ""},
            ],
        )
    )
    assert c.profile.fingerprint == (
        "p=-5|ipb=2|rpb=1|reqs=kubernetes.io/arch:3:;"
        "topology.kubernetes.io/zone:1:a,b;topology.kubernetes.io/zone:2:c;"
        "|spr=rack:3:0;topology.kubernetes.io/zone:1:1;"
    )
    assert c.profile.requirements == (
        Requirement("kubernetes.io/arch", OP_EXISTS, ()),
        Requirement(ZONE, OP_IN, ("a", "b")),
        Requirement(ZONE, OP_NOT_IN, ("c",)),
    )
    assert c.profile.spread == (Spread("rack", 3, 0), Spread(ZONE, 1, 1))


def test_unknown_when_unsatisfiable_kept_as_zero() -> None:
    c = contribution_from_cr(
        cr(topologySpread=[{"topologyKey": "z", "maxSkew": 1, "whenUnsatisfiable": "Bogus"}])
    )
    assert c.profile.fingerprint == "p=0|ipb=0|rpb=0|reqs=|spr=z:1:0;"


def test_schedule_anyway_dropped_merges_profiles() -> None:
    soft = cr(
        "soft",
        topologySpread=[{"topologyKey": ZONE, "maxSkew": 1, "whenUnsatisfiable": "ScheduleAnyway"}],
    )
    plain = cr("plain")
    needs = build_from_scratch([soft, plain])
    assert len(needs) == 1
    assert needs[0].spread == []
    assert needs[0].aggregate_resources == {GPU: "16"}


def test_resources_not_part_of_profile() -> None:
    a = contribution_from_cr(cr(resources={GPU: "8"}))
    b = contribution_from_cr(cr(resources={"cpu": "2", "memory": "4Gi"}))
    assert a.profile == b.profile and a.profile.fingerprint == b.profile.fingerprint


# ---------------------------------------------------------------------------- selectors
@pytest.mark.parametrize(
    ("selector", "text"),
    [
        (None, ""),
        ({}, ";"),
        ({"matchLabels": {}}, ";"),
        ({"matchLabels": {"job": "trainer-7"}}, "job=trainer-7,;"),
        ({"matchLabels": {"b": "2", "a": "1"}}, "a=1,b=2,;"),
        (
            {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web", "api"]}]},
            ";tier In api,web;",
        ),
        (
            {
                "matchLabels": {"x": "y"},
                "matchExpressions": [{"key": "k", "operator": "Exists"}],
            },
            "x=y,;k Exists ;",
        ),
        (
            {
                "matchExpressions": [
                    {"key": "b", "operator": "In", "values": ["1"]},
                    {"key": "a", "operator": "NotIn", "values": ["2"]},
                    {"key": "a", "operator": "In", "values": ["3"]},
                ]
            },
            ";a In 3;a NotIn 2;b In 1;",
        ),
    ],
)
def test_canonical_label_selector(selector: dict[str, Any] | None, text: str) -> None:
    assert canonical_label_selector(selector) == text


@pytest.mark.parametrize(
    ("spec", "group"),
    [
        ({}, ""),
        ({"coLocation": None}, ""),
        ({"coLocation": {"topologyKey": ""}}, ""),
        ({"coLocation": {"topologyKey": "", "labelSelector": {}}}, ""),
        ({"coLocation": {"topologyKey": ZONE}}, "topology.kubernetes.io/zone\x00"),
        (
            {"coLocation": {"topologyKey": ZONE, "labelSelector": {}}},
            "topology.kubernetes.io/zone\x00;",
        ),
        (
            {
                "coLocation": {
                    "topologyKey": HOST,
                    "labelSelector": {"matchLabels": {"job": "trainer-7"}},
                }
            },
            "kubernetes.io/hostname\x00job=trainer-7,;",
        ),
    ],
)
def test_co_location_group(spec: dict[str, Any], group: str) -> None:
    assert co_location_group(spec) == group


# ---------------------------------------------------------------------------- Same
def _profile(*reqs: Requirement) -> Profile:
    return Profile.new(reqs, (), 0, 0, 0)


def test_same_inserted_at_sorted_position() -> None:
    p = _profile(Requirement(ZONE, OP_IN, ("a",)))
    q = with_same_requirement(p, HOST)
    # "kubernetes.io/hostname" < "topology.kubernetes.io/zone": Same goes first, not last
    assert q.requirements == (Requirement(HOST, OP_SAME, ()), Requirement(ZONE, OP_IN, ("a",)))
    assert q.fingerprint == (
        "p=0|ipb=0|rpb=0|reqs=kubernetes.io/hostname:5:;topology.kubernetes.io/zone:1:a;|spr="
    )


def test_same_after_in_on_same_key() -> None:
    p = _profile(Requirement(HOST, OP_NOT_IN, ("n2",)), Requirement(HOST, OP_IN, ("n1",)))
    q = with_same_requirement(p, HOST)
    assert [r.operator for r in q.requirements] == [OP_IN, OP_NOT_IN, OP_SAME]
    assert q.fingerprint == (
        "p=0|ipb=0|rpb=0|reqs=kubernetes.io/hostname:1:n1;kubernetes.io/hostname:2:n2;"
        "kubernetes.io/hostname:5:;|spr="
    )


def test_same_idempotent() -> None:
    p = with_same_requirement(_profile(), ZONE)
    assert with_same_requirement(p, ZONE) is p
    assert p.fingerprint == "p=0|ipb=0|rpb=0|reqs=topology.kubernetes.io/zone:5:;|spr="
    # a Same on another key is a different requirement
    r = with_same_requirement(p, HOST)
    assert [(x.key, x.operator) for x in r.requirements] == [(HOST, OP_SAME), (ZONE, OP_SAME)]


def test_colocated_cr_gets_same_and_group() -> None:
    c = contribution_from_cr(
        cr(
            coLocation={
                "topologyKey": HOST,
                "labelSelector": {"matchLabels": {"job": "trainer-7"}},
            }
        )
    )
    assert c.group == "kubernetes.io/hostname\x00job=trainer-7,;"
    assert c.profile.fingerprint == "p=0|ipb=0|rpb=0|reqs=kubernetes.io/hostname:5:;|spr="


def test_colocation_grouping_rules() -> None:
    sel = {"matchLabels": {"job": "t"}}
    crs = [
        cr("a1", coLocation={"topologyKey": HOST, "labelSelector": sel}),
        cr("a2", coLocation={"topologyKey": HOST, "labelSelector": {"matchLabels": {"job": "t"}}}),
        cr("b", coLocation={"topologyKey": HOST, "labelSelector": {"matchLabels": {"job": "u"}}}),
        cr("c", coLocation={"topologyKey": ZONE, "labelSelector": sel}),
        cr("d", coLocation={"topologyKey": ZONE}),  # nil selector
        cr("e", coLocation={"topologyKey": ZONE, "labelSelector": {}}),  # empty selector
        cr("plain"),
    ]
    needs = build_from_scratch(crs)
    by_group = {n.group: n for n in needs}
    assert set(by_group) == {
        "",
        "kubernetes.io/hostname\x00job=t,;",
        "kubernetes.io/hostname\x00job=u,;",
        "topology.kubernetes.io/zone\x00job=t,;",
        "topology.kubernetes.io/zone\x00",
        "topology.kubernetes.io/zone\x00;",
    }
    assert by_group["kubernetes.io/hostname\x00job=t,;"].aggregate_resources == {GPU: "16"}
    assert by_group[""].requirements == []
    same_zone = [pb.NodeSelectorRequirement(ZONE, pb.NodeSelectorRequirementOperator.OPERATOR_SAME)]
    assert by_group["topology.kubernetes.io/zone\x00"].requirements == same_zone


# ---------------------------------------------------------------------------- errors
@pytest.mark.parametrize("op", ["Gt", "Lt", "", None, "Same", "in"])
def test_unsupported_operator_raises(op: object) -> None:
    bad = cr("x", "team", requirements=[{"key": "k", "operator": op, "values": ["1"]}])
    with pytest.raises(UnsupportedRequirement) as exc:
        contribution_from_cr(bad)
    e = exc.value
    assert e.cr == "team/x" and e.field == "spec.requirements[0].operator"
    assert e.operator == op and e.reason == "UnsupportedRequirement"
    assert "team/x" in str(e)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"resources": {"cpu": "abc"}}, "spec.resources[cpu]"),
        ({"resources": {"cpu": "1", "memory": "1 Gi"}}, "spec.resources[memory]"),
        ({"resources": {"cpu": "-1"}}, "spec.resources[cpu]"),
        ({"resources": {"cpu": None}}, "spec.resources[cpu]"),
        ({"resources": ["cpu"]}, "spec.resources"),
        ({"resources": {"": "1"}}, "spec.resources[]"),
        ({"interruptionPenalty": "lots"}, "spec.interruptionPenalty"),
        ({"reclamationPenalty": "1$"}, "spec.reclamationPenalty"),
        ({"priority": "high"}, "spec.priority"),
        ({"priority": 2**31}, "spec.priority"),
        ({"priority": True}, "spec.priority"),
        (
            {"topologySpread": [{"topologyKey": "z", "maxSkew": "1"}]},
            "spec.topologySpread[0].maxSkew",
        ),
        ({"requirements": [{"key": "k", "operator": "In", "values": "a"}]}, None),
        ({"coLocation": "host"}, "spec.coLocation"),
    ],
)
def test_malformed_cr_names_cr_and_field(spec: dict[str, Any], field: str | None) -> None:
    bad = cr("x", "team", **spec)
    with pytest.raises(InvalidCapacityRequest) as exc:
        contribution_from_cr(bad)
    assert "team/x" in str(exc.value)
    if field is not None:
        assert exc.value.field == field
        assert field in str(exc.value)


def test_missing_spec_parts_default() -> None:
    c = contribution_from_cr({"metadata": {"name": "n", "namespace": "s"}, "spec": {}})
    assert c.resources == {} and c.profile.fingerprint == "p=0|ipb=0|rpb=0|reqs=|spr="
    c2 = contribution_from_cr({"metadata": {"name": "n", "namespace": "s"}})
    assert c2.profile == c.profile


# ---------------------------------------------------------------------------- aggregation
def test_three_gpu_crs_aggregate() -> None:
    crs = [cr(n, resources={GPU: "8"}) for n in ("a", "b", "c")]
    needs = build_from_scratch(crs)
    assert len(needs) == 1
    assert needs[0].aggregate_resources == {GPU: "24"}
    assert needs[0].min_unit == {GPU: "8"}
    agg = RollupAggregator()
    for c in crs:
        agg.upsert(f"ns/{c['metadata']['name']}", c)
    assert agg.needs() == needs


def test_mixed_vectors_sum_and_max() -> None:
    crs = [
        cr("a", resources={"cpu": "500m", "memory": "1Gi"}),
        cr("b", resources={"cpu": "500m", "memory": "512Mi"}),
        cr("c", resources={"cpu": "2"}),
    ]
    (need,) = build_from_scratch(crs)
    assert need.aggregate_resources == {"cpu": "3", "memory": "1536Mi"}
    assert need.min_unit == {"cpu": "2", "memory": "1Gi"}
    assert list(need.aggregate_resources) == ["cpu", "memory"]


def test_canonical_strings_even_for_single_cr() -> None:
    (need,) = build_from_scratch([cr(resources={"cpu": "8000", "memory": "1024Mi", "x": "0.5"})])
    assert need.aggregate_resources == {"cpu": "8k", "memory": "1Gi", "x": "500m"}
    assert need.min_unit == {"cpu": "8k", "memory": "1Gi", "x": "500m"}
    (need,) = build_from_scratch(
        [cr("a", resources={"c": "500m"}), cr("b", resources={"c": "500m"})]
    )
    assert need.aggregate_resources == {"c": "1"} and need.min_unit == {"c": "500m"}
    (need,) = build_from_scratch([cr("a", resources={"c": "3"}), cr("b", resources={"c": "4500m"})])
    assert need.aggregate_resources == {"c": "7500m"} and need.min_unit == {"c": "4500m"}


def test_mixed_formats_are_order_independent() -> None:
    a = cr("a", resources={"memory": "1Gi"})
    b = cr("b", resources={"memory": "1073741824"})
    one = build_from_scratch([a, b])
    two = build_from_scratch([b, a])
    assert one == two
    # BinarySI wins: 2Gi for the sum, 1Gi for the tied maximum
    assert one[0].aggregate_resources == {"memory": "2Gi"}
    assert one[0].min_unit == {"memory": "1Gi"}


def test_need_order_is_by_fingerprint_then_group() -> None:
    crs = [
        cr("p9", priority=9),
        cr("p10", priority=10),
        cr("g", priority=9, coLocation={"topologyKey": "a"}),
    ]
    needs = build_from_scratch(crs)
    # "p=10|..." < "p=9|ipb=0|rpb=0|reqs=a:5:;..." < "p=9|ipb=0|rpb=0|reqs=|spr="
    assert [(n.priority, n.group) for n in needs] == [(10, ""), (9, "a\x00"), (9, "")]


def test_wire_mapping_every_field() -> None:
    c = cr(
        priority=1000,
        interruptionPenalty="1500m",
        reclamationPenalty="8Mi",
        resources={"cpu": "2", GPU: "8"},
        requirements=[
            {"key": ZONE, "operator": "In", "values": ["z2", "z1"]},
            {"key": "gpu", "operator": "DoesNotExist"},
        ],
        topologySpread=[{"topologyKey": ZONE, "maxSkew": 2, "whenUnsatisfiable": "DoNotSchedule"}],
        coLocation={"topologyKey": HOST, "labelSelector": {"matchLabels": {"j": "1"}}},
    )
    (n,) = build_from_scratch([c])
    op = pb.NodeSelectorRequirementOperator
    assert n.requirements == [
        pb.NodeSelectorRequirement(key="gpu", operator=op.OPERATOR_DOES_NOT_EXIST, values=[]),
        pb.NodeSelectorRequirement(key=HOST, operator=op.OPERATOR_SAME, values=[]),
        pb.NodeSelectorRequirement(key=ZONE, operator=op.OPERATOR_IN, values=["z1", "z2"]),
    ]
    assert n.aggregate_resources == {"cpu": "2", GPU: "8"}
    assert n.min_unit == {"cpu": "2", GPU: "8"}
    assert n.priority == 1000
    assert n.spread == [
        pb.TopologySpread(
            topology_key=ZONE,
            max_skew=2,
            when_unsatisfiable=pb.TopologySpreadWhenUnsatisfiable.WHEN_UNSATISFIABLE_DO_NOT_SCHEDULE,
        )
    ]
    assert int(n.interruption_penalty_bucket) == 4
    assert int(n.reclamation_penalty_bucket) == 26
    assert n.group == "kubernetes.io/hostname\x00j=1,;"
    # round trip through the wire
    back = pb.CapacityNeed().parse(bytes(n))
    assert back == n and back.group.encode() == b"kubernetes.io/hostname\x00j=1,;"


def test_rollup_message_and_empty_cluster() -> None:
    agg = RollupAggregator()
    assert agg.needs() == []
    msg = build_rollup_message("c-1", agg.needs(), 1234)
    assert msg.cluster_id == "c-1" and msg.timestamp_unix_nanos == 1234 and msg.needs == []
    assert pb.ClusterCapacityNeeds().parse(bytes(msg)) == msg
    agg.upsert("ns/a", cr("a"))
    msg = build_rollup_message("c-1", agg.needs(), 5)
    assert len(msg.needs) == 1 and msg.needs[0].aggregate_resources == {GPU: "8"}
    agg.delete("ns/a")
    assert build_rollup_message("c-1", agg.needs(), 6).needs == []


# ---------------------------------------------------------------------------- aggregator
def test_aggregator_update_moves_between_needs() -> None:
    agg = RollupAggregator()
    agg.upsert("ns/a", cr("a", priority=1, resources={"cpu": "1"}))
    agg.upsert("ns/b", cr("b", priority=1, resources={"cpu": "3"}))
    (n,) = agg.needs()
    assert n.aggregate_resources == {"cpu": "4"} and n.min_unit == {"cpu": "3"}
    agg.upsert("ns/b", cr("b", priority=2, resources={"cpu": "3"}))
    needs = agg.needs()
    assert [(x.priority, x.aggregate_resources) for x in needs] == [
        (1, {"cpu": "1"}),
        (2, {"cpu": "3"}),
    ]
    agg.delete("ns/a")
    assert [x.priority for x in agg.needs()] == [2]
    agg.delete("ns/missing")  # no-op
    assert len(agg) == 1


def test_aggregator_max_recomputed_on_delete() -> None:
    agg = RollupAggregator()
    agg.upsert("ns/a", cr("a", resources={"cpu": "1"}))
    agg.upsert("ns/b", cr("b", resources={"cpu": "4"}))
    agg.upsert("ns/c", cr("c", resources={"cpu": "2", "memory": "1Gi"}))
    (n,) = agg.needs()
    assert n.aggregate_resources == {"cpu": "7", "memory": "1Gi"}
    assert n.min_unit == {"cpu": "4", "memory": "1Gi"}
    agg.delete("ns/b")
    (n,) = agg.needs()
    assert n.aggregate_resources == {"cpu": "3", "memory": "1Gi"} and n.min_unit["cpu"] == "2"
    agg.delete("ns/c")
    (n,) = agg.needs()
    assert n.aggregate_resources == {"cpu": "1"} and n.min_unit == {"cpu": "1"}


def test_aggregator_format_only_update() -> None:
    agg = RollupAggregator()
    agg.upsert("ns/a", cr("a", resources={"memory": "1Gi"}))
    agg.upsert("ns/a", cr("a", resources={"memory": "1073741824"}))
    (n,) = agg.needs()
    assert n.aggregate_resources == {"memory": "1073741824"}


def test_aggregator_caches_clean_needs() -> None:
    agg = RollupAggregator()
    agg.upsert("ns/a", cr("a", priority=1))
    agg.upsert("ns/b", cr("b", priority=2))
    first = agg.needs()
    agg.upsert("ns/b2", cr("b2", priority=2))
    second = agg.needs()
    assert second[0] is first[0]  # untouched need reused
    assert second[1] is not first[1] and second[1].aggregate_resources == {GPU: "16"}
    agg.upsert("ns/b2", cr("b2", priority=2))  # identical resync: nothing dirty
    assert agg.needs()[1] is second[1]


def test_aggregator_excludes_unsupported_visibly() -> None:
    agg = RollupAggregator()
    assert agg.upsert("ns/a", cr("a")) is None
    agg.upsert("ns/b", cr("b"))
    err = agg.upsert(
        "ns/a", cr("a", requirements=[{"key": "k", "operator": "Gt", "values": ["3"]}])
    )
    assert isinstance(err, UnsupportedRequirement)
    assert set(agg.excluded()) == {"ns/a"} and "Gt" in agg.excluded()["ns/a"]
    assert isinstance(agg.excluded_errors()["ns/a"], CapacityRequestError)
    (n,) = agg.needs()
    assert n.aggregate_resources == {GPU: "8"}  # only b left
    assert agg.upsert("ns/a", cr("a")) is None  # fixed: back in, no longer excluded
    assert agg.excluded() == {} and agg.needs()[0].aggregate_resources == {GPU: "16"}
    agg.upsert("ns/c", cr("c", resources={"cpu": "x"}))
    assert "spec.resources[cpu]" in agg.excluded()["ns/c"]
    agg.delete("ns/c")
    assert agg.excluded() == {}


def test_aggregator_pending_tracking() -> None:
    agg = RollupAggregator()
    agg.upsert("ns/a", cr("a"))  # no status: pending
    agg.upsert("ns/b", cr("b", phase="Pending"))
    agg.upsert("ns/c", cr("c", phase="Acknowledged"))
    agg.upsert("ns/d", cr("d", phase="", requirements=[{"key": "k", "operator": "Lt"}]))
    assert agg.pending() == {"ns/a", "ns/b"}  # excluded CRs are never acknowledged
    agg.upsert("ns/a", cr("a", phase="Acknowledged"))
    agg.delete("ns/b")
    assert agg.pending() == set()
    assert is_pending(cr(phase="")) and not is_pending(cr(phase="Acknowledged"))


def test_aggregator_rebuild() -> None:
    agg = RollupAggregator()
    agg.upsert("ns/x", cr("x", priority=7))
    items = [("ns/a", cr("a")), ("ns/b", cr("b", resources={"cpu": "1"}))]
    agg.rebuild(items)
    assert agg.needs() == build_from_scratch([c for _, c in items])
    assert sorted(agg.keys()) == ["ns/a", "ns/b"]


def test_contribution_resources_are_quantities() -> None:
    c = contribution_from_cr(cr(resources={"memory": "1024Mi", "cpu": 2}))
    assert list(c.resources) == ["cpu", "memory"]
    assert c.resources["memory"] == Quantity.parse("1Gi")
    assert c.need_key == (c.profile.fingerprint, "")


def test_encode_need_edge_cases_match_betterproto() -> None:
    from bigfleet_trio.operator.rollup.encoding import encode_need, need_to_wire

    p = Profile.new(
        [Requirement("zöne", OP_IN, ("", "ä")), Requirement("", OP_EXISTS, ())],
        [Spread("", 0, 0), Spread("z", -1, 1)],
        -5,
        27,
        0,
    )
    agg = {"": "", "cpu": "1"}
    mins = {"cpu": "-1"}
    assert encode_need(p, "g\x00;", agg, mins) == bytes(need_to_wire(p, "g\x00;", agg, mins))
    assert encode_need(Profile.new([], [], 0, 0, 0), "", {}, {}) == b""
