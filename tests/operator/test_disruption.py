"""Disruption annotations platform teams already set (karpenter.sh/do-not-disrupt,
cluster-autoscaler.kubernetes.io/safe-to-evict): the pure reading, the highest reclamation
penalty on the Pod's CR, and a drain that evicts such a Pod last, near its deadline, saying so."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from bigfleet_trio.kube.disruption import DO_NOT_DISRUPT, SAFE_TO_EVICT, disruption_blocker
from bigfleet_trio.kube.resources import PODS
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


@pytest.mark.parametrize(("annotations", "blocker"), [
    ({DO_NOT_DISRUPT: "true"}, f"annotation {DO_NOT_DISRUPT}=true"),
    ({DO_NOT_DISRUPT: "30m"}, f"annotation {DO_NOT_DISRUPT}=30m"),
    ({DO_NOT_DISRUPT: "false"}, None),
    ({DO_NOT_DISRUPT: "soon"}, None),
    ({DO_NOT_DISRUPT: "0s"}, None),
    ({SAFE_TO_EVICT: "false"}, f"annotation {SAFE_TO_EVICT}=false"),
    ({SAFE_TO_EVICT: "true"}, None),
    ({}, None),
    (None, None),
    (["not", "a", "map"], None),
])
def test_which_annotations_protect_a_pod(annotations: Any, blocker: str | None) -> None:
    assert disruption_blocker(annotations) == blocker


def pod_with(annotations: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "db", "namespace": "prod", "uid": "u-1",
                         "annotations": annotations},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}


@pytest.mark.parametrize(("annotations", "honour", "bucket"), [
    ({DO_NOT_DISRUPT: "true"}, True, 27),
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


def seed(kube: Any, name: str, annotations: dict[str, str] | None = None) -> None:
    kube.seed(PODS, {
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name},
                     "annotations": annotations or {}},
        "spec": {"nodeName": "n-1", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running"},
    })


async def drain(kube: Any, *, honour: bool = True, grace: int = 120) -> None:
    recorder = EventRecorder(kube)
    drains = DrainManager(kube, DrainMemory(), events=recorder, disruption_annotations=honour)
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
