"""``kubectl describe pod`` shows what became of the Pod's demand, and ``kubectl get cr`` its
conditions: the operator's outcome pass runs in process against the embedded apiserver served
on loopback, the real kubectl reads the result back."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, NAMESPACES, PODS
from bigfleet_trio.operator import outcomes as oc
from bigfleet_trio.operator.crview import slim
from bigfleet_trio.operator.kubeevents import EventRecorder
from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig
from tests.operator.test_outcomes import NOW, cr, offer, upcoming
from tests.support.kubectl import KUBECTL_MARKS, run_kubectl

pytestmark = KUBECTL_MARKS
kubectl = run_kubectl


async def pod_and_cr(client: KubeClient, name: str, **kw: Any) -> None:
    pod = await client.create(PODS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}, "team")
    uid = pod["metadata"]["uid"]
    body = cr(**kw)
    status = body.pop("status")
    body["metadata"].update(name=f"cr-{uid}", labels={"bigfleet.lucy.sh/owned-by-pod": uid})
    body["metadata"]["ownerReferences"][0].update(name=name, uid=uid)
    await client.create(CAPACITY_REQUESTS, body, "team")
    await client.patch(CAPACITY_REQUESTS, f"cr-{uid}", {"status": status}, "team",
                       patch_type="merge", subresource="status")


async def test_kubectl_describe_shows_the_outcome_events_in_order(tmp_path: Path) -> None:
    server = ApiServer()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(partial(serve, server, engine="fast"))
        kubeconfig = str(tmp_path / "kubeconfig")
        write_kubeconfig(url, kubeconfig)
        async with KubeClient(KubeConfig(server=url)) as client:
            await client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": "team"}})
            await pod_and_cr(client, "served")
            await pod_and_cr(client, "starved", memory="1Ti")
            recorder = EventRecorder(client)
            await nursery.start(recorder.run)
            machines: list[dict[str, Any]] = []

            async def crs() -> list[dict[str, Any]]:
                return [slim(o) for o in (await client.list(CAPACITY_REQUESTS, "team")).items]

            for coming in ([], [upcoming()]):
                machines[:] = coming
                listed = await crs()
                writer = oc.OutcomeWriter(client, crs=lambda listed=listed: listed,
                                          upcoming=lambda: machines, offers=lambda: [offer()],
                                          events=recorder, now=lambda: NOW)
                await writer.run_once()
            await recorder.wait_written()
            served = await kubectl(kubeconfig, tmp_path, "describe", "pod", "-n", "team",
                                   "served")
            starved = await kubectl(kubeconfig, tmp_path, "describe", "pod", "-n", "team",
                                    "starved")
            table = await kubectl(kubeconfig, tmp_path, "get", "cr", "-n", "team")
        nursery.cancel_scope.cancel()
    events = served.split("Events:", 1)[1]
    assert "CapacityRequested" in events and "MachineComing" in events
    assert events.index("CapacityRequested") < events.index("MachineComing")
    assert "Warning  NoCapacityOffered" in starved.split("Events:", 1)[1]
    header = table.splitlines()[0].split()
    assert header[-3:] == ["SENT", "OFFERED", "COMING"]
    rows = [ln.split() for ln in table.splitlines()[1:]]
    assert sorted(r[-3:] for r in rows) == [["True", "False", "False"], ["True", "True", "True"]]
