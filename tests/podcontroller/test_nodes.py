"""NodeWatch without an apiserver: the Node view answers, which Node changes re-queue Pods, and
the re-queue scan (docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.informer import Store
from bigfleet_trio.kube.workqueue import WorkQueue
from bigfleet_trio.podcontroller.keys import PodKey, QueueKey
from bigfleet_trio.podcontroller.nodes import SCAN_CHUNK, NodeWatch
from bigfleet_trio.podcontroller.scope import NodeView, PodScope


def cached_pod(name: str, node: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": name}
    if node is not None:
        meta["nodeName"] = node
    return {"metadata": meta, "spec": {}}


def watch(pods: Store) -> tuple[NodeWatch, WorkQueue[QueueKey]]:
    queue: WorkQueue[QueueKey] = WorkQueue()
    client = KubeClient(KubeConfig(server="http://kube.test"))
    return NodeWatch(client, PodScope.parse(), pods, queue), queue


async def drain(queue: WorkQueue[QueueKey]) -> set[str]:
    keys: set[str] = set()
    while len(queue):
        item = await queue.get()
        keys.add(str(item))
        queue.done(item)
    return keys


def test_only_a_cached_unmanaged_node_makes_a_pod_unmanaged() -> None:
    nw, _ = watch(Store())
    nw.informer.store._set("sys", NodeView("sys", True))
    nw.informer.store._set("work", NodeView("work", False))
    assert nw.unmanaged(cached_pod("a", "sys"))
    assert not nw.unmanaged(cached_pod("b", "work"))
    assert not nw.unmanaged(cached_pod("c", "unknown"))
    assert not nw.unmanaged(cached_pod("d", None))


def test_changes_that_can_flip_a_pod_are_remembered_once_live() -> None:
    nw, _ = watch(Store())
    nw._on_add(NodeView("early", True))
    assert nw._changed == set()  # before sync: the first resync covers every Pod
    nw.live = True
    nw._on_add(NodeView("managed", False))  # unknown was managed already
    nw._on_update(NodeView("same", True), NodeView("same", True))
    nw._on_delete(NodeView("gone-managed", False))
    assert nw._changed == set()
    nw._on_add(NodeView("new", True))
    nw._on_update(NodeView("flip", False), NodeView("flip", True))
    nw._on_update(NodeView("back", True), NodeView("back", False))
    nw._on_delete(NodeView("gone", True))
    assert nw._changed == {"new", "flip", "back", "gone"}


async def test_requeue_scans_the_pod_cache_and_yields(
        autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    pods = Store()
    n = 2 * SCAN_CHUNK + 5
    for i in range(n):
        pod = cached_pod(f"p{i}", "sys" if i % 3 == 0 else "work" if i % 3 == 1 else None)
        pods._set(f"ns/p{i}", pod)
    nw, queue = watch(pods)
    # count the scan's yields to the loop itself: a task counting its own turns depends on
    # Trio's (randomised) run order
    yields = 0
    checkpoint = trio.lowlevel.checkpoint

    async def counted() -> None:
        nonlocal yields
        yields += 1
        await checkpoint()

    monkeypatch.setattr(trio.lowlevel, "checkpoint", counted)
    queued = await nw.requeue_bound({"sys"})
    monkeypatch.undo()
    assert queued == len(range(0, n, 3))
    assert await drain(queue) == {str(PodKey("ns", f"p{i}")) for i in range(0, n, 3)}
    assert yields == n // SCAN_CHUNK  # one between each two chunks
