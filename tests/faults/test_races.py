"""Races between concurrent writers, each driven with the project's own pieces (autojump clock).

The real :class:`Session` over the in-memory stream, real handlers over the in-process sim
apiserver (:class:`RecordingKube`), faults injected per call. Guarantees: docs/rules.md.
"""

from __future__ import annotations

import signal
from typing import Any

import trio
import trio.testing

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.errors import KubeTransportError
from bigfleet_trio.kube.leader import LeaderElector
from bigfleet_trio.kube.resources import AVAILABLE_CAPACITIES
from bigfleet_trio.operator.app import _supervise
from bigfleet_trio.operator.available import AvailableCapacityHandler, available_capacity_name
from bigfleet_trio.operator.session.core import Session
from bigfleet_trio.operator.session.types import Reply, SessionConfig
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.transport import memory_stream_pair
from tests.kube.fakekube import FakeKube
from tests.support.kube import RecordingKube
from tests.support.rollup import EmptyRollupSource

KEY = "available:req=zone:In:a|res=cpu"
NAME = available_capacity_name(KEY)


class _Handlers:
    """Only AvailableCapacity goes to a real handler; the other kinds are not sent here."""

    def __init__(self, available: AvailableCapacityHandler) -> None:
        self.available = available

    async def on_bootstrap_request(self, req: pb.BootstrapRequest) -> pb.BootstrapBlobResponse:
        raise AssertionError("not used")

    async def on_reclaim_instruction(self, instr: pb.ReclaimInstruction, reply: Reply) -> None:
        raise AssertionError("not used")

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> None:
        raise AssertionError("not used")

    async def on_available_capacity(self, u: pb.AvailableCapacityUpdate) -> None:
        await self.available.on_available_capacity(u)


class _FailPatchOnce(RecordingKube):
    """Fails the first PATCH whose body sets ``availableCount`` to ``count`` (transport error),
    after recording it: the write never reached the server."""

    fail_count: int | None = None

    async def patch(self, res: Any, name: str, patch: Any, *a: Any, **kw: Any) -> Any:
        if self.fail_count is not None and patch.get("spec", {}).get(
            "availableCount"
        ) == self.fail_count:
            self.fail_count = None
            self.fail["patch"] = [KubeTransportError("connection reset by peer")]
        return await super().patch(res, name, patch, *a, **kw)


def _update(count: int) -> pb.ShardMessage:
    return pb.ShardMessage(available_capacity=pb.AvailableCapacityUpdate(
        supersedes_key=KEY, available_count=count,
        confidence=pb.AvailableCapacityUpdateConfidence.CONFIDENCE_HIGH, cost_per_hour=0.5,
    ))


async def test_available_capacity_last_update_wins_when_an_earlier_write_is_retried(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    """Issue item 1: 1, then 2 and 3 back to back; 2's PATCH fails once (transport error).

    Before the fix each update ran in its own task: 3's PATCH landed during 2's retry backoff,
    then the retried 2 overwrote it and the object stayed at 2 (PATCH log 2, 3, 2). Now one
    writer per supersedes_key, newest pending update next (docs/rules.md#availablecapacity).
    """
    server_kube = RecordingKube.over_sim(nursery)
    kube = _FailPatchOnce(server_kube.client, server_kube.server)
    op, shard = memory_stream_pair()
    session = Session(op, SessionConfig(cluster_id="c1"), EmptyRollupSource(),
                      _Handlers(AvailableCapacityHandler(kube)))
    nursery.start_soon(session.run)
    await shard.send(_update(1))
    await trio.testing.wait_all_tasks_blocked()
    assert kube.objects(AVAILABLE_CAPACITIES)[NAME]["spec"]["availableCount"] == 1

    kube.fail_count = 2
    await shard.send(_update(2))
    await shard.send(_update(3))
    await trio.sleep(30)  # well past every retry backoff

    counts = [r.body["spec"]["availableCount"] for r in kube.of("patch", "availablecapacities")]
    assert counts[-1] == 3, counts
    assert kube.objects(AVAILABLE_CAPACITIES)[NAME]["spec"]["availableCount"] == 3


def _elector(fake: FakeKube, who: str) -> LeaderElector:
    client = KubeClient(
        KubeConfig(server="http://kube.test"), transport=fake.transport(who), max_attempts=1
    )
    return LeaderElector(client, name="bf", namespace="sys", identity=who, rng=lambda: 0.0)


async def test_sigterm_leader_renews_until_its_drains_returned_then_hands_over(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Issue item 2: SIGTERM a leader whose work ends like ``DrainManager.run`` (drains go on,
    shielded, up to 30 s after the cancel); another replica waits for the Lease.

    Before the fix SIGTERM cancelled the scope around the elector, so renewals stopped at once:
    B took the expired Lease at t~21 while A's drains acted until t=36, and A's release then
    failed with 409. Now the signal cancels the work, not the elector: A renews until its work
    has returned, then releases, and B leads only after A's last act
    (docs/rules.md#leader-hand-over-on-sigterm).
    """
    fake = FakeKube()
    a, b = _elector(fake, "a"), _elector(fake, "b")
    acts: dict[str, list[float]] = {"a": [], "b": []}

    def drains_like(who: str, shutdown: float) -> Any:
        async def work() -> None:
            # acts once a second; once cancelled, keeps acting (shielded) for ``shutdown`` s
            try:
                while True:
                    acts[who].append(trio.current_time())
                    await trio.sleep(1)
            finally:
                with trio.CancelScope(shield=True) as scope:
                    scope.deadline = trio.current_time() + shutdown
                    while True:
                        acts[who].append(trio.current_time())
                        await trio.sleep(1)
        return work

    send, sigs = trio.open_memory_channel[int](1)
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as a_nursery:
            a_nursery.start_soon(_supervise, a_nursery, drains_like("a", 30), a, sigs, 30.0)
            await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(1)  # b polls at odd seconds, a renews at even ones
            outer.start_soon(_supervise, outer, drains_like("b", 0), b, None, 30.0)
            await trio.sleep(5)
            await send.send(signal.SIGTERM)  # t=6
            await trio.sleep(60)
            a_nursery.cancel_scope.cancel()
        assert acts["b"], "b never led"
        assert max(acts["a"]) < min(acts["b"]), (max(acts["a"]), min(acts["b"]))
        assert max(acts["a"]) >= 35  # the drains had their whole 30 s
        outer.cancel_scope.cancel()


async def test_sigterm_while_campaigning_returns_at_once_and_never_leads(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    fake = FakeKube()
    a, b = _elector(fake, "a"), _elector(fake, "b")
    nursery.start_soon(a.run, trio.sleep_forever)
    await trio.testing.wait_all_tasks_blocked()
    send, sigs = trio.open_memory_channel[int](1)
    led: list[float] = []

    async def work() -> None:
        led.append(trio.current_time())

    returned = trio.Event()

    async def supervise_b(b_nursery: trio.Nursery) -> None:
        await _supervise(b_nursery, work, b, sigs, 30.0)
        returned.set()

    async with trio.open_nursery() as b_nursery:
        b_nursery.start_soon(supervise_b, b_nursery)
        await trio.sleep(5)
        await send.send(signal.SIGTERM)
        with trio.fail_after(0.5):  # the campaign stops at once (no lease to wait for)
            await returned.wait()
        b_nursery.cancel_scope.cancel()
    assert led == [] and not b.is_leader
    assert fake.objects[("leases", "sys", "bf")]["spec"]["holderIdentity"] == "a"


def _live_tasks() -> int:
    """Every task in this run (walked from the root task)."""
    count, todo = 0, [trio.lowlevel.current_root_task()]
    while todo:
        task = todo.pop()
        count += 1
        for child_nursery in task.child_nurseries:
            todo.extend(child_nursery.child_tasks)
    return count


class _GatedStatusPatches:
    """Just the ``patch`` of a KubeAPI: every call waits for ``gate``, then succeeds."""

    def __init__(self) -> None:
        self.gate = trio.Event()
        self.patched: list[str] = []
        self.active = 0
        self.max_active = 0

    async def patch(self, res: Any, name: str, body: Any, namespace: str | None = None,
                    **kw: Any) -> dict[str, Any]:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await self.gate.wait()
        finally:
            self.active -= 1
        self.patched.append(name)
        return {}


async def test_acknowledger_runs_a_fixed_pool_not_a_task_per_capacity_request(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    """Issue item 3: 10,000 Pending CRs submitted at once behind a stalled apiserver.

    Before the fix the Acknowledger started one task per CR (the limiter bounded patches in
    flight, not tasks): 10,001 more live tasks. Now ``concurrency`` workers pull keys from a
    queue, so the task count does not grow with the backlog (memory figure:
    docs/benchmarks/acknowledge.md).
    """
    from bigfleet_trio.operator.acknowledge import Acknowledger

    client = _GatedStatusPatches()
    ack = Acknowledger(client, concurrency=4)  # type: ignore[arg-type]
    await nursery.start(ack.run)
    await trio.testing.wait_all_tasks_blocked()
    before = _live_tasks()
    keys = [("ns", f"cr-{i:05d}") for i in range(10_000)]
    assert ack.submit_keys(keys) == 10_000
    assert ack.submit_keys(keys[:10]) == 0  # already queued: never twice
    await trio.testing.wait_all_tasks_blocked()
    assert _live_tasks() == before  # the 4 workers were there before the burst
    assert client.max_active == 4
    assert len(ack.in_flight) == 10_000
    client.gate.set()
    await trio.testing.wait_all_tasks_blocked()
    assert sorted(client.patched) == sorted(name for _, name in keys)
    assert set(client.patched[:4]) == {"cr-00000", "cr-00001", "cr-00002", "cr-00003"}  # FIFO
    assert ack.acknowledged_total == 10_000 and ack.in_flight == frozenset()
    assert _live_tasks() == before


# ---- reclaim: the record before the ack (items 5 and 8) ----------------------------------------


async def _reclaim_setup(nursery: trio.Nursery) -> tuple[RecordingKube, Any, Any]:
    """A Node ``n-1`` backing UpcomingNode ``un-m-1`` (Ready), no Pods; a running DrainManager
    and a ReclaimHandler over a RecordingKube."""
    import random

    from bigfleet_trio.kube.resources import NODES, UPCOMING_NODES
    from bigfleet_trio.operator.reclaim.drain import DrainManager
    from bigfleet_trio.operator.reclaim.handler import ReclaimHandler
    from bigfleet_trio.operator.upcoming.plan import DrainMemory

    kube = RecordingKube.over_sim(nursery)
    kube.seed(NODES, {"metadata": {"name": "n-1"}})
    kube.seed(UPCOMING_NODES, {"metadata": {"name": "un-m-1"}, "spec": {"resources": {}},
                               "status": {"phase": "Ready",
                                          "nodeRef": {"kind": "Node", "name": "n-1"}}})
    memory = DrainMemory()
    drains = DrainManager(kube, memory, rng=random.Random(1))
    await nursery.start(drains.run)
    return kube, drains, ReclaimHandler(kube, drains, memory)


async def test_reclaim_is_not_acked_when_the_drain_record_cannot_be_written(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    """Issue item 5: the drain record (annotations) on the UpcomingNode fails for good.

    Before the fix the failure was logged and the ack went out (nodes_started=1) with a drain
    running only in memory: after a crash nothing could resume it and the shard, acked, never
    re-issued. Now no ack and no drain without the record; the instruction is forgotten, so the
    shard's re-issue does the whole thing again (docs/rules.md#reclaim-ack).
    """
    from bigfleet_trio.kube.errors import Forbidden
    from bigfleet_trio.kube.resources import UPCOMING_NODES
    from bigfleet_trio.operator.reclaim.resume import DRAIN_DEADLINE_ANNOTATION
    from tests.operator.test_reclaim import Replies, instr

    kube, drains, handler = await _reclaim_setup(nursery)
    kube.fail = {("patch", "un-m-1"): [Forbidden(403, "Forbidden", "admission webhook said no")]}
    replies = Replies()
    await handler.on_reclaim_instruction(instr("r-1", "m-1", grace=60), replies)
    assert replies.acks == []
    assert drains.active == frozenset()
    assert DRAIN_DEADLINE_ANNOTATION not in kube.objects(UPCOMING_NODES)["un-m-1"]["metadata"].get(
        "annotations", {})

    # the shard re-issues (no ack came): this time the record is written, then the ack
    await handler.on_reclaim_instruction(instr("r-1", "m-1", grace=60), replies)
    assert replies.acks == [("r-1", 1)]
    un = kube.objects(UPCOMING_NODES).get("un-m-1")
    assert un is None or DRAIN_DEADLINE_ANNOTATION in un["metadata"]["annotations"]
    await drains.wait_idle()
    assert drains.completed_total == 1


async def test_a_reissue_during_a_failed_reclaim_never_acks_zero(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    """The first instruction fails with a non-Kubernetes exception while the shard's re-issue
    is parked on it.

    An ack of the failed attempt's ``nodes_started=0`` would tell the shard the reclaim was
    handled, and the shard never re-issues an acked instruction: the node would never be
    drained. The parked re-issue is left unacked (it holds no dispatch slot while parked), and
    the shard's next re-issue does the work: cordon, record, ack 1, drain.
    """
    from tests.operator.test_reclaim import Replies, instr

    kube, drains, handler = await _reclaim_setup(nursery)
    release = trio.Event()
    real_get = kube.get
    gets = 0

    async def get(res: Any, name: str, namespace: str | None = None) -> Any:
        nonlocal gets
        gets += 1
        if gets == 1:  # the first attempt's first read: held, then a bug
            await release.wait()
            raise RuntimeError("a bug in a lookup")
        return await real_get(res, name, namespace)

    kube.get = get  # type: ignore[method-assign]
    replies = Replies()
    errors: list[BaseException] = []

    async def first() -> None:
        try:
            await handler.on_reclaim_instruction(instr("r-1", "m-1", grace=60), replies)
        except Exception as exc:  # the session logs and counts a handler error
            errors.append(exc)

    async with trio.open_nursery() as session:
        session.start_soon(first)
        await trio.testing.wait_all_tasks_blocked()
        # the shard re-issues while the first attempt is in flight: it waits for that one
        session.start_soon(handler.on_reclaim_instruction, instr("r-1", "m-1", grace=60), replies)
        await trio.testing.wait_all_tasks_blocked()
        release.set()
    assert len(errors) == 1
    assert replies.acks == []  # neither the failed attempt nor the parked re-issue acked 0
    await handler.on_reclaim_instruction(instr("r-1", "m-1", grace=60), replies)  # re-issued
    assert replies.acks == [("r-1", 1)]
    await drains.wait_idle()
    assert drains.completed_total == 1


# ---- pod controller: no CR for a deleted Pod through the update path (item 7) -----------------


async def test_cr_update_finding_the_cr_gone_recreates_it_only_for_a_live_pod(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Issue item 7: a Pod resized, then deleted; GC removes its CR; the controller, behind on
    the Pod watch, still plans "update the CR" from its cache and the patch finds it gone.

    Before the fix the NotFound fell back to a create without the live-Pod check the recreate
    path has, so a CR (phantom demand) was created for a deleted Pod. Now the fallback GETs the
    Pod first: gone, another uid or terminating -> no CR.
    """
    from bigfleet_trio.kube.resources import PODS
    from bigfleet_trio.podcontroller.keys import PodKey
    from bigfleet_trio.sim.apiserver import ApiServer
    from tests.podcontroller.test_controller import _count, crs, eventually, pod, running

    server = ApiServer()
    async with running(server) as (ctl, client):
        await client.create(PODS, pod("p"))
        await eventually(lambda: _count(client, 1))
        [cr] = await crs(client)
        stale_pod = ctl.pods.store.get("default/p")
        await client.delete(PODS, "p", "default")
        await eventually(lambda: _count(client, 0))  # GC removed the CR
        await eventually(lambda: ctl.pods.store.get("default/p") is None)
        creates = server.counters[("create", "capacityrequests")]
        # The caches as a lagging controller sees them: the Pod, resized, and its CR.
        resized = dict(stale_pod)
        resized["spec"] = {**stale_pod["spec"], "containers": [
            {**c, "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}
            for c in stale_pod["spec"]["containers"]]}
        ctl.pods.store._set("default/p", resized)
        ctl.crs.store._set(f"default/{cr['metadata']['name']}", cr)
        outcome = await ctl.reconciler.reconcile_pod(PodKey("default", "p"))
        assert server.counters[("create", "capacityrequests")] == creates, outcome
        assert await crs(client) == []


# ---- drain: eviction of the Pod that was listed, not of its namesake (item 9) ------------------


async def test_drain_never_evicts_a_namesake_recreated_on_another_node(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    """Issue item 9: between the drain's Pod LIST and its eviction, StatefulSet Pod ``web-0``
    is deleted and recreated under the same name on another node.

    Before the fix the eviction named the Pod only, so the new ``web-0`` on ``n-2`` was evicted
    (kubectl drain has the same gap). Now each eviction carries the listed Pod's UID as a
    precondition (``deleteOptions.preconditions.uid``): the apiserver refuses it with 409, the
    next round's LIST no longer shows a Pod on the node, and the drain ends Drained with the new
    Pod untouched (docs/rules.md#reclaim-drain).
    """
    from bigfleet_trio.kube.resources import NODES, PODS
    from tests.operator.test_reclaim import Replies, instr

    kube, drains, handler = await _reclaim_setup(nursery)
    kube.seed(NODES, {"metadata": {"name": "n-2"}})

    def web0(node: str) -> dict[str, Any]:
        # (no ownerReference: the sim's garbage collector would collect a Pod whose
        # StatefulSet does not exist)
        return {"metadata": {"name": "web-0", "namespace": "default"},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
                "status": {"phase": "Running"}}

    old = kube.seed(PODS, web0("n-1"))
    real_evict = kube.client.evict
    swapped: list[str] = []

    async def evict(name: str, namespace: str, **kw: Any) -> None:
        if not swapped:  # the StatefulSet controller was quicker than the drain
            server = kube.server
            server.delete(server.find("pods"), "default", "web-0")
            swapped.append(kube.seed(PODS, web0("n-2"))["metadata"]["uid"])
        await real_evict(name, namespace, **kw)

    kube.client.evict = evict  # type: ignore[method-assign]
    await handler.on_reclaim_instruction(instr("r-1", "m-1", grace=60), Replies())
    await drains.wait_idle()
    pods = kube.objects(PODS, "default")
    assert "web-0" in pods, "the namesake on n-2 was evicted"
    assert pods["web-0"]["metadata"]["uid"] == swapped[0] != old["metadata"]["uid"]
    assert pods["web-0"]["spec"]["nodeName"] == "n-2"
    assert drains.results["n-1"].outcome == "drained"


# ---- UpcomingNode: a stale node-state write never takes Draining back (item 6) -----------------


class _FailReadyOnce(RecordingKube):
    """Fails the first status PATCH that sets phase Ready (transport error), after recording."""

    armed = True

    async def patch(self, res: Any, name: str, patch: Any, *a: Any, **kw: Any) -> Any:
        if self.armed and kw.get("subresource") == "status" and (
            patch.get("status", {}).get("phase") == "Ready"
        ):
            self.armed = False
            self.fail["patch"] = [KubeTransportError("connection reset by peer")]
        return await super().patch(res, name, patch, *a, **kw)


async def _draining_race(nursery: trio.Nursery, *, cached: bool) -> dict[str, Any]:
    """CONFIGURED for machine m-1 (UpcomingNode Registered) races a reclaim of it; returns the
    UpcomingNode once both are done (the drain still blocked by a budget)."""
    import random

    from bigfleet_trio.kube.errors import TooManyRequests
    from bigfleet_trio.kube.resources import NODES, PODS, UPCOMING_NODES
    from bigfleet_trio.operator.reclaim.drain import DrainManager
    from bigfleet_trio.operator.reclaim.handler import ReclaimHandler
    from bigfleet_trio.operator.upcoming.handler import UpcomingNodeHandler
    from bigfleet_trio.operator.upcoming.plan import DrainMemory
    from tests.operator.test_reclaim import Replies, instr
    from tests.support.reconcile import until_reconciled

    base = RecordingKube.over_sim(nursery)
    kube = _FailReadyOnce(base.client, base.server)
    kube.armed = not cached
    kube.seed(NODES, {"metadata": {"name": "n-1"}})
    stale = kube.seed(UPCOMING_NODES, {
        "metadata": {"name": "un-m-1"},
        "spec": {"resources": {}, "nodeName": "n-1", "providerID": "sim://m-1"},
        "status": {"phase": "Registered", "nodeRef": {"kind": "Node", "name": "n-1"},
                   "providerID": "sim://m-1"}})
    kube.seed(PODS, {"metadata": {"name": "web", "namespace": "default"},
                     "spec": {"nodeName": "n-1", "containers": [{"name": "c", "image": "b"}]},
                     "status": {"phase": "Running"}})
    kube.fail["evict"] = [TooManyRequests(429, "TooManyRequests", "budget")] * 1000
    memory = DrainMemory()
    drains = DrainManager(kube, memory, rng=random.Random(1))
    await nursery.start(drains.run)
    reclaim = ReclaimHandler(kube, drains, memory)
    upcoming = UpcomingNodeHandler(
        kube, memory, get_cached=(lambda name: stale) if cached else None
    )
    configured = pb.NodeStateUpdate(
        supersedes_key="machine/m-1", machine_id="m-1", cluster_id="c1",
        state=pb.MachineState.CONFIGURED, node_name="n-1", provider_id="sim://m-1")
    async with trio.open_nursery() as session:
        if cached:
            # the reclaim lands first; the node-state worker then plans from a cache that has
            # not seen it yet (informer lag)
            await reclaim.on_reclaim_instruction(instr("r-1", "m-1", grace=60), Replies())
            session.start_soon(upcoming.on_node_state_update, configured)
        else:
            # the node-state write is in flight first, fails once and is retried after the
            # reclaim walked the object to Draining
            session.start_soon(until_reconciled, upcoming.on_node_state_update, configured)
            await trio.testing.wait_all_tasks_blocked()
            session.start_soon(reclaim.on_reclaim_instruction, instr("r-1", "m-1", grace=60),
                               Replies())
    assert drains.active == frozenset({"n-1"})
    return kube.objects(UPCOMING_NODES)["un-m-1"]


async def test_node_state_retry_never_resets_draining_to_ready(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    """Issue item 6, live read: CONFIGURED (Ready) fails once and is retried after the reclaim
    wrote Draining and the drain record.

    Before the fix the retry planned Ready over the Draining it read and wrote it: the object
    showed Ready mid-drain, and a restart then would not resume the drain (only Draining objects
    with the record are resumed). Now a node-state update never takes a Draining object back to
    Provisioning/Registered/Ready (docs/rules.md#upcomingnode-phases).
    """
    from bigfleet_trio.operator.reclaim.resume import DRAIN_DEADLINE_ANNOTATION

    un = await _draining_race(nursery, cached=False)
    assert un["status"]["phase"] == "Draining"
    assert DRAIN_DEADLINE_ANNOTATION in un["metadata"]["annotations"]


async def test_node_state_write_from_a_stale_cache_never_resets_draining_to_ready(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    """Issue item 6, cached read: the node-state worker plans from an informer cache that still
    shows Registered after the reclaim wrote Draining.

    Before the fix its unguarded merge patch wrote Ready over Draining. Now a status write that
    changes the phase carries the resourceVersion it was planned from: the apiserver refuses it
    (409), the handler re-reads live, and the rule above keeps Draining.
    """
    un = await _draining_race(nursery, cached=True)
    assert un["status"]["phase"] == "Draining"
