"""What a reclaim leaves for ``kubectl get events`` / ``kubectl describe`` (Reclaim, Cordoned,
EvictionBlocked, Evicted, Drained, DrainFailed) and on the operator's ``/events`` feed
(drain_started, drain_finished). Event writes never fail a drain."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

import pytest
import trio
from prometheus_client import REGISTRY

from bigfleet_trio.kube.resources import EVENTS, NODES, PDBS, PODS, UPCOMING_NODES
from bigfleet_trio.observability.events import EventFeed
from bigfleet_trio.operator.kubeevents import EVENT_COMPONENT, EventRecorder
from bigfleet_trio.operator.reclaim.drain import DrainManager
from bigfleet_trio.operator.reclaim.handler import ReclaimHandler
from bigfleet_trio.operator.upcoming.plan import DrainMemory
from tests.operator.test_reclaim import Replies, instr
from tests.support.kube import RecordingKube

PDB_TEXT = "429: Cannot evict pod as it would violate the pod's disruption budget."


def cluster(nursery: trio.Nursery) -> RecordingKube:
    """The sim with Node n-1 and its UpcomingNode un-m-1 (Ready, nodeRef n-1)."""
    kube = RecordingKube.over_sim(nursery)
    kube.seed(NODES, {"metadata": {"name": "n-1"}})
    kube.seed(UPCOMING_NODES, {
        "metadata": {"name": "un-m-1"}, "spec": {"resources": {}},
        "status": {"phase": "Ready", "nodeRef": {"kind": "Node", "name": "n-1"}},
    })
    return kube


def pod(kube: RecordingKube, name: str, ns: str = "default") -> str:
    """A Running, Ready Pod on n-1 (label app=<name>); its ``ns/name``."""
    kube.seed(PODS, {
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"nodeName": "n-1", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    })
    return f"{ns}/{name}"


def pdb_blocks(kube: RecordingKube, name: str, ns: str = "default") -> None:
    """A PodDisruptionBudget over Pod ``name`` that allows no disruption: the sim answers its
    eviction with 429."""
    kube.seed(PDBS, {
        "metadata": {"name": name, "namespace": ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": name}}},
        "status": {"observedGeneration": 1, "disruptionsAllowed": 0, "currentHealthy": 1,
                   "desiredHealthy": 1, "expectedPods": 1},
    })


def evicted(kube: RecordingKube, key: str) -> int:
    """Eviction calls sent for Pod ``ns/name``."""
    return sum(1 for r in kube.of("evict") if f"{r.namespace}/{r.name}" == key)


def uid(kube: RecordingKube, node: str) -> str:
    return kube.objects(NODES)[node]["metadata"]["uid"]  # type: ignore[no-any-return]


def events(kube: RecordingKube) -> list[dict[str, Any]]:
    """Every Event stored in the sim, in write order, as the fields these tests read."""
    stored = sorted(kube.objects(EVENTS).values(),
                    key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [{
        "kind": e["involvedObject"].get("kind"),
        "name": e["involvedObject"].get("name"),
        "namespace": e["involvedObject"].get("namespace"),
        "uid": e["involvedObject"].get("uid"),
        "type": e["type"],
        "reason": e["reason"],
        "message": e["message"],
        "component": e["source"]["component"],
    } for e in stored]


def seen(kube: RecordingKube) -> list[tuple[str, str, str, str]]:
    """(kind, name, type, reason) of every Event written, in order."""
    return [(e["kind"], e["name"], e["type"], e["reason"]) for e in events(kube)]


@dataclass
class Rig:
    drains: DrainManager
    handler: ReclaimHandler
    recorder: EventRecorder
    feed: EventFeed


def rig(c: RecordingKube) -> Rig:
    memory = DrainMemory()
    recorder = EventRecorder(c)
    feed = EventFeed()
    drains = DrainManager(c, memory, rng=random.Random(7), events=recorder, feed=feed)
    handler = ReclaimHandler(c, drains, memory, events=recorder)
    return Rig(drains, handler, recorder, feed)


async def reclaim(r: Rig, *batches: Any) -> list[dict[str, Any]]:
    """Run the recorder and drains; per batch (an instruction or a list of them) apply it and
    wait for every drain and Event; returns the feed's drain_* events."""
    async with trio.open_nursery() as nursery:
        await nursery.start(r.recorder.run)
        await nursery.start(r.drains.run)
        async with r.feed.subscribe(kinds=["drain_started", "drain_finished"]) as sub:
            for batch in batches:
                for i in batch if isinstance(batch, list) else [batch]:
                    await r.handler.on_reclaim_instruction(i, Replies())
                await r.drains.wait_idle()
                await r.recorder.wait_written()
            feed_events = []
            while True:
                try:
                    feed_events.append(sub.receive_nowait())
                except trio.WouldBlock:
                    break
        nursery.cancel_scope.cancel()
    return feed_events


async def test_reclaim_that_drains_tells_its_story_in_events(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    c = cluster(nursery)
    pod(c, "app")
    app_uid = c.objects(PODS, "default")["app"]["metadata"]["uid"]
    r = rig(c)
    feed = await reclaim(r, instr("r-1", "n-1", grace=30))
    assert seen(c) == [
        ("Node", "n-1", "Normal", "Reclaim"),
        ("Node", "n-1", "Normal", "Cordoned"),
        ("Pod", "app", "Normal", "Evicted"),
        ("Node", "n-1", "Normal", "Drained"),
    ]
    written = events(c)
    reclaim_ev, cordoned, evicted_ev, drained = written
    assert "r-1" in reclaim_ev["message"]
    assert all(e["component"] == EVENT_COMPONENT == "bigfleet-operator" for e in written)
    # the Node's uid (from the cordon's answer) makes `kubectl describe node` find them
    for e in (reclaim_ev, cordoned, drained):
        assert (e["uid"], e["namespace"]) == (uid(c, "n-1"), None)
    assert (evicted_ev["namespace"], evicted_ev["uid"]) == ("default", app_uid)
    assert "n-1" in evicted_ev["message"]
    assert [(e["kind"], e["node"], e["instruction_id"]) for e in feed] == [
        ("drain_started", "n-1", "r-1"),
        ("drain_finished", "n-1", "r-1"),
    ]
    started, finished = feed
    assert started["grace_seconds"] == 30
    assert (finished["outcome"], finished["pods_left"], finished["error"]) == ("drained", 0, "")


async def test_pdb_refusals_one_event_per_pod_then_drain_failed(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    c = cluster(nursery)
    db = pod(c, "db", ns="prod")
    pdb_blocks(c, "db", ns="prod")
    db_uid = c.objects(PODS, "prod")["db"]["metadata"]["uid"]
    r = rig(c)
    feed = await reclaim(r, instr("r-1", "n-1", grace=10))
    assert evicted(c, db) >= 4  # refused round after round ...
    assert seen(c) == [  # ... but one EvictionBlocked for the Pod in this drain
        ("Node", "n-1", "Normal", "Reclaim"),
        ("Node", "n-1", "Normal", "Cordoned"),
        ("Pod", "db", "Warning", "EvictionBlocked"),
        ("Node", "n-1", "Warning", "DrainFailed"),
    ]
    blocked, failed = events(c)[2:]
    assert (blocked["namespace"], blocked["uid"]) == ("prod", db_uid)
    assert PDB_TEXT in blocked["message"]
    last_error = c.objects(UPCOMING_NODES)["un-m-1"]["status"]["lastError"]
    assert failed["message"] == last_error
    assert failed["uid"] == uid(c, "n-1")
    finished = feed[-1]
    assert (finished["kind"], finished["outcome"], finished["pods_left"]) == (
        "drain_finished", "failed", 1)
    assert finished["error"] == last_error


async def test_refused_eviction_names_the_apiservers_message(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    c = cluster(nursery)
    pod(c, "stuck")
    c.server.faults.fail_next(5, code=403, verb="create", resource="pods/eviction",
                              name="stuck", message="pdb misconfigured")
    r = rig(c)
    await reclaim(r, instr("r-1", "n-1", grace=8))
    blocked = [e for e in events(c) if e["reason"] == "EvictionBlocked"]
    assert len(blocked) == 1
    assert blocked[0]["type"] == "Warning" and "403: pdb misconfigured" in blocked[0]["message"]


async def test_a_second_drain_reports_a_still_blocked_pod_again(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    c = cluster(nursery)
    pod(c, "db")
    pdb_blocks(c, "db")
    r = rig(c)
    await reclaim(r, [instr("r-1", "n-1", grace=5), instr("r-2", "n-1", grace=5)],
                  instr("r-3", "n-1", grace=5))
    # r-2 arrives while r-1 drains (no second drain); r-3 after it failed: a new drain
    reasons = [e["reason"] for e in events(c)]
    assert reasons.count("EvictionBlocked") == 2
    assert reasons.count("DrainFailed") == 2


def _event_metric(reason: str, outcome: str) -> float:
    v = REGISTRY.get_sample_value(
        "bigfleet_operator_kube_events_total", {"reason": reason, "outcome": outcome}
    )
    return v or 0.0


@pytest.mark.parametrize("how", ["raises", "refused"])
async def test_event_failures_never_fail_the_drain(
    how: str, nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = cluster(nursery)
    pod(c, "app")
    if how == "raises":
        async def on_fire(*a: Any, **kw: Any) -> bool:
            raise RuntimeError("apiserver on fire")

        c.create_event = on_fire  # type: ignore[method-assign]
    else:
        # the sim refuses every Event: KubeClient.create_event logs that and returns False
        c.server.faults.fail_next(1000, code=403, verb="create", resource="events")
    before = _event_metric("Drained", "failed")
    r = rig(c)
    with caplog.at_level(logging.DEBUG, logger="bigfleet_trio.operator.kubeevents"):
        await reclaim(r, instr("r-1", "n-1"))
    assert r.drains.results["n-1"].outcome == "drained"
    assert "un-m-1" not in c.objects(UPCOMING_NODES)
    assert events(c) == []
    assert _event_metric("Drained", "failed") == before + 1
    failures = [rec for rec in caplog.records if rec.name == "bigfleet_trio.operator.kubeevents"]
    assert failures and all(rec.levelno == logging.DEBUG for rec in failures)


async def test_written_events_are_counted(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    c = cluster(nursery)
    pod(c, "app")
    before = _event_metric("Evicted", "written")
    await reclaim(rig(c), instr("r-1", "n-1"))
    assert _event_metric("Evicted", "written") == before + 1


async def test_recorder_is_bounded_and_drops_newest(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    c = cluster(nursery)
    recorder = EventRecorder(c, capacity=2)
    before = _event_metric("Evicted", "dropped")
    for i in range(3):
        recorder.record({"kind": "Pod", "metadata": {"name": f"p{i}"}}, reason="Evicted",
                        message="m")
    assert _event_metric("Evicted", "dropped") == before + 1
    async with trio.open_nursery() as inner:
        await inner.start(recorder.run)
        await recorder.wait_written()
        inner.cancel_scope.cancel()
    assert [e["name"] for e in events(c)] == ["p0", "p1"]


async def test_drain_without_recorder_or_feed_still_works(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    c = cluster(nursery)
    pod(c, "app")
    memory = DrainMemory()
    drains = DrainManager(c, memory, rng=random.Random(7))
    handler = ReclaimHandler(c, drains, memory)
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        await handler.on_reclaim_instruction(instr("r-1", "n-1"), Replies())
        await drains.wait_idle()
        inner.cancel_scope.cancel()
    assert events(c) == []
    assert drains.results["n-1"].outcome == "drained"
