"""What a reclaim leaves for ``kubectl get events`` / ``kubectl describe`` (Reclaim, Cordoned,
EvictionBlocked, Evicted, Drained, DrainFailed) and on the operator's ``/events`` feed
(drain_started, drain_finished). Event writes never fail a drain."""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
from prometheus_client import REGISTRY

from bigfleet_trio.kube.errors import Forbidden
from bigfleet_trio.observability.events import EventFeed
from bigfleet_trio.operator.kubeevents import EVENT_COMPONENT, EventRecorder
from bigfleet_trio.operator.reclaim.drain import DrainManager
from bigfleet_trio.operator.reclaim.handler import ReclaimHandler
from bigfleet_trio.operator.upcoming.plan import DrainMemory
from tests.operator.test_reclaim import FakeCluster, Replies, _pod, instr, pdb_block

PDB_TEXT = "429: Cannot evict pod as it would violate the pod's disruption budget."


@dataclass
class EventCluster(FakeCluster):
    """The reclaim fake plus ``create_event`` (KubeClient's signature; True when written)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    event_failure: BaseException | None = None
    event_refused: bool = False

    async def create_event(
        self,
        involved: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        type: str = "Normal",  # noqa: A002
        component: str = "bigfleet-trio",
    ) -> bool:
        await trio.lowlevel.checkpoint()
        if self.event_failure is not None:
            raise self.event_failure
        if self.event_refused:
            return False
        meta = involved.get("metadata") or {}
        self.events.append({
            "kind": involved.get("kind"),
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "type": type,
            "reason": reason,
            "message": message,
            "component": component,
        })
        return True

    def seen(self) -> list[tuple[str, str, str, str]]:
        """(kind, name, type, reason) of every Event written, in order."""
        return [(e["kind"], e["name"], e["type"], e["reason"]) for e in self.events]


def cluster() -> EventCluster:
    c = EventCluster()
    c.add_node("n-1")
    c.nodes["n-1"]["metadata"]["uid"] = "uid-n-1"
    c.add_un("un-m-1", nodeRef={"kind": "Node", "name": "n-1"})
    return c


def pod(name: str, **kw: Any) -> dict[str, Any]:
    p = _pod(name, **kw)
    p["metadata"]["uid"] = f"uid-{name}"
    return p


@dataclass
class Rig:
    drains: DrainManager
    handler: ReclaimHandler
    recorder: EventRecorder
    feed: EventFeed


def rig(c: EventCluster) -> Rig:
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
    autojump_clock: trio.abc.Clock,
) -> None:
    c = cluster()
    c.add_pod(pod("app"))
    r = rig(c)
    feed = await reclaim(r, instr("r-1", "n-1", grace=30))
    assert c.seen() == [
        ("Node", "n-1", "Normal", "Reclaim"),
        ("Node", "n-1", "Normal", "Cordoned"),
        ("Pod", "app", "Normal", "Evicted"),
        ("Node", "n-1", "Normal", "Drained"),
    ]
    reclaim_ev, cordoned, evicted, drained = c.events
    assert "r-1" in reclaim_ev["message"]
    assert all(e["component"] == EVENT_COMPONENT == "bigfleet-operator" for e in c.events)
    # the Node's uid (from the cordon's answer) makes `kubectl describe node` find them
    for e in (reclaim_ev, cordoned, drained):
        assert (e["uid"], e["namespace"]) == ("uid-n-1", None)
    assert (evicted["namespace"], evicted["uid"]) == ("default", "uid-app")
    assert "n-1" in evicted["message"]
    assert [(e["kind"], e["node"], e["instruction_id"]) for e in feed] == [
        ("drain_started", "n-1", "r-1"),
        ("drain_finished", "n-1", "r-1"),
    ]
    started, finished = feed
    assert started["grace_seconds"] == 30
    assert (finished["outcome"], finished["pods_left"], finished["error"]) == ("drained", 0, "")


async def test_pdb_refusals_one_event_per_pod_then_drain_failed(
    autojump_clock: trio.abc.Clock,
) -> None:
    c = cluster()
    db = c.add_pod(pod("db", ns="prod"))
    c.eviction_policy[db] = pdb_block(None)
    r = rig(c)
    feed = await reclaim(r, instr("r-1", "n-1", grace=10))
    assert c.evicted(db) >= 4  # refused round after round ...
    assert c.seen() == [  # ... but one EvictionBlocked for the Pod in this drain
        ("Node", "n-1", "Normal", "Reclaim"),
        ("Node", "n-1", "Normal", "Cordoned"),
        ("Pod", "db", "Warning", "EvictionBlocked"),
        ("Node", "n-1", "Warning", "DrainFailed"),
    ]
    blocked, failed = c.events[2], c.events[3]
    assert (blocked["namespace"], blocked["uid"]) == ("prod", "uid-db")
    assert PDB_TEXT in blocked["message"]
    last_error = c.upcoming["un-m-1"]["status"]["lastError"]
    assert failed["message"] == last_error
    assert failed["uid"] == "uid-n-1"
    finished = feed[-1]
    assert (finished["kind"], finished["outcome"], finished["pods_left"]) == (
        "drain_finished", "failed", 1)
    assert finished["error"] == last_error


async def test_refused_eviction_names_the_apiservers_message(
    autojump_clock: trio.abc.Clock,
) -> None:
    c = cluster()
    stuck = c.add_pod(pod("stuck"))
    c.eviction_policy[stuck] = lambda attempt: Forbidden(403, "Forbidden", "pdb misconfigured")
    r = rig(c)
    await reclaim(r, instr("r-1", "n-1", grace=8))
    blocked = [e for e in c.events if e["reason"] == "EvictionBlocked"]
    assert len(blocked) == 1
    assert blocked[0]["type"] == "Warning" and "403: pdb misconfigured" in blocked[0]["message"]


async def test_a_second_drain_reports_a_still_blocked_pod_again(
    autojump_clock: trio.abc.Clock,
) -> None:
    c = cluster()
    db = c.add_pod(pod("db"))
    c.eviction_policy[db] = pdb_block(None)
    r = rig(c)
    await reclaim(r, [instr("r-1", "n-1", grace=5), instr("r-2", "n-1", grace=5)],
                  instr("r-3", "n-1", grace=5))
    # r-2 arrives while r-1 drains (no second drain); r-3 after it failed: a new drain
    assert [e["reason"] for e in c.events].count("EvictionBlocked") == 2
    assert [e["reason"] for e in c.events].count("DrainFailed") == 2


def _event_metric(reason: str, outcome: str) -> float:
    v = REGISTRY.get_sample_value(
        "bigfleet_operator_kube_events_total", {"reason": reason, "outcome": outcome}
    )
    return v or 0.0


@pytest.mark.parametrize("how", ["raises", "refused"])
async def test_event_failures_never_fail_the_drain(
    how: str, autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    c = cluster()
    c.add_pod(pod("app"))
    if how == "raises":
        c.event_failure = RuntimeError("apiserver on fire")
    else:
        c.event_refused = True  # KubeClient.create_event: logged there, False here
    before = _event_metric("Drained", "failed")
    r = rig(c)
    with caplog.at_level(logging.DEBUG, logger="bigfleet_trio.operator.kubeevents"):
        await reclaim(r, instr("r-1", "n-1"))
    assert r.drains.results["n-1"].outcome == "drained"
    assert "un-m-1" not in c.upcoming
    assert c.events == []
    assert _event_metric("Drained", "failed") == before + 1
    failures = [rec for rec in caplog.records if rec.name == "bigfleet_trio.operator.kubeevents"]
    assert failures and all(rec.levelno == logging.DEBUG for rec in failures)


async def test_written_events_are_counted(autojump_clock: trio.abc.Clock) -> None:
    c = cluster()
    c.add_pod(pod("app"))
    before = _event_metric("Evicted", "written")
    await reclaim(rig(c), instr("r-1", "n-1"))
    assert _event_metric("Evicted", "written") == before + 1


async def test_recorder_is_bounded_and_drops_newest(autojump_clock: trio.abc.Clock) -> None:
    c = cluster()
    recorder = EventRecorder(c, capacity=2)
    before = _event_metric("Evicted", "dropped")
    for i in range(3):
        recorder.record({"kind": "Pod", "metadata": {"name": f"p{i}"}}, reason="Evicted",
                        message="m")
    assert _event_metric("Evicted", "dropped") == before + 1
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        await recorder.wait_written()
        nursery.cancel_scope.cancel()
    assert [e["name"] for e in c.events] == ["p0", "p1"]


async def test_drain_without_recorder_or_feed_still_works(autojump_clock: trio.abc.Clock) -> None:
    c = cluster()
    c.add_pod(pod("app"))
    memory = DrainMemory()
    drains = DrainManager(c, memory, rng=random.Random(7))
    handler = ReclaimHandler(c, drains, memory)
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        await handler.on_reclaim_instruction(instr("r-1", "n-1"), Replies())
        await drains.wait_idle()
        nursery.cancel_scope.cancel()
    assert c.events == []
    assert drains.results["n-1"].outcome == "drained"
