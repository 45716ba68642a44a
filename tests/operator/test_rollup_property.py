"""Incremental roll-up == from-scratch roll-up over random add/update/delete sequences."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bigfleet_trio.operator.crview import slim
from bigfleet_trio.operator.rollup.aggregate import RollupAggregator, build_from_scratch
from bigfleet_trio.operator.rollup.encoding import (
    build_rollup_message,
    encode_operator_rollup,
    encode_rollup,
)
from bigfleet_trio.operator.rollup.translate import is_pending
from bigfleet_trio.proto import pb

KEYS = [f"ns/cr-{i}" for i in range(8)]
QUANTITIES = ["0", "1", "500m", "1500m", "2", "8", "1Gi", "512Mi", "1073741824", "1e3", "1k"]

requirement = st.one_of(
    st.fixed_dictionaries(
        {
            "key": st.sampled_from(["zone", "arch"]),
            "operator": st.sampled_from(["In", "NotIn"]),
            "values": st.lists(st.sampled_from(["a", "b", "c"]), max_size=2),
        }
    ),
    st.fixed_dictionaries(
        {"key": st.sampled_from(["zone", "gpu"]), "operator": st.sampled_from(["Exists", "Gt"])}
    ),
)
spread = st.fixed_dictionaries(
    {
        "topologyKey": st.sampled_from(["zone", "host"]),
        "maxSkew": st.integers(1, 2),
        "whenUnsatisfiable": st.sampled_from(["DoNotSchedule", "ScheduleAnyway", ""]),
    }
)
co_location = st.one_of(
    st.none(),
    st.fixed_dictionaries({"topologyKey": st.sampled_from(["host", ""])}),
    st.fixed_dictionaries(
        {
            "topologyKey": st.sampled_from(["host", "zone"]),
            "labelSelector": st.one_of(
                st.just({}), st.fixed_dictionaries({"matchLabels": st.just({"job": "t"})})
            ),
        }
    ),
)
spec = st.fixed_dictionaries(
    {
        "priority": st.sampled_from([0, 10]),
        "resources": st.dictionaries(
            st.sampled_from(["cpu", "memory", "gpu"]),
            st.sampled_from(QUANTITIES + ["bad"]),
            max_size=3,
        ),
    },
    optional={
        "requirements": st.lists(requirement, max_size=2),
        "topologySpread": st.lists(spread, max_size=2),
        "coLocation": co_location,
        "interruptionPenalty": st.sampled_from(["500m", "1", "9", "-1"]),
    },
)
op = st.tuples(
    st.sampled_from(["upsert", "upsert", "delete"]),
    st.sampled_from(KEYS),
    spec,
    st.sampled_from([None, "Pending", "Acknowledged"]),
)


def make(key: str, spec: dict[str, Any], phase: str | None) -> dict[str, Any]:
    ns, name = key.split("/")
    obj: dict[str, Any] = {"metadata": {"name": name, "namespace": ns}, "spec": spec}
    if phase:
        obj["status"] = {"phase": phase}
    return obj


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=40))
def test_incremental_matches_from_scratch(ops: list[tuple[str, str, dict[str, Any], Any]]) -> None:
    agg = RollupAggregator()
    live: dict[str, dict[str, Any]] = {}
    for kind, key, sp, phase in ops:
        if kind == "delete":
            agg.delete(key)
            live.pop(key, None)
        else:
            obj = slim(make(key, sp, phase))
            agg.upsert(key, obj)
            live[key] = obj
        expected = build_from_scratch(live.values())
        got = agg.needs()
        assert got == expected
        assert [bytes(n) for n in got] == [bytes(n) for n in expected]
        assert agg.needs_encoded() == [bytes(n) for n in expected]
    expected_pending = {k for k, o in live.items() if is_pending(o) and k not in agg.excluded()}
    assert agg.pending() == expected_pending
    assert set(agg.excluded()) | set(agg.keys()) == set(live)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(KEYS), spec), max_size=12),
    st.text(max_size=8),
    st.integers(0, 2**63 - 1),
)
def test_fast_encoding_matches_betterproto(
    items: list[tuple[str, dict[str, Any]]], cluster: str, now: int
) -> None:
    agg = RollupAggregator()
    for key, sp in items:
        agg.upsert(key, make(key, sp, None))
    msg = build_rollup_message(cluster, agg.needs(), now)
    assert encode_rollup(cluster, now, agg.needs_encoded()) == bytes(msg)
    assert encode_operator_rollup(cluster, now, agg.needs_encoded()) == bytes(
        pb.OperatorMessage(rollup=msg)
    )
