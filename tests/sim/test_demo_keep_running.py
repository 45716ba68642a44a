"""``bigfleet-trio demo --keep-running`` after its scenario is a cluster to explore (README.md,
the demo section): the workload controllers ``sim cluster`` runs serve it, so a Deployment
created through its apiserver gets Pods, and they get machines and are bound; a Pod applied
with kubectl shows on the live page (its demand, then a machine and its Ready UpcomingNode).

Real sockets and real time (the demo's own processes over loopback), each wait bounded; the
scenario runs over one small workload so it converges in seconds.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import load_kubeconfig
from bigfleet_trio.kube.resources import DEPLOYMENTS, JOBS, PODS
from bigfleet_trio.sim.cluster.scheduler import RUN_SECONDS_ANNOTATION
from bigfleet_trio.sim.demo import run_scenario
from bigfleet_trio.sim.demo_options import DemoOptions
from tests.support.kubectl import KUBECTL, run_kubectl

pytestmark = pytest.mark.slow  # a whole demo per test, on real time

Pods = dict[str, dict[str, Any]]


def _deployment(name: str, replicas: int, cpu: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [
                     {"name": "app", "image": "registry.k8s.io/pause:3.10",
                      "resources": {"requests": {"cpu": cpu, "memory": "256Mi"}}}]}}},
    }


def _opts(tmp_path: Path) -> DemoOptions:
    """One cluster over one 1-replica Deployment: scaled up, scaled down, its machine reclaimed."""
    workloads = tmp_path / "workloads"
    workloads.mkdir()
    (workloads / "tiny.yaml").write_text(json.dumps(_deployment("tiny", 1, "500m")))
    return DemoOptions(workloads_dir=str(workloads), clusters=1, timeout=120.0, seed=1,
                       quiet=True)


async def _pods_until(client: KubeClient, done: Callable[[Pods], bool]) -> Pods:
    """The default namespace's Pods once ``done`` holds for them (a list, then its watch)."""
    listed = await client.list(PODS, "default")
    pods = {p["metadata"]["name"]: p for p in listed.items}
    if done(pods):
        return pods
    async with client.watch(PODS, "default", resource_version=listed.resource_version) as events:
        async for ev in events:
            name = (ev.object.get("metadata") or {}).get("name")
            if ev.type == "DELETED":
                pods.pop(name, None)
            elif ev.type in ("ADDED", "MODIFIED"):
                pods[name] = ev.object
            if done(pods):
                return pods
    raise AssertionError(f"the Pod watch ended: {sorted(pods)}")


def _of(pods: Pods, deployment: str) -> list[dict[str, Any]]:
    """The live Pods a ReplicaSet of ``deployment`` owns."""
    return [p for p in pods.values()
            if not p["metadata"].get("deletionTimestamp")
            and any(r.get("kind") == "ReplicaSet" and r.get("name", "").startswith(
                f"{deployment}-") for r in p["metadata"].get("ownerReferences") or [])]


async def test_a_deployment_created_after_the_scenario_gets_pods_bound_on_machines(
        tmp_path: Path) -> None:
    got: Pods = {}

    async def explore(summary: Any) -> None:
        assert summary.ok, summary.failure
        cfg = load_kubeconfig(summary.kubeconfig, env={})
        async with KubeClient(cfg, qps=0) as client:
            await client.create(DEPLOYMENTS, _deployment("web", 2, "1"), "default")
            with trio.fail_after(60):  # before: no Pod ever came (no controller ran)
                got.update(await _pods_until(client, lambda ps: len(_of(ps, "web")) == 2 and all(
                    p["spec"].get("nodeName") for p in _of(ps, "web"))))

    with trio.fail_after(200):
        await run_scenario(_opts(tmp_path), out=io.StringIO(), keep_running=explore)
    web = _of(got, "web")
    assert len(web) == 2
    assert len({p["metadata"]["ownerReferences"][0]["name"] for p in web}) == 1  # one ReplicaSet


def _page_socket(page: str) -> str:
    """The live page's ``/fleet`` WebSocket URL (with the run's token) from its printed URL."""
    url = urlsplit(page)
    return f"ws://{url.netloc}/fleet?{url.query}"


async def test_a_pod_applied_with_kubectl_shows_on_the_live_page(tmp_path: Path) -> None:
    from trio_websocket import open_websocket_url

    states: list[dict[str, Any]] = []
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "late", "namespace": "default"},
           "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}]}}

    def shows_it(state: dict[str, Any]) -> bool:
        [c] = state["clusters"]
        return (any(d["cpu"] == "2" and d["machines"] >= 1 for d in c["demand"])
                and c["machines"] >= 1 and c["phases"].get("Ready", 0) >= 1)

    async def explore(summary: Any) -> None:
        assert summary.ok, summary.failure
        async with open_websocket_url(_page_socket(summary.page)) as ws:
            states.append(json.loads(await ws.get_message()))
            if KUBECTL is not None:
                manifest = tmp_path / "late.json"
                manifest.write_text(json.dumps(pod))
                await run_kubectl(summary.kubeconfig, tmp_path, "apply", "-f", str(manifest))
            else:  # the same create, through the REST path kubectl takes
                cfg = load_kubeconfig(summary.kubeconfig, env={})
                async with KubeClient(cfg, qps=0) as client:
                    await client.create(PODS, pod, "default")
            with trio.fail_after(60):
                while not shows_it(states[-1]):
                    states.append(json.loads(await ws.get_message()))

    with trio.fail_after(200):
        await run_scenario(_opts(tmp_path), out=io.StringIO(), keep_running=explore)
    [before] = states[0]["clusters"]
    assert before["name"] == "demo-cluster"
    assert not any(d["cpu"] == "2" for d in before["demand"])  # the scenario's was 500m
    assert shows_it(states[-1])


def _job(name: str, run_seconds: str) -> dict[str, Any]:
    """A one-Pod Job whose Pod runs ``run_seconds`` (the simulation's kubelet reads the
    annotation) once it is Running."""
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"completions": 1, "parallelism": 1, "template": {
            "metadata": {"annotations": {RUN_SECONDS_ANNOTATION: run_seconds}},
            "spec": {"restartPolicy": "Never", "containers": [
                {"name": "work", "image": "registry.k8s.io/pause:3.10",
                 "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}}}]}}},
    }


async def _job_until(client: KubeClient, name: str,
                     done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The Job ``name`` in the default namespace once ``done`` holds for it (a get, its watch)."""
    job = await client.get(JOBS, name, "default")
    if done(job):
        return job
    rv = job["metadata"]["resourceVersion"]
    async with client.watch(JOBS, "default", resource_version=rv) as events:
        async for ev in events:
            if ev.type == "MODIFIED" and ev.object["metadata"]["name"] == name and done(ev.object):
                return ev.object
    raise AssertionError(f"the Job watch ended before {name} was done")


async def test_a_job_created_after_the_scenario_runs_to_completion(tmp_path: Path) -> None:
    done: dict[str, Any] = {}

    def succeeded(pods: Pods) -> bool:
        return any((p.get("status") or {}).get("phase") == "Succeeded"
                   and any(r.get("kind") == "Job" and r.get("name") == "batch"
                           for r in p["metadata"].get("ownerReferences") or [])
                   for p in pods.values())

    async def explore(summary: Any) -> None:
        assert summary.ok, summary.failure
        cfg = load_kubeconfig(summary.kubeconfig, env={})
        async with KubeClient(cfg, qps=0) as client:
            await client.create(JOBS, _job("batch", "1"), "default")
            with trio.fail_after(60):  # before: the Pod was bound and ran for ever
                await _pods_until(client, succeeded)
            with trio.fail_after(30):  # the Job controller then counts it
                done.update(await _job_until(client, "batch", lambda j: (
                    j.get("status") or {}).get("succeeded") == 1))

    with trio.fail_after(200):
        await run_scenario(_opts(tmp_path), out=io.StringIO(), keep_running=explore)
    assert done["status"]["succeeded"] == 1
