"""The operator level-triggered on the real control plane (docs/rules.md#level-triggered-operator):
kube-apiserver stopped for 60 s (connections refused) while the shard's stream stays up and its
machines walk their lifecycle; once it is back, every UpcomingNode and AvailableCapacity reaches
the state of its latest frame on the same session."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import trio

from bigfleet_trio.kube.errors import NotFound
from bigfleet_trio.kube.resources import AVAILABLE_CAPACITIES, PODS, UPCOMING_NODES
from bigfleet_trio.operator.available import available_capacity_name
from bigfleet_trio.operator.upcoming.plan import upcoming_node_name
from bigfleet_trio.proto import pb
from bigfleet_trio.sim.shard.catalog import Catalog, MachineShape
from bigfleet_trio.sim.shard.cli import serve_sim_shard
from bigfleet_trio.sim.shard.model import EngineConfig
from bigfleet_trio.sim.shard.session import SimShard
from tests.realkube.agent import Agent, acknowledged, phase
from tests.realkube.test_agent_faults import RESTARTED_AFTER, bare_pod
from tests.support.realkube import RealKube

#: How long kube-apiserver stays down, and how long after it is back everything must converge.
OUTAGE = 60.0
CONVERGE = 30.0

#: Slow enough that a machine's whole lifecycle (Creating, Idle with its bootstrap pull,
#: Configuring, Configured: four NodeStateUpdates) and the pool's AvailableCapacityUpdates fall
#: inside the outage, well after the stop has taken effect.
ENGINE = EngineConfig(seed=44, create_delay=10.0, boot_delay=8.0, configure_delay=8.0,
                      bootstrap_timeout=30.0, reclaim_ack_timeout=60.0)


async def test_frames_during_a_60s_apiserver_stop_converge_on_the_same_session(
    realkube: RealKube, tmp_path: Path
) -> None:
    cp = realkube.cp
    realkube.reset()
    ns = realkube.namespace("outage")
    shard = SimShard(Catalog([MachineShape("out-2", "z-a", {"cpu": "2", "memory": "4Gi"}, 0.1,
                                           count=4)]), ENGINE)
    try:
        async with realkube.client() as admin, trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve_sim_shard, shard, port=0))
            a = Agent(realkube, tmp_path, nursery, admin)
            try:
                await a.start_pod_controller()
                await a.start_operator(shard_port=port)
                await a.ready("pod-controller")
                await a.ready("operator")
                for i in range(3):  # 1 cpu each: two 2-cpu machines
                    await admin.create(PODS, bare_pod(f"bare-{i}"), ns)
                await acknowledged(a, ns, "bare", 3)  # the roll-up reached the shard
                sessions = shard.sessions_started
                # nothing CONFIGURED yet: every machine's lifecycle comes in the outage
                assert all(m.state != pb.MachineState.CONFIGURED for m in shard.engine.machines)

                stopped = time.monotonic()
                await trio.to_thread.run_sync(cp.stop_component, "kube-apiserver")
                # the machines walk their lifecycle with nobody able to write it down
                await a.until("the shard's machines CONFIGURED during the outage", _configured(
                    shard), OUTAGE)
                await trio.sleep(max(0.0, OUTAGE - (time.monotonic() - stopped)))
                await trio.to_thread.run_sync(cp.start_component, "kube-apiserver")

                reason = "no check completed"

                async def converged() -> bool:
                    nonlocal reason
                    want = {upcoming_node_name(m.machine_id): "Ready"
                            for m in shard.engine.machines
                            if m.bound and m.state == pb.MachineState.CONFIGURED}
                    got = {u["metadata"]["name"]: phase(u)
                           for u in (await admin.list(UPCOMING_NODES)).items}
                    if len(want) < 2 or got != want:
                        reason = f"UpcomingNodes {got} != shard {want}"
                        return False
                    for shape in shard.engine.catalog:
                        sent = shard.engine._ac_sent.get(shape.key)
                        if sent is None:
                            continue
                        key = shard.engine.available_update(shape, sent).supersedes_key
                        try:
                            obj = await admin.get(AVAILABLE_CAPACITIES,
                                                  available_capacity_name(key))
                        except NotFound:
                            reason = f"no AvailableCapacity for {shape.key}"
                            return False
                        if obj["spec"]["availableCount"] != sent[0]:
                            reason = (f"{shape.key}: {obj['spec']['availableCount']} != "
                                      f"{sent[0]}")
                            return False
                    return True

                await a.until(f"every object in its latest frame's state {CONVERGE:.0f} s after "
                              "the apiserver came back", converged, CONVERGE,
                              status=lambda: reason)
                assert shard.sessions_started == sessions  # the same session all along
                assert await a.metric("operator", "bigfleet_operator_reconcile_retries_total") > 0
            finally:
                await a.stop()
                nursery.cancel_scope.cancel()
    finally:
        if "kube-apiserver" not in cp.procs:
            await trio.to_thread.run_sync(cp.start_component, "kube-apiserver")
        for comp in RESTARTED_AFTER:
            if comp != "kwok" or cp.binaries.kwok is not None:
                await trio.to_thread.run_sync(cp.restart, comp)


def _configured(shard: SimShard) -> Callable[[], Awaitable[bool]]:
    """A check: at least two machines bound, each CONFIGURED."""
    async def check() -> bool:
        bound = [m for m in shard.engine.machines if m.bound]
        return len(bound) >= 2 and all(m.state == pb.MachineState.CONFIGURED for m in bound)
    return check
