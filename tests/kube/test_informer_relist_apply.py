"""Applying a big LIST: it yields to the event loop between chunks, keeps one cache (an
unchanged object keeps its cached copy), and the store's single-key index entries."""

from __future__ import annotations

import random
from typing import Any

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.informer import Informer, Store
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS
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
