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
