"""Pods and Nodes in Kubernetes protobuf from kube-apiserver: a LIST, a watch and a streaming
list give the informers the projections JSON gives (docs/kube-api.md#protobuf)."""

from __future__ import annotations

from typing import Any

import trio

from bigfleet_trio.kube.informer import Informer
from bigfleet_trio.kube.resources import NODES, PODS
from bigfleet_trio.operator.wiring import slim_node
from bigfleet_trio.podcontroller.projections import slim_pod
from tests.support.realkube import RealKube, until


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                                     "resources": {"requests": {"cpu": "100m"}}}],
                     "nodeSelector": {"no-such-node": "x"}}}


async def test_protobuf_lists_and_watches_match_json(realkube: RealKube) -> None:
    realkube.reset()
    ns = realkube.namespace("pb")
    async with realkube.client() as kube:
        assert kube.protobuf
        for i in range(3):
            await kube.create(PODS, pod(f"p{i}"), ns)
        items: list[dict[str, Any]] = []
        await kube.list_paged(PODS, ns, on_items=items.extend, protobuf=True, limit=2)
        # protobuf items carry the schema's fields only: no managedFields, no creationTimestamp
        assert sorted(i["metadata"]["name"] for i in items) == ["p0", "p1", "p2"]
        assert all("creationTimestamp" not in i["metadata"] for i in items)
        full = (await kube.list(PODS, ns)).items
        assert sorted(map(str, map(slim_pod, items))) == sorted(map(str, map(slim_pod, full)))
        nodes: list[dict[str, Any]] = []
        await kube.list_paged(NODES, on_items=nodes.extend, protobuf=True)
        whole = (await kube.list(NODES)).items
        assert sorted(map(str, map(slim_node, nodes))) == sorted(map(str, map(slim_node, whole)))
        for watch_list in (False, True):
            await _watch_applies(kube, ns, watch_list)
            await kube.create(PODS, pod("p1"), ns)
            await kube.patch(PODS, "p0", {"metadata": {"annotations": None}}, ns)


async def _watch_applies(kube: Any, ns: str, watch_list: bool) -> None:
    """A protobuf informer (paged LIST or streaming list, then a watch) sees a patch and a
    delete."""
    inf = Informer(kube, PODS, namespace=ns, transform=slim_pod, protobuf=True,
                   watch_list=watch_list)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(inf.run)
        await inf.wait_synced()
        assert len(inf.store) == 3
        await kube.patch(PODS, "p0", {"metadata": {"annotations": {
            "bigfleet.lucy.sh/interruption-penalty": "7"}}}, ns)
        await kube.delete(PODS, "p1", ns, grace_period_seconds=0)

        async def applied() -> bool:
            p0 = inf.store.get(f"{ns}/p0")
            return (f"{ns}/p1" not in inf.store and p0 is not None
                    and p0["metadata"].get("annotations") is not None)

        await until("the watch applied the patch and the delete", applied, 60)
        nursery.cancel_scope.cancel()
