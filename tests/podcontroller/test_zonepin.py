"""Co-location zone pinning (bigfleet_trio/podcontroller/zonepin.py): once a zone co-location
group's Pods run in one zone, every CR of the group asks for that zone
(docs/rules.md#pod-translation-co-location-zone-pin)."""

from __future__ import annotations

from typing import Any

import pytest

from bigfleet_trio.kube.informer import Store
from bigfleet_trio.podcontroller import zonepin
from bigfleet_trio.podcontroller.plan import plan_pod
from bigfleet_trio.podcontroller.projections import slim_pod
from bigfleet_trio.podcontroller.translate import translate_pod
from bigfleet_trio.podcontroller.zonepin import (
    PIN_ANNOTATION,
    ZONE_LABEL,
    ZonePin,
    pinned_spec,
    plan_zone_pin,
    selector_matches,
)

REQ = "requiredDuringSchedulingIgnoredDuringExecution"
GROUP = {"app": "db"}


def term(selector: Any = None, key: str = ZONE_LABEL, **extra: Any) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": GROUP} if selector is None else selector,
            "topologyKey": key, **extra}


def pending(name: str = "p", ns: str = "ns", *, terms: list[Any] | None = None,
            annotations: dict[str, str] | None = None,
            node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"resources": {"requests": {"cpu": "1"}}}],
                            "affinity": {"podAffinity": {REQ: [term()] if terms is None
                                                         else terms}}}
    if node_selector:
        spec["nodeSelector"] = node_selector
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{name}",
                            "labels": dict(GROUP)}
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


def bound(name: str, zone: str | None, ns: str = "ns", labels: dict[str, str] | None = None,
          phase: str = "Running") -> dict[str, Any]:
    lab = dict(GROUP if labels is None else labels)
    if zone is not None:
        lab[ZONE_LABEL] = zone  # PodTopologyLabels admission copies it from the Node
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": lab},
            "spec": {"nodeName": f"node-{name}", "containers": []}, "status": {"phase": phase}}


def decide(pod: dict[str, Any], members: list[dict[str, Any]]) -> ZonePin:
    return plan_zone_pin(pod, translate_pod(pod, None).spec, members)


# ---- the decision ------------------------------------------------------------------------------

@pytest.mark.parametrize(("members", "decision", "zones"), [
    ([], "not_running", ()),
    ([bound("a", "z-a")], "pinned", ("z-a",)),
    ([bound("a", "z-a"), bound("b", "z-a")], "pinned", ("z-a",)),
    ([bound("a", "z-a"), bound("b", "z-b")], "several_zones", ("z-a", "z-b")),
    # on a Node without the zone label (kwok's, a bare system pool): no zone, not a member
    ([bound("a", None)], "not_running", ()),
    ([bound("a", None), bound("b", "z-b")], "pinned", ("z-b",)),
    # finished Pods are gone for kube-scheduler
    ([bound("a", "z-a", phase="Succeeded"), bound("b", "z-b")], "pinned", ("z-b",)),
    ([bound("a", "z-a", phase="Failed")], "not_running", ()),
    # other namespaces and Pods the selector does not match are not the group
    ([bound("a", "z-a", ns="other")], "not_running", ()),
    ([bound("a", "z-a", labels={"app": "web"})], "not_running", ()),
])
def test_the_group_is_the_bound_matching_pods_and_one_zone_pins(
        members: list[dict[str, Any]], decision: str, zones: tuple[str, ...]) -> None:
    got = decide(pending(), members)
    assert got == ZonePin(decision, zones)  # type: ignore[arg-type]
    assert got.zone == (zones[0] if decision == "pinned" else None)


def test_no_pin_without_a_required_zone_pod_affinity_term() -> None:
    members = [bound("a", "z-a")]
    assert decide(pending(terms=[]), members) == ZonePin("no_group")
    hostname = term(key="kubernetes.io/hostname")
    assert decide(pending(terms=[hostname]), members) == ZonePin("no_group")
    # only the first term is the group (as the translation's coLocation)
    assert decide(pending(terms=[hostname, term()]), members) == ZonePin("no_group")
    no_affinity = pending()
    del no_affinity["spec"]["affinity"]
    assert decide(no_affinity, members) == ZonePin("no_group")


def test_the_opt_out_annotation_the_pods_own_zone_and_namespace_selectors_win() -> None:
    members = [bound("a", "z-a")]
    assert decide(pending(annotations={PIN_ANNOTATION: "false"}), members) == ZonePin(
        "opted_out")
    assert decide(pending(annotations={PIN_ANNOTATION: "true"}), members).zone == "z-a"
    assert decide(pending(node_selector={ZONE_LABEL: "z-b"}), members) == ZonePin("own_zone")
    assert decide(pending(node_selector={"disk": "ssd"}), members).zone == "z-a"
    by_label = term(namespaceSelector={"matchLabels": {"team": "x"}})
    assert decide(pending(terms=[by_label]), members) == ZonePin("namespace_selector")


def test_a_term_listing_namespaces_looks_in_those() -> None:
    listed = term(namespaces=["other", "third"])
    assert decide(pending(terms=[listed]), [bound("a", "z-a")]) == ZonePin("not_running")
    assert decide(pending(terms=[listed]), [bound("a", "z-c", ns="third")]).zone == "z-c"


def test_the_pod_itself_bound_counts_as_its_groups_zone() -> None:
    me = bound("p", "z-a")
    me["spec"]["affinity"] = pending()["spec"]["affinity"]
    assert decide(me, [me]).zone == "z-a"


@pytest.mark.parametrize(("selector", "labels", "matches"), [
    (None, {"app": "db"}, False),  # a nil selector selects nothing
    ({}, {"app": "db"}, True),
    ({"matchLabels": {"app": "db"}}, {"app": "db", "x": "y"}, True),
    ({"matchLabels": {"app": "db"}}, {"app": "web"}, False),
    ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["db", "x"]}]},
     {"app": "db"}, True),
    ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["x"]}]}, {"app": "db"},
     False),
    ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["db"]}]}, {}, False),
    ({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["db"]}]}, {}, True),
    ({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["db"]}]},
     {"app": "db"}, False),
    ({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, {"app": ""}, True),
    ({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, {}, False),
    ({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, {}, True),
    ({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, {"app": "x"}, False),
    ({"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}, {"app": "2"},
     False),
    ({"matchExpressions": ["junk"]}, {}, False),
    ({"matchLabels": "junk"}, {}, False),
    ({"matchLabels": {"app": "db"},
      "matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {"app": "db"}, False),
])
def test_label_selectors(selector: Any, labels: dict[str, str], matches: bool) -> None:
    assert selector_matches(selector, labels) is matches


def test_the_pin_is_one_more_requirement() -> None:
    spec = translate_pod(pending(), None).spec
    pinned = pinned_spec(spec, ZonePin("pinned", ("z-a",)))
    assert pinned["requirements"] == [*spec["requirements"],
                                      {"key": ZONE_LABEL, "operator": "In", "values": ["z-a"]}]
    assert pinned_spec(spec, ZonePin("several_zones", ("z-a", "z-b"))) == spec
    assert "requirements" in spec and len(spec["requirements"]) == 1  # not mutated


# ---- in the plan ---------------------------------------------------------------------------

def test_plan_pod_writes_the_pinned_cr_and_says_why() -> None:
    plan = plan_pod(slim_pod(pending()), [], None, [slim_pod(bound("a", "z-a"))])
    assert plan.action == "create" and plan.zone_pin == ZonePin("pinned", ("z-a",))
    assert plan.body is not None
    assert {"key": ZONE_LABEL, "operator": "In", "values": ["z-a"]} in plan.body["spec"][
        "requirements"]
    unpinned = plan_pod(slim_pod(pending()), [], None)
    assert unpinned.zone_pin == ZonePin("not_running")
    assert unpinned.body is not None and all(
        r["key"] != ZONE_LABEL for r in unpinned.body["spec"]["requirements"])
    # a CR written before the group ran gets the pin as an update
    assert plan.body is not None
    cr = {**unpinned.body, "metadata": {**unpinned.body["metadata"]}}
    update = plan_pod(slim_pod(pending()), [cr], None, [slim_pod(bound("a", "z-a"))])
    assert update.action == "update"
    assert update.patch == {"spec": {"requirements": plan.body["spec"]["requirements"]}}


def test_the_cache_keeps_the_labels_of_bound_pods_with_a_zone_only() -> None:
    assert slim_pod(bound("a", "z-a"))["metadata"]["labels"] == {**GROUP, ZONE_LABEL: "z-a"}
    assert "labels" not in slim_pod(bound("a", None))["metadata"]
    assert "labels" not in slim_pod(pending())["metadata"]
    opted = slim_pod(pending(annotations={PIN_ANNOTATION: "false", "other": "x"}))
    assert opted["metadata"]["annotations"] == {PIN_ANNOTATION: "false"}


# ---- the controller's lookups ----------------------------------------------------------------

def store_of(*pods: dict[str, Any]) -> Store:
    store = Store({zonepin.BOUND_ZONE_INDEX: zonepin.index_bound_zone,
                   zonepin.CO_LOCATED_INDEX: zonepin.index_co_located})
    for pod in pods:
        slim = slim_pod(pod)
        store._set(f"{slim['metadata']['namespace']}/{slim['metadata']['name']}", slim)
    return store


def test_candidates_and_group_keys_come_from_the_indexes() -> None:
    by_expr = pending("e", terms=[term({"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["db"]}]})])
    other_group = pending("o", terms=[term({"matchLabels": {"app": "web"}})])
    elsewhere = pending("x", ns="other")
    done = pending("d")
    done["status"]["phase"] = "Succeeded"
    member = bound("a", "z-a")
    store = store_of(pending("p"), by_expr, other_group, elsewhere, done, member,
                     bound("b", None), bound("c", "z-b", ns="other"))
    assert [p["metadata"]["name"] for p in zonepin.candidates(store, slim_pod(pending()))] == [
        "a"]
    assert sorted(zonepin.group_keys(store, slim_pod(member))) == ["ns/e", "ns/p"]
    assert zonepin.group_keys(store, slim_pod(bound("b", None))) == []
    assert zonepin.group_keys(store, slim_pod(pending())) == []
    assert zonepin.candidates(store, slim_pod(pending(terms=[]))) == []


async def test_a_groups_re_reconciles_wait_behind_pods_with_a_change_of_their_own() -> None:
    """A group that starts or stops running in a zone re-reconciles all its Pods (each CR is
    patched once); under a burst that is hundreds of writes, which must not hold back the
    creates of new Pods' CRs. A member that changes itself meanwhile moves up."""
    from bigfleet_trio.kube.workqueue import WorkQueue
    from bigfleet_trio.podcontroller.keys import PodKey

    member = bound("a", "z-a")
    store = store_of(pending("p"), pending("e"), pending("f"), member)
    queue: WorkQueue[PodKey] = WorkQueue()
    zonepin.enqueue_groups(queue, store, None, slim_pod(member))  # the group now runs in z-a
    queue.add(PodKey("ns", "new"))  # a Pod with no CR yet, created after
    queue.add(PodKey("ns", "f"))  # a group member with a change of its own
    order = [await queue.get() for _ in range(4)]
    assert order[:2] == [PodKey("ns", "new"), PodKey("ns", "f")]
    assert sorted(map(str, order[2:])) == ["ns/e", "ns/p"]
    assert len(queue) == 0
