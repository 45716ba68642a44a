"""The simulated kubelet's heartbeats (bigfleet_trio/sim/shard/heartbeat.py): a registered
Node's Lease renewed every 10 s and its Ready condition re-reported every 5 minutes until its
machine is released (docs/deviations.md#simulated-shard-node-heartbeats)."""

from __future__ import annotations

import math

import pytest
import trio

from bigfleet_trio.kube.errors import ServerError
from bigfleet_trio.kube.resources import LEASES, NODES
from bigfleet_trio.sim.shard.engine import MachineInfo
from bigfleet_trio.sim.shard.heartbeat import (
    LEASE_RENEW_INTERVAL,
    STATUS_REPORT_INTERVAL,
    Beat,
    HeartbeatTiming,
    after_beat,
    due_beats,
    lease_manifest,
    next_due,
    ready_heartbeat,
    registered_beat,
)
from bigfleet_trio.sim.shard.nodes import KubeNodeHooks
from bigfleet_trio.sim.shard.session import HeartbeatNodeHooks, NoopNodeHooks, SimShard
from tests.support.kube import RecordingKube

LEASE_NS = "kube-node-lease"


def machine(name: str) -> MachineInfo:
    return MachineInfo(machine_id=f"i-{name}", node_name=name, provider_id=f"sim://r/z/{name}",
                       instance_type="m", zone="z-a",
                       labels={"kubernetes.io/hostname": name}, allocatable={"cpu": "4"},
                       taints=(), price_per_hour=1.0)


# ---- the pure schedule ----------------------------------------------------------------------

def test_a_registered_node_renews_in_10_s_and_reports_in_5_min() -> None:
    assert registered_beat("u", 100.0) == Beat("u", 110.0, 400.0, 0)
    assert (LEASE_RENEW_INTERVAL, STATUS_REPORT_INTERVAL) == (10.0, 300.0)


@pytest.mark.parametrize(("lease_due", "status_due", "now", "due"), [
    (110.0, 400.0, 109.9, []),
    (110.0, 400.0, 110.0, ["lease"]),
    (110.0, 400.0, 400.0, ["lease", "status"]),
    (500.0, 400.0, 400.0, ["status"]),
])
def test_due_beats_lists_what_is_due_at_now(lease_due: float, status_due: float, now: float,
                                            due: list[str]) -> None:
    assert due_beats({"n": Beat("u", lease_due, status_due)}, now) == [("n", k) for k in due]


def test_due_beats_go_by_node_name_and_next_due_is_the_earliest() -> None:
    beats = {"b": Beat("u", 5.0, 300.0), "a": Beat("u", 6.0, 2.0), "c": Beat("u", 50.0, 60.0)}
    assert due_beats(beats, 10.0) == [("a", "lease"), ("a", "status"), ("b", "lease")]
    assert next_due(beats) == 2.0
    assert next_due({}) == math.inf


def test_after_a_write_the_next_is_an_interval_later_or_backs_off_on_failure() -> None:
    beat = Beat("u", 10.0, 300.0)
    assert after_beat(beat, "lease", 10.0, ok=True) == Beat("u", 20.0, 300.0, 0)
    assert after_beat(beat, "status", 300.0, ok=True) == Beat("u", 10.0, 600.0, 0)
    failed = after_beat(beat, "lease", 10.0, ok=False)
    assert failed == Beat("u", 10.1, 300.0, 1)
    again = after_beat(failed, "lease", 10.1, ok=False)
    assert again.failures == 2 and again.lease_due == pytest.approx(10.3)
    many = Beat("u", 0.0, 300.0, failures=20)
    assert after_beat(many, "lease", 0.0, ok=False).lease_due == 7.0  # the backoff's cap
    assert after_beat(many, "status", 0.0, ok=False).status_due == 7.0
    assert after_beat(many, "lease", 0.0, ok=True).failures == 0


def test_the_lease_and_the_status_patch() -> None:
    lease = lease_manifest("n-1", "uid-1", "2026-01-01T00:00:00.000000Z")
    assert lease["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n-1", "uid": "uid-1"}]
    # no holder: kwok, which runs the Pods of the Nodes whose Lease it holds, takes it at once
    assert lease["spec"] == {"leaseDurationSeconds": 40,
                             "renewTime": "2026-01-01T00:00:00.000000Z"}
    (cond,) = ready_heartbeat("2026-01-01T00:00:00Z")["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["lastHeartbeatTime"]) == (
        "Ready", "True", "2026-01-01T00:00:00Z")
    assert "lastTransitionTime" not in cond


# ---- applied: KubeNodeHooks against the embedded apiserver ------------------------------------

def lease_renewals(kube: RecordingKube, name: str) -> list[float]:
    return [r.at for r in kube.of("patch", "leases") if r.name == name]


def status_reports(kube: RecordingKube, name: str) -> list[float]:
    return [r.at for r in kube.of("patch/status", "nodes")
            if r.name == name and r.patch_type == "strategic"]


async def test_a_registered_nodes_lease_is_renewed_every_10_s_until_it_is_released(
        autojump_clock: trio.abc.Clock, nursery: trio.Nursery) -> None:
    kube = RecordingKube.over_sim(nursery)
    hooks = KubeNodeHooks(kube)
    await nursery.start(hooks.run)
    start = trio.current_time()
    await hooks.on_machine_configured(machine("n-1"))
    first = (await kube.get(LEASES, "n-1", LEASE_NS))["spec"]["renewTime"]
    await trio.sleep(35)
    assert [t - start for t in lease_renewals(kube, "n-1")] == pytest.approx([10, 20, 30])
    lease = await kube.get(LEASES, "n-1", LEASE_NS)
    assert lease["spec"]["renewTime"] > first

    await hooks.on_machine_released(machine("n-1"))
    await trio.sleep(60)
    assert len(lease_renewals(kube, "n-1")) == 3  # released: no renewal after it
    assert hooks.heartbeats.beats == {}


async def test_the_ready_condition_is_re_reported_every_5_minutes(
        autojump_clock: trio.abc.Clock, nursery: trio.Nursery) -> None:
    kube = RecordingKube.over_sim(nursery)
    hooks = KubeNodeHooks(kube)
    await nursery.start(hooks.run)
    start = trio.current_time()
    await hooks.on_machine_configured(machine("n-1"))
    registered = (await kube.get(NODES, "n-1"))["status"]["conditions"]
    await trio.sleep(601)
    assert [t - start for t in status_reports(kube, "n-1")] == pytest.approx([300, 600])
    assert len(lease_renewals(kube, "n-1")) == 60
    (ready,) = (await kube.get(NODES, "n-1"))["status"]["conditions"]
    assert ready["status"] == "True"
    assert ready["lastTransitionTime"] == registered[0]["lastTransitionTime"]
    assert (await kube.get(NODES, "n-1"))["status"]["allocatable"] == {"cpu": "4"}


async def test_a_failed_renewal_is_retried_soon_and_a_lost_lease_is_recreated(
        autojump_clock: trio.abc.Clock, nursery: trio.Nursery) -> None:
    kube = RecordingKube.over_sim(nursery)
    hooks = KubeNodeHooks(kube)
    await nursery.start(hooks.run)
    start = trio.current_time()
    await hooks.on_machine_configured(machine("n-1"))
    kube.fail[("patch", "n-1")] = [ServerError(503, "ServiceUnavailable", "apiserver down")]
    await trio.sleep(10.5)
    assert [t - start for t in lease_renewals(kube, "n-1")] == pytest.approx([10, 10.1])
    assert hooks.heartbeats.errors == 1 and hooks.heartbeats.renewals == 1

    await kube.delete(LEASES, "n-1", LEASE_NS)  # e.g. deleted by hand
    await trio.sleep(10)
    lease = await kube.get(LEASES, "n-1", LEASE_NS)
    assert lease["metadata"]["ownerReferences"][0]["uid"] == (
        await kube.get(NODES, "n-1"))["metadata"]["uid"]


async def test_a_renewal_leaves_a_holder_that_took_the_lease_in_place(
        autojump_clock: trio.abc.Clock, nursery: trio.Nursery) -> None:
    # kwok takes a Lease with no holder (and then runs the Node's Pods); the sim keeps only
    # renewTime fresh, so the Node stays Ready however slowly kwok renews
    kube = RecordingKube.over_sim(nursery)
    hooks = KubeNodeHooks(kube)
    await nursery.start(hooks.run)
    await hooks.on_machine_configured(machine("n-1"))
    await kube.patch(LEASES, "n-1", {"spec": {"holderIdentity": "kwok", "leaseDurationSeconds": 200,
                                              "renewTime": "2026-01-01T00:00:00.000000Z"}},
                     LEASE_NS)
    await trio.sleep(10.5)
    spec = (await kube.get(LEASES, "n-1", LEASE_NS))["spec"]
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"]) == ("kwok", 200)
    assert spec["renewTime"] > "2026-01-01T00:00:00.000000Z"


async def test_nodes_renew_on_their_own_schedules(
        autojump_clock: trio.abc.Clock, nursery: trio.Nursery) -> None:
    kube = RecordingKube.over_sim(nursery)
    hooks = KubeNodeHooks(kube)
    await nursery.start(hooks.run)
    start = trio.current_time()
    await hooks.on_machine_configured(machine("n-1"))
    await trio.sleep(3)
    await hooks.on_machine_configured(machine("n-2"))
    await trio.sleep(20)
    assert [t - start for t in lease_renewals(kube, "n-1")] == pytest.approx([10, 20])
    assert [t - start for t in lease_renewals(kube, "n-2")] == pytest.approx([13])


async def test_the_sim_shard_runs_its_hooks_heartbeats(
        autojump_clock: trio.abc.Clock, nursery: trio.Nursery) -> None:
    kube = RecordingKube.over_sim(nursery)
    hooks = KubeNodeHooks(kube)
    assert isinstance(hooks, HeartbeatNodeHooks)
    assert not isinstance(NoopNodeHooks(), HeartbeatNodeHooks)
    shard = SimShard(hooks=hooks)
    await nursery.start(shard.run)
    await hooks.on_machine_configured(machine("n-1"))
    await trio.sleep(10.5)
    assert len(lease_renewals(kube, "n-1")) == 1


def test_a_longer_lease_is_renewed_at_a_quarter_of_it_as_kubelet_does() -> None:
    """At fleet scale the bench runs the simulated kubelets' Leases at 200 s, as kwok's: 5,000
    Nodes renewing every 10 s were 40 % of kube-apiserver's writes in the full-size soak."""
    timing = HeartbeatTiming(lease_duration=200)
    assert timing.renew_interval == 50.0
    assert registered_beat("u", 100.0, timing) == Beat("u", 150.0, 400.0, 0)
    assert after_beat(Beat("u", 150.0, 400.0), "lease", 150.0, True, timing).lease_due == 200.0
    assert lease_manifest("n", "u", "t", timing)["spec"]["leaseDurationSeconds"] == 200
    assert lease_manifest("n", "u", "t")["spec"]["leaseDurationSeconds"] == 40
    with pytest.raises(ValueError, match="lease_duration"):
        HeartbeatTiming(lease_duration=3)
