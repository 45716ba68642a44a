"""What became of a Pod's demand: the CapacityRequest conditions the operator plans (pure) and
writes, and the Pod Events that tell the same story (``kubectl describe pod``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import trio
from prometheus_client import REGISTRY

from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, EVENTS, PODS
from bigfleet_trio.operator import outcomes as oc
from bigfleet_trio.operator.crview import slim
from bigfleet_trio.operator.kubeevents import EventRecorder
from tests.support import capacity
from tests.support.kube import RecordingKube

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
ZONE, ITYPE = "topology.kubernetes.io/zone", "node.kubernetes.io/instance-type"


def cr(*, phase: str = "Acknowledged", cpu: str = "2", memory: str = "4Gi",
       requirements: list[dict[str, Any]] | None = None,
       conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A CR owned by Pod team/web-0, with these resources, requirements and status."""
    obj = capacity.cr("cr-u1", 10, {"cpu": cpu, "memory": memory}, namespace="team",
                      phase=phase, requirements=requirements or [])
    obj["metadata"]["ownerReferences"] = [{"kind": "Pod", "name": "web-0", "uid": "u1",
                                           "apiVersion": "v1", "controller": True}]
    if conditions is not None:
        obj["status"]["conditions"] = conditions
    return obj


def upcoming(name: str = "m-1", *, phase: str = "Provisioning", zone: str = "z-a",
             cpu: str = "8", memory: str = "32Gi") -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"labels": {ZONE: zone, ITYPE: "c.large"},
                     "resources": {"cpu": cpu, "memory": memory}},
            "status": {"phase": phase}}


def offer(*, count: int = 3, zone: str = "z-a", cpu: str = "8",
          memory: str = "32Gi") -> dict[str, Any]:
    return {"availability": "High", "availableCount": count, "cost": "500m",
            "resources": {"cpu": cpu, "memory": memory},
            "requirements": [{"key": ZONE, "operator": "In", "values": [zone]}]}


def summary(conds: list[dict[str, Any]] | None) -> list[tuple[str, str, str]]:
    return [(c["type"], c["status"], c["reason"]) for c in conds or []]


# ------------------------------------------------------------------------------------- plan


def test_served_cr_is_sent_offered_and_has_a_machine_coming() -> None:
    got = oc.plan_conditions(cr(requirements=[{"key": ZONE, "operator": "In",
                                               "values": ["z-a"]}]),
                             offers=[offer()], upcoming=[upcoming()], now=NOW)
    assert summary(got) == [("Sent", "True", "InRollUp"),
                            ("CapacityOffered", "True", "Offered"),
                            ("MachineComing", "True", "MachineFits")]
    assert got is not None
    assert "m-1" in got[2]["message"] and "c.large" in got[2]["message"]
    assert {c["lastTransitionTime"] for c in got} == {"2026-03-01T12:00:00Z"}


def test_sent_says_queued_not_received() -> None:
    """Sent is True once a roll-up carrying the CR was queued on the shard session; the operator
    never waits for the shard to receive or acknowledge it, and the words say so."""
    got = oc.plan_conditions(cr(), offers=None, upcoming=[], now=NOW)
    assert got is not None
    queued = ("in a roll-up queued on the shard session (the shard's receipt is not awaited; "
              "every roll-up carries the request while it exists)")
    assert got[0]["message"] == queued
    [sent] = [e for e in oc.transition_events(cr(), got) if e.reason == "CapacityRequested"]
    assert sent.message == f"demand queued for the fleet: {queued}"
    assert "acknowledg" not in sent.message.lower() and "sent" not in sent.message.lower()


def test_too_big_a_request_is_offered_nothing_and_gets_no_machine() -> None:
    got = oc.plan_conditions(cr(memory="1Ti"), offers=[offer()], upcoming=[upcoming()],
                             now=NOW)
    assert summary(got)[1:] == [("CapacityOffered", "False", "NoOffer"),
                                ("MachineComing", "False", "NoneFits")]
    assert got is not None and "memory=1Ti" in got[1]["message"]


@pytest.mark.parametrize(("req", "fits"), [
    ({"key": ZONE, "operator": "In", "values": ["z-a"]}, True),
    ({"key": ZONE, "operator": "In", "values": ["z-b"]}, False),
    ({"key": ZONE, "operator": "NotIn", "values": ["z-a"]}, False),
    ({"key": ZONE, "operator": "NotIn", "values": ["z-b"]}, True),
    ({"key": ZONE, "operator": "Exists"}, True),
    ({"key": "gpu", "operator": "Exists"}, False),
    ({"key": "gpu", "operator": "DoesNotExist"}, True),
    ({"key": ZONE, "operator": "DoesNotExist"}, False),
])
def test_machine_coming_uses_node_affinity_rules(req: dict[str, Any], fits: bool) -> None:
    got = oc.plan_conditions(cr(requirements=[req]), offers=None, upcoming=[upcoming()],
                             now=NOW)
    assert got is not None
    assert got[2]["status"] == ("True" if fits else "False")


@pytest.mark.parametrize(("phase", "counts"), [
    ("Provisioning", True), ("Launched", True), ("Registered", True), ("Ready", True),
    ("Draining", False), ("Drained", False), ("Failed", False),
])
def test_only_machines_on_their_way_count(phase: str, counts: bool) -> None:
    got = oc.plan_conditions(cr(), offers=None, upcoming=[upcoming(phase=phase)], now=NOW)
    assert got is not None and (got[2]["status"] == "True") is counts


def test_no_hints_yet_is_unknown_not_false() -> None:
    got = oc.plan_conditions(cr(), offers=None, upcoming=[], now=NOW)
    assert summary(got)[1] == ("CapacityOffered", "Unknown", "NoHints")


@pytest.mark.parametrize("bad", [offer(count=0), offer(zone="z-b"), offer(cpu="1"),
                                 {**offer(), "resources": {"cpu": "lots"}}])
def test_an_offer_that_cannot_serve_the_request_does_not_count(bad: dict[str, Any]) -> None:
    req = [{"key": ZONE, "operator": "In", "values": ["z-a"]}]
    got = oc.plan_conditions(cr(requirements=req), offers=[bad], upcoming=[], now=NOW)
    assert summary(got)[1] == ("CapacityOffered", "False", "NoOffer")


def test_nothing_came_after_the_wait_is_its_own_reason() -> None:
    sent_at = (NOW - timedelta(seconds=601)).strftime("%Y-%m-%dT%H:%M:%SZ")
    old = [{"type": "Sent", "status": "True", "reason": "InRollUp",
            "lastTransitionTime": sent_at}]
    got = oc.plan_conditions(cr(conditions=old), offers=None, upcoming=[], now=NOW, wait=600)
    assert got is not None
    assert summary(got)[2] == ("MachineComing", "False", "NothingCame")
    assert got[0]["lastTransitionTime"] == sent_at  # unchanged status keeps its time
    early = oc.plan_conditions(cr(conditions=old), offers=None, upcoming=[], now=NOW,
                               wait=700)
    assert summary(early)[2] == ("MachineComing", "False", "NoneFits")


@pytest.mark.parametrize(("spec_part", "field"), [
    ({"requirements": [{"key": "gen", "operator": "Gt", "values": ["3"]}]},
     "spec.requirements[0].operator"),
    ({"resources": {"cpu": "two"}}, "spec.resources"),
])
def test_excluded_cr_says_which_field(spec_part: dict[str, Any], field: str) -> None:
    c = cr(phase="Pending")
    c["spec"].update(spec_part)
    got = oc.plan_conditions(c, offers=[offer()], upcoming=[upcoming()], now=NOW)
    assert summary(got) == [("Sent", "False", "Excluded")]
    assert got is not None and field in got[0]["message"]


def test_pending_cr_that_can_be_sent_gets_no_write_yet() -> None:
    assert oc.plan_conditions(cr(phase="Pending"), offers=None, upcoming=[], now=NOW) is None


# ------------------------------------------------------------------ patch and transitions


def test_patch_only_when_type_status_or_reason_changes() -> None:
    first = oc.plan_conditions(cr(), offers=None, upcoming=[upcoming()], now=NOW)
    assert first is not None
    patch = oc.conditions_patch(cr(), first)
    assert patch == {"status": {"conditions": first}}
    written = cr(conditions=first)
    other_machine = oc.plan_conditions(written, offers=None,
                                       upcoming=[upcoming("m-2")], now=NOW)
    assert oc.conditions_patch(written, other_machine) is None  # message only: no write
    gone = oc.plan_conditions(written, offers=None, upcoming=[], now=NOW)
    assert oc.conditions_patch(written, gone) is not None


def test_events_follow_transitions_once_each_in_order() -> None:
    served = oc.plan_conditions(cr(), offers=[offer()], upcoming=[upcoming()], now=NOW)
    assert served is not None
    assert [(e.type, e.reason) for e in oc.transition_events(cr(), served)] == [
        ("Normal", "CapacityRequested"), ("Normal", "MachineComing")]
    assert oc.transition_events(cr(conditions=served), served) == []
    starved = oc.plan_conditions(cr(memory="1Ti"), offers=[offer()], upcoming=[], now=NOW)
    assert starved is not None
    assert [(e.type, e.reason) for e in oc.transition_events(cr(), starved)] == [
        ("Normal", "CapacityRequested"), ("Warning", "NoCapacityOffered")]


def test_slim_view_keeps_what_the_outcome_pass_reads() -> None:
    conds = [{"type": "Sent", "status": "True", "reason": "InRollUp", "message": "long text",
              "lastTransitionTime": "2026-03-01T12:00:00Z"}]
    view = slim(cr(conditions=conds))
    assert view["status"]["conditions"] == [
        {"type": "Sent", "status": "True", "reason": "InRollUp",
         "lastTransitionTime": "2026-03-01T12:00:00Z"}]
    assert view["metadata"]["podName"] == "web-0"
    uid = "0b7a4c8e-1f2d-4e5a-9b6c-7d8e9f0a1b2c"
    named = slim({**cr(), "metadata": {**cr()["metadata"], "name": f"cr-{uid}"}})
    assert oc.pod_of(named) == {"apiVersion": "v1", "kind": "Pod",
                                "metadata": {"name": "web-0", "namespace": "team", "uid": uid}}
    assert oc.pod_of(view) == {"apiVersion": "v1", "kind": "Pod",  # cr-u1: no uid in the name
                               "metadata": {"name": "web-0", "namespace": "team"}}
    assert slim(cr(conditions=conds))["status"] is view["status"]  # shared


# -------------------------------------------------------------------- on the sim apiserver


def seed_pod_and_cr(kube: RecordingKube, name: str, **kw: Any) -> None:
    kube.ensure_namespace("team")
    kube.seed(PODS, {"metadata": {"name": name, "namespace": "team"},
                     "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                     "status": {"phase": "Pending"}})
    uid = kube.objects(PODS, "team")[name]["metadata"]["uid"]
    body = cr(**kw)
    body["metadata"]["name"] = f"cr-{uid}"
    body["metadata"]["labels"] = {"bigfleet.lucy.sh/owned-by-pod": uid}
    body["metadata"]["ownerReferences"][0].update(name=name, uid=uid)
    kube.seed(CAPACITY_REQUESTS, body)


def pod_events(kube: RecordingKube, pod: str) -> list[tuple[str, str]]:
    stored = sorted(kube.objects(EVENTS, "team").values(),
                    key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [(e["type"], e["reason"]) for e in stored
            if e["involvedObject"].get("kind") == "Pod" and e["involvedObject"]["name"] == pod]


async def test_writer_on_the_sim_writes_conditions_and_pod_events_in_order(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    kube = RecordingKube.over_sim(nursery)
    seed_pod_and_cr(kube, "served")
    seed_pod_and_cr(kube, "starved", memory="1Ti")
    seed_pod_and_cr(kube, "excluded", phase="Pending",
                    requirements=[{"key": "gen", "operator": "Gt", "values": ["3"]}])
    machines: list[dict[str, Any]] = []
    recorder = EventRecorder(kube)

    def crs() -> list[dict[str, Any]]:
        return [slim(o) for o in kube.objects(CAPACITY_REQUESTS, "team").values()]

    writer = oc.OutcomeWriter(kube, crs=crs, upcoming=lambda: machines,
                              offers=lambda: [offer()], events=recorder, now=lambda: NOW)
    await nursery.start(recorder.run)
    assert await writer.run_once() == 3
    machines.append(upcoming())
    assert await writer.run_once() == 1  # only "served" changed
    assert await writer.run_once() == 0  # level-triggered: nothing left to say
    await recorder.wait_written()

    assert pod_events(kube, "served") == [("Normal", "CapacityRequested"),
                                          ("Normal", "MachineComing")]
    assert pod_events(kube, "starved") == [("Normal", "CapacityRequested"),
                                           ("Warning", "NoCapacityOffered")]
    assert pod_events(kube, "excluded") == [("Warning", "CapacityRequestExcluded")]
    by_pod = {o["metadata"]["ownerReferences"][0]["name"]: o
              for o in kube.objects(CAPACITY_REQUESTS, "team").values()}
    assert summary(by_pod["served"]["status"]["conditions"])[2] == (
        "MachineComing", "True", "MachineFits")
    assert summary(by_pod["excluded"]["status"]["conditions"]) == [
        ("Sent", "False", "Excluded")]
    assert gauge("Sent", "False", "Excluded") == 1
    assert gauge("MachineComing", "True", "MachineFits") == 1
    assert gauge("CapacityOffered", "False", "NoOffer") == 1


def gauge(condition: str, status: str, reason: str) -> float | None:
    return REGISTRY.get_sample_value("bigfleet_operator_capacityrequests_outcome", {
        "condition": condition, "status": status, "reason": reason})


async def test_the_outcome_gauge_drops_to_zero_when_the_writer_stops(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    kube = RecordingKube.over_sim(nursery)
    seed_pod_and_cr(kube, "starved", memory="1Ti")
    writer = oc.OutcomeWriter(
        kube, crs=lambda: [slim(o) for o in kube.objects(CAPACITY_REQUESTS, "team").values()],
        upcoming=list, offers=lambda: [offer()], events=None, now=lambda: NOW)
    async with trio.open_nursery() as own:
        await own.start(writer.run)
        await trio.sleep(writer.period + 1)
        assert gauge("CapacityOffered", "False", "NoOffer") == 1
        own.cancel_scope.cancel()
    assert gauge("CapacityOffered", "False", "NoOffer") == 0


async def test_writer_defers_past_its_budget(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    kube = RecordingKube.over_sim(nursery)
    for i in range(5):
        seed_pod_and_cr(kube, f"p-{i}")
    writer = oc.OutcomeWriter(
        kube, crs=lambda: [slim(o) for o in kube.objects(CAPACITY_REQUESTS, "team").values()],
        upcoming=list, offers=lambda: None, events=None, budget=2, now=lambda: NOW)
    assert [await writer.run_once() for _ in range(4)] == [2, 2, 1, 0]


def test_writer_refuses_a_budget_of_zero() -> None:
    with pytest.raises(ValueError, match="budget"):
        oc.OutcomeWriter(object(), crs=list, upcoming=list,  # type: ignore[arg-type]
                         offers=lambda: None, events=None, budget=0)
