"""The demo's scale-down check over a shard whose reclaimed machine was bound again (warm reuse):
converged once the reclaimed binding ended, its UpcomingNode and Node are gone, whatever the
machine does in a later binding (docs/rules.md#reclaim-the-same-machine-again)."""

from __future__ import annotations

from typing import Any

import betterproto

from bigfleet_trio.proto import pb
from bigfleet_trio.sim.demo_world import World, converged_down, reclaims_pending
from bigfleet_trio.sim.shard.catalog import Catalog, MachineShape
from bigfleet_trio.sim.shard.engine import EngineConfig, Machine, State
from bigfleet_trio.sim.shard.session import SimShard
from tests.support.rollup import cpu_rollup


def _configure(shard: SimShard, effects: list[Any], now: float) -> float:
    eng = shard.engine
    while True:
        for e in effects:
            kind, msg = betterproto.which_one_of(getattr(e, "frame", pb.ShardMessage()), "payload")
            if kind == "bootstrap_request":
                eng.on_bootstrap_response(
                    pb.BootstrapBlobResponse(request_id=msg.request_id, user_data=b"x"), now)
        if all(m.state == State.CONFIGURED for m in eng.bound_machines()):
            return now
        due = eng.next_deadline()
        assert due is not None
        now = due
        effects = eng.advance(now)


def _reused() -> tuple[SimShard, Machine, float]:
    """Two machines serve 2 cpu; demand drops to 1 -> one reclaimed, drained, released; demand
    back to 2 -> the released (warm) machine is bound again and configured."""
    shard = SimShard(Catalog([MachineShape("small", "sim-a", {"cpu": "2"}, 0.1, count=3)]),
                     EngineConfig(surplus_rollups=1, drain_wait=1.0, drain_step=0.5,
                                  reclaim_grace_seconds=1))
    eng = shard.engine
    eng.on_connect("c1", 0.0)
    now = _configure(shard, eng.on_rollup(cpu_rollup("3"), 1.0), 1.0)
    eng.on_rollup(cpu_rollup("1"), now)
    [rec] = eng.reclaims
    eng.on_reclaim_ack(pb.ReclaimAck(rec.instruction_id, 1), now)
    eng.advance(now + 1.0)  # drain_wait -> Draining
    eng.advance(now + 1.5)  # drain_step (and the 1 s grace window) over -> Idle, released
    m = eng.machine(rec.machine_id)
    assert m is not None and not m.bound
    now = _configure(shard, eng.on_rollup(cpu_rollup("3"), now + 2), now + 2)
    assert m.bound and m.state == State.CONFIGURED
    return shard, m, now


def _world(shard: SimShard, upcoming: dict[str, str]) -> World:
    ups = [{"metadata": {"name": name}, "status": {"phase": phase}}
           for name, phase in upcoming.items()]
    nodes = [{"metadata": {"name": m.node_name}} for m in shard.engine.bound_machines()]
    return World(pods=[], crs=[], upcoming=ups, nodes=nodes, shard=shard.snapshot())


def test_a_reclaimed_machine_bound_again_in_a_new_binding_does_not_block_convergence() -> None:
    shard, m, _ = _reused()
    world = _world(shard, {f"un-{x.machine_id}": "Ready" for x in shard.engine.bound_machines()})
    why = converged_down(world, shard, 0)
    # before: "machine ... still bound (configured)" for ever, the demo timed out
    assert not [w for w in why if m.machine_id in w or m.node_name in w], why
    assert reclaims_pending(world, shard, 0) == []


def test_the_reclaimed_bindings_upcomingnode_still_draining_is_not_converged() -> None:
    shard, m, _ = _reused()
    ups = {f"un-{x.machine_id}": "Ready" for x in shard.engine.bound_machines()}
    ups[f"un-{m.machine_id}"] = "Draining"  # the old binding's record, not deleted yet
    assert reclaims_pending(_world(shard, ups), shard, 0) == [
        f"UpcomingNode un-{m.machine_id} not deleted yet"]


def test_a_reclaimed_machine_not_released_yet_is_still_bound() -> None:
    shard = SimShard(Catalog([MachineShape("small", "sim-a", {"cpu": "2"}, 0.1, count=3)]),
                     EngineConfig(surplus_rollups=1))
    eng = shard.engine
    eng.on_connect("c1", 0.0)
    now = _configure(shard, eng.on_rollup(cpu_rollup("3"), 1.0), 1.0)
    eng.on_rollup(cpu_rollup("1"), now)
    [rec] = eng.reclaims
    world = _world(shard, {f"un-{x.machine_id}": "Ready" for x in eng.bound_machines()})
    assert reclaims_pending(world, shard, 0) == [
        "1 ReclaimInstructions not acknowledged",
        f"machine {rec.machine_id} ({rec.node_name}) still bound (configured)"]
