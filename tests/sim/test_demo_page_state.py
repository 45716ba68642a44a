"""The fleet demo's pure parts over plain data: the live page's state (:func:`page_state`,
:func:`need_profile`), a cluster's summary row (:func:`cluster_row`) and when a fleet cluster
counts as settled (:func:`converged_fleet`, docs/rules.md#simulated-fleet). The shard side is a
stand-in holding plain records (machines, reclaims, needs), the way the functions read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from bigfleet_trio.operator.rollup.aggregate import build_from_scratch
from bigfleet_trio.proto import pb
from bigfleet_trio.sim.demo_page import ClusterFacts, need_profile, page_state
from bigfleet_trio.sim.demo_world import OWNED_BY_POD, World, cluster_row, converged_fleet
from bigfleet_trio.sim.shard.fleet import Move
from bigfleet_trio.sim.shard.model import NeedStatus, ReclaimRecord
from tests.support.capacity import cr

IT = "node.kubernetes.io/instance-type"


def need(key: str = "n1", short: tuple[str, ...] = (), priority: int = 0,
         requirements: tuple[tuple[str, str, tuple[str, ...]], ...] = (),
         aggregate: dict[str, str] | None = None,
         machines: tuple[str, ...] = ()) -> NeedStatus:
    return NeedStatus(key=key, priority=priority, group="", requirements=requirements,
                      aggregate=aggregate if aggregate is not None else {"cpu": "3"},
                      min_unit={"cpu": "1"}, machines=machines, new=0, short=short)


# ------------------------------------------------------------------------------------------------
# the live page's state
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("requirements", "label"), [
    ((), "any machine"),
    (((IT, "OPERATOR_EXISTS", ()),), "type exists"),
    (((IT, "OPERATOR_IN", ("a", "b")), ("demo.bigfleet.io/pool", "OPERATOR_IN", ("fleet",))),
     "type in a,b, pool in fleet"),
    ((("topology.kubernetes.io/zone", "OPERATOR_NOT_IN", ("z1",)),), "zone not in z1"),
    ((("bigfleet.io/spot", "OPERATOR_DOES_NOT_EXIST", ()),), "spot absent"),
    ((("kubernetes.io/hostname", "OPERATOR_SAME", ()),), "host same"),
    ((("cloud.google.com/gke-accelerator", "OPERATOR_GT", ("1",)),), "accel operator_gt 1"),
    ((("plain", "OPERATOR_IN", ("x",)),), "plain in x"),
])
def test_a_need_profile_is_its_requirements_in_short(
        requirements: tuple[tuple[str, str, tuple[str, ...]], ...], label: str) -> None:
    assert need_profile(need(requirements=requirements)) == label


def test_the_page_state_is_every_cluster_then_the_moves() -> None:
    busy = ClusterFacts(
        name="c1",
        needs=[need("n1", priority=10, requirements=((IT, "OPERATOR_EXISTS", ()),),
                    machines=("m-1", "m-2")),
               need("n2", short=("cpu", "memory"), aggregate={"memory": "1Gi"})],
        phases={"Ready": 2, "Draining": 1, "Bootstrapping": 1}, machines=2, spot=1,
        cost_per_hour=0.456, reclaims_in_flight=1, drains_in_flight=1,
        events=[{"kind": "reclaim", "detail": "node=n-1"}])
    idle = ClusterFacts(name="c2")
    moves = [Move(105.04, "m-1", "n-1", "fleet-od-4", "c2", "c1", "surplus", False),
             Move(112.96, "m-9", "n-9", "fleet-spot-4", "c1", "c2", "preempted", True)]
    state = page_state(12.345, [busy, idle], moves, 100.0)
    assert state == {
        "t": 12.3,
        "clusters": [
            {"name": "c1",
             "demand": [{"profile": "type exists", "priority": 10, "cpu": "3", "machines": 2,
                         "short": ""},
                        {"profile": "any machine", "priority": 0, "cpu": "0", "machines": 0,
                         "short": "cpu,memory"}],
             "phases": {"Bootstrapping": 1, "Draining": 1, "Ready": 2},
             "machines": 2, "spot": 1, "cost_per_hour": 0.46, "reclaims_in_flight": 1,
             "drains_in_flight": 1, "shortfalls": 1,
             "events": [{"kind": "reclaim", "detail": "node=n-1"}]},
            {"name": "c2", "demand": [], "phases": {}, "machines": 0, "spot": 0,
             "cost_per_hour": 0.0, "reclaims_in_flight": 0, "drains_in_flight": 0,
             "shortfalls": 0, "events": []},
        ],
        "moves": [
            {"t": 5.0, "machine": "m-1", "node": "n-1", "instance_type": "fleet-od-4",
             "from": "c2", "to": "c1", "why": "surplus", "spot": False},
            {"t": 13.0, "machine": "m-9", "node": "n-9", "instance_type": "fleet-spot-4",
             "from": "c1", "to": "c2", "why": "preempted", "spot": True},
        ],
    }
    assert list(state["clusters"][0]["phases"]) == ["Bootstrapping", "Draining", "Ready"]


def test_an_empty_fleet_is_an_empty_page() -> None:
    assert page_state(0.0, [], [], 0.0) == {"t": 0.0, "clusters": [], "moves": []}


# ------------------------------------------------------------------------------------------------
# a stand-in shard view: plain records, read as the demo's ClusterView is
# ------------------------------------------------------------------------------------------------


def machine(mid: str, state: str = "CONFIGURED", *, spot: bool = False, price: float = 0.2,
            bound: bool = True, binding: int = 1) -> Any:
    return SimpleNamespace(machine_id=mid, node_name=f"node-{mid}", state=SimpleNamespace(
        name=state), spot=spot, shape=SimpleNamespace(price_per_hour=price), bound=bound,
        binding=binding, reclaim=None)


def reclaim(mid: str, reason: str = "surplus", *, acked: bool = True,
            released: bool = True) -> ReclaimRecord:
    return ReclaimRecord(f"ri-{mid}", mid, f"node-{mid}", 1, 1.0,
                         acked_at=2.0 if acked else None, binding=1,
                         released_at=3.0 if released else None, cluster_id="c1", reason=reason)


@dataclass
class Engine:
    machines: list[Any] = field(default_factory=list)
    reclaims: list[ReclaimRecord] = field(default_factory=list)
    needs: list[NeedStatus] = field(default_factory=list)

    def bound_machines(self) -> list[Any]:
        return [m for m in self.machines if m.bound]

    def machine(self, mid: str) -> Any:
        return next((m for m in self.machines if m.machine_id == mid), None)


@dataclass
class View:
    engine: Engine
    last_rollup: Any = None

    @property
    def reclaims_issued(self) -> list[ReclaimRecord]:
        return list(self.engine.reclaims)


def pod(name: str, node: str | None = None, *, phase: str = "Running",
        deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "fleet", "uid": f"u-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-03T06:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase}}


def world(pods: list[dict[str, Any]], engine: Engine) -> tuple[World, View]:
    """A World in which every live Pod has its CR and the shard holds the roll-up of those CRs,
    every bound machine's UpcomingNode is Ready: what is left to check is the shard's side."""
    live = [p for p in pods if p["status"]["phase"] not in ("Succeeded", "Failed")]
    crs = []
    for p in live:
        c = cr(f"cr-{p['metadata']['name']}", namespace="fleet")
        c["metadata"]["labels"] = {OWNED_BY_POD: p["metadata"]["uid"]}
        crs.append(c)
    ups = [{"metadata": {"name": f"un-{m.machine_id}"}, "status": {"phase": "Ready"}}
           for m in engine.bound_machines()]
    nodes = [{"metadata": {"name": m.node_name}} for m in engine.bound_machines()]
    view = View(engine, pb.ClusterCapacityNeeds(cluster_id="c1",
                                                needs=build_from_scratch(crs)))
    return World(pods=pods, crs=crs, upcoming=ups, nodes=nodes, shard={}), view


# ------------------------------------------------------------------------------------------------
# a cluster's summary row
# ------------------------------------------------------------------------------------------------


def test_a_cluster_row_counts_configured_machines_spot_and_the_cost_of_every_bound_one() -> None:
    eng = Engine(machines=[machine("a", spot=True, price=0.06), machine("b", price=0.2),
                           machine("c", "CONFIGURING", spot=True, price=0.06),
                           machine("gone", bound=False, price=9.0)],
                 reclaims=[reclaim("x"), reclaim("y", "preempted")])
    w, view = world([pod("p1", "node-a"), pod("p2", "node-b"), pod("done", phase="Succeeded"),
                     pod("leaving", "node-b", deleting=True)], eng)
    row = cluster_row("c1", "/k", "127.0.0.1:1", w, view)
    assert row == {"name": "c1", "kubeconfig": "/k", "diagnostics": "127.0.0.1:1",
                   "pods": 2, "pods_bound": 2, "pods_pending": [], "pending_why": "",
                   "machines": 2, "spot_machines": 1, "hourly_cost": 0.32, "short_needs": 0,
                   "reclaims": 2, "preempted": 1}


@pytest.mark.parametrize(("reasons", "short", "why"), [
    (["preempted", "preempted", "surplus"], (), "2 of its machines were preempted by "
     "higher-priority demand in another cluster and nothing free fits"),
    (["surplus"], ("cpu",), "1 needs short of machines"),
    ([], ("cpu",), "1 needs short of machines"),
    ([], (), "being placed"),
])
def test_a_cluster_row_says_why_pods_are_pending(reasons: list[str], short: tuple[str, ...],
                                                 why: str) -> None:
    eng = Engine(machines=[machine("a")],
                 reclaims=[reclaim(f"r{i}", r) for i, r in enumerate(reasons)],
                 needs=[need("n1", short=short), need("n2")])
    w, view = world([pod("b"), pod("a1", "node-a"), pod("a0")], eng)
    row = cluster_row("c1", "/k", "", w, view)
    assert row["pods_pending"] == ["fleet/a0", "fleet/b"]
    assert row["pending_why"] == why
    assert row["short_needs"] == (1 if short else 0)


def test_a_cluster_row_before_any_read_has_no_pods() -> None:
    view = View(Engine(machines=[machine("a")], needs=[need(short=("cpu",))]))
    row = cluster_row("c1", "/k", "", None, view)
    assert (row["pods"], row["pods_bound"], row["pods_pending"], row["pending_why"]) == (
        0, 0, [], "")
    assert (row["machines"], row["short_needs"]) == (1, 1)


# ------------------------------------------------------------------------------------------------
# a fleet cluster settled after the scale-down and the burst
# ------------------------------------------------------------------------------------------------

SHORT = "1 needs short of machines"
UNBOUND = "1 Pods not bound to a node"


@pytest.mark.parametrize(("reasons", "floor", "short", "pending", "want"), [
    # settled: nothing reclaimed, every Pod bound, no shortfall
    ([], 0, False, False, []),
    # without a preemption a shortfall and a Pending Pod are not settled
    ([], 0, True, True, [SHORT, UNBOUND]),
    (["surplus"], 0, True, True, [SHORT, UNBOUND]),
    # preempted: nothing free fits, so its short need and Pending Pod are what is expected
    (["preempted"], 0, True, True, []),
    (["surplus", "preempted"], 0, True, False, []),
    # a preemption before the floor (an earlier phase) does not excuse them
    (["preempted"], 1, True, True, [SHORT, UNBOUND]),
])
def test_a_fleet_cluster_is_settled_when_its_reclaims_are_done_and_only_preemption_leaves_it_short(
        reasons: list[str], floor: int, short: bool, pending: bool, want: list[str]) -> None:
    eng = Engine(machines=[machine("a"), *(machine(f"r{i}", bound=False, binding=1)
                                           for i in range(len(reasons)))],
                 reclaims=[reclaim(f"r{i}", r) for i, r in enumerate(reasons)],
                 needs=[need(short=("cpu",) if short else ())])
    w, view = world([pod("p1", "node-a"), *([pod("p2")] if pending else [])], eng)
    assert converged_fleet(w, view, floor) == want


def test_a_fleet_cluster_with_reclaims_in_flight_is_not_settled_even_when_preempted() -> None:
    eng = Engine(machines=[machine("a"), machine("b"), machine("c", "CONFIGURING")],
                 reclaims=[reclaim("b", "preempted", released=False),
                           reclaim("gone", "preempted", acked=False, released=False)],
                 needs=[need(short=("cpu",))])
    w, view = world([pod("p1", "node-a"), pod("p2")], eng)
    assert converged_fleet(w, view, 0) == [
        "1 ReclaimInstructions not acknowledged",
        "machine b (node-b) still bound (configured)",
        "machine gone (node-gone) still bound (?)",
        "1 machines not Configured yet",
    ]
