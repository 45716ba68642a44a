"""The simulated cluster services (workload controllers + scheduler/kubelet) against the embedded
apiserver, in-process: a Deployment becomes a ReplicaSet and Pods bound to the Nodes there, scale
changes follow, a StatefulSet comes up in order, a Job's Pods finish and the Job completes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.resources import (
    DEPLOYMENTS,
    JOBS,
    NAMESPACES,
    NODES,
    PODS,
    PRIORITY_CLASSES,
    REPLICASETS,
    STATEFULSETS,
)
from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.testing import InProcessTransport
from bigfleet_trio.sim.cluster import ClusterServices, run_cluster_services


def node(name: str, cpu: str = "4", **labels: str) -> dict[str, Any]:
    alloc = {"cpu": cpu, "memory": "16Gi", "pods": "110"}
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
            "spec": {},
            "status": {"allocatable": alloc, "capacity": alloc,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def template(app: str, cpu: str = "1", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": app}},
            "spec": {"containers": [{"name": "c", "image": "x",
                                     "resources": {"requests": {"cpu": cpu}}}], **spec}}


@asynccontextmanager
async def cluster(job_run_seconds: float | None = 30.0,
                  server: ApiServer | None = None) -> AsyncIterator[
        tuple[KubeClient, ClusterServices]]:
    server = server or ApiServer()
    async with trio.open_nursery() as nursery:
        client = KubeClient(KubeConfig(server="http://apiserver"),
                            transport=InProcessTransport(server.app, nursery), qps=0)
        services = await nursery.start(lambda task_status: run_cluster_services(
            client, job_run_seconds=job_run_seconds, task_status=task_status))
        yield client, services
        nursery.cancel_scope.cancel()


async def eventually(check: Callable[[], Awaitable[bool]], seconds: float = 60.0) -> None:
    with trio.fail_after(seconds):
        while not await check():  # noqa: ASYNC110 - the condition is read over HTTP
            await trio.sleep(0.5)


async def pods_of(client: KubeClient, prefix: str) -> list[dict[str, Any]]:
    return [p for p in (await client.list(PODS, "default")).items
            if p["metadata"]["name"].startswith(prefix)]


async def add_node(client: KubeClient, body: dict[str, Any]) -> None:
    await client.create(NODES, {"metadata": body["metadata"], "spec": body["spec"]})
    await client.patch(NODES, body["metadata"]["name"], {"status": body["status"]},
                       subresource="status")


async def test_deployment_to_bound_pods_and_scaling(autojump_clock: trio.testing.MockClock) -> None:
    async with cluster() as (client, _services):
        await add_node(client, node("n1", cpu="4"))
        await add_node(client, node("n2", cpu="4"))
        await client.create(PRIORITY_CLASSES, {"metadata": {"name": "high"}, "value": 1000})
        await client.create(DEPLOYMENTS, {
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                     "template": template("web", priorityClassName="high")}})

        async def three_ready() -> bool:
            d = await client.get(DEPLOYMENTS, "web", "default")
            st = d.get("status") or {}
            return st.get("readyReplicas") == 3 and st.get("updatedReplicas") == 3

        await eventually(three_ready)
        rss = (await client.list(REPLICASETS, "default")).items
        assert len(rss) == 1
        rs = rss[0]
        assert rs["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
        h = rs["metadata"]["labels"]["pod-template-hash"]
        assert rs["metadata"]["name"] == f"web-{h}"
        pods = await pods_of(client, "web-")
        assert len(pods) == 3
        for p in pods:
            assert p["metadata"]["ownerReferences"][0]["name"] == rs["metadata"]["name"]
            assert p["metadata"]["labels"] == {"app": "web", "pod-template-hash": h}
            assert p["spec"]["priority"] == 1000  # admitted
            assert p["spec"]["nodeName"] in ("n1", "n2")
            assert p["status"]["phase"] == "Running"
        # bin-packing: 3 x 1 CPU fit on one 4-CPU node
        assert len({p["spec"]["nodeName"] for p in pods}) == 1
        d = await client.get(DEPLOYMENTS, "web", "default")
        st = d["status"]
        assert st["observedGeneration"] == d["metadata"]["generation"]
        assert st["replicas"] == st["availableReplicas"] == 3
        assert {c["type"]: c["reason"] for c in st["conditions"]} == {
            "Available": "MinimumReplicasAvailable", "Progressing": "NewReplicaSetAvailable"}

        # scale to 6: 4 fit on the first node, 2 on the second
        await client.patch(DEPLOYMENTS, "web", {"spec": {"replicas": 6}}, "default")

        async def six_bound() -> bool:
            pods = await pods_of(client, "web-")
            return len(pods) == 6 and all(p["spec"].get("nodeName") for p in pods)

        await eventually(six_bound)
        nodes = sorted(p["spec"]["nodeName"] for p in await pods_of(client, "web-"))
        assert sorted(nodes.count(n) for n in set(nodes)) == [2, 4]

        # scale to 0: every Pod deleted, status back to 0
        await client.patch(DEPLOYMENTS, "web", {"spec": {"replicas": 0}}, "default")

        async def none_left() -> bool:
            d = await client.get(DEPLOYMENTS, "web", "default")
            return not await pods_of(client, "web-") and (d.get("status") or {}).get(
                "replicas") == 0

        await eventually(none_left)
        d = await client.get(DEPLOYMENTS, "web", "default")
        assert "readyReplicas" not in d["status"]


async def test_pending_until_a_node_has_room(autojump_clock: trio.testing.MockClock) -> None:
    async with cluster() as (client, _services):
        await client.create(DEPLOYMENTS, {
            "metadata": {"name": "big", "namespace": "default"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "big"}},
                     "template": template("big", cpu="3")}})
        await eventually(lambda: _count(client, "big-", 2))
        await trio.sleep(5)
        assert not [p for p in await pods_of(client, "big-") if p["spec"].get("nodeName")]
        await add_node(client, node("n1", cpu="4"))  # room for one 3-CPU Pod only

        async def one_bound() -> bool:
            return len([p for p in await pods_of(client, "big-")
                        if p["spec"].get("nodeName")]) == 1

        await eventually(one_bound)
        await trio.sleep(5)
        assert len([p for p in await pods_of(client, "big-") if p["spec"].get("nodeName")]) == 1


async def _count(client: KubeClient, prefix: str, n: int) -> bool:
    return len(await pods_of(client, prefix)) == n


async def test_statefulset_ordered_and_scaled_down_from_the_top(
        autojump_clock: trio.testing.MockClock) -> None:
    async with cluster() as (client, _services):
        await add_node(client, node("n1", cpu="8"))
        await client.create(STATEFULSETS, {
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"replicas": 3, "serviceName": "db",
                     "selector": {"matchLabels": {"app": "db"}}, "template": template("db")}})

        async def ready(n: int) -> bool:
            s = await client.get(STATEFULSETS, "db", "default")
            return (s.get("status") or {}).get("readyReplicas") == n

        await eventually(lambda: ready(3))
        pods = sorted(await pods_of(client, "db-"), key=lambda p: p["metadata"]["name"])
        assert [p["metadata"]["name"] for p in pods] == ["db-0", "db-1", "db-2"]
        # OrderedReady: each Pod was created after its predecessor was Ready
        created = [p["metadata"]["creationTimestamp"] for p in pods]
        assert created == sorted(created)
        assert pods[1]["metadata"]["labels"]["apps.kubernetes.io/pod-index"] == "1"
        assert pods[1]["spec"]["hostname"] == "db-1" and pods[1]["spec"]["subdomain"] == "db"
        s = await client.get(STATEFULSETS, "db", "default")
        assert s["status"]["currentRevision"] == s["status"]["updateRevision"]
        await client.patch(STATEFULSETS, "db", {"spec": {"replicas": 1}}, "default")
        await eventually(lambda: ready(1))
        assert [p["metadata"]["name"] for p in await pods_of(client, "db-")] == ["db-0"]


async def test_job_pods_finish_and_the_job_completes(
        autojump_clock: trio.testing.MockClock) -> None:
    async with cluster(job_run_seconds=10.0) as (client, services):
        await add_node(client, node("n1", cpu="8"))
        await client.create(JOBS, {
            "metadata": {"name": "batch", "namespace": "default"},
            "spec": {"completions": 5, "parallelism": 2,
                     "template": template("batch", restartPolicy="Never")}})

        async def complete() -> bool:
            j = await client.get(JOBS, "batch", "default")
            return any(c["type"] == "Complete" and c["status"] == "True"
                       for c in (j.get("status") or {}).get("conditions") or [])

        t0 = trio.current_time()
        await eventually(complete, 300)
        took = trio.current_time() - t0
        # 5 completions, 2 at a time, 10 s each: three waves
        assert 30 <= took < 45
        j = await client.get(JOBS, "batch", "default")
        assert j["status"]["succeeded"] == 5
        assert "active" not in j["status"]
        assert j["status"]["completionTime"]
        pods = await pods_of(client, "batch-")
        assert len(pods) == 5
        assert {p["status"]["phase"] for p in pods} == {"Succeeded"}
        assert services.scheduler.jobs.succeeded == 5


async def test_pods_of_a_deleted_node_are_replaced(autojump_clock: trio.testing.MockClock) -> None:
    async with cluster() as (client, _services):
        await add_node(client, node("n1", cpu="4"))
        await client.create(NAMESPACES, {"metadata": {"name": "apps"}})
        await client.create(DEPLOYMENTS, {
            "metadata": {"name": "web", "namespace": "apps"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                     "template": template("web")}})

        async def bound_on(node_name: str) -> bool:
            pods = (await client.list(PODS, "apps")).items
            return len(pods) == 2 and all(p["spec"].get("nodeName") == node_name for p in pods)

        await eventually(lambda: bound_on("n1"))
        await add_node(client, node("n2", cpu="4"))
        await client.delete(NODES, "n1")
        await eventually(lambda: bound_on("n2"))
        assert await bound_on("n2")


async def test_a_pod_naming_its_node_and_one_bound_elsewhere(
        autojump_clock: trio.testing.MockClock) -> None:
    async with cluster() as (client, _services):
        await add_node(client, node("n1", cpu="8"))
        await add_node(client, node("n2", cpu="8"))
        pinned = {"metadata": {"name": "pinned", "namespace": "default"},
                  "spec": {"containers": [{"name": "c", "image": "x"}],
                           "affinity": {"nodeAffinity": {
                               "requiredDuringSchedulingIgnoredDuringExecution": {
                                   "nodeSelectorTerms": [{"matchFields": [
                                       {"key": "metadata.name", "operator": "In",
                                        "values": ["n2"]}]}]}}}}}
        # bound by someone else (spec.nodeName set at creation): the kubelet side starts it
        preset = {"metadata": {"name": "preset", "namespace": "default"},
                  "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]}}
        await client.create(PODS, pinned, "default")
        await client.create(PODS, preset, "default")

        async def both_running() -> bool:
            pods = {p["metadata"]["name"]: p for p in (await client.list(PODS, "default")).items}
            return all((pods[n].get("status") or {}).get("phase") == "Running"
                       for n in ("pinned", "preset"))

        await eventually(both_running)
        assert (await client.get(PODS, "pinned", "default"))["spec"]["nodeName"] == "n2"
        assert (await client.get(PODS, "preset", "default"))["spec"]["nodeName"] == "n1"


async def test_failed_pod_deletes_are_retried_not_fatal(
        autojump_clock: trio.testing.MockClock) -> None:
    server = ApiServer()
    async with cluster(server=server) as (client, services):
        await add_node(client, node("n1", cpu="8"))
        await client.create(DEPLOYMENTS, {
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                     "template": template("web")}})
        await eventually(lambda: _count(client, "web-", 3))
        server.faults.fail_next(20, code=500, verb="delete", resource="pods")
        await client.patch(DEPLOYMENTS, "web", {"spec": {"replicas": 0}}, "default")
        await eventually(lambda: _count(client, "web-", 0), 300)
        assert services.controllers.errors >= 1


async def test_running_pods_get_their_own_ips(autojump_clock: trio.testing.MockClock) -> None:
    """Each Running Pod has its own podIP, and hostIP is its Node's (not 10.1.0.1 for all)."""
    async with cluster() as (client, _services):
        await add_node(client, node("n1", cpu="4"))
        await add_node(client, node("n2", cpu="4"))
        await client.create(DEPLOYMENTS, {
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 6, "selector": {"matchLabels": {"app": "web"}},
                     "template": template("web")}})

        async def six_running() -> bool:
            return len([p for p in await pods_of(client, "web-")
                        if (p.get("status") or {}).get("podIP")]) == 6

        await eventually(six_running)
        pods = await pods_of(client, "web-")
        assert len({p["status"]["podIP"] for p in pods}) == 6
        host_of = {p["spec"]["nodeName"]: set() for p in pods}
        for p in pods:
            host_of[p["spec"]["nodeName"]].add(p["status"]["hostIP"])
            assert p["status"]["podIPs"] == [{"ip": p["status"]["podIP"]}]
        assert all(len(ips) == 1 for ips in host_of.values())
        assert len(set().union(*host_of.values())) == len(host_of)
