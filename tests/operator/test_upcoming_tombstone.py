"""A late NodeStateUpdate must not resurrect an UpcomingNode its drain finished and deleted
(docs/rules.md#upcomingnode-phases): the frame order seen from outside, replayed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.errors import NotFound
from bigfleet_trio.kube.resources import UPCOMING_NODES
from bigfleet_trio.operator.upcoming.handler import UpcomingNodeHandler
from bigfleet_trio.operator.upcoming.plan import (
    DrainMemory,
    converges_back,
    plan_node_state_update,
)
from bigfleet_trio.proto import pb
from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.testing import InProcessTransport

MS = pb.MachineState
NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def nsu(state: int) -> pb.NodeStateUpdate:
    return pb.NodeStateUpdate(
        supersedes_key="node:m-1", machine_id="m-1", state=state, node_name="n-1"
    )


def test_plan_ignores_a_late_draining_after_the_drain_deleted_the_object() -> None:
    plan = plan_node_state_update(nsu(MS.DRAINING), None, "drained", NOW)
    assert (plan.op, plan.name, plan.memory) == ("ignore", "un-m-1", "keep")
    assert "drain finished" in plan.reason


@pytest.mark.parametrize("state", [MS.CREATING, MS.CONFIGURING, MS.CONFIGURED])
def test_a_new_lifecycle_after_the_tombstone_still_creates(state: int) -> None:
    # The machine went back to the shard's pool and was bound again: a new UpcomingNode.
    plan = plan_node_state_update(nsu(state), None, "drained", NOW)
    assert plan.op == "create"


def test_draining_without_a_tombstone_still_creates() -> None:
    # No drain of ours finished: a DRAINING frame for a machine we never saw is mirrored.
    assert plan_node_state_update(nsu(MS.DRAINING), None, None, NOW).op == "create"
    assert plan_node_state_update(nsu(MS.DRAINING), None, "draining", NOW).op == "create"


async def test_replayed_frame_order_after_a_reclaim_drain(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    """As logged from outside: the drain deletes the UpcomingNode at Drained, then the shard's
    DRAINING and IDLE for the machine arrive. Before the fix the object was created again as
    Draining and deleted again as Drained (kubectl get upn -w: deleted, added, deleted)."""
    server = ApiServer()
    client = KubeClient(
        KubeConfig(server="http://apiserver"), transport=InProcessTransport(server.app, nursery)
    )
    memory = DrainMemory()
    h = UpcomingNodeHandler(client, memory, now=lambda: NOW)
    await h.on_node_state_update(nsu(MS.CONFIGURED))
    assert (await client.get(UPCOMING_NODES, "un-m-1"))["status"]["phase"] == "Ready"
    # The reclaim path: Draining, then Drained and deleted when the drain ends.
    memory.mark_draining("un-m-1")
    await client.delete(UPCOMING_NODES, "un-m-1")
    memory.mark_drained("un-m-1")
    rv = (await client.list(UPCOMING_NODES)).resource_version
    await h.on_node_state_update(nsu(MS.DRAINING))
    await h.on_node_state_update(nsu(MS.IDLE))
    with pytest.raises(NotFound):
        await client.get(UPCOMING_NODES, "un-m-1")
    # Not even a transient object: no watch event after the delete.
    events = []
    with trio.move_on_after(1):
        async with client.watch(UPCOMING_NODES, resource_version=rv) as stream:
            async for ev in stream:
                events.append(ev.type)
    assert [e for e in events if e != "BOOKMARK"] == []


@pytest.mark.parametrize(("phase", "mark", "back"), [
    ("Provisioning", None, True),
    ("Launched", None, True),
    ("Registered", None, True),
    ("Ready", None, True),
    ("Draining", None, True),
    (None, None, True),           # created, no status yet: the machine is live
    ("Draining", "draining", True),
    ("Ready", "drained", False),  # a drain recorded it drained: ours
    ("Drained", None, False),     # the drain path deletes at Drained itself
    ("Failed", None, False),      # failed-object retention deletes Failed ones
])
def test_which_deleted_upcoming_nodes_converge_back(
    phase: str | None, mark: str | None, back: bool,
) -> None:
    memory = DrainMemory()
    if mark == "drained":
        memory.mark_drained("un-m1")
    elif mark == "draining":
        memory.mark_draining("un-m1")
    obj: dict[str, object] = {"metadata": {"name": "un-m1"}}
    if phase is not None:
        obj["status"] = {"phase": phase}
    assert converges_back(obj, memory) == ("un-m1" if back else None)


@pytest.mark.parametrize("obj", [None, {}, {"metadata": {}}, {"metadata": {"name": ""}},
                                 {"metadata": "x"}, {"metadata": {"name": 7}}])
def test_a_deleted_object_without_a_usable_name_never_converges_back(obj: object) -> None:
    assert converges_back(obj, DrainMemory()) is None  # type: ignore[arg-type]


def test_a_malformed_status_counts_as_live() -> None:
    assert converges_back({"metadata": {"name": "un-1"}, "status": 3}, DrainMemory()) == "un-1"
