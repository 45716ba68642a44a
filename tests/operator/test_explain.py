"""``bigfleet-trio explain``: the one screen for a served, an unserved and an excluded Pod, read
from the simulated apiserver after the operator's outcome pass wrote conditions and Events."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from bigfleet_trio import cli
from bigfleet_trio.kube.resources import AVAILABLE_CAPACITIES, CAPACITY_REQUESTS, UPCOMING_NODES
from bigfleet_trio.operator import explain as ex
from bigfleet_trio.operator import outcomes as oc
from bigfleet_trio.operator.crview import slim
from bigfleet_trio.operator.kubeevents import EventRecorder
from tests.operator.test_outcomes import NOW, offer, seed_pod_and_cr, upcoming
from tests.support.kube import RecordingKube


async def cluster(nursery: trio.Nursery) -> RecordingKube:
    """Pods served, starved (1 Ti memory) and excluded (Gt), after one outcome pass."""
    kube = RecordingKube.over_sim(nursery)
    seed_pod_and_cr(kube, "served")
    seed_pod_and_cr(kube, "starved", memory="1Ti")
    seed_pod_and_cr(kube, "excluded", phase="Pending",
                    requirements=[{"key": "gen", "operator": "Gt", "values": ["3"]}])
    kube.seed(UPCOMING_NODES, upcoming())
    kube.seed(AVAILABLE_CAPACITIES, {"metadata": {"name": "ac-1"}, "spec": offer()})
    recorder = EventRecorder(kube)
    await nursery.start(recorder.run)
    writer = oc.OutcomeWriter(
        kube, crs=lambda: [slim(o) for o in kube.objects(CAPACITY_REQUESTS, "team").values()],
        upcoming=lambda: list(kube.objects(UPCOMING_NODES).values()),
        offers=lambda: [offer()], events=recorder, now=lambda: NOW)
    await writer.run_once()
    await recorder.wait_written()
    return kube


async def screen(kube: RecordingKube, kind: str, target: str, **kw: Any) -> str:
    return ex.render(await ex.gather(kube, kind, target, **kw))


async def test_served_pod_shows_the_whole_chain(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    kube = await cluster(nursery)
    out = await screen(kube, "pod", "team/served", aggregate=True)
    assert "Pod team/served" in out and "phase        Pending (not bound to a Node)" in out
    assert "Sent             True    InRollUp" in out
    assert "MachineComing    True    MachineFits: UpcomingNode m-1 (c.large in z-a" in out
    assert "aggregate    2 CR(s): cpu=4, memory=1028Gi" in out  # served + starved share a need
    assert "AvailableCapacity  1 of 1 offer(s) fit" in out
    assert "UpcomingNodes      1 of 1 fit" in out
    assert out.index("CapacityRequested") < out.index("Normal  Pod             MachineComing")


async def test_unserved_pod_shows_why(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    out = await screen(await cluster(nursery), "pod", "team/starved")
    assert "CapacityOffered  False   NoOffer" in out
    assert "AvailableCapacity  0 of 1 offer(s) fit" in out
    assert "UpcomingNodes      0 of 1 fit" in out
    assert "Warning Pod             NoCapacityOffered" in out
    assert "--aggregate" in out  # not summed unless asked


async def test_excluded_pod_names_the_field(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    kube = await cluster(nursery)
    out = await screen(kube, "pod", "team/excluded")
    assert "excluded     spec.requirements[0].operator" in out
    assert "Warning Pod             CapacityRequestExcluded" in out
    assert "Roll-up need" not in out
    name = next(n for n, o in kube.objects(CAPACITY_REQUESTS, "team").items()
                if o["metadata"]["ownerReferences"][0]["name"] == "excluded")
    assert (await screen(kube, "cr", f"team/{name}")).startswith("Pod team/excluded")


async def test_a_pod_without_a_cr_and_bad_targets(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    kube = RecordingKube.over_sim(nursery)
    seed_pod_and_cr(kube, "served")
    for o in kube.objects(CAPACITY_REQUESTS, "team"):
        await kube.delete(CAPACITY_REQUESTS, o, "team")
    out = await screen(kube, "pod", "team/served")
    assert "none: the pod controller made none" in out and "Events       none" in out
    with pytest.raises(ex.ExplainError, match="pod team/nope not found"):
        await ex.gather(kube, "pod", "team/nope")
    with pytest.raises(ex.ExplainError, match="NAMESPACE/NAME"):
        await ex.gather(kube, "pod", "served")


def test_cli_refuses_a_target_without_namespace(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["explain", "pod", "web-0"]) == 2
    assert "explain: expected NAMESPACE/NAME, got 'web-0'" in capsys.readouterr().err
