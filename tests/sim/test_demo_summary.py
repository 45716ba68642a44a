"""The summary of a demo that ran out of time counts what it last saw (README.md, the demo
section): the machines Configured then, in every stage, not zeros for the rows of a phase it
never reached."""

from __future__ import annotations

from typing import Any

import betterproto
import pytest

from bigfleet_trio.proto import pb
from bigfleet_trio.sim.demo_scenario import fill_stalled
from bigfleet_trio.sim.demo_world import DemoSummary, World
from bigfleet_trio.sim.shard.catalog import Catalog, MachineShape
from bigfleet_trio.sim.shard.engine import EngineConfig, State
from bigfleet_trio.sim.shard.session import SimShard
from tests.support.rollup import cpu_rollup


def _four_configured() -> SimShard:
    """A shard whose cluster has 4 machines of 2 cpu Configured for 7 cpu of demand."""
    shard = SimShard(Catalog([MachineShape("small", "sim-a", {"cpu": "2"}, 0.1, count=6)]),
                     EngineConfig())
    eng = shard.engine
    eng.on_connect("c1", 0.0)
    now, effects = 1.0, eng.on_rollup(cpu_rollup("7"), 1.0)
    while not all(m.state == State.CONFIGURED for m in eng.bound_machines()):
        for e in effects:
            kind, msg = betterproto.which_one_of(getattr(e, "frame", pb.ShardMessage()),
                                                 "payload")
            if kind == "bootstrap_request":
                eng.on_bootstrap_response(
                    pb.BootstrapBlobResponse(request_id=msg.request_id, user_data=b"x"), now)
        due = eng.next_deadline()
        assert due is not None
        now = due
        effects = eng.advance(now)
    assert len(eng.bound_machines()) == 4
    return shard


def _world(shard: SimShard) -> World:
    pods: list[dict[str, Any]] = [
        {"metadata": {"name": f"p{i}", "namespace": "default", "uid": f"u{i}"},
         "spec": {"nodeName": m.node_name}, "status": {"phase": "Running"}}
        for i, m in enumerate(shard.engine.bound_machines())]
    pods.append({"metadata": {"name": "stuck", "namespace": "default", "uid": "u-stuck"},
                 "spec": {}, "status": {"phase": "Pending"}})
    ups = [{"metadata": {"name": f"un-{m.machine_id}"}, "status": {"phase": "Ready"}}
           for m in shard.engine.bound_machines()]
    return World(pods=pods, crs=[], upcoming=ups, nodes=[], shard=shard.snapshot())


@pytest.mark.parametrize("stage", ["scale-up", "reclaim"])
def test_a_stalled_run_counts_the_machines_configured_at_the_end(stage: str) -> None:
    shard = _four_configured()
    summary = DemoSummary()
    fill_stalled(summary, stage, _world(shard), shard, (0, 0, 0))
    # before: "after: machines Configured 0 ($0.00/h)" when it stalled scaling up
    assert summary.final_machines_configured == 4
    assert summary.final_hourly_cost == 0.4
    assert summary.final_pods == 5
    if stage == "scale-up":  # the scale-up rows too; the scale-down's stay 0 (never reached)
        assert (summary.machines_configured, summary.pods_bound, summary.upcoming_ready) == (
            4, 4, 4)
        assert summary.reclaims_issued == 0


def test_a_run_stalled_before_any_read_keeps_zeros() -> None:
    summary = DemoSummary()
    fill_stalled(summary, "apply", None, _four_configured(), (0, 0, 0))
    assert summary == DemoSummary()
