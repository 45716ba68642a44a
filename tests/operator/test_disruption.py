"""Disruption annotations platform teams already set (karpenter.sh/do-not-disrupt,
cluster-autoscaler.kubernetes.io/safe-to-evict): the pure reading, the highest reclamation
penalty on the Pod's CR, and a drain that evicts such a Pod last, near its deadline, saying so."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import trio

from bigfleet_trio.kube.disruption import (
    DO_NOT_DISRUPT,
    SAFE_TO_EVICT,
    disruption_blocker,
    invalid_do_not_disrupt,
)
from bigfleet_trio.kube.resources import EVENTS, PODS
from bigfleet_trio.operator.kubeevents import EventRecorder
from bigfleet_trio.operator.reclaim.drain import DrainManager
from bigfleet_trio.operator.reclaim.handler import ReclaimHandler
from bigfleet_trio.operator.reclaim.plan import protected_wait
from bigfleet_trio.operator.rollup.profile import penalty_bucket
from bigfleet_trio.operator.upcoming.plan import DrainMemory
from bigfleet_trio.podcontroller.projections import slim_pod
from bigfleet_trio.podcontroller.translate import translate_pod
from tests.operator.test_reclaim import Replies, instr
from tests.operator.test_reclaim_events import cluster, seen

START = "2026-03-01T12:00:00Z"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("annotations", "blocker"), [
    ({DO_NOT_DISRUPT: "true"}, f"annotation {DO_NOT_DISRUPT}=true"),
    ({DO_NOT_DISRUPT: "false"}, None),
    ({DO_NOT_DISRUPT: "soon"}, None),
    ({DO_NOT_DISRUPT: "0s"}, None),
    ({DO_NOT_DISRUPT: "-5m"}, None),
    ({DO_NOT_DISRUPT: "600"}, None),  # Go's time.ParseDuration wants a unit
    ({DO_NOT_DISRUPT: "True"}, None),  # Karpenter compares with "true" exactly
    ({DO_NOT_DISRUPT: 1}, None),
    ({SAFE_TO_EVICT: "false"}, f"annotation {SAFE_TO_EVICT}=false"),
    ({SAFE_TO_EVICT: "true"}, None),
    ({DO_NOT_DISRUPT: "false", SAFE_TO_EVICT: "false"}, f"annotation {SAFE_TO_EVICT}=false"),
    ({}, None),
    (None, None),
    (["not", "a", "map"], None),
])
def test_which_annotations_protect_a_pod(annotations: Any, blocker: str | None) -> None:
    assert disruption_blocker(annotations) == blocker
    # "true" and safe-to-evict do not expire: a start time and a clock change nothing
    assert disruption_blocker(annotations, started=START, now=T0 + timedelta(days=400)) == (
        blocker)


@pytest.mark.parametrize(("value", "started", "after", "blocker"), [
    # protected for the duration from the Pod's status.startTime, as Karpenter reads it
    ("30m", START, timedelta(0), f"annotation {DO_NOT_DISRUPT}=30m until 2026-03-01T12:30:00Z"),
    ("30m", START, timedelta(minutes=29, seconds=59),
     f"annotation {DO_NOT_DISRUPT}=30m until 2026-03-01T12:30:00Z"),
    ("30m", START, timedelta(minutes=30), None),  # the protection has ended
    ("30m", START, timedelta(hours=5), None),
    ("1h30m", START, timedelta(hours=1),
     f"annotation {DO_NOT_DISRUPT}=1h30m until 2026-03-01T13:30:00Z"),
    ("90s", "2026-03-01T12:00:00.5+00:00", timedelta(seconds=90), (
        f"annotation {DO_NOT_DISRUPT}=90s until 2026-03-01T12:01:30Z")),
    ("90s", "2026-03-01T12:00:00.5+00:00", timedelta(seconds=90.5), None),
    # not started yet (a Pending Pod), or a start we cannot read: protected (Karpenter's
    # fail-safe), with no end to name
    ("30m", None, timedelta(hours=5), f"annotation {DO_NOT_DISRUPT}=30m"),
    ("30m", "yesterday", timedelta(hours=5), f"annotation {DO_NOT_DISRUPT}=30m"),
    ("30m", "2026-03-01T12:00:00", timedelta(hours=5), f"annotation {DO_NOT_DISRUPT}=30m"),
    ("30m", 1772366400, timedelta(hours=5), f"annotation {DO_NOT_DISRUPT}=30m"),
])
def test_a_duration_protects_from_the_pods_start_for_that_long(
    value: str, started: object, after: timedelta, blocker: str | None,
) -> None:
    annotations = {DO_NOT_DISRUPT: value}
    assert disruption_blocker(annotations, started=started, now=T0 + after) == blocker


@pytest.mark.parametrize(("annotations", "invalid"), [
    ({DO_NOT_DISRUPT: "600"}, "600"), ({DO_NOT_DISRUPT: "True"}, "True"),
    ({DO_NOT_DISRUPT: "false"}, "false"), ({DO_NOT_DISRUPT: "0s"}, "0s"),
    ({DO_NOT_DISRUPT: "-5m"}, "-5m"), ({DO_NOT_DISRUPT: ""}, ""), ({DO_NOT_DISRUPT: 1}, "1"),
    ({DO_NOT_DISRUPT: "true"}, None), ({DO_NOT_DISRUPT: "30m"}, None),
    ({SAFE_TO_EVICT: "maybe"}, None),  # cluster-autoscaler's reads only "false": not ours
    ({}, None), (None, None),
])
def test_a_do_not_disrupt_value_that_protects_nothing_is_named(
    annotations: Any, invalid: str | None,
) -> None:
    """As Karpenter's InvalidDoNotDisruptAnnotation: the value, and what would work."""
    expected = None if invalid is None else (
        f'annotation {DO_NOT_DISRUPT}="{invalid}" protects nothing and is ignored: use "true" '
        'or a Go duration such as "30m"')
    assert invalid_do_not_disrupt(annotations) == expected


def test_without_a_clock_a_duration_protects() -> None:
    """The pod controller's reading (a Pending Pod's CR): the protection has not begun."""
    assert disruption_blocker({DO_NOT_DISRUPT: "30m"}, started=START) == (
        f"annotation {DO_NOT_DISRUPT}=30m until 2026-03-01T12:30:00Z")


def pod_with(annotations: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "db", "namespace": "prod", "uid": "u-1",
                         "annotations": annotations},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}


@pytest.mark.parametrize(("annotations", "honour", "bucket"), [
    ({DO_NOT_DISRUPT: "true"}, True, 27),
    ({DO_NOT_DISRUPT: "30m"}, True, 27),  # a Pending Pod: its protection has not begun
    ({DO_NOT_DISRUPT: "600"}, True, 0),  # not a Go duration: no protection
    ({SAFE_TO_EVICT: "false"}, True, 27),
    ({DO_NOT_DISRUPT: "true"}, False, 0),   # --disruption-annotations=false: the opt-out
    ({DO_NOT_DISRUPT: "true", "bigfleet.lucy.sh/reclamation-penalty": "5"}, True, 6),  # own wins
    ({}, True, 0),
])
def test_a_protected_pod_gets_the_highest_reclamation_bucket(
    annotations: dict[str, str], honour: bool, bucket: int,
) -> None:
    spec = translate_pod(slim_pod(pod_with(annotations)), None,
                         disruption_annotations=honour).spec
    assert penalty_bucket(spec.get("reclamationPenalty")) == bucket


@pytest.mark.parametrize(("grace", "remaining", "waits"), [
    (None, 100.0, True), (None, 34.1, True), (None, 34.0, False), (5, 10.0, True),
    (5, 9.0, False), (600, 120.0, False),  # its own grace longer than the drain's: at once
])
def test_a_protected_pod_waits_for_the_deadline_less_its_grace(
    grace: int | None, remaining: float, waits: bool,
) -> None:
    pod: dict[str, Any] = {"spec": {}}
    if grace is not None:
        pod["spec"]["terminationGracePeriodSeconds"] = grace
    assert protected_wait(pod, remaining, 2.0) is waits


def seed(kube: Any, name: str, annotations: dict[str, str] | None = None,
         started: str | None = None) -> None:
    status: dict[str, Any] = {"phase": "Running"}
    if started is not None:
        status["startTime"] = started
    kube.seed(PODS, {
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name},
                     "annotations": annotations or {}},
        "spec": {"nodeName": "n-1", "containers": [{"name": "c", "image": "busybox"}]},
        "status": status,
    })


def wall_from(start: datetime) -> Callable[[], datetime]:
    """A wall clock that reads ``start`` now and moves with Trio's (autojump) clock."""
    t0 = trio.current_time()
    return lambda: start + timedelta(seconds=trio.current_time() - t0)


async def drain(kube: Any, *, honour: bool = True, grace: int = 120,
                wall_clock: Callable[[], datetime] | None = None) -> None:
    recorder = EventRecorder(kube)
    drains = DrainManager(kube, DrainMemory(), events=recorder, disruption_annotations=honour,
                          **({"wall_clock": wall_clock} if wall_clock else {}))
    handler = ReclaimHandler(kube, drains, drains.memory, events=recorder)
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        await nursery.start(drains.run)
        await handler.on_reclaim_instruction(instr("r-1", "n-1", grace=grace), Replies())
        await drains.wait_idle()
        await recorder.wait_written()
        nursery.cancel_scope.cancel()


def evicted_at(kube: Any) -> dict[str, float]:
    return {r.name: r.at for r in kube.of("evict")}


async def test_a_drain_evicts_the_protected_pod_last_near_its_deadline(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    kube = cluster(nursery)
    seed(kube, "web")
    seed(kube, "db", {DO_NOT_DISRUPT: "true"})
    t0 = trio.current_time()
    await drain(kube)
    at = {name: t - t0 for name, t in evicted_at(kube).items()}
    assert at["web"] < 5
    assert 120 - 30 - 2 * 2.0 * 1.25 <= at["db"] <= 120 - 30  # its own 30 s grace still fits
    pod_events = [(name, reason) for kind, name, _, reason in seen(kube) if kind == "Pod"]
    assert pod_events.count(("db", "DisruptionBlocked")) == 1  # once per drain, not per round
    assert pod_events.index(("web", "Evicted")) < pod_events.index(("db", "Evicted"))
    assert ("Node", "n-1", "Normal", "Drained") in seen(kube)


async def test_with_the_opt_out_the_annotation_is_ignored(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    kube = cluster(nursery)
    seed(kube, "db", {SAFE_TO_EVICT: "false"})
    t0 = trio.current_time()
    await drain(kube, honour=False)
    assert evicted_at(kube)["db"] - t0 < 5
    assert not any(reason == "DisruptionBlocked" for *_, reason in seen(kube))


async def test_a_duration_holds_the_pod_only_until_its_protection_ends(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    kube = cluster(nursery)
    # started a minute before the drain: "2m" protects it 60 s into the drain, "1h" past the
    # drain's deadline (so it goes last, as "true" does)
    seed(kube, "short", {DO_NOT_DISRUPT: "2m"}, started="2026-03-01T11:59:00Z")
    seed(kube, "long", {DO_NOT_DISRUPT: "1h"}, started="2026-03-01T11:59:00Z")
    seed(kube, "spent", {DO_NOT_DISRUPT: "30s"}, started="2026-03-01T11:59:00Z")
    t0 = trio.current_time()
    await drain(kube, grace=300, wall_clock=wall_from(T0))
    at = {name: t - t0 for name, t in evicted_at(kube).items()}
    assert at["spent"] < 5  # its protection ended before the drain began
    assert 60 <= at["short"] < 60 + 2 * 2.0 * 1.25
    assert 300 - 30 - 2 * 2.0 * 1.25 <= at["long"] <= 300 - 30
    held = {e["involvedObject"]["name"]: e["message"] for e in kube.objects(EVENTS).values()
            if e["reason"] == "DisruptionBlocked"}
    assert sorted(held) == ["long", "short"]
    assert held["short"].endswith(f"annotation {DO_NOT_DISRUPT}=2m until 2026-03-01T12:01:00Z")


async def test_a_drain_warns_once_of_a_value_that_protects_nothing(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    kube = cluster(nursery)
    seed(kube, "db", {DO_NOT_DISRUPT: "600"})  # seconds? Go wants a unit: no protection
    t0 = trio.current_time()
    await drain(kube)
    assert evicted_at(kube)["db"] - t0 < 5
    warned = [e for e in kube.objects(EVENTS).values()
              if e["reason"] == "InvalidDoNotDisruptAnnotation"]
    assert [(e["type"], e["involvedObject"]["name"]) for e in warned] == [("Warning", "db")]
    assert warned[0]["message"] == invalid_do_not_disrupt({DO_NOT_DISRUPT: "600"})
    assert not any(reason == "DisruptionBlocked" for *_, reason in seen(kube))


async def test_with_the_opt_out_no_warning_either(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    kube = cluster(nursery)
    seed(kube, "db", {DO_NOT_DISRUPT: "600"})
    await drain(kube, honour=False)
    assert not any(e["reason"] == "InvalidDoNotDisruptAnnotation"
                   for e in kube.objects(EVENTS).values())
