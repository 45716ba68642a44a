"""The composed Operator on the embedded apiserver (in-process ASGI, autojump clock) against the
simulated shard over the in-memory connector.

Expected values are worked out by hand from docs/rules.md#roll-up:

* CRs a (cpu 1, memory 1Gi) and b (cpu 500m, memory 1Gi), both priority 100 with no
  requirements, share one profile -> one need: aggregate cpu 1 + 0.5 = "1500m", memory 2Gi =
  "2Gi"; min_unit = per-resource max: cpu "1", memory "1Gi".
* CR c (priority 10, cpu 2) has another fingerprint -> a second need, aggregate = min_unit =
  cpu "2".
* CR gt has a ``Gt`` requirement (the wire cannot carry it) and CR neg a negative quantity: both
  are left out of the roll-up, stay Pending, and get one Warning Event each.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing

from bigfleet_trio.config import OperatorConfig
from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.errors import NotFound, Unauthorized
from bigfleet_trio.kube.informer import SyncTimeout
from bigfleet_trio.kube.resources import (
    CAPACITY_REQUESTS,
    CRDS,
    EVENTS,
    NODES,
    PODS,
    UPCOMING_NODES,
)
from bigfleet_trio.kube.startup import Unauthenticated
from bigfleet_trio.observability.events import EventFeed
from bigfleet_trio.operator.app import Operator
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.transport import MemoryConnector, ShardStream
from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.testing import InProcessTransport
from bigfleet_trio.sim.shard.catalog import Catalog, MachineShape
from bigfleet_trio.sim.shard.engine import EngineConfig
from bigfleet_trio.sim.shard.nodes import KubeNodeHooks
from bigfleet_trio.sim.shard.session import SimShard
from tests.support.capacity import cr


@dataclass
class Harness:
    server: ApiServer
    client: KubeClient
    shard: SimShard
    connector: MemoryConnector
    operator: Operator
    feed: EventFeed
    shard_ends: list[ShardStream]
    nursery: trio.Nursery

    # Polling on the mock clock: the conditions span several components (apiserver objects,
    # shard engine, operator counters) that expose no common event; autojump keeps it instant.
    async def wait(self, predicate: Callable[[], Any], limit: float = 60.0) -> None:
        """Poll ``predicate`` (sync) on the mock clock until true (fails after ``limit``)."""
        with trio.fail_after(limit):
            while not predicate():  # noqa: ASYNC110
                await trio.sleep(0.05)

    async def wait_async(self, predicate: Callable[[], Any], limit: float = 60.0) -> None:
        """Same as :meth:`wait` for an async predicate (apiserver reads)."""
        with trio.fail_after(limit):
            while not await predicate():  # noqa: ASYNC110
                await trio.sleep(0.05)

    async def phase(self, name: str) -> str | None:
        try:
            obj = await self.client.get(CAPACITY_REQUESTS, name, "default")
        except NotFound:
            return None
        return (obj.get("status") or {}).get("phase")

    async def upcoming(self) -> dict[str, dict[str, Any]]:
        items = (await self.client.list(UPCOMING_NODES)).items
        return {o["metadata"]["name"]: o for o in items}


@asynccontextmanager
async def harness(
    *,
    shapes: int = 4,
    engine: EngineConfig | None = None,
    **cfg: Any,
) -> AsyncIterator[Harness]:
    server = ApiServer()
    async with trio.open_nursery() as nursery:
        client = KubeClient(
            KubeConfig(server="http://apiserver"),
            transport=InProcessTransport(server.app, nursery),
        )
        catalog = Catalog(
            [MachineShape("sim-4", "z-a", {"cpu": "4", "memory": "16Gi"}, 0.2, count=shapes)]
        )
        shard = SimShard(catalog, engine or EngineConfig(seed=3), hooks=KubeNodeHooks(client))
        connector = MemoryConnector()
        ends: list[ShardStream] = []

        async def accept() -> None:
            async with trio.open_nursery() as sessions:
                async for end in connector.accepted:
                    ends.append(end)
                    sessions.start_soon(shard.serve_session, end)

        await nursery.start(shard.run)
        nursery.start_soon(accept)
        options: dict[str, Any] = {"cluster_id": "c1", "shard_addr": "shard:1",
                                   "rollup_interval": 1.0}
        options.update(cfg)
        feed = EventFeed()
        op = Operator(OperatorConfig(**options), client=client, connector=connector, feed=feed)
        yield Harness(server, client, shard, connector, op, feed, ends, nursery)
        nursery.cancel_scope.cancel()


Need = tuple[int, dict[str, str], dict[str, str]]


def _needs(rollup: pb.ClusterCapacityNeeds | None) -> list[Need]:
    if rollup is None:
        return []
    return sorted(
        ((n.priority, dict(n.aggregate_resources), dict(n.min_unit)) for n in rollup.needs),
        key=repr,
    )


async def _allow_gt(client: KubeClient) -> None:
    """Install the CapacityRequest CRD without the operator enum (an older CRD in the cluster)."""
    crd = await client.get(CRDS, "capacityrequests.bigfleet.lucy.sh")
    crd = copy.deepcopy(crd)
    for version in crd["spec"]["versions"]:
        op = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
            "requirements"]["items"]["properties"]["operator"]
        op.pop("enum", None)
    await client.update(CRDS, crd)


# ------------------------------------------------------------------------------------- tests


async def test_rollup_acknowledgement_and_exclusion(autojump_clock: trio.testing.MockClock) -> None:
    async with harness() as h:
        await _allow_gt(h.client)
        await h.client.create(CAPACITY_REQUESTS, cr("a", 100, {"cpu": "1", "memory": "1Gi"}),
                              "default")
        await h.client.create(CAPACITY_REQUESTS, cr("b", 100, {"cpu": "500m", "memory": "1Gi"}),
                              "default")
        await h.client.create(
            CAPACITY_REQUESTS,
            cr("gt", 100, {"cpu": "1"},
               requirements=[{"key": "example.com/gen", "operator": "Gt", "values": ["3"]}]),
            "default",
        )
        await h.client.create(CAPACITY_REQUESTS, cr("neg", 100, {"cpu": "-1"}), "default")
        async with trio.open_nursery() as run:
            await run.start(h.operator.run)
            # synced before the first roll-up: the first roll-up the shard sees is complete
            await h.wait(lambda: h.shard.last_rollup is not None)
            assert _needs(h.shard.last_rollup) == [(100, {"cpu": "1500m", "memory": "2Gi"},
                                                    {"cpu": "1", "memory": "1Gi"})]
            assert h.shard.last_rollup is not None
            assert h.shard.last_rollup.cluster_id == "c1"

            # a CR added later changes the next roll-up (incremental aggregate)
            await h.client.create(CAPACITY_REQUESTS, cr("c", 10, {"cpu": "2"}), "default")
            await h.wait(lambda: len(_needs(h.shard.last_rollup)) == 2)
            assert _needs(h.shard.last_rollup) == [
                (10, {"cpu": "2"}, {"cpu": "2"}),
                (100, {"cpu": "1500m", "memory": "2Gi"}, {"cpu": "1", "memory": "1Gi"}),
            ]

            async def all_acked() -> bool:
                return [await h.phase(n) for n in ("a", "b", "c")] == ["Acknowledged"] * 3

            await h.wait_async(all_acked)
            acked = await h.client.get(CAPACITY_REQUESTS, "a", "default")
            assert acked["status"]["acknowledgedAt"].endswith("Z")
            # excluded CRs are not in the roll-up, so they are not acknowledged
            assert await h.phase("gt") in (None, "", "Pending")
            assert await h.phase("neg") in (None, "", "Pending")

            events = (await h.client.list(EVENTS, "default")).items
            by_obj = {}
            for e in events:
                by_obj.setdefault(e["involvedObject"]["name"], []).append(e)
            assert sorted(by_obj) == ["gt", "neg"]
            assert [e["reason"] for e in by_obj["gt"]] == ["UnsupportedRequirement"]
            assert by_obj["gt"][0]["type"] == "Warning"
            assert "Gt" in by_obj["gt"][0]["message"]
            assert [e["reason"] for e in by_obj["neg"]] == ["InvalidCapacityRequest"]

            # a new version of an excluded CR is reported again, once; a relabel of the same
            # spec is a new version as well
            await h.client.patch(CAPACITY_REQUESTS, "gt", {"metadata": {"labels": {"x": "1"}}},
                                 "default")

            async def two_gt_events() -> bool:
                items = (await h.client.list(EVENTS, "default")).items
                return sum(e["involvedObject"]["name"] == "gt" for e in items) == 2

            await h.wait_async(two_gt_events)
            # fixing the CR brings it back into the roll-up and it gets acknowledged
            await h.client.patch(
                CAPACITY_REQUESTS, "gt",
                {"spec": {"requirements": [
                    {"key": "example.com/gen", "operator": "In", "values": ["4"]}]}},
                "default",
            )

            async def gt_acked() -> bool:
                return await h.phase("gt") == "Acknowledged"

            await h.wait_async(gt_acked)
            await h.wait(lambda: len(_needs(h.shard.last_rollup)) == 3)
            stats = h.operator.statistics()
            assert stats.crs_contributing == 4
            assert stats.crs_excluded == 1
            assert stats.crs_acknowledged == 4
            assert stats.needs_last_rollup == 3
            assert stats.session_up and stats.running
            assert stats.rollups_sent >= 3
            # deleting every CR withdraws all demand: an empty roll-up
            for name in ("a", "b", "c", "gt", "neg"):
                await h.client.delete(CAPACITY_REQUESTS, name, "default")
            await h.wait(lambda: h.shard.last_rollup is not None
                         and len(h.shard.last_rollup.needs) == 0)
            assert h.operator.statistics().crs_excluded == 0
            assert h.operator.rollup is not None
            assert await h.operator.rollup.check_consistency()
            run.cancel_scope.cancel()


async def test_machines_walk_to_ready_then_reclaim_drains_and_deletes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # grace 10 s: the drain's eviction rounds are ~2 s apart (reclaim.RETRY_INTERVAL_SECONDS)
    async with harness(engine=EngineConfig(seed=3, reclaim_grace_seconds=10)) as h:
        # 6 cpu of demand -> two 4-cpu machines
        await h.client.create(CAPACITY_REQUESTS, cr("w", 100, {"cpu": "3"}), "default")
        await h.client.create(CAPACITY_REQUESTS, cr("v", 100, {"cpu": "3"}), "default")
        async with h.feed.subscribe() as feed_events, trio.open_nursery() as run:
            await run.start(h.operator.run)
            await h.wait(lambda: h.shard.machines_by_state().get("CONFIGURED") == 2)

            async def two_ready() -> bool:
                uns = await h.upcoming()
                return len(uns) == 2 and all(
                    (u.get("status") or {}).get("phase") == "Ready" for u in uns.values()
                )

            await h.wait_async(two_ready)
            # NodeStateUpdates planned from the informer cache: no GET of an UpcomingNode
            assert h.server.counters[("get", "upcomingnodes")] == 0
            assert h.server.counters[("patch", "upcomingnodes/status")] >= 2
            uns = await h.upcoming()
            nodes = {n["metadata"]["name"] for n in (await h.client.list(NODES)).items}
            refs = {u["status"]["nodeRef"]["name"] for u in uns.values()}
            assert refs == nodes and len(nodes) == 2
            for name, u in uns.items():
                assert name.startswith("un-")
                assert u["spec"]["resources"] == {"cpu": "4", "memory": "16Gi"}
                assert u["status"]["providerID"]
                lookup = h.operator.parts.handlers.reclaim._upcoming_lookup
                assert lookup(u["status"]["nodeRef"]["name"])
            assert h.operator.statistics().drains_active == 0

            # a Pod on one node, so the drain has something to evict
            victim = sorted(nodes)[0]
            await h.client.create(PODS, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                "spec": {"nodeName": victim, "containers": [{"name": "c", "image": "x"}]},
            }, "default")

            # withdraw the demand -> the shard reclaims both -> cordon, ack, drain, delete
            await h.client.delete(CAPACITY_REQUESTS, "w", "default")
            await h.client.delete(CAPACITY_REQUESTS, "v", "default")
            await h.wait(lambda: len(h.shard.reclaims_acked) == 2)
            # one machine per instruction; each names a Node that exists, so each started 1
            assert sorted(r.node_name for r in h.shard.reclaims_acked) == sorted(nodes)
            assert [r.nodes_started for r in h.shard.reclaims_acked] == [1, 1]

            async def all_gone() -> bool:
                return await h.upcoming() == {}

            await h.wait_async(all_gone)
            await h.wait(lambda: h.shard.engine.released == 2)
            # the shard walks its machines on after drain_wait; our drains end on their own
            await h.wait(lambda: h.operator.statistics().drains_active == 0)
            assert (await h.client.list(PODS, "default")).items == []
            stats = h.operator.statistics()
            assert stats.drains_completed == 2 and stats.drains_failed == 0
            assert stats.drains_active == 0
            kinds = []
            while True:
                try:
                    kinds.append(feed_events.receive_nowait()["kind"])
                except trio.WouldBlock:
                    break
            for kind in ("rollup", "bootstrap", "node_state", "reclaim", "reclaim_ack"):
                assert kind in kinds
            run.cancel_scope.cancel()


async def test_readiness_flips_with_sync_and_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with harness(reconnect_initial_backoff=0.5, reconnect_max_backoff=1.0) as h:
        assert h.operator.ready() == (False, ["operator not running"])
        h.connector.fail_next = 2
        async with trio.open_nursery() as run:
            await run.start(h.operator.run)
            ok, reasons = h.operator.ready()
            assert not ok
            assert reasons[0].startswith("shard session not established")
            await h.wait(lambda: h.operator.ready()[0])
            assert h.operator.ready() == (True, ["informers synced", "shard session up"])
            # the shard drops the stream: not ready, then back after a reconnect
            sessions = h.operator.statistics().sessions
            await h.shard_ends[-1].aclose()
            await h.wait(lambda: not h.operator.ready()[0])
            await h.wait(lambda: h.operator.ready()[0])
            assert h.operator.statistics().sessions == sessions + 1
            run.cancel_scope.cancel()
        assert h.operator.ready() == (False, ["operator not running"])


class _Tasks(trio.abc.Instrument):
    def __init__(self) -> None:
        self.live: set[trio.lowlevel.Task] = set()

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.live.add(task)

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self.live.discard(task)


def _descends_from(task: trio.lowlevel.Task, ancestor: trio.lowlevel.Task) -> bool:
    t: trio.lowlevel.Task | None = task
    while t is not None:
        if t is ancestor:
            return True
        nursery = t.parent_nursery
        t = nursery.parent_task if nursery is not None else None
    return False


async def test_cancellation_leaves_no_task_and_lets_a_drain_finish_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tasks = _Tasks()
    trio.lowlevel.add_instrument(tasks)
    try:
        async with harness(drain_shutdown_timeout=5.0,
                           engine=EngineConfig(seed=3, reclaim_grace_seconds=60)) as h:
            await h.client.create(CAPACITY_REQUESTS, cr("w", 100, {"cpu": "3"}), "default")
            host: trio.lowlevel.Task | None = None
            stopped_at = math.inf

            async def host_operator(task_status: trio.TaskStatus[None]) -> None:
                nonlocal host, stopped_at
                host = trio.lowlevel.current_task()
                try:
                    await h.operator.run(task_status=task_status)
                finally:
                    stopped_at = trio.current_time()

            async with trio.open_nursery() as run:
                await run.start(host_operator)
                await h.wait(lambda: h.shard.machines_by_state().get("CONFIGURED") == 1)
                node = (await h.client.list(NODES)).items[0]["metadata"]["name"]
                # a Pod whose eviction a PDB never allows: the drain can only end by a deadline
                await h.client.create(PODS, {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "stuck", "labels": {"app": "stuck"}},
                    "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
                }, "default")
                await h.client.patch(PODS, "stuck", {"status": {
                    "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
                    "default", subresource="status")
                await h.client.create(
                    _PDB,
                    {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                     "metadata": {"name": "stuck"},
                     "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "stuck"}}}},
                    "default",
                )
                await h.client.patch(_PDB, "stuck", {"status": {
                    "observedGeneration": 1, "disruptionsAllowed": 0, "currentHealthy": 1,
                    "desiredHealthy": 1, "expectedPods": 1}}, "default", subresource="status")
                await h.client.delete(CAPACITY_REQUESTS, "w", "default")
                drains = h.operator.drains
                assert drains is not None
                await h.wait(lambda: len(drains.active) == 1)
                cancelled_at = trio.current_time()
                run.cancel_scope.cancel()
            assert host is not None
            # the stream closed at once, but the drain kept the operator up to the timeout
            assert 4.9 <= stopped_at - cancelled_at <= 5.5
            assert drains.results[node].outcome == "abandoned"
            leftover = [t for t in tasks.live if _descends_from(t, host) and t is not host]
            assert leftover == []
            assert not h.operator.ready()[0]
    finally:
        trio.lowlevel.remove_instrument(tasks)


_PDB = CRDS.__class__("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True)


async def test_drain_survives_a_reconnect(autojump_clock: trio.testing.MockClock) -> None:
    async with harness(engine=EngineConfig(seed=3, reclaim_grace_seconds=60),
                       reconnect_initial_backoff=0.5, reconnect_max_backoff=1.0) as h:
        await h.client.create(CAPACITY_REQUESTS, cr("w", 100, {"cpu": "3"}), "default")
        async with trio.open_nursery() as run:
            await run.start(h.operator.run)
            await h.wait(lambda: h.shard.machines_by_state().get("CONFIGURED") == 1)
            node = (await h.client.list(NODES)).items[0]["metadata"]["name"]
            await h.client.create(PODS, {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "web", "labels": {"app": "web"}},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
            }, "default")
            await h.client.patch(PODS, "web", {"status": {
                "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
                "default", subresource="status")
            await h.client.create(
                _PDB,
                {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                 "metadata": {"name": "web"},
                 "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}},
                "default",
            )
            pdb_status = {"observedGeneration": 1, "disruptionsAllowed": 0, "currentHealthy": 1,
                          "desiredHealthy": 1, "expectedPods": 1}
            await h.client.patch(_PDB, "web", {"status": pdb_status}, "default",
                                 subresource="status")
            await h.client.delete(CAPACITY_REQUESTS, "w", "default")
            drains = h.operator.drains
            assert drains is not None
            await h.wait(lambda: drains.is_draining(node))
            sessions = h.operator.statistics().sessions
            # the stream drops while the PDB blocks the eviction; the drain goes on
            await h.shard_ends[-1].aclose()
            await h.wait(lambda: h.operator.statistics().sessions == sessions + 1)
            assert drains.is_draining(node)
            await h.client.patch(_PDB, "web", {"status": {**pdb_status, "disruptionsAllowed": 1}},
                                 "default", subresource="status")
            await h.wait(lambda: not drains.is_draining(node))
            assert drains.results[node].outcome == "drained"
            assert (await h.client.list(PODS, "default")).items == []
            run.cancel_scope.cancel()


async def test_session_up_and_down_are_published_on_the_feed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with harness(reconnect_initial_backoff=0.5, reconnect_max_backoff=1.0) as h:
        h.connector.fail_next = 1
        async with h.feed.subscribe(kinds=["session_up", "session_down"]) as sub:
            async with trio.open_nursery() as run:
                await run.start(h.operator.run)
                await h.wait(lambda: h.operator.ready()[0])
                await h.shard_ends[-1].aclose()
                await h.wait(lambda: h.operator.statistics().sessions == 2)
                run.cancel_scope.cancel()
            events = []
            while True:
                try:
                    events.append(sub.receive_nowait())
                except trio.WouldBlock:
                    break
    kinds = [e["kind"] for e in events]
    assert kinds == ["session_down", "session_up", "session_down", "session_up", "session_down"]
    refused, _, closed, _, stopping = events
    assert refused["error"] == "stream closed: connection refused (injected)"
    assert 0.4 <= refused["retry_in"] <= 0.5 and refused["uptime"] is None  # jitter <= 20 %
    assert closed["error"] == "stream closed: peer closed"
    assert 0.8 <= closed["retry_in"] <= 1.0 and closed["uptime"] >= 0
    assert stopping["error"] == "operator stopping" and stopping["retry_in"] is None
    assert all(e["cluster"] == "c1" for e in events)


async def _start_up_failure(h: Any, *, limit: float) -> SyncTimeout:
    """Run the operator, which must end its start-up with exactly one SyncTimeout."""
    try:
        with trio.fail_after(limit):
            await h.operator.run()
    except BaseExceptionGroup as group:
        matched, rest = group.split(SyncTimeout)
        assert rest is None and matched is not None
        [exc] = matched.exceptions
        assert isinstance(exc, SyncTimeout)
        return exc
    raise AssertionError("Operator.run returned although its informers could not sync")


async def test_informers_that_never_sync_end_run_with_sync_timeout_and_no_dial(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # RBAC missing for capacityrequests: every LIST and WATCH is 403 (the streaming list's 403
    # falls back to the paged LIST). The Go operator exits after 30 s
    # ("cache: initial sync timed out"); so do we (--sync-timeout), without dialling the shard.
    async with harness(sync_timeout=30.0) as h:
        h.server.faults.fail_next(10**6, code=403, verb="list", resource="capacityrequests")
        h.server.faults.fail_next(10**6, code=403, verb="watch", resource="capacityrequests")
        t0 = trio.current_time()
        exc = await _start_up_failure(h, limit=120)
        assert trio.current_time() - t0 == 30.0
        assert str(exc) == (  # with the last error: what to fix
            "timed out after 30s waiting for informer caches to sync (capacityrequests); "
            "last error (capacityrequests): 403 Forbidden: injected fault (list capacityrequests)"
        )
        assert h.shard_ends == []  # never dialled
        assert h.operator.ready() == (False, ["operator not running"])


async def test_401_during_sync_is_reported_at_once_not_after_the_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A wrong token or client certificate does not heal by waiting: the first 401 ends the
    # start-up with "401 Unauthorized: ..." instead of retrying until --sync-timeout.
    async with harness(sync_timeout=600.0) as h:
        h.server.faults.fail_next(10**6, code=401, verb="list", resource="capacityrequests")
        h.server.faults.fail_next(10**6, code=401, verb="watch", resource="capacityrequests")
        t0 = trio.current_time()
        exc = await _start_up_failure(h, limit=1200)
        assert isinstance(exc, Unauthenticated)  # a SyncTimeout: callers report it too
        assert str(exc).startswith("401 Unauthorized: ")
        assert "\n" not in str(exc)
        assert trio.current_time() - t0 < 5  # at the first 401, not at the 600 s deadline
        assert h.shard_ends == []  # never dialled
        assert h.operator.ready() == (False, ["operator not running"])


async def test_a_401_from_before_the_run_does_not_fail_its_sync(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The client remembers its first 401 (e.g. from an earlier leadership term, the token since
    # rotated); a later run whose informers sync must start, not fail on that old answer.
    async with harness(sync_timeout=600.0) as h:
        h.server.faults.fail_next(1, code=401, verb="get", resource="nodes")
        try:
            await h.client.get(NODES, "n1")
        except Unauthorized:
            pass
        assert h.client.unauthorized is not None
        await h.nursery.start(h.operator.run)
        assert h.operator.statistics().running


# ------------------------------------------------------------- failures that say what to fix


UN_CRD = "upcomingnodes.bigfleet.lucy.sh"


async def _ready_reasons(h: Harness, want: Callable[[list[str]], bool]) -> list[str]:
    with trio.fail_after(120):
        while True:
            ok, reasons = h.operator.ready()
            if want(reasons):
                return reasons
            await trio.sleep(0.5)


async def test_a_missing_crd_is_one_error_naming_install_crds_and_readyz_says_it(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
) -> None:
    """docs/crds.md#missing-crds: not a 404 line every few seconds but one ERROR naming the CRD
    and the command that installs it; /readyz false with that reason until it is installed."""
    caplog.set_level(logging.DEBUG)
    async with harness() as h:
        crd = await h.client.get(CRDS, UN_CRD)
        await h.client.delete(CRDS, UN_CRD)
        async with trio.open_nursery() as run:
            run.start_soon(h.operator.run)
            await trio.sleep(120)  # many retries
            ok, reasons = h.operator.ready()
            assert not ok
            assert any(r.startswith(f"{UN_CRD} is not served: the CustomResourceDefinition")
                       and "bigfleet-trio install-crds" in r for r in reasons), reasons
            errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
            assert len(errors) == 1, errors
            assert UN_CRD in errors[0] and "`bigfleet-trio install-crds`" in errors[0]
            assert not [r for r in caplog.records if r.levelno == logging.WARNING
                        and "404" in r.getMessage()]
            for key in ("uid", "resourceVersion", "creationTimestamp"):
                crd["metadata"].pop(key, None)
            crd.pop("status", None)
            await h.client.create(CRDS, crd)  # installed: the operator gets on with it
            await _ready_reasons(h, lambda rs: not any(UN_CRD in r for r in rs))
            run.cancel_scope.cancel()


async def test_crds_deleted_while_running_make_readyz_false_until_they_return(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with harness() as h:
        async with trio.open_nursery() as run:
            await run.start(h.operator.run)
            await _ready_reasons(h, lambda rs: rs == ["informers synced", "shard session up"])
            crd = await h.client.get(CRDS, UN_CRD)
            await h.client.delete(CRDS, UN_CRD)
            reasons = await _ready_reasons(h, lambda rs: any(UN_CRD in r for r in rs))
            assert h.operator.ready()[0] is False, reasons
            for key in ("uid", "resourceVersion", "creationTimestamp"):
                crd["metadata"].pop(key, None)
            crd.pop("status", None)
            await h.client.create(CRDS, crd)
            await _ready_reasons(h, lambda rs: rs == ["informers synced", "shard session up"])
            run.cancel_scope.cancel()
