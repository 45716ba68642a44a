"""Reclaim: cordon-then-ack and background drain (docs/rules.md#reclaim; known bugs 2-4 and our
other differences: docs/deviations.md#5-reclaim-and-drain-operatorreclaim)."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
from prometheus_client import REGISTRY

from bigfleet_trio.kube.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    Invalid,
    KubeTransportError,
    NotFound,
    ServerError,
    TooManyRequests,
)
from bigfleet_trio.kube.resources import NODES, PODS, UPCOMING_NODES, Resource
from bigfleet_trio.operator.reclaim.drain import DrainManager
from bigfleet_trio.operator.reclaim.handler import ReclaimHandler
from bigfleet_trio.operator.reclaim.plan import (
    EvictionOutcome,
    classify_eviction_error,
    drain_failure_message,
    effective_grace,
    eviction_grace_seconds,
    skip_reason,
)
from bigfleet_trio.operator.upcoming.plan import DrainMemory
from bigfleet_trio.proto import pb

# --------------------------------------------------------------------------- pure


@pytest.mark.parametrize(
    ("exc", "outcome"),
    [
        (NotFound(404, "NotFound", "gone"), EvictionOutcome.GONE),
        (TooManyRequests(429, "TooManyRequests", "pdb"), EvictionOutcome.RETRY),
        # podseidon: 429 with reason Forbidden on newer apiservers -> still by status code
        (TooManyRequests(429, "Forbidden", "PodProtector"), EvictionOutcome.RETRY),
        (Conflict(409, "Forbidden", "full admission buffer"), EvictionOutcome.RETRY),
        (ServerError(500, "InternalError", "webhook"), EvictionOutcome.RETRY),
        (ServerError(503, "ServiceUnavailable", "x"), EvictionOutcome.RETRY),
        (KubeTransportError("reset"), EvictionOutcome.RETRY),
        (Forbidden(403, "Forbidden", "disruptionsAllowed < 0"), EvictionOutcome.STOP),
        (BadRequest(400, "BadRequest", "x"), EvictionOutcome.STOP),
        (Invalid(422, "Invalid", "x"), EvictionOutcome.STOP),
        (ValueError("?"), EvictionOutcome.STOP),
    ],
)
def test_classify_eviction_error(exc: Exception, outcome: EvictionOutcome) -> None:
    assert classify_eviction_error(exc) is outcome


def _pod(
    name: str,
    *,
    ns: str = "default",
    node: str = "n-1",
    owner: str | None = "ReplicaSet",
    mirror: bool = False,
    phase: str = "Running",
    tgps: int | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner, "name": "o"}]
    if mirror:
        meta["annotations"] = {"kubernetes.io/config.mirror": "abc"}
    spec: dict[str, Any] = {"nodeName": node}
    if tgps is not None:
        spec["terminationGracePeriodSeconds"] = tgps
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


@pytest.mark.parametrize(
    ("pod", "reason"),
    [
        (_pod("a"), None),
        (_pod("a", owner=None), None),
        (_pod("a", owner="DaemonSet"), "daemonset"),
        (_pod("a", owner=None, mirror=True), "mirror"),
        (_pod("a", phase="Succeeded"), "terminal"),
        (_pod("a", phase="Failed"), "terminal"),
        (_pod("a", phase="Pending"), None),
    ],
)
def test_skip_reason(pod: dict[str, Any], reason: str | None) -> None:
    assert skip_reason(pod) == reason


@pytest.mark.parametrize(
    ("tgps", "remaining", "grace"),
    [
        (None, 100.0, 30),
        (30, 100.0, 30),
        (5, 100.0, 5),
        (30, 12.7, 12),
        (30, 0.3, 1),
        (0, 100.0, 1),
        (120, 600.0, 120),
    ],
)
def test_eviction_grace_seconds(tgps: int | None, remaining: float, grace: int) -> None:
    assert eviction_grace_seconds(_pod("a", tgps=tgps), remaining) == grace


@pytest.mark.parametrize(("given", "grace"), [(0, 30.0), (-5, 30.0), (10, 10.0), (600, 600.0)])
def test_effective_grace(given: int, grace: float) -> None:
    assert effective_grace(given) == grace


def test_drain_failure_message() -> None:
    assert drain_failure_message(
        "n-1", 30.0, {"b/y": "terminating", "a/x": "eviction blocked: 429: pdb"}
    ) == (
        "drain of node n-1 did not finish within 30s; pods left: "
        "a/x (eviction blocked: 429: pdb), b/y (terminating)"
    )
    assert len(drain_failure_message("n", 1.0, {f"ns/p{i}": "x" * 50 for i in range(100)})) == 2000


# --------------------------------------------------------------------------- fake cluster


@dataclass
class Listing:
    items: list[dict[str, Any]]
    resource_version: str = "1"


@dataclass
class FakeCluster:
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    upcoming: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    # pod key -> callable(attempt_number) returning an exception to raise, or None to allow
    eviction_policy: dict[str, Callable[[int], Exception | None]] = field(default_factory=dict)
    evictions: list[tuple[str, int | None, float]] = field(default_factory=list)
    node_patches: list[tuple[str, Any]] = field(default_factory=list)
    un_writes: list[tuple[str, str, Any, float]] = field(default_factory=list)
    # pod key -> seconds it stays Terminating after an admitted eviction (default: gone at once)
    terminate_delay: dict[str, float] = field(default_factory=dict)
    # pod key -> clock time at which a Terminating pod disappears
    vanish_at: dict[str, float] = field(default_factory=dict)
    pod_lists: list[float] = field(default_factory=list)

    def add_node(self, name: str, provider_id: str = "") -> None:
        self.nodes[name] = {"metadata": {"name": name}, "spec": {"providerID": provider_id}}

    def add_un(self, name: str, phase: str = "Ready", **status: Any) -> None:
        self.upcoming[name] = {
            "metadata": {"name": name},
            "spec": {"resources": {}},
            "status": {"phase": phase, **status},
        }

    def add_pod(self, pod: dict[str, Any]) -> str:
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        self.pods[key] = pod
        return key

    def _store(self, res: Resource) -> dict[str, dict[str, Any]]:
        if res == NODES:
            return self.nodes
        if res == UPCOMING_NODES:
            return self.upcoming
        raise AssertionError(res)

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        store = self._store(res)
        if name not in store:
            raise NotFound(404, "NotFound", name)
        return copy.deepcopy(store[name])

    def terminate(self, key: str, after: float) -> None:
        """Mark a pod Terminating; it disappears ``after`` seconds from now."""
        self.pods[key]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        self.vanish_at[key] = trio.current_time() + after

    async def list(self, res: Resource, namespace: str | None = None, **kw: Any) -> Listing:
        await trio.lowlevel.checkpoint()
        if res == PODS:
            self.pod_lists.append(trio.current_time())
            for key, at in list(self.vanish_at.items()):
                if at <= trio.current_time():
                    self.pods.pop(key, None)
                    del self.vanish_at[key]
            sel = kw["field_selector"]
            assert sel.startswith("spec.nodeName=")
            node = sel.split("=", 1)[1]
            return Listing(
                [copy.deepcopy(p) for p in self.pods.values() if p["spec"]["nodeName"] == node]
            )
        return Listing([copy.deepcopy(o) for o in self._store(res).values()])

    async def create(self, *a: Any, **kw: Any) -> dict[str, Any]:
        raise AssertionError("reclaim never creates")

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: str = "merge",
        subresource: str | None = None,
    ) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        if res == NODES:
            self.node_patches.append((name, patch))
            if name not in self.nodes:
                raise NotFound(404, "NotFound", name)
            self.nodes[name]["spec"].update(patch["spec"])
            return self.nodes[name]
        assert res == UPCOMING_NODES
        if subresource is None:  # drain annotations: docs/rules.md#reclaim-resume-after-restart
            assert set(patch) == {"metadata"}
            if name not in self.upcoming:
                raise NotFound(404, "NotFound", name)
            annotations = self.upcoming[name]["metadata"].setdefault("annotations", {})
            annotations.update(patch["metadata"]["annotations"])
            return self.upcoming[name]
        assert subresource == "status"
        self.un_writes.append(("patch", name, patch["status"], trio.current_time()))
        if name not in self.upcoming:
            raise NotFound(404, "NotFound", name)
        self.upcoming[name]["status"].update(patch["status"])
        return self.upcoming[name]

    async def delete(
        self, res: Resource, name: str, namespace: str | None = None, **kw: Any
    ) -> None:
        await trio.lowlevel.checkpoint()
        assert res == UPCOMING_NODES
        self.un_writes.append(("delete", name, None, trio.current_time()))
        if name not in self.upcoming:
            raise NotFound(404, "NotFound", name)
        del self.upcoming[name]

    async def evict(
        self,
        name: str,
        namespace: str,
        *,
        grace_period_seconds: int | None = None,
        uid: str | None = None,
    ) -> None:
        await trio.lowlevel.checkpoint()
        key = f"{namespace}/{name}"
        self.evictions.append((key, grace_period_seconds, trio.current_time()))
        if key not in self.pods:
            raise NotFound(404, "NotFound", key)
        policy = self.eviction_policy.get(key)
        attempt = sum(1 for k, _, _ in self.evictions if k == key)
        if policy is not None:
            err = policy(attempt)
            if err is not None:
                raise err
        if key in self.terminate_delay:
            if not self.pods[key]["metadata"].get("deletionTimestamp"):
                self.terminate(key, self.terminate_delay[key])
            return
        del self.pods[key]  # terminates at once in this fake

    def evicted(self, key: str) -> int:
        return sum(1 for k, _, _ in self.evictions if k == key)


def pdb_block(times: int | None) -> Callable[[int], Exception | None]:
    """429 for the first ``times`` attempts (forever if None), then allowed."""

    def policy(attempt: int) -> Exception | None:
        if times is None or attempt <= times:
            return TooManyRequests(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
            )
        return None

    return policy


class Replies:
    def __init__(self, accept: bool = True) -> None:
        self.acks: list[tuple[str, int]] = []
        self.accept = accept

    def __call__(self, msg: pb.OperatorMessage) -> bool:
        self.acks.append((msg.reclaim_ack.instruction_id, msg.reclaim_ack.nodes_started))
        return self.accept


def instr(iid: str, *nodes: str, grace: int = 30) -> pb.ReclaimInstruction:
    return pb.ReclaimInstruction(
        instruction_id=iid, nodes=list(nodes), grace_period_seconds=grace, preemptor_priority=100
    )


def make(cluster: FakeCluster, **kw: Any) -> tuple[DrainManager, ReclaimHandler, DrainMemory]:
    memory = DrainMemory()
    drains = DrainManager(cluster, memory, rng=random.Random(7), **kw)
    return drains, ReclaimHandler(cluster, drains, memory), memory


def standard_cluster() -> FakeCluster:
    c = FakeCluster()
    c.add_node("n-1")
    c.add_un("un-m-1", nodeRef={"kind": "Node", "name": "n-1"})
    return c


# --------------------------------------------------------------------------- handler + drains


async def test_cordon_ack_drain_skips_daemonset_mirror_terminal(
    autojump_clock: trio.abc.Clock,
) -> None:
    c = standard_cluster()
    app = c.add_pod(_pod("app", tgps=20))
    ds = c.add_pod(_pod("fluentd", owner="DaemonSet"))
    mirror = c.add_pod(_pod("kube-proxy", owner=None, mirror=True))
    done = c.add_pod(_pod("job-1", owner="Job", phase="Succeeded"))
    drains, handler, memory = make(c)
    replies = Replies()
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        await handler.on_reclaim_instruction(instr("r-1", "n-1"), replies)
        # the ack went out after the cordon, before the drain finished
        assert replies.acks == [("r-1", 1)]
        assert c.node_patches == [("n-1", {"spec": {"unschedulable": True}})]
        assert c.un_writes[0][:3] == ("patch", "un-m-1", {"phase": "Draining"})
        assert memory.get("un-m-1") == "draining"
        await drains.wait_idle()
        nursery.cancel_scope.cancel()
    assert [(k, g) for k, g, _ in c.evictions] == [(app, 20)]
    assert set(c.pods) == {ds, mirror, done}
    assert [w[:3] for w in c.un_writes] == [
        ("patch", "un-m-1", {"phase": "Draining"}),
        ("patch", "un-m-1", {"phase": "Drained"}),
        ("delete", "un-m-1", None),
    ]
    assert memory.get("un-m-1") == "drained"
    assert drains.results["n-1"].outcome == "drained"


async def test_machine_id_resolved_through_upcoming_node_ref(
    autojump_clock: trio.abc.Clock,
) -> None:
    c = FakeCluster()
    c.add_node("ip-10-0-0-7")
    c.add_un("un-m-7", nodeRef={"kind": "Node", "name": "ip-10-0-0-7"})
    drains, handler, _ = make(c)
    replies = Replies()
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "m-7"), replies)
        await drains.wait_idle()
        nursery.cancel_scope.cancel()
    assert replies.acks == [("r", 1)]
    assert c.node_patches == [("ip-10-0-0-7", {"spec": {"unschedulable": True}})]
    assert "un-m-7" not in c.upcoming  # drained (no pods) and deleted


async def test_node_name_upcoming_found_through_injected_lookup(
    autojump_clock: trio.abc.Clock,
) -> None:
    # the shard names the Node itself; its UpcomingNode (un-m-1, nodeRef n-1) comes from the
    # injected lookup (the operator's informer index), not from listing every UpcomingNode.
    c = standard_cluster()
    lists: list[Resource] = []
    real_list = c.list

    async def counting_list(res: Resource, namespace: str | None = None, **kw: Any) -> Listing:
        lists.append(res)
        return await real_list(res, namespace, **kw)

    c.list = counting_list  # type: ignore[method-assign]
    asked: list[str] = []

    def lookup(node: str) -> list[dict[str, Any]]:
        asked.append(node)
        return [copy.deepcopy(c.upcoming["un-m-1"])] if node == "n-1" else []

    memory = DrainMemory()
    drains = DrainManager(c, memory, rng=random.Random(7))
    handler = ReclaimHandler(c, drains, memory, upcoming_lookup=lookup)
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "n-1"), Replies())
        await drains.wait_idle()
        nursery.cancel_scope.cancel()
    assert asked == ["n-1"]
    assert UPCOMING_NODES not in lists
    assert c.un_writes[0][:3] == ("patch", "un-m-1", {"phase": "Draining"})
    assert "un-m-1" not in c.upcoming  # drained and deleted


async def test_node_name_upcoming_found_by_listing_without_lookup(
    autojump_clock: trio.abc.Clock,
) -> None:
    c = standard_cluster()
    drains, handler, _ = make(c)
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "n-1"), Replies())
        await drains.wait_idle()
        nursery.cancel_scope.cancel()
    assert c.un_writes[0][:3] == ("patch", "un-m-1", {"phase": "Draining"})


async def test_machine_id_resolved_through_provider_id(autojump_clock: trio.abc.Clock) -> None:
    c = FakeCluster()
    c.add_node("other", provider_id="aws:///us-east-1a/i-2")
    c.add_node("ip-10-0-0-9", provider_id="aws:///us-east-1a/i-9")
    c.add_un("un-m-9", phase="Ready", providerID="aws:///us-east-1a/i-9")
    drains, handler, _ = make(c)
    replies = Replies()
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "m-9"), replies)
        nursery.cancel_scope.cancel()
    assert c.node_patches == [("ip-10-0-0-9", {"spec": {"unschedulable": True}})]
    assert replies.acks == [("r", 1)]


async def test_machine_id_resolved_through_injected_provider_id_lookup(
    autojump_clock: trio.abc.Clock,
) -> None:
    # un-m-9 has no nodeRef, only a providerID: the Node comes from the injected lookup (the
    # operator's Node informer indexed by spec.providerID), never from listing every Node.
    c = FakeCluster()
    c.add_node("other", provider_id="aws:///us-east-1a/i-2")
    c.add_node("ip-10-0-0-9", provider_id="aws:///us-east-1a/i-9")
    c.add_un("un-m-9", phase="Ready", providerID="aws:///us-east-1a/i-9")
    lists: list[Resource] = []
    real_list = c.list

    async def counting_list(res: Resource, namespace: str | None = None, **kw: Any) -> Listing:
        lists.append(res)
        return await real_list(res, namespace, **kw)

    c.list = counting_list  # type: ignore[method-assign]
    asked: list[str] = []

    def by_provider(provider_id: str) -> list[dict[str, Any]]:
        asked.append(provider_id)
        # a stale index entry (providerID since changed) is ignored, the matching one used
        stale = {"metadata": {"name": "stale"}, "spec": {"providerID": "aws:///x/i-0"}}
        return [stale] + [copy.deepcopy(n) for n in c.nodes.values()
                          if n["spec"]["providerID"] == provider_id]

    memory = DrainMemory()
    drains = DrainManager(c, memory, rng=random.Random(7))
    handler = ReclaimHandler(c, drains, memory, node_lookup=by_provider)
    replies = Replies()
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "m-9"), replies)
        nursery.cancel_scope.cancel()
    assert asked == ["aws:///us-east-1a/i-9"]
    assert NODES not in lists
    assert c.node_patches == [("ip-10-0-0-9", {"spec": {"unschedulable": True}})]
    assert replies.acks == [("r", 1)]


async def test_provider_id_lookup_miss_is_no_node(autojump_clock: trio.abc.Clock) -> None:
    c = FakeCluster()
    c.add_un("un-m-9", phase="Ready", providerID="aws:///us-east-1a/i-9")
    memory = DrainMemory()
    drains = DrainManager(c, memory, rng=random.Random(7))
    handler = ReclaimHandler(c, drains, memory, node_lookup=lambda pid: [])
    replies = Replies()
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "m-9"), replies)
        nursery.cancel_scope.cancel()
    assert c.node_patches == []
    assert replies.acks == [("r", 0)]  # acked, nothing cordoned
    assert c.upcoming["un-m-9"]["status"]["phase"] == "Draining"


async def test_nodes_started_counts_only_cordoned(autojump_clock: trio.abc.Clock) -> None:
    c = standard_cluster()
    c.add_un("un-m-2", phase="Launched")  # a machine with no Node yet
    drains, handler, memory = make(c)
    replies = Replies()
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "m-2", "n-1", "nonexistent"), replies)
        nursery.cancel_scope.cancel()
    assert replies.acks == [("r", 1)]
    # the node-less machine is still walked to Draining and remembered
    assert c.upcoming["un-m-2"]["status"]["phase"] == "Draining"
    assert memory.get("un-m-2") == "draining"


async def test_pdb_blocks_then_allows(autojump_clock: trio.abc.Clock) -> None:
    c = standard_cluster()
    key = c.add_pod(_pod("web"))
    c.eviction_policy[key] = pdb_block(2)
    drains, handler, _ = make(c)
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        t0 = trio.current_time()
        await handler.on_reclaim_instruction(instr("r", "n-1", grace=30), Replies())
        await drains.wait_idle()
        elapsed = trio.current_time() - t0
        nursery.cancel_scope.cancel()
    assert c.evicted(key) == 3
    times = [t - t0 for k, _, t in c.evictions]
    # retries every ~2 s with +-25 % jitter
    for a, b in zip(times, times[1:], strict=False):
        assert 1.5 <= b - a <= 2.5
    # rounds: 429, pause, 429, pause, evicted, quick re-check (0.25 s), empty list
    # -> two ~2 s pauses (1.5..2.5 s each) + 0.25 s
    assert 3.25 <= elapsed <= 5.25
    assert drains.results["n-1"].outcome == "drained"
    assert "un-m-1" not in c.upcoming


async def test_pdb_never_allows_fails_at_deadline(autojump_clock: trio.abc.Clock) -> None:
    c = standard_cluster()
    key = c.add_pod(_pod("db", ns="prod"))
    c.eviction_policy[key] = pdb_block(None)
    drains, handler, memory = make(c)
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        t0 = trio.current_time()
        await handler.on_reclaim_instruction(instr("r", "n-1", grace=10), Replies())
        await drains.wait_idle()
        nursery.cancel_scope.cancel()
    kind, name, status, at = c.un_writes[-1]
    assert (kind, name) == ("patch", "un-m-1")
    assert at - t0 == pytest.approx(10.0)
    assert status == {
        "phase": "Failed",
        "lastError": "drain of node n-1 did not finish within 10s; pods left: prod/db "
        "(eviction blocked: 429: Cannot evict pod as it would violate the pod's disruption "
        "budget.)",
    }
    assert drains.results["n-1"].outcome == "failed"
    assert c.upcoming["un-m-1"]["status"]["phase"] == "Failed"
    assert memory.get("un-m-1") == "draining"  # a later Idle still means Drained
    # first eviction got the whole (bounded) grace: 10 s left < the pod's 30 s
    assert c.evictions[0][1] == 10
    assert 4 <= c.evicted(key) <= 7


async def test_short_grace_pod_gone_soon_after_eviction_is_drained(
    autojump_clock: trio.abc.Clock,
) -> None:
    # grace 2 s; the evicted pod terminates in 0.3 s. Re-check quickly after an eviction:
    # list at 0 (evict), 0.25 (still Terminating), 0.25 + 0.5 = 0.75 (gone) -> Drained at 0.75.
    c = standard_cluster()
    key = c.add_pod(_pod("web", tgps=1))
    c.terminate_delay[key] = 0.3
    drains, handler, _ = make(c)
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        t0 = trio.current_time()
        await handler.on_reclaim_instruction(instr("r", "n-1", grace=2), Replies())
        await drains.wait_idle()
        nursery.cancel_scope.cancel()
    assert [t - t0 for t in c.pod_lists] == pytest.approx([0.0, 0.25, 0.75])
    assert c.evicted(key) == 1  # a Terminating pod is not evicted again
    assert drains.results["n-1"].outcome == "drained"
    assert [w[:3] for w in c.un_writes][-2:] == [
        ("patch", "un-m-1", {"phase": "Drained"}),
        ("delete", "un-m-1", None),
    ]
    assert c.un_writes[-1][3] - t0 == pytest.approx(0.75)


async def test_final_check_at_deadline(autojump_clock: trio.abc.Clock) -> None:
    # A pod already Terminating vanishes at 2.9 s; grace 3 s. Polls at 0, 0.25, 0.75, 1.75
    # (0.25/0.5/1.0 s apart), then the pause reaches the ~2 s interval (>= 1.5 s -> past 3 s):
    # the deadline cuts it, and the check made right at the deadline sees no pod -> Drained.
    c = standard_cluster()
    key = c.add_pod(_pod("web"))
    drains, handler, _ = make(c)
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        t0 = trio.current_time()
        c.terminate(key, 2.9)
        await handler.on_reclaim_instruction(instr("r", "n-1", grace=3), Replies())
        await drains.wait_idle()
        assert trio.current_time() - t0 == pytest.approx(3.0)
        nursery.cancel_scope.cancel()
    assert [t - t0 for t in c.pod_lists] == pytest.approx([0.0, 0.25, 0.75, 1.75, 3.0])
    assert c.evicted(key) == 0
    assert drains.results["n-1"].outcome == "drained"
    assert "un-m-1" not in c.upcoming


async def test_forbidden_stops_for_that_pod(autojump_clock: trio.abc.Clock) -> None:
    c = standard_cluster()
    stuck = c.add_pod(_pod("stuck"))
    ok = c.add_pod(_pod("ok"))
    c.eviction_policy[stuck] = lambda attempt: Forbidden(403, "Forbidden", "pdb misconfigured")
    drains, handler, _ = make(c)
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "n-1", grace=8), Replies())
        await drains.wait_idle()
        nursery.cancel_scope.cancel()
    assert c.evicted(stuck) == 1
    assert c.evicted(ok) == 1
    assert drains.results["n-1"].outcome == "failed"
    assert drains.results["n-1"].pods_left == {
        stuck: "eviction refused, not retried: 403: pdb misconfigured"
    }


async def test_gone_pod_counts_as_done(autojump_clock: trio.abc.Clock) -> None:
    c = standard_cluster()
    key = c.add_pod(_pod("ghost"))
    c.eviction_policy[key] = lambda attempt: NotFound(404, "NotFound", "ghost")

    async def list_then_forget(res: Resource, namespace: str | None = None, **kw: Any) -> Listing:
        listing = await FakeCluster.list(c, res, namespace, **kw)
        c.pods.pop(key, None)  # the pod disappears right after it was listed
        return listing

    c.list = list_then_forget  # type: ignore[method-assign]
    drains, handler, _ = make(c)
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        t0 = trio.current_time()
        await handler.on_reclaim_instruction(instr("r", "n-1"), Replies())
        await drains.wait_idle()
        assert trio.current_time() == t0  # no retry round needed
        nursery.cancel_scope.cancel()
    assert drains.results["n-1"].outcome == "drained"


async def test_duplicate_instruction_one_drain_two_acks(autojump_clock: trio.abc.Clock) -> None:
    c = standard_cluster()
    key = c.add_pod(_pod("web"))
    c.eviction_policy[key] = pdb_block(1)
    drains, handler, _ = make(c)
    replies = Replies()
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        await handler.on_reclaim_instruction(instr("r-1", "n-1"), replies)
        await handler.on_reclaim_instruction(instr("r-1", "n-1"), replies)
        # a different instruction naming a node already draining: acked, no second drain
        await handler.on_reclaim_instruction(instr("r-2", "n-1"), replies)
        assert drains.active == frozenset({"n-1"})
        await drains.wait_idle()
        nursery.cancel_scope.cancel()
    assert replies.acks == [("r-1", 1), ("r-1", 1), ("r-2", 1)]
    assert len(c.node_patches) == 2  # r-1 once, r-2 (idempotent cordon); the duplicate did nothing
    assert c.evicted(key) == 2  # one drain: 429, then allowed


async def test_concurrent_duplicate_waits_for_first(autojump_clock: trio.abc.Clock) -> None:
    c = standard_cluster()
    drains, handler, _ = make(c)
    replies = Replies()
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        async with trio.open_nursery() as session:
            session.start_soon(handler.on_reclaim_instruction, instr("r", "n-1"), replies)
            session.start_soon(handler.on_reclaim_instruction, instr("r", "n-1"), replies)
        nursery.cancel_scope.cancel()
    assert replies.acks == [("r", 1), ("r", 1)]
    assert len(c.node_patches) == 1


async def test_reconnect_does_not_cancel_drain(autojump_clock: trio.abc.Clock) -> None:
    c = standard_cluster()
    key = c.add_pod(_pod("web"))
    c.eviction_policy[key] = pdb_block(3)
    drains, handler, _ = make(c)
    replies = Replies()
    async with trio.open_nursery() as operator:
        await operator.start(drains.run)
        # session 1: handles the instruction, then the stream breaks
        async with trio.open_nursery() as session:
            session.start_soon(handler.on_reclaim_instruction, instr("r", "n-1"), replies)
            await trio.sleep(1)
            session.cancel_scope.cancel()
        assert replies.acks == [("r", 1)]
        assert drains.is_draining("n-1")
        # session 2 (reconnected): the shard re-sends the instruction
        async with trio.open_nursery() as session2:
            session2.start_soon(handler.on_reclaim_instruction, instr("r", "n-1"), replies)
        await drains.wait_idle()
        operator.cancel_scope.cancel()
    assert replies.acks == [("r", 1), ("r", 1)]
    assert drains.results["n-1"].outcome == "drained"
    assert c.evicted(key) == 4


async def test_ack_dropped_is_logged_not_raised(autojump_clock: trio.abc.Clock) -> None:
    c = standard_cluster()
    drains, handler, _ = make(c)
    replies = Replies(accept=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "n-1"), replies)
        nursery.cancel_scope.cancel()
    assert replies.acks == [("r", 1)]


async def test_shutdown_lets_drains_finish_within_timeout(autojump_clock: trio.abc.Clock) -> None:
    c = standard_cluster()
    key = c.add_pod(_pod("web"))
    c.eviction_policy[key] = pdb_block(3)  # allowed at ~6 s
    drains, handler, _ = make(c, shutdown_timeout=20.0)
    async with trio.open_nursery() as operator:
        await operator.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "n-1", grace=600), Replies())
        await trio.sleep(1)
        operator.cancel_scope.cancel()  # SIGTERM
    assert drains.results["n-1"].outcome == "drained"
    assert "un-m-1" not in c.upcoming


async def test_shutdown_timeout_abandons_drain(autojump_clock: trio.abc.Clock) -> None:
    c = standard_cluster()
    key = c.add_pod(_pod("web"))
    c.eviction_policy[key] = pdb_block(None)
    drains, handler, _ = make(c, shutdown_timeout=20.0)
    async with trio.open_nursery() as operator:
        await operator.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "n-1", grace=600), Replies())
        await trio.sleep(5)
        t_stop = trio.current_time()
        operator.cancel_scope.cancel()
    assert trio.current_time() - t_stop == pytest.approx(20.0)
    assert drains.results["n-1"].outcome == "abandoned"
    assert drains.abandoned_total == 1
    # no new drains once shutting down
    assert drains.start("n-2", un_name=None, grace_seconds=1, instruction_id="x") is False


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _drain_metrics() -> dict[str, float]:
    out = {
        f"drains/{o}": _sample("bigfleet_operator_drains_total", outcome=o)
        for o in ("drained", "failed", "abandoned")
    }
    out.update(
        {
            f"evictions/{r}": _sample("bigfleet_operator_evictions_total", result=r)
            for r in ("evicted", "gone", "blocked", "refused")
        }
    )
    return out


def _delta(before: dict[str, float]) -> dict[str, float]:
    after = _drain_metrics()
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


async def test_drain_metrics_and_totals(autojump_clock: trio.abc.Clock) -> None:
    # n-1: "web" blocked once (429) then evicted, "ghost" 404, "stuck" 403 -> Failed at 8 s.
    # n-2: "api" evicted at once -> Drained.
    c = standard_cluster()
    c.add_node("n-2")
    web = c.add_pod(_pod("web"))
    ghost = c.add_pod(_pod("ghost"))
    stuck = c.add_pod(_pod("stuck"))
    c.add_pod(_pod("api", node="n-2"))
    c.eviction_policy[web] = pdb_block(1)
    c.eviction_policy[ghost] = lambda attempt: NotFound(404, "NotFound", "ghost")
    c.eviction_policy[stuck] = lambda attempt: Forbidden(403, "Forbidden", "no")
    before = _drain_metrics()
    active0 = _sample("bigfleet_operator_drains_active")
    drains, handler, _ = make(c)
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "n-1", "n-2", grace=8), Replies())
        assert _sample("bigfleet_operator_drains_active") - active0 == 2
        await drains.wait_idle()
        nursery.cancel_scope.cancel()
    assert _sample("bigfleet_operator_drains_active") == active0
    # the fake keeps "ghost" listed (404 on eviction each round): counted per eviction call
    assert c.evicted(ghost) >= 2
    assert _delta(before) == {
        "drains/drained": 1,
        "drains/failed": 1,
        "evictions/evicted": 2,
        "evictions/blocked": 1,
        "evictions/gone": c.evicted(ghost),
        "evictions/refused": 1,
    }
    assert (drains.completed_total, drains.failed_total, drains.abandoned_total) == (1, 1, 0)


async def test_totals_not_bounded_by_results_ring(autojump_clock: trio.abc.Clock) -> None:
    c = FakeCluster()
    for i in range(3):
        c.add_node(f"n-{i}")
    drains, handler, _ = make(c, results_capacity=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "n-0", "n-1", "n-2"), Replies())
        await drains.wait_idle()
        nursery.cancel_scope.cancel()
    assert len(drains.results) == 1
    assert drains.completed_total == 3


async def test_start_without_run_is_an_error() -> None:
    drains = DrainManager(FakeCluster(), DrainMemory())
    with pytest.raises(RuntimeError):
        drains.start("n", un_name=None, grace_seconds=1, instruction_id="x")


# --------------------------------------------------------------------------- on the test apiserver


def _server_and_client(nursery: trio.Nursery) -> tuple[Any, Any]:
    from bigfleet_trio.kube.client import KubeClient
    from bigfleet_trio.kube.config import KubeConfig
    from bigfleet_trio.sim.apiserver import ApiServer
    from bigfleet_trio.sim.apiserver.testing import InProcessTransport

    server = ApiServer()
    client = KubeClient(
        KubeConfig(server="http://apiserver"), transport=InProcessTransport(server.app, nursery)
    )
    return server, client


PDB = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True)
DAEMONSETS = Resource("apps", "v1", "daemonsets", "DaemonSet", True)


async def _seed(client: Any) -> None:
    await client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n-1"}})
    await client.create(
        UPCOMING_NODES,
        {
            "apiVersion": "bigfleet.lucy.sh/v1alpha1",
            "kind": "UpcomingNode",
            "metadata": {"name": "un-m-1"},
            "spec": {"resources": {}},
        },
    )
    await client.patch(
        UPCOMING_NODES,
        "un-m-1",
        {"status": {"phase": "Ready", "nodeRef": {"kind": "Node", "name": "n-1"}}},
        subresource="status",
    )
    ds = await client.create(
        DAEMONSETS,
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "agent"},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {
                    "metadata": {"labels": {"app": "agent"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                },
            },
        },
        "default",
    )
    for name, owner in (("web", None), ("agent", "DaemonSet")):
        meta: dict[str, Any] = {"name": name, "labels": {"app": name}}
        if owner:
            meta["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": owner,
                    "name": "agent",
                    "uid": ds["metadata"]["uid"],
                }
            ]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {"nodeName": "n-1", "containers": [{"name": "c", "image": "busybox"}]},
        }
        await client.create(PODS, body, "default")
        await client.patch(
            PODS,
            name,
            {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
            "default",
            subresource="status",
        )
    await client.create(
        PDB,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "web"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
        },
        "default",
    )
    await _pdb_allows(client, 0)


async def _pdb_allows(client: Any, allowed: int) -> None:
    await client.patch(
        PDB,
        "web",
        {
            "status": {
                "observedGeneration": 1,
                "disruptionsAllowed": allowed,
                "currentHealthy": 1,
                "desiredHealthy": 1,
                "expectedPods": 1,
            }
        },
        "default",
        subresource="status",
    )


async def _pod_names(client: Any) -> list[str]:
    return sorted(p["metadata"]["name"] for p in (await client.list(PODS, "default")).items)


async def test_apiserver_pdb_blocks_then_allows(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    _, client = _server_and_client(nursery)
    await _seed(client)
    memory = DrainMemory()
    drains = DrainManager(client, memory, rng=random.Random(1))
    handler = ReclaimHandler(client, drains, memory)
    replies = Replies()
    async with trio.open_nursery() as operator:
        await operator.start(drains.run)
        await handler.on_reclaim_instruction(instr("r-1", "m-1", grace=60), replies)
        assert replies.acks == [("r-1", 1)]
        node = await client.get(NODES, "n-1")
        assert node["spec"]["unschedulable"] is True
        un = await client.get(UPCOMING_NODES, "un-m-1")
        assert un["status"]["phase"] == "Draining"
        await trio.sleep(7)
        assert await _pod_names(client) == ["agent", "web"]  # PDB still blocks
        await _pdb_allows(client, 1)
        await drains.wait_idle()
        operator.cancel_scope.cancel()
    assert drains.results["n-1"].outcome == "drained"
    assert await _pod_names(client) == ["agent"]  # the DaemonSet Pod is left alone
    with pytest.raises(NotFound):
        await client.get(UPCOMING_NODES, "un-m-1")  # Drained -> deleted
    assert memory.get("un-m-1") == "drained"


async def test_apiserver_pdb_never_allows_fails_at_deadline(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    _, client = _server_and_client(nursery)
    await _seed(client)
    memory = DrainMemory()
    drains = DrainManager(client, memory, rng=random.Random(1))
    handler = ReclaimHandler(client, drains, memory)
    async with trio.open_nursery() as operator:
        await operator.start(drains.run)
        t0 = trio.current_time()
        await handler.on_reclaim_instruction(instr("r-1", "n-1", grace=10), Replies())
        await drains.wait_idle()
        assert trio.current_time() - t0 == pytest.approx(10.0, abs=0.01)
        operator.cancel_scope.cancel()
    un = await client.get(UPCOMING_NODES, "un-m-1")
    assert un["status"]["phase"] == "Failed"
    assert un["status"]["lastError"].startswith(
        "drain of node n-1 did not finish within 10s; pods left: "
        "default/web (eviction blocked: 429:"
    )
    assert await _pod_names(client) == ["agent", "web"]


async def test_apiserver_duplicate_instruction_one_drain_two_acks(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    server, client = _server_and_client(nursery)
    await _seed(client)
    await _pdb_allows(client, 1)  # the one eviction succeeds at once: no 429 retries to count
    # hold the eviction in flight so the duplicate arrives while the drain is running
    server.faults.add_latency(5.0, verb="create", resource="pods/eviction")
    server.counters.reset()
    memory = DrainMemory()
    drains = DrainManager(client, memory, rng=random.Random(1))
    handler = ReclaimHandler(client, drains, memory)
    replies = Replies()
    async with trio.open_nursery() as operator:
        await operator.start(drains.run)
        await handler.on_reclaim_instruction(instr("r-1", "m-1", grace=60), replies)
        await trio.sleep(1)
        assert drains.active == frozenset({"n-1"})
        assert server.counters[("create", "pods/eviction")] == 1  # sent, answer still delayed
        # the shard re-sends the same instruction (lost ack, reconnect): re-acked, nothing redone
        await handler.on_reclaim_instruction(instr("r-1", "m-1", grace=60), replies)
        assert replies.acks == [("r-1", 1), ("r-1", 1)]
        assert drains.active == frozenset({"n-1"})
        await drains.wait_idle()
        operator.cancel_scope.cancel()
    assert server.counters[("patch", "nodes")] == 1  # one cordon
    assert server.counters[("patch", "upcomingnodes/status")] == 2  # Draining, then Drained
    assert server.counters[("create", "pods/eviction")] == 1  # web evicted once
    assert drains.completed_total == 1 and drains.failed_total == 0
    assert drains.results["n-1"].outcome == "drained"
    assert await _pod_names(client) == ["agent"]
    with pytest.raises(NotFound):
        await client.get(UPCOMING_NODES, "un-m-1")


# --------------------------------------------------------------------------- operator wiring


def _operator_runtime() -> Any:
    from bigfleet_trio.config import OperatorConfig
    from bigfleet_trio.operator.app import Operator
    from bigfleet_trio.shard.transport import MemoryConnector

    cfg = OperatorConfig(cluster_id="c1", shard_addr="h:1")
    op = Operator(cfg, client=FakeCluster(), connector=MemoryConnector())  # type: ignore[arg-type]
    op._rt = op.build()
    return op


def test_statistics_use_cumulative_drain_totals() -> None:
    op = _operator_runtime()
    drains = op.parts.drains
    drains.completed_total, drains.failed_total, drains.abandoned_total = 5000, 7, 2
    stats = op.statistics()
    assert (stats.drains_completed, stats.drains_failed, stats.drains_abandoned) == (5000, 7, 2)


def test_reclaim_handler_reads_the_informer_stores_directly() -> None:
    from bigfleet_trio.operator.wiring import slim_node

    op = _operator_runtime()
    handler = op.parts.handlers.reclaim
    nodes = op.parts.node_informer.store
    for name, pid in [("a", "sim://1"), ("b", "sim://2"), ("c", ""), ("d", "sim://1")]:
        nodes._set(name, slim_node({"metadata": {"name": name}, "spec": {"providerID": pid}}))
    by_pid = handler._node_lookup
    assert [n["metadata"]["name"] for n in by_pid("sim://1")] == ["a", "d"]
    assert by_pid("sim://2")[0]["metadata"]["name"] == "b"
    assert by_pid("") == []  # Nodes without a providerID are not indexed
    assert by_pid("sim://9") == []
    nodes._pop("a")
    assert [n["metadata"]["name"] for n in by_pid("sim://1")] == ["d"]
    un = {"metadata": {"name": "un-1"}, "status": {"nodeRef": {"name": "a"}}}
    op.parts.un_informer.store._set("un-1", un)
    assert handler._upcoming_lookup("a") == [un] and handler._upcoming_lookup("b") == []


# ------------------------------------------------------------------------------- eviction timeout


async def test_eviction_waits_for_a_slow_disruption_webhook(autojump_clock: trio.abc.Clock) -> None:
    # A Podseidon-style disruption webhook may take up to 10 s (its timeoutSeconds); the
    # eviction call must wait longer than that. KubeClient's default request_timeout (30 s)
    # applies to evict(), which is never retried: a 12 s answer is a success.
    import httpx

    from bigfleet_trio.kube.client import KubeClient
    from bigfleet_trio.kube.config import KubeConfig

    seen: list[tuple[str, float]] = []

    async def slow_webhook(request: httpx.Request) -> httpx.Response:
        await trio.sleep(12)
        seen.append((request.url.path, trio.current_time()))
        return httpx.Response(201, json={"kind": "Status", "status": "Success"})

    client = KubeClient(
        KubeConfig(server="http://apiserver"), transport=httpx.MockTransport(slow_webhook)
    )
    assert client.request_timeout > 10
    t0 = trio.current_time()
    async with client:
        await client.evict("web", "default", grace_period_seconds=30)
    assert [(p, t - t0) for p, t in seen] == [
        ("/api/v1/namespaces/default/pods/web/eviction", pytest.approx(12.0))
    ]


async def test_multi_node_cordons_all_then_acks_then_drains(autojump_clock: trio.abc.Clock) -> None:
    """docs/rules.md#reclaim-cordon: cordon every named node, ack, and only then drain; no
    eviction may start while a later node of the same instruction is still being cordoned."""
    c = FakeCluster()
    for n in ("n-1", "n-2", "n-3"):
        c.add_node(n)
        c.add_pod(_pod(f"app-{n}", node=n))
    drains, handler, _ = make(c)
    order: list[str] = []

    class Recording(Replies):
        def __call__(self, msg: pb.OperatorMessage) -> bool:
            order.append("ack")
            return super().__call__(msg)

    original_patch, original_evict = c.patch, c.evict

    async def slow_patch(res: Resource, name: str, patch: Any, *a: Any, **kw: Any) -> Any:
        if res == NODES:
            await trio.sleep(1.0)  # a slow cordon gives a premature drain time to evict
            order.append(f"cordon {name}")
        return await original_patch(res, name, patch, *a, **kw)

    async def recording_evict(name: str, namespace: str, **kw: Any) -> None:
        order.append(f"evict {name}")
        await original_evict(name, namespace, **kw)

    c.patch = slow_patch  # type: ignore[method-assign]
    c.evict = recording_evict  # type: ignore[method-assign]
    replies = Recording()
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "n-1", "n-2", "n-3"), replies)
        await drains.wait_idle()
        nursery.cancel_scope.cancel()
    assert sorted(order[:3]) == ["cordon n-1", "cordon n-2", "cordon n-3"]
    assert order[3] == "ack"
    assert sorted(order[4:]) == ["evict app-n-1", "evict app-n-2", "evict app-n-3"]
    assert replies.acks == [("r", 3)]
    assert {n: r.outcome for n, r in drains.results.items()} == {
        "n-1": "drained", "n-2": "drained", "n-3": "drained",
    }


async def test_many_nodes_are_cordoned_concurrently_before_the_ack(
    autojump_clock: trio.abc.Clock,
) -> None:
    """100 nodes whose cordon takes 1 s each: the ack must not wait 100 s (bounded concurrency,
    16 by default -> ceil(100 / 16) = 7 rounds), and nodes_started counts all of them."""
    c = FakeCluster()
    names = [f"n-{i:03d}" for i in range(100)]
    for n in names:
        c.add_node(n)
    drains, handler, _ = make(c)
    original_patch = c.patch

    async def slow_patch(res: Resource, name: str, patch: Any, *a: Any, **kw: Any) -> Any:
        if res == NODES:
            await trio.sleep(1.0)
        return await original_patch(res, name, patch, *a, **kw)

    c.patch = slow_patch  # type: ignore[method-assign]
    replies = Replies()
    async with trio.open_nursery() as nursery:
        await nursery.start(drains.run)
        start = trio.current_time()
        await handler.on_reclaim_instruction(instr("r", *names), replies)
        took = trio.current_time() - start
        await drains.wait_idle()
        nursery.cancel_scope.cancel()
    assert replies.acks == [("r", 100)]
    assert 7.0 <= took < 8.0, took
    assert {name for name, _ in c.node_patches} == set(names)
