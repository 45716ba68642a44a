"""On kube-apiserver, the rule that drops unchanged Pod events holds: a status write leaves the
generation alone and is skipped; a spec change bumps it and a kept annotation changes the
projection, and both reach the handlers, on protobuf and on JSON watches
(docs/kube-api.md#unchanged-pod-events)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from bigfleet_trio.kube.disruption import DO_NOT_DISRUPT
from bigfleet_trio.kube.informer import Informer
from bigfleet_trio.kube.resources import PODS
from bigfleet_trio.podcontroller.projections import pod_unchanged, slim_pod
from tests.support.realkube import RealKube, until


def _pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                                     "resources": {"requests": {"cpu": "100m"}}}],
                     "nodeSelector": {"no-such-node": "x"}}}  # stays Pending, unbound


@pytest.mark.parametrize("protobuf", [True, False], ids=["protobuf", "json"])
async def test_status_writes_are_skipped_and_changes_are_not(realkube: RealKube,
                                                             protobuf: bool) -> None:
    realkube.reset()
    ns = realkube.namespace("unchanged-pb" if protobuf else "unchanged-json")
    async with realkube.client() as kube:
        kube.protobuf = protobuf
        await kube.create(PODS, _pod("p"), ns)
        inf = Informer(kube, PODS, namespace=ns, transform=slim_pod, protobuf=True,
                       unchanged=pod_unchanged)
        updates: list[dict[str, Any]] = []
        inf.add_handler(on_update=lambda _old, new: updates.append(new))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(inf.run)
            await inf.wait_synced()
            generation = inf.store.get(f"{ns}/p")["metadata"]["generation"]
            before = inf.unchanged_events  # kube-scheduler's PodScheduled=False may be in it

            # a kubelet-like status write: a condition, the phase unchanged
            await kube.patch(PODS, "p", {"status": {"conditions": [
                {"type": "bigfleet.test/Probe", "status": "True"}]}}, ns, subresource="status")

            async def skipped() -> bool:
                return inf.unchanged_events > before

            await until("the status write skipped as unchanged", skipped, 60)
            got = await kube.get(PODS, "p", ns)
            assert got["metadata"]["generation"] == generation  # the rule's premise
            assert updates == []  # status writes (ours, the scheduler's) change nothing kept

            # a spec change (a mutable field): the generation moves, the event goes through
            await kube.patch(PODS, "p", {"spec": {"activeDeadlineSeconds": 3600}}, ns)

            async def updated(count: int) -> bool:
                return len(updates) == count

            await until("the spec change reached the handler", lambda: updated(1), 60)
            assert updates[0]["metadata"]["generation"] == generation + 1

            # a kept annotation: the projection changes, the generation does not
            await kube.patch(PODS, "p", {"metadata": {"annotations": {DO_NOT_DISRUPT: "true"}}},
                             ns)
            await until("the annotation reached the handler", lambda: updated(2), 60)
            assert updates[1]["metadata"]["annotations"] == {DO_NOT_DISRUPT: "true"}
            assert updates[1]["metadata"]["generation"] == generation + 1
            nursery.cancel_scope.cancel()
