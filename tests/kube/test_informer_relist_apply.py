"""Applying a big LIST: it yields to the event loop between chunks, keeps one cache (an
unchanged object keeps its cached copy), and the store's single-key index entries."""

from __future__ import annotations

import random
from typing import Any

import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.informer import Informer, Store
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, PODS
from bigfleet_trio.kube.retry import Backoff

from .fakekube import FakeKube

CR = "capacityrequests"


def _cr(name: str, cpu: str = "1") -> dict[str, Any]:
    return {"apiVersion": "bigfleet.lucy.sh/v1alpha1", "kind": "CapacityRequest",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"priority": 1, "resources": {"cpu": cpu}}}


def _informer(fake: FakeKube, transform: Any, chunk: int) -> Informer:
    return Informer(KubeClient(KubeConfig(server="http://kube.test"), transport=fake.transport()),
                    CAPACITY_REQUESTS, transform=transform, page_size=100, apply_chunk=chunk,
                    backoff=Backoff(rng=lambda: 0.0), rng=random.Random(7))


def _cpu(obj: dict[str, Any]) -> dict[str, Any]:
    return {"name": obj["metadata"]["name"], "cpu": obj["spec"]["resources"]["cpu"]}


def test_store_index_one_key_then_many_then_none() -> None:
    store = Store({"owner": lambda o: [o["owner"]]})
    store._set("a", {"owner": "x"})
    assert store.index_keys("owner", "x") == ["a"]
    store._set("b", {"owner": "x"})
    store._set("a", {"owner": "x"})  # re-set with the same value: still once
    assert store.index_keys("owner", "x") == ["a", "b"]
    store._pop("a")
    assert store.by_index("owner", "x") == [{"owner": "x"}]
    store._set("b", {"owner": "y"})
    assert store.index_keys("owner", "x") == [] and store.index_values("owner") == ["y"]
    store._pop("b")
    assert store.index_values("owner") == [] and store.index_keys("owner", "y") == []


async def test_freeze_heap_moves_the_cache_out_of_the_collectors_passes(
    autojump_clock: trio.abc.Clock,
) -> None:
    """docs/kube-api.md#garbage-collector: with ``freeze_heap`` the cached objects end in the
    permanent generation (``gc.get_freeze_count()``); without it nothing is frozen."""
    import gc

    gc.unfreeze()
    try:
        for freeze in (False, True):
            fake = FakeKube()
            for i in range(50):
                fake.seed("pods", {"metadata": {"name": f"p{i}", "namespace": "d"},
                                   "spec": {"n": i}})
            client = KubeClient(KubeConfig(server="http://kube.test"),
                                transport=fake.transport(), max_attempts=1)
            inf = Informer(client, PODS, apply_chunk=10, freeze_heap=freeze)
            async with trio.open_nursery() as nursery:
                await nursery.start(inf.run)
                await inf.wait_synced()
                frozen = gc.get_freeze_count()
                nursery.cancel_scope.cancel()
            assert (frozen > 0) is freeze, frozen
            gc.unfreeze()
    finally:
        gc.unfreeze()


async def test_freeze_heap_never_keeps_a_reference_cycle_that_is_already_garbage(
    autojump_clock: trio.abc.Clock,
) -> None:
    """docs/kube-api.md#garbage-collector: a cycle that is garbage when the informer freezes
    the heap is collected first, not moved where the collector never looks again (a soak
    leaked every such cycle: a failed request's exception and its traceback)."""
    import gc
    import weakref

    class Cycle:
        me: Any = None

    gc.unfreeze()
    try:
        fake = FakeKube()
        for i in range(50):
            fake.seed("pods", {"metadata": {"name": f"p{i}", "namespace": "d"}, "spec": {}})
        client = KubeClient(KubeConfig(server="http://kube.test"),
                            transport=fake.transport(), max_attempts=1)
        inf = Informer(client, PODS, apply_chunk=10, freeze_heap=True)
        gc.disable()  # no collection of its own between the garbage and the freeze
        try:
            garbage = Cycle()
            garbage.me = garbage
            ref = weakref.ref(garbage)
            del garbage
            async with trio.open_nursery() as nursery:
                await nursery.start(inf.run)
                await inf.wait_synced()
                assert gc.get_freeze_count() > 0
                nursery.cancel_scope.cancel()
        finally:
            gc.enable()
        gc.collect()  # a frozen cycle would survive this
        assert ref() is None
    finally:
        gc.unfreeze()


async def test_a_relist_after_a_churn_applies_each_page_as_it_arrives(
    autojump_clock: trio.abc.Clock,
) -> None:
    """docs/kube-api.md#relist-memory: when every object changed (a churn), a relist that held
    the listed objects until its end would hold two caches; each page is applied to the store
    before the next is read, and the objects gone are removed at the end."""
    fake = FakeKube()
    for i in range(300):
        fake.seed(CR, _cr(f"c{i:03}", "1"))
    inf = _informer(fake, _cpu, chunk=50)
    events: list[tuple[str, str]] = []
    inf.add_handler(on_add=lambda o: events.append(("ADDED", o["name"])),
                    on_update=lambda _o, n: events.append(("MODIFIED", n["name"])),
                    on_delete=lambda o: events.append(("DELETED", o["name"])))
    async with trio.open_nursery() as nursery:
        await nursery.start(inf.run)
        await inf.wait_synced()
        nursery.cancel_scope.cancel()
    events.clear()
    for i in range(300):  # the churn: every object changes, ten are deleted, one is new
        if i % 30 == 0:
            fake.remove(CR, "default", f"c{i:03}")
        else:
            fake.modify(CR, "default", f"c{i:03}", {"spec": {"resources": {"cpu": "2"}}})
    fake.seed(CR, _cr("new", "3"))
    applied_per_page: list[int] = []
    list_paged = inf.client.list_paged

    async def spy(*args: Any, on_items: Any, **kwargs: Any) -> str:
        def counted(items: list[dict[str, Any]]) -> None:
            on_items(items)
            applied_per_page.append(sum(o["cpu"] == "2" for o in inf.store.list()))
        return await list_paged(*args, on_items=counted, **kwargs)

    inf.client.list_paged = spy  # type: ignore[method-assign]
    await inf._relist()
    assert applied_per_page == [100, 200, 290]  # 100 listed per page (the last: 90 and "new")
    assert sorted(inf.store.keys()) == sorted(
        [f"default/c{i:03}" for i in range(300) if i % 30] + ["default/new"])
    assert sum(1 for e in events if e[0] == "MODIFIED") == 290
    assert [e for e in events if e[0] == "ADDED"] == [("ADDED", "new")]
    assert events[-10:] == [("DELETED", f"c{i:03}") for i in range(0, 300, 30)]  # last


def test_a_churned_store_gives_its_oversized_tables_back() -> None:
    """docs/kube-api.md#relist-memory: a dict never shrinks as keys are deleted, so after a
    churn that replaced every object the store's tables stayed sized for the burst (the
    150,000-Pod churn ended 150 MB over start-up). Once as many keys were removed as it holds,
    the store rebuilds its dicts, the index ones too."""
    import sys

    store = Store({"owner": lambda o: [o["owner"]]})
    for i in range(20_000):
        store._set(f"old-{i}", {"owner": f"o{i}"})
    for i in range(20_000):  # the churn: a new object in, an old one out
        store._set(f"new-{i}", {"owner": f"n{i}"})
        store._pop(f"old-{i}")
    store.compact_if_churned()
    fresh_items = dict(store._items)
    assert len(store) == 20_000 and store.get("new-7") == {"owner": "n7"}
    assert store.index_keys("owner", "n7") == ["new-7"]
    assert sys.getsizeof(store._items) <= sys.getsizeof(fresh_items)
    assert sys.getsizeof(store._indices["owner"]) <= sys.getsizeof(dict(store._indices["owner"]))
    before = sys.getsizeof(store._items)
    store._pop("new-1")
    store.compact_if_churned()  # one removal is no churn: nothing rebuilt
    assert sys.getsizeof(store._items) == before
