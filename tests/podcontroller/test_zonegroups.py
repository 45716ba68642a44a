"""The running zones of each co-location group, kept from the Pod cache's changes
(bigfleet_trio/podcontroller/zonegroups.py): always equal to a scan of the cache, and a change is
reported only when a group's set of zones changes
(docs/rules.md#pod-translation-co-location-zone-pin)."""

from __future__ import annotations

import random
from typing import Any

from bigfleet_trio.kube.informer import Informer, Store
from bigfleet_trio.kube.resources import PODS
from bigfleet_trio.kube.watch import WatchEvent
from bigfleet_trio.podcontroller import zonepin
from bigfleet_trio.podcontroller.projections import slim_pod
from bigfleet_trio.podcontroller.translate import translate_pod
from bigfleet_trio.podcontroller.zonegroups import GroupZones
from tests.podcontroller.test_zonepin import bound, pending, term

ZONES = ("z-a", "z-b", "z-c", None)
APPS = ("db", "web", "cache")
NAMESPACES = ("ns", "other")


def new_store() -> Store:
    return Store({zonepin.BOUND_ZONE_INDEX: zonepin.index_bound_zone,
                  zonepin.CO_LOCATED_INDEX: zonepin.index_co_located})


class Cluster:
    """A Pod cache fed the way the informer feeds it: each object set, then dispatched."""

    def __init__(self) -> None:
        self.store = new_store()
        self.groups = GroupZones(self.store)

    def put(self, pod: dict[str, Any]) -> bool:
        slim = slim_pod(pod)
        key = f"{slim['metadata']['namespace']}/{slim['metadata']['name']}"
        self.store._set(key, slim)  # the store tells its observers
        return self.groups.take_moved()

    def drop(self, ns: str, name: str) -> bool:
        self.store._pop(f"{ns}/{name}")
        return self.groups.take_moved()

    def scanned(self, pod: dict[str, Any]) -> tuple[str, ...]:
        """What a scan of the whole cache says (the rule as plan_zone_pin states it)."""
        pin = zonepin.plan_zone_pin(pod, translate_pod(pod, None).spec,
                                    zonepin.candidates(self.store, pod))
        return pin.zones

    def all_groups(self) -> dict[str, tuple[str, ...]]:
        return {k: self.scanned(p) for k, p in self.store.items() if zonepin.zone_term(p)}


def random_pod(rng: random.Random, i: int) -> dict[str, Any]:
    ns = rng.choice(NAMESPACES)
    app = rng.choice(APPS)
    if rng.random() < 0.5:
        selector: Any = {"matchLabels": {"app": app}}
        if rng.random() < 0.3:
            selector = {"matchExpressions": [{"key": "app", "operator": "In",
                                              "values": [app, "web"]}]}
        terms = [term(selector, namespaces=[ns, "other"])] if rng.random() < 0.2 else [
            term(selector)]
        body = pending(f"p{i}", ns, terms=terms)
        body["metadata"]["labels"] = {"app": app}
        if rng.random() < 0.5:  # a member of its own group, bound somewhere
            zone = rng.choice(ZONES)
            if zone is not None:
                body["metadata"]["labels"]["topology.kubernetes.io/zone"] = zone
            body["spec"]["nodeName"] = "n"
        return body
    phase = rng.choice(("Running", "Running", "Succeeded"))
    return bound(f"p{i}", rng.choice(ZONES), ns, {"app": app}, phase)


def test_the_kept_zones_equal_a_scan_through_random_events() -> None:
    rng = random.Random(7)
    cluster = Cluster()
    names: list[tuple[str, str]] = []
    for step in range(800):
        before = cluster.all_groups()
        roll = rng.random()
        if names and roll < 0.4:
            ns, name = names.pop(rng.randrange(len(names)))
            changed = cluster.drop(ns, name)
            key = f"{ns}/{name}"
        elif names and roll < 0.7:  # an update: the same Pod rebound, relabelled or finished
            ns, name = rng.choice(names)
            body = random_pod(rng, step)
            body["metadata"].update(name=name, namespace=ns, uid=f"uid-{name}")
            changed = cluster.put(body)
            key = f"{ns}/{name}"
        else:
            body = random_pod(rng, step)
            names.append((body["metadata"]["namespace"], body["metadata"]["name"]))
            changed = cluster.put(body)
            key = "/".join(names[-1])
        after = cluster.all_groups()
        for other, zones in after.items():
            assert cluster.groups.zones(cluster.store.get(other)) == zones, (step, other)
        # the Pod of the event is queued anyway; any other whose group moved must be re-planned
        moved = [k for k in after if k != key and k in before and before[k] != after[k]]
        assert changed or not moved, (step, moved)


def test_a_pod_binding_in_a_zone_the_group_already_runs_in_changes_nothing() -> None:
    cluster = Cluster()
    assert cluster.put(pending("p")) is False  # a new group: its own Pod is queued anyway
    assert cluster.put(bound("a", "z-a")) is True  # the group now runs in z-a
    assert cluster.put(bound("b", "z-a")) is False  # still z-a alone: nobody to re-plan
    assert cluster.put(bound("c", None)) is False  # no zone: not a member
    assert cluster.put(bound("d", "z-b", labels={"app": "web"})) is False  # not selected
    assert cluster.drop("ns", "a") is False  # b still runs in z-a
    assert cluster.drop("ns", "b") is True  # nothing runs any more
    assert cluster.groups.zones(slim_pod(pending("p"))) == ()


def test_a_group_is_forgotten_with_its_last_pod_and_counted_afresh_when_it_returns() -> None:
    cluster = Cluster()
    cluster.put(pending("p"))
    cluster.put(bound("a", "z-a"))
    cluster.drop("ns", "p")
    assert cluster.groups.tracked() == 0
    cluster.put(bound("b", "z-b"))  # no group to count it for
    cluster.put(pending("q"))  # the group again: counted from the cache
    assert cluster.groups.zones(slim_pod(pending("q"))) == ("z-a", "z-b")
    # a Pod with no zone term has no group
    assert cluster.groups.zones(slim_pod(pending("x", terms=[]))) is None


def test_an_unobserved_group_is_answered_by_a_scan() -> None:
    store = new_store()
    for pod in (bound("a", "z-a"), bound("b", "z-a")):
        slim = slim_pod(pod)
        store._set(f"ns/{slim['metadata']['name']}", slim)
    assert GroupZones(store).zones(slim_pod(pending())) == ("z-a",)


def test_a_delete_is_counted_by_the_object_cached_not_the_one_the_watch_ends_with() -> None:
    """A DELETED watch event may carry a later state than the cache (the Pod finished, then went):
    the counts follow the store, so the zone goes with the Pod whatever the handlers are told."""
    informer = Informer(None, PODS, transform=slim_pod,  # type: ignore[arg-type]
                        indexers={zonepin.BOUND_ZONE_INDEX: zonepin.index_bound_zone,
                                  zonepin.CO_LOCATED_INDEX: zonepin.index_co_located})
    groups = GroupZones(informer.store)
    for body in (pending("p"), bound("a", "z-a")):
        body["metadata"]["resourceVersion"] = "1"
        informer._apply(WatchEvent("ADDED", body))
    assert groups.zones(slim_pod(pending("p"))) == ("z-a",)
    gone = bound("a", "z-a", phase="Succeeded")  # no MODIFIED for it was seen
    informer._apply(WatchEvent("DELETED", gone))
    assert groups.take_moved() is True
    assert groups.zones(slim_pod(pending("p"))) == ()
