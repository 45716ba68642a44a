"""Reclaim: cordon-then-ack and background drain (docs/rules.md#reclaim; known bugs 2-4 and our
other differences: docs/deviations.md#5-reclaim-and-drain-operatorreclaim)."""

from __future__ import annotations

import copy
import random
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
from bigfleet_trio.kube.resources import NODES, PDBS, PODS, UPCOMING_NODES, Resource
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
from tests.support.kube import MERGE, RecordingKube, sim_kube

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


# --------------------------------------------------------------------------- on the sim

PDB_REFUSED = "Cannot evict pod as it would violate the pod's disruption budget."
OWNERS = {
    "ReplicaSet": Resource("apps", "v1", "replicasets", "ReplicaSet", True),
    "DaemonSet": Resource("apps", "v1", "daemonsets", "DaemonSet", True),
    "Job": Resource("batch", "v1", "jobs", "Job", True),
}
HOLD = "test.bigfleet/hold"  # a finalizer: an evicted Pod stays Terminating until released


def add_node(kube: RecordingKube, name: str, provider_id: str = "") -> None:
    kube.seed(NODES, {"metadata": {"name": name}, "spec": {"providerID": provider_id}})


def add_un(kube: RecordingKube, name: str, phase: str = "Ready", **status: Any) -> None:
    kube.seed(UPCOMING_NODES, {"metadata": {"name": name}, "spec": {"resources": {}},
                               "status": {"phase": phase, **status}})


def _owner(kube: RecordingKube, kind: str, ns: str) -> str:
    """The uid of owner ``o`` of ``kind`` in ``ns`` (stored when missing: the sim's garbage
    collector deletes a Pod whose owner does not exist)."""
    res = OWNERS[kind]
    have = kube.objects(res, ns).get("o")
    if have is None:
        labels = {"app": "o"}
        template = {"metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
        spec: dict[str, Any] = {"selector": {"matchLabels": labels}, "template": template}
        if kind == "Job":
            template["spec"]["restartPolicy"] = "Never"
            spec = {"template": template}
        have = kube.seed(res, {"metadata": {"name": "o", "namespace": ns}, "spec": spec})
    return have["metadata"]["uid"]  # type: ignore[no-any-return]


def add_pod(kube: RecordingKube, pod: dict[str, Any], *, hold: bool = False) -> str:
    """Store :func:`_pod`'s ``pod`` in the sim (containers, label app=<name>, Ready); with
    ``hold``, a finalizer keeps it Terminating after its eviction until :func:`release`.
    Returns ``ns/name``."""
    pod = copy.deepcopy(pod)
    meta = pod["metadata"]
    ns = meta["namespace"]
    meta["labels"] = {"app": meta["name"]}
    for ref in meta.get("ownerReferences", []):
        ref["uid"] = _owner(kube, ref["kind"], ns)
    if hold:
        meta["finalizers"] = [HOLD]
    pod["spec"]["containers"] = [{"name": "c", "image": "busybox"}]
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    kube.seed(PODS, pod)
    return f"{ns}/{meta['name']}"


def terminate(kube: RecordingKube, key: str) -> None:
    """Delete held Pod ``ns/name`` in-process: it is Terminating (deletionTimestamp set)."""
    ns, name = key.split("/")
    kube.server.delete(kube.server.find("pods"), ns, name)


def release_at(nursery: trio.Nursery, kube: RecordingKube, key: str, at: float) -> None:
    """At clock time ``at``, drop the held Pod's finalizer: a Terminating Pod then vanishes."""
    ns, name = key.split("/")

    async def release() -> None:
        await trio.sleep_until(at)
        kube.server.patch(kube.server.find("pods"), ns, name, {"metadata": {"finalizers": None}},
                          MERGE)

    nursery.start_soon(release)


def pdb_blocks(kube: RecordingKube, key: str) -> None:
    """A PodDisruptionBudget over Pod ``ns/name`` allowing no disruption: every eviction of it
    is answered 429 by the sim."""
    ns, name = key.split("/")
    kube.seed(PDBS, {
        "metadata": {"name": name, "namespace": ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": name}}},
        "status": {"observedGeneration": 1, "disruptionsAllowed": 0, "currentHealthy": 1,
                   "desiredHealthy": 1, "expectedPods": 1},
    })


def refuse(
    kube: RecordingKube, key: str, times: int, code: int = 429, message: str = PDB_REFUSED
) -> None:
    """The sim answers the next ``times`` evictions of Pod ``ns/name`` with ``code`` (default:
    the 429 of a PodDisruptionBudget that allows no disruption), then evaluates them."""
    kube.server.faults.fail_next(times, code=code, verb="create", resource="pods/eviction",
                                 name=key.split("/")[1], message=message)


def evictions(kube: RecordingKube) -> list[tuple[str, int | None, float]]:
    """Eviction calls as ``(ns/name, gracePeriodSeconds, time)``, failed ones included."""
    return [(f"{r.namespace}/{r.name}", r.body["gracePeriodSeconds"], r.at)
            for r in kube.of("evict")]


def evicted(kube: RecordingKube, key: str) -> int:
    return sum(1 for k, _, _ in evictions(kube) if k == key)


def node_patches(kube: RecordingKube) -> list[tuple[str, Any]]:
    return [(r.name, r.body) for r in kube.of("patch", "nodes")]


def un_writes(kube: RecordingKube) -> list[tuple[str, str, Any, float]]:
    """UpcomingNode status patches and deletes: ``("patch", name, status, t)`` /
    ``("delete", name, None, t)`` (the drain-annotation patches are not listed)."""
    return [("patch", r.name, r.body["status"], r.at) if r.op == "patch/status"
            else ("delete", r.name, None, r.at)
            for r in kube.history
            if r.plural == "upcomingnodes" and r.op in ("patch/status", "delete")]


def pod_lists(kube: RecordingKube) -> list[float]:
    return [r.at for r in kube.of("list", "pods")]


def pods(kube: RecordingKube) -> set[str]:
    return set(kube.objects(PODS))


def upcoming(kube: RecordingKube) -> dict[str, dict[str, Any]]:
    return kube.objects(UPCOMING_NODES)


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


def make(cluster: RecordingKube, **kw: Any) -> tuple[DrainManager, ReclaimHandler, DrainMemory]:
    memory = DrainMemory()
    drains = DrainManager(cluster, memory, rng=random.Random(7), **kw)
    return drains, ReclaimHandler(cluster, drains, memory), memory


def standard_cluster(nursery: trio.Nursery) -> RecordingKube:
    c = RecordingKube.over_sim(nursery)
    add_node(c, "n-1")
    add_un(c, "un-m-1", nodeRef={"kind": "Node", "name": "n-1"})
    return c


# --------------------------------------------------------------------------- handler + drains


async def test_cordon_ack_drain_skips_daemonset_mirror_terminal(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    c = standard_cluster(nursery)
    app = add_pod(c, _pod("app", tgps=20))
    ds = add_pod(c, _pod("fluentd", owner="DaemonSet"))
    mirror = add_pod(c, _pod("kube-proxy", owner=None, mirror=True))
    done = add_pod(c, _pod("job-1", owner="Job", phase="Succeeded"))
    drains, handler, memory = make(c)
    replies = Replies()
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        await handler.on_reclaim_instruction(instr("r-1", "n-1"), replies)
        # the ack went out after the cordon, before the drain finished
        assert replies.acks == [("r-1", 1)]
        assert node_patches(c) == [("n-1", {"spec": {"unschedulable": True}})]
        assert un_writes(c)[0][:3] == ("patch", "un-m-1", {"phase": "Draining"})
        assert memory.get("un-m-1") == "draining"
        await drains.wait_idle()
        inner.cancel_scope.cancel()
    assert [(k, g) for k, g, _ in evictions(c)] == [(app, 20)]
    assert pods(c) == {ds, mirror, done}
    assert [w[:3] for w in un_writes(c)] == [
        ("patch", "un-m-1", {"phase": "Draining"}),
        ("patch", "un-m-1", {"phase": "Drained"}),
        ("delete", "un-m-1", None),
    ]
    assert memory.get("un-m-1") == "drained"
    assert drains.results["n-1"].outcome == "drained"


async def test_machine_id_resolved_through_upcoming_node_ref(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    c = RecordingKube.over_sim(nursery)
    add_node(c, "ip-10-0-0-7")
    add_un(c, "un-m-7", nodeRef={"kind": "Node", "name": "ip-10-0-0-7"})
    drains, handler, _ = make(c)
    replies = Replies()
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "m-7"), replies)
        await drains.wait_idle()
        inner.cancel_scope.cancel()
    assert replies.acks == [("r", 1)]
    assert node_patches(c) == [("ip-10-0-0-7", {"spec": {"unschedulable": True}})]
    assert "un-m-7" not in upcoming(c)  # drained (no pods) and deleted


async def test_node_name_upcoming_found_through_injected_lookup(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    # the shard names the Node itself; its UpcomingNode (un-m-1, nodeRef n-1) comes from the
    # injected lookup (the operator's informer index), not from listing every UpcomingNode.
    c = standard_cluster(nursery)
    asked: list[str] = []

    def lookup(node: str) -> list[dict[str, Any]]:
        asked.append(node)
        return [upcoming(c)["un-m-1"]] if node == "n-1" else []

    memory = DrainMemory()
    drains = DrainManager(c, memory, rng=random.Random(7))
    handler = ReclaimHandler(c, drains, memory, upcoming_lookup=lookup)
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "n-1"), Replies())
        await drains.wait_idle()
        inner.cancel_scope.cancel()
    assert asked == ["n-1"]
    assert c.of("list", "upcomingnodes") == []
    assert un_writes(c)[0][:3] == ("patch", "un-m-1", {"phase": "Draining"})
    assert "un-m-1" not in upcoming(c)  # drained and deleted


def _caches(c: RecordingKube) -> dict[str, Any]:
    """The operator's informer lookups, answered from the sim store as it is now."""
    def by_ref(node: str) -> list[dict[str, Any]]:
        return [u for u in upcoming(c).values()
                if ((u.get("status") or {}).get("nodeRef") or {}).get("name") == node]

    def by_provider(pid: str) -> list[dict[str, Any]]:
        return [n for n in c.objects(NODES).values() if n["spec"].get("providerID") == pid]

    return {"node_get": lambda name: c.objects(NODES).get(name),
            "upcoming_get": lambda name: upcoming(c).get(name),
            "upcoming_lookup": by_ref, "node_lookup": by_provider}


async def _reclaim_with_caches(c: RecordingKube, caches: dict[str, Any],
                               entry: str) -> tuple[list[tuple[str, int]], list[Any]]:
    """One instruction naming ``entry`` through a handler with ``caches``, drained: the acks
    and the reads made before the ack."""
    memory = DrainMemory()
    drains = DrainManager(c, memory, rng=random.Random(7))
    handler = ReclaimHandler(c, drains, memory, **caches)
    replies = Replies()
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        c.history.clear()
        await handler.on_reclaim_instruction(instr("r", entry), replies)
        reads = [(r.op, r.plural, r.name) for r in c.history if r.op in ("get", "list")]
        await drains.wait_idle()
        inner.cancel_scope.cancel()
    return replies.acks, reads


@pytest.mark.parametrize(("entry", "how"), [("n-1", "a Node name"), ("m-1", "a machine id")])
async def test_an_entry_the_caches_know_is_cordoned_without_a_read(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock, entry: str, how: str,
) -> None:
    # The reference cordons the named Node with one merge patch; resolving each entry with
    # reads first (the UpcomingNode by name, the Node by name: one of them a 404 whichever the
    # shard sends) put two to three round trips before every ack, seconds each on a loaded
    # kube-apiserver. The operator's informers know both: only the writes go out.
    c = standard_cluster(nursery)
    acks, reads = await _reclaim_with_caches(c, _caches(c), entry)
    assert acks == [("r", 1)], how
    assert reads == []
    assert node_patches(c) == [("n-1", {"spec": {"unschedulable": True}})]
    assert un_writes(c)[0][:3] == ("patch", "un-m-1", {"phase": "Draining"})


async def test_an_upcoming_node_the_cache_has_not_seen_is_read_for_the_drain_record(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    # The Node is cached, its UpcomingNode (named after the entry) not yet: it is read, so the
    # ack still waits for the drain record on it.
    c = standard_cluster(nursery)
    add_node(c, "m-9")
    add_un(c, "un-m-9", nodeRef={"kind": "Node", "name": "m-9"})
    caches = _caches(c)
    caches["upcoming_get"] = lambda name: None
    caches["upcoming_lookup"] = lambda node: []
    acks, reads = await _reclaim_with_caches(c, caches, "m-9")
    assert acks == [("r", 1)]
    assert reads == [("get", "upcomingnodes", "un-m-9")]
    assert un_writes(c)[0][:3] == ("patch", "un-m-9", {"phase": "Draining"})


async def test_a_node_the_cache_still_holds_but_gone_falls_back_to_reads(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    # The caches lag: they still show un-m-1 pointing at n-1, and n-1, which is deleted; the
    # machine's UpcomingNode now points at n-2. The cordon's 404 sends the entry through the
    # reads, which find n-2 as they did before the caches were used.
    c = standard_cluster(nursery)
    add_node(c, "n-2")
    stale_un = upcoming(c)["un-m-1"]
    stale_node = c.objects(NODES)["n-1"]
    c.server.delete(c._res(NODES), None, "n-1")
    c.server.patch(c._res(UPCOMING_NODES), None, "un-m-1",
                   {"status": {"nodeRef": {"kind": "Node", "name": "n-2"}}}, MERGE,
                   subresource="status")
    caches = _caches(c)
    caches["node_get"] = {"n-1": stale_node}.get
    caches["upcoming_get"] = {"un-m-1": stale_un}.get
    acks, _reads = await _reclaim_with_caches(c, caches, "m-1")
    assert acks == [("r", 1)]
    assert node_patches(c)[-1] == ("n-2", {"spec": {"unschedulable": True}})


async def test_node_name_upcoming_found_by_listing_without_lookup(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    c = standard_cluster(nursery)
    drains, handler, _ = make(c)
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "n-1"), Replies())
        await drains.wait_idle()
        inner.cancel_scope.cancel()
    assert un_writes(c)[0][:3] == ("patch", "un-m-1", {"phase": "Draining"})


async def test_machine_id_resolved_through_provider_id(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    c = RecordingKube.over_sim(nursery)
    add_node(c, "other", provider_id="aws:///us-east-1a/i-2")
    add_node(c, "ip-10-0-0-9", provider_id="aws:///us-east-1a/i-9")
    add_un(c, "un-m-9", phase="Ready", providerID="aws:///us-east-1a/i-9")
    drains, handler, _ = make(c)
    replies = Replies()
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "m-9"), replies)
        inner.cancel_scope.cancel()
    assert node_patches(c) == [("ip-10-0-0-9", {"spec": {"unschedulable": True}})]
    assert replies.acks == [("r", 1)]


async def test_machine_id_resolved_through_injected_provider_id_lookup(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    # un-m-9 has no nodeRef, only a providerID: the Node comes from the injected lookup (the
    # operator's Node informer indexed by spec.providerID), never from listing every Node.
    c = RecordingKube.over_sim(nursery)
    add_node(c, "other", provider_id="aws:///us-east-1a/i-2")
    add_node(c, "ip-10-0-0-9", provider_id="aws:///us-east-1a/i-9")
    add_un(c, "un-m-9", phase="Ready", providerID="aws:///us-east-1a/i-9")
    asked: list[str] = []

    def by_provider(provider_id: str) -> list[dict[str, Any]]:
        asked.append(provider_id)
        # a stale index entry (providerID since changed) is ignored, the matching one used
        stale = {"metadata": {"name": "stale"}, "spec": {"providerID": "aws:///x/i-0"}}
        return [stale] + [n for n in c.objects(NODES).values()
                          if n["spec"]["providerID"] == provider_id]

    memory = DrainMemory()
    drains = DrainManager(c, memory, rng=random.Random(7))
    handler = ReclaimHandler(c, drains, memory, node_lookup=by_provider)
    replies = Replies()
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "m-9"), replies)
        inner.cancel_scope.cancel()
    assert asked == ["aws:///us-east-1a/i-9"]
    assert c.of("list", "nodes") == []
    assert node_patches(c) == [("ip-10-0-0-9", {"spec": {"unschedulable": True}})]
    assert replies.acks == [("r", 1)]


async def test_provider_id_lookup_miss_is_no_node(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    c = RecordingKube.over_sim(nursery)
    add_un(c, "un-m-9", phase="Ready", providerID="aws:///us-east-1a/i-9")
    memory = DrainMemory()
    drains = DrainManager(c, memory, rng=random.Random(7))
    handler = ReclaimHandler(c, drains, memory, node_lookup=lambda pid: [])
    replies = Replies()
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "m-9"), replies)
        inner.cancel_scope.cancel()
    assert node_patches(c) == []
    assert replies.acks == [("r", 0)]  # acked, nothing cordoned
    assert upcoming(c)["un-m-9"]["status"]["phase"] == "Draining"


async def test_nodes_started_counts_only_cordoned(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    c = standard_cluster(nursery)
    add_un(c, "un-m-2", phase="Launched")  # a machine with no Node yet
    drains, handler, memory = make(c)
    replies = Replies()
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "m-2", "n-1", "nonexistent"), replies)
        inner.cancel_scope.cancel()
    assert replies.acks == [("r", 1)]
    # the node-less machine is still walked to Draining and remembered
    assert upcoming(c)["un-m-2"]["status"]["phase"] == "Draining"
    assert memory.get("un-m-2") == "draining"


async def test_pdb_blocks_then_allows(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    c = standard_cluster(nursery)
    key = add_pod(c, _pod("web"))
    refuse(c, key, 2)
    drains, handler, _ = make(c)
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        t0 = trio.current_time()
        await handler.on_reclaim_instruction(instr("r", "n-1", grace=30), Replies())
        await drains.wait_idle()
        elapsed = trio.current_time() - t0
        inner.cancel_scope.cancel()
    assert evicted(c, key) == 3
    times = [t - t0 for k, _, t in evictions(c)]
    # retries every ~2 s with +-25 % jitter
    for a, b in zip(times, times[1:], strict=False):
        assert 1.5 <= b - a <= 2.5
    # rounds: 429, pause, 429, pause, evicted, quick re-check (0.25 s), empty list
    # -> two ~2 s pauses (1.5..2.5 s each) + 0.25 s
    assert 3.25 <= elapsed <= 5.25
    assert drains.results["n-1"].outcome == "drained"
    assert "un-m-1" not in upcoming(c)


async def test_pdb_never_allows_fails_at_deadline(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    c = standard_cluster(nursery)
    key = add_pod(c, _pod("db", ns="prod"))
    pdb_blocks(c, key)
    drains, handler, memory = make(c)
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        t0 = trio.current_time()
        await handler.on_reclaim_instruction(instr("r", "n-1", grace=10), Replies())
        await drains.wait_idle()
        inner.cancel_scope.cancel()
    kind, name, status, at = un_writes(c)[-1]
    assert (kind, name) == ("patch", "un-m-1")
    assert at - t0 == pytest.approx(10.0)
    assert status == {
        "phase": "Failed",
        "lastError": "drain of node n-1 did not finish within 10s; pods left: prod/db "
        "(eviction blocked by PodDisruptionBudget prod/db: The disruption budget db needs 1 "
        "healthy pods and has 1 currently (429: Cannot evict pod as it would violate the pod's "
        "disruption budget.))",
    }
    assert drains.results["n-1"].outcome == "failed"
    assert upcoming(c)["un-m-1"]["status"]["phase"] == "Failed"
    assert memory.get("un-m-1") == "draining"  # a later Idle still means Drained
    # first eviction got the whole (bounded) grace: 10 s left < the pod's 30 s
    assert evictions(c)[0][1] == 10
    assert 4 <= evicted(c, key) <= 7


async def test_short_grace_pod_gone_soon_after_eviction_is_drained(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    # grace 2 s; the evicted pod terminates in 0.3 s. Re-check quickly after an eviction:
    # list at 0 (evict), 0.25 (still Terminating), 0.25 + 0.5 = 0.75 (gone) -> Drained at 0.75.
    c = standard_cluster(nursery)
    key = add_pod(c, _pod("web", tgps=1), hold=True)
    drains, handler, _ = make(c)
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        t0 = trio.current_time()
        release_at(nursery, c, key, t0 + 0.3)
        await handler.on_reclaim_instruction(instr("r", "n-1", grace=2), Replies())
        await drains.wait_idle()
        inner.cancel_scope.cancel()
    assert [t - t0 for t in pod_lists(c)] == pytest.approx([0.0, 0.25, 0.75])
    assert evicted(c, key) == 1  # a Terminating pod is not evicted again
    assert drains.results["n-1"].outcome == "drained"
    assert [w[:3] for w in un_writes(c)][-2:] == [
        ("patch", "un-m-1", {"phase": "Drained"}),
        ("delete", "un-m-1", None),
    ]
    assert un_writes(c)[-1][3] - t0 == pytest.approx(0.75)


async def test_final_check_at_deadline(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    # A pod already Terminating vanishes at 2.9 s; grace 3 s. Polls at 0, 0.25, 0.75, 1.75
    # (0.25/0.5/1.0 s apart), then the pause reaches the ~2 s interval (>= 1.5 s -> past 3 s):
    # the deadline cuts it, and the check made right at the deadline sees no pod -> Drained.
    c = standard_cluster(nursery)
    key = add_pod(c, _pod("web"), hold=True)
    drains, handler, _ = make(c)
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        t0 = trio.current_time()
        terminate(c, key)
        release_at(nursery, c, key, t0 + 2.9)
        await handler.on_reclaim_instruction(instr("r", "n-1", grace=3), Replies())
        await drains.wait_idle()
        assert trio.current_time() - t0 == pytest.approx(3.0)
        inner.cancel_scope.cancel()
    assert [t - t0 for t in pod_lists(c)] == pytest.approx([0.0, 0.25, 0.75, 1.75, 3.0])
    assert evicted(c, key) == 0
    assert drains.results["n-1"].outcome == "drained"
    assert "un-m-1" not in upcoming(c)


async def test_forbidden_stops_for_that_pod(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    c = standard_cluster(nursery)
    stuck = add_pod(c, _pod("stuck"))
    ok = add_pod(c, _pod("ok"))
    refuse(c, stuck, 5, 403, "pdb misconfigured")
    drains, handler, _ = make(c)
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "n-1", grace=8), Replies())
        await drains.wait_idle()
        inner.cancel_scope.cancel()
    assert evicted(c, stuck) == 1
    assert evicted(c, ok) == 1
    assert drains.results["n-1"].outcome == "failed"
    assert drains.results["n-1"].pods_left == {
        stuck: "eviction refused, not retried: 403: pdb misconfigured"
    }


async def test_gone_pod_counts_as_done(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    c = standard_cluster(nursery)
    key = add_pod(c, _pod("ghost"))
    real_list = c.list

    async def list_then_forget(res: Resource, namespace: str | None = None, **kw: Any) -> Any:
        listing = await real_list(res, namespace, **kw)
        if res == PODS and key in pods(c):  # the pod disappears right after it was listed
            ns, name = key.split("/")
            c.server.delete(c.server.find("pods"), ns, name)
        return listing

    c.list = list_then_forget  # type: ignore[method-assign]
    drains, handler, _ = make(c)
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        t0 = trio.current_time()
        await handler.on_reclaim_instruction(instr("r", "n-1"), Replies())
        await drains.wait_idle()
        assert trio.current_time() == t0  # no retry round needed
        inner.cancel_scope.cancel()
    assert drains.results["n-1"].outcome == "drained"


async def test_duplicate_instruction_one_drain_two_acks(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    c = standard_cluster(nursery)
    key = add_pod(c, _pod("web"))
    refuse(c, key, 1)
    drains, handler, _ = make(c)
    replies = Replies()
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        await handler.on_reclaim_instruction(instr("r-1", "n-1"), replies)
        await handler.on_reclaim_instruction(instr("r-1", "n-1"), replies)
        # a different instruction naming a node already draining: acked, no second drain
        await handler.on_reclaim_instruction(instr("r-2", "n-1"), replies)
        assert drains.active == frozenset({"n-1"})
        await drains.wait_idle()
        inner.cancel_scope.cancel()
    assert replies.acks == [("r-1", 1), ("r-1", 1), ("r-2", 1)]
    assert len(node_patches(c)) == 2  # r-1 once, r-2 (idempotent cordon); the duplicate did nothing
    assert evicted(c, key) == 2  # one drain: 429, then allowed


async def test_a_reused_id_naming_other_nodes_is_a_new_instruction(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    """A shard that numbers its instructions from 1 again after a restart re-uses an id for
    another reclaim: it is cordoned, acked and drained as the new instruction it is, never
    re-acked as a duplicate of the first (docs/rules.md#reclaim-instruction-ids). Before: acked
    with no cordon and no drain, and the shard deleted the Node with its Pods on it."""
    c = standard_cluster(nursery)
    add_node(c, "n-2")
    web = add_pod(c, _pod("web"))
    api = add_pod(c, _pod("api", node="n-2"))
    drains, handler, _ = make(c)
    replies = Replies()
    reused = _sample("bigfleet_operator_reclaim_instruction_ids_reused_total")
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        await handler.on_reclaim_instruction(instr("reclaim-000001", "n-1"), replies)
        await drains.wait_idle()
        await handler.on_reclaim_instruction(instr("reclaim-000001", "n-2"), replies)
        await drains.wait_idle()
        # the same id, same node, but another grace period: another instruction as well
        await handler.on_reclaim_instruction(instr("reclaim-000001", "n-2", grace=60), replies)
        # and a true re-issue (same id, same content) is still a duplicate
        await handler.on_reclaim_instruction(instr("reclaim-000001", "n-2", grace=60), replies)
        await drains.wait_idle()
        inner.cancel_scope.cancel()
    assert replies.acks == [("reclaim-000001", 1)] * 4
    assert [name for name, _ in node_patches(c)] == ["n-1", "n-2", "n-2"]
    assert evicted(c, web) == 1 and evicted(c, api) == 1
    assert drains.results["n-2"].outcome == "drained"
    assert _sample("bigfleet_operator_reclaim_instruction_ids_reused_total") - reused == 2


async def test_concurrent_duplicate_waits_for_first(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    c = standard_cluster(nursery)
    drains, handler, _ = make(c)
    replies = Replies()
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        async with trio.open_nursery() as session:
            session.start_soon(handler.on_reclaim_instruction, instr("r", "n-1"), replies)
            session.start_soon(handler.on_reclaim_instruction, instr("r", "n-1"), replies)
        inner.cancel_scope.cancel()
    assert replies.acks == [("r", 1), ("r", 1)]
    assert len(node_patches(c)) == 1


async def test_reconnect_does_not_cancel_drain(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    c = standard_cluster(nursery)
    key = add_pod(c, _pod("web"))
    refuse(c, key, 3)
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
    assert evicted(c, key) == 4


async def test_ack_dropped_is_logged_not_raised(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    c = standard_cluster(nursery)
    drains, handler, _ = make(c)
    replies = Replies(accept=False)
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "n-1"), replies)
        inner.cancel_scope.cancel()
    assert replies.acks == [("r", 1)]


async def test_shutdown_lets_drains_finish_within_timeout(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    c = standard_cluster(nursery)
    key = add_pod(c, _pod("web"))
    refuse(c, key, 3)  # allowed at ~6 s
    drains, handler, _ = make(c, shutdown_timeout=20.0)
    async with trio.open_nursery() as operator:
        await operator.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "n-1", grace=600), Replies())
        await trio.sleep(1)
        operator.cancel_scope.cancel()  # SIGTERM
    assert drains.results["n-1"].outcome == "drained"
    assert "un-m-1" not in upcoming(c)


async def test_shutdown_timeout_abandons_drain(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    c = standard_cluster(nursery)
    key = add_pod(c, _pod("web"))
    pdb_blocks(c, key)
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


async def test_drain_metrics_and_totals(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    # n-1: "web" blocked once (429) then evicted, "ghost" 404, "stuck" 403 -> Failed at 8 s.
    # n-2: "api" evicted at once -> Drained.
    c = standard_cluster(nursery)
    add_node(c, "n-2")
    web = add_pod(c, _pod("web"))
    ghost = add_pod(c, _pod("ghost"))
    stuck = add_pod(c, _pod("stuck"))
    add_pod(c, _pod("api", node="n-2"))
    refuse(c, web, 1)
    refuse(c, ghost, 100, 404, "ghost")  # listed, yet 404 on eviction
    refuse(c, stuck, 5, 403, "no")
    before = _drain_metrics()
    active0 = _sample("bigfleet_operator_drains_active")
    drains, handler, _ = make(c)
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "n-1", "n-2", grace=8), Replies())
        assert _sample("bigfleet_operator_drains_active") - active0 == 2
        await drains.wait_idle()
        inner.cancel_scope.cancel()
    assert _sample("bigfleet_operator_drains_active") == active0
    # "ghost" stays listed (404 on eviction each round): counted per eviction call
    assert evicted(c, ghost) >= 2
    assert _delta(before) == {
        "drains/drained": 1,
        "drains/failed": 1,
        "evictions/evicted": 2,
        "evictions/blocked": 1,
        "evictions/gone": evicted(c, ghost),
        "evictions/refused": 1,
    }
    assert (drains.completed_total, drains.failed_total, drains.abandoned_total) == (1, 1, 0)


async def test_totals_not_bounded_by_results_ring(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    c = RecordingKube.over_sim(nursery)
    for i in range(3):
        add_node(c, f"n-{i}")
    drains, handler, _ = make(c, results_capacity=1)
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "n-0", "n-1", "n-2"), Replies())
        await drains.wait_idle()
        inner.cancel_scope.cancel()
    assert len(drains.results) == 1
    assert drains.completed_total == 3


async def test_start_without_run_is_an_error(nursery: trio.Nursery) -> None:
    drains = DrainManager(RecordingKube.over_sim(nursery), DrainMemory())
    with pytest.raises(RuntimeError):
        drains.start("n", un_name=None, grace_seconds=1, instruction_id="x")


# --------------------------------------------------------------------------- on the test apiserver


def _server_and_client(nursery: trio.Nursery) -> tuple[Any, Any]:
    # the product client's own retries and rate limit (KubeClient's defaults), not the seam's
    return sim_kube(nursery, qps=50, burst=100, max_attempts=5)


DAEMONSETS = OWNERS["DaemonSet"]


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
        PDBS,
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
        PDBS,
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
        "default/web (eviction blocked by PodDisruptionBudget default/web: "
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


def _operator_runtime(nursery: trio.Nursery) -> Any:
    from bigfleet_trio.config import OperatorConfig
    from bigfleet_trio.operator.app import Operator
    from bigfleet_trio.shard.transport import MemoryConnector

    cfg = OperatorConfig(cluster_id="c1", shard_addr="h:1")
    op = Operator(cfg, client=RecordingKube.over_sim(nursery), connector=MemoryConnector())
    op._rt = op.build()
    return op


async def test_statistics_use_cumulative_drain_totals(nursery: trio.Nursery) -> None:
    op = _operator_runtime(nursery)
    drains = op.parts.drains
    drains.completed_total, drains.failed_total, drains.abandoned_total = 5000, 7, 2
    stats = op.statistics()
    assert (stats.drains_completed, stats.drains_failed, stats.drains_abandoned) == (5000, 7, 2)


async def test_reclaim_handler_reads_the_informer_stores_directly(nursery: trio.Nursery) -> None:
    from bigfleet_trio.operator.wiring import slim_node

    op = _operator_runtime(nursery)
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


async def test_multi_node_cordons_all_then_acks_then_drains(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    """docs/rules.md#reclaim-cordon: cordon every named node, ack, and only then drain; no
    eviction may start while a later node of the same instruction is still being cordoned."""
    c = RecordingKube.over_sim(nursery)
    for n in ("n-1", "n-2", "n-3"):
        add_node(c, n)
        add_pod(c, _pod(f"app-{n}", node=n))
    drains, handler, _ = make(c)
    order: list[str] = []

    class Recording(Replies):
        def __call__(self, msg: pb.OperatorMessage) -> bool:
            order.append("ack")
            return super().__call__(msg)

    original_patch, original_evict = c.patch, c.evict

    async def slow_patch(res: Resource, name: str, patch: Any, *a: Any, **kw: Any) -> Any:
        if res == NODES:
            answer = await original_patch(res, name, patch, *a, **kw)
            order.append(f"cordon {name}")
            return answer
        return await original_patch(res, name, patch, *a, **kw)

    async def recording_evict(name: str, namespace: str, **kw: Any) -> None:
        order.append(f"evict {name}")
        await original_evict(name, namespace, **kw)

    # a slow cordon (1 s in the apiserver) gives a premature drain time to evict
    c.server.faults.add_latency(1.0, verb="patch", resource="nodes")
    c.patch = slow_patch  # type: ignore[method-assign]
    c.evict = recording_evict  # type: ignore[method-assign]
    replies = Recording()
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        await handler.on_reclaim_instruction(instr("r", "n-1", "n-2", "n-3"), replies)
        await drains.wait_idle()
        inner.cancel_scope.cancel()
    assert sorted(order[:3]) == ["cordon n-1", "cordon n-2", "cordon n-3"]
    assert order[3] == "ack"
    assert sorted(order[4:]) == ["evict app-n-1", "evict app-n-2", "evict app-n-3"]
    assert replies.acks == [("r", 3)]
    assert {n: r.outcome for n, r in drains.results.items()} == {
        "n-1": "drained", "n-2": "drained", "n-3": "drained",
    }


async def test_many_nodes_are_cordoned_concurrently_before_the_ack(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    """100 nodes whose cordon takes 1 s each: the ack must not wait 100 s (bounded concurrency,
    16 by default -> ceil(100 / 16) = 7 rounds), and nodes_started counts all of them."""
    c = RecordingKube.over_sim(nursery)
    names = [f"n-{i:03d}" for i in range(100)]
    for n in names:
        add_node(c, n)
    drains, handler, _ = make(c)
    c.server.faults.add_latency(1.0, verb="patch", resource="nodes")
    replies = Replies()
    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        start = trio.current_time()
        await handler.on_reclaim_instruction(instr("r", *names), replies)
        took = trio.current_time() - start
        await drains.wait_idle()
        inner.cancel_scope.cancel()
    assert replies.acks == [("r", 100)]
    assert 7.0 <= took < 8.0, took
    assert {name for name, _ in node_patches(c)} == set(names)


async def test_a_leader_that_cannot_renew_stops_its_drains_before_its_lease_can_expire(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    """Leadership lost (no renewal within renew_deadline) cancels the drains at once, with no
    --drain-shutdown-timeout grace: that grace is for a SIGTERM, where the Lease is still held.
    Leader a renews at 2, 4, 6, 8; partitioned at 9, it declares the loss at 20, before its
    Lease can expire (8 + 15 = 23) and another replica can lead
    (docs/rules.md#leadership-loss). Before: its drain went on evicting until 20 + 30 = 50."""
    from bigfleet_trio.kube.client import KubeClient
    from bigfleet_trio.kube.config import KubeConfig
    from bigfleet_trio.kube.leader import LeaderElector
    from tests.kube.fakekube import FakeKube

    fake = FakeKube()
    a = LeaderElector(KubeClient(KubeConfig(server="http://kube.test"),
                                 transport=fake.transport("a"), max_attempts=1),
                      name="bf", namespace="sys", identity="a", rng=lambda: 0.0)
    c = standard_cluster(nursery)
    key = add_pod(c, _pod("web"))
    refuse(c, key, 10**6)  # a budget that never allows: the drain retries every ~2 s
    drains, handler, _ = make(c, shutdown_timeout=30)
    a.on_lost(drains.abandon)

    async def work() -> None:
        async with trio.open_nursery() as inner:
            await inner.start(drains.run)
            await handler.on_reclaim_instruction(instr("r", "n-1", grace=600), Replies())
            await trio.sleep_forever()

    nursery.start_soon(a.run, work)
    await trio.sleep(9)
    fake.partition("a")
    await trio.sleep(60)
    times = [t for k, _, t in evictions(c) if k == key]
    assert times and max(times) <= 20.0, max(times)
    assert drains.abandoned_total == 1 and drains.active == frozenset()


async def test_wait_idle_started_before_a_second_drain_wakes_when_both_end(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    """A ``wait_idle`` caller already waiting when a second drain starts is woken once every
    drain has ended. Before: the second ``start`` replaced the idle event the caller waited on,
    and it was never set."""
    c = standard_cluster(nursery)
    add_node(c, "n-2")
    a = add_pod(c, _pod("a", node="n-1"), hold=True)
    b = add_pod(c, _pod("b", node="n-2"), hold=True)
    drains, _, _ = make(c)
    idle_at: list[float] = []
    woken = trio.Event()

    async def waiter() -> None:
        await drains.wait_idle()
        idle_at.append(trio.current_time())
        woken.set()

    async with trio.open_nursery() as inner:
        await inner.start(drains.run)
        t0 = trio.current_time()
        release_at(inner, c, a, t0 + 10)
        release_at(inner, c, b, t0 + 20)
        assert drains.start("n-1", un_name=None, grace_seconds=60, instruction_id="r-1")
        inner.start_soon(waiter)
        await trio.sleep(1)  # the waiter waits on the first drain's idle event
        assert drains.start("n-2", un_name=None, grace_seconds=60, instruction_id="r-2")
        with trio.move_on_after(120):
            await woken.wait()
        inner.cancel_scope.cancel()
    assert drains.results["n-1"].outcome == "drained"
    assert drains.results["n-2"].outcome == "drained"
    assert len(idle_at) == 1
    assert t0 + 20 <= idle_at[0] <= t0 + 25  # the second drain ends once b is gone
