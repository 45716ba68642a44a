"""The fault matrix on the real control plane (FAULTS.md, "Real control plane"): both binaries as
processes under the shipped RBAC, each reaching kube-apiserver through a TCP proxy the test
controls, the operator reaching the shard through another; faults in the link, etcd and
kube-apiserver. What happened is read from kube-apiserver's own audit log
(scripts/realkube/controlplane.py, AUDIT_POLICY), not from our logs:

- no Pod is evicted twice;
- no Pod is left on a Node the shard deleted;
- no UpcomingNode is lost (its life is walked in order to its end) or resurrected (created
  again after its deletion).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import trio
import yaml

from bigfleet_trio.kube.resources import (
    DEPLOYMENTS,
    EVENTS,
    LEASES,
    NODES,
    PDBS,
    PODS,
    UPCOMING_NODES,
)
from tests.realkube.agent import (
    Agent,
    container,
    deleted,
    deployment,
    history,
    phase,
)
from tests.support.audit import evictions_by_pod, read_writes
from tests.support.realkube import NS, OPERATOR_SA, POD_CONTROLLER_SA, RealKube
from tests.support.tcpproxy import TcpProxy

pytestmark = [pytest.mark.realkube, pytest.mark.slow]

UPCOMING_ORDER = ["Provisioning", "Launched", "Registered", "Ready", "Draining", "Drained"]
#: Long enough that the drain is still in flight after every fault here (the shard takes the
#: machine when it ends: docs/deviations.md 13.5).
GRACE = "120"
#: Pods the agent does not count as demand (a Gt requirement the wire cannot carry), put on the
#: reclaimed machine directly, guarded by a budget that allows no disruption.
GT = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [
        {"key": "bigfleet.test/generation", "operator": "Gt", "values": ["0"]}]}]}}}


@dataclass
class Links:
    """The proxies between the processes: ``api`` (both binaries -> kube-apiserver) and
    ``shard`` (operator -> shard)."""

    api: TcpProxy
    shard: TcpProxy


def _via(rk: RealKube, tmp: Path, sa: str, port: int) -> Path:
    """A kubeconfig with ServiceAccount ``sa``'s token, reaching kube-apiserver at ``port``."""
    path = rk.cp.write_kubeconfig(tmp / f"{sa}.via-proxy.kubeconfig",
                                  token=rk.cp.token(NS, sa), user=sa)
    doc = yaml.safe_load(path.read_text())
    doc["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(doc))
    return path


@asynccontextmanager
async def proxied_agent(rk: RealKube, tmp: Path, prefix: str
                        ) -> AsyncIterator[tuple[Agent, str, Links]]:
    """A fresh namespace, the sim shard (reclaim grace :data:`GRACE`), and both binaries
    behind the proxies; yields the agent, the namespace and the links."""
    rk.reset()
    ns = rk.namespace(prefix)
    async with rk.client() as admin, trio.open_nursery() as nursery:
        a = Agent(rk, tmp, nursery, admin)
        try:
            await a.start_shard("--reclaim-grace", GRACE)
            api = TcpProxy("127.0.0.1", int(urlparse(rk.cp.server).port or 0))
            shard = TcpProxy("127.0.0.1", a.shard_port)
            api_port = await nursery.start(api.run)
            shard_port = await nursery.start(shard.run)
            await a.start_pod_controller(
                kubeconfig=_via(rk, tmp, POD_CONTROLLER_SA, api_port))
            await a.start_operator(kubeconfig=_via(rk, tmp, OPERATOR_SA, api_port),
                                   shard_port=shard_port)
            await a.ready("pod-controller")
            await a.ready("operator")
            yield a, ns, Links(api, shard)
        finally:
            await a.stop()
            nursery.cancel_scope.cancel()


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def blocked_drain(a: Agent, ns: str) -> tuple[str, str, list[dict[str, Any]]]:
    """One machine Ready under a one-replica Deployment, two guarded Pods put on its Node, a
    PodDisruptionBudget allowing no disruption, then the demand withdrawn: returns once the
    operator's drain of that Node is blocked by the budget (an EvictionBlocked Event). Returns
    the UpcomingNode's name, the Node's and the UpcomingNode recorder."""
    kube = a.admin
    seen = await a.record(UPCOMING_NODES)
    await kube.create(DEPLOYMENTS, deployment("demand", 1, "1"), ns)

    async def one_ready() -> bool:
        ups = (await kube.list(UPCOMING_NODES)).items
        return len(ups) == 1 and phase(ups[0]) == "Ready"

    await a.until("one UpcomingNode Ready", one_ready, 120)
    (up,) = (await kube.list(UPCOMING_NODES)).items
    node = up["status"]["nodeRef"]["name"]
    for name in ("guarded-0", "guarded-1"):
        await kube.create(PODS, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "guarded"}},
            "spec": {"nodeName": node, "affinity": GT, "containers": [container("100m")]}}, ns)
    await kube.create(PDBS, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guarded"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "guarded"}}}}, ns)

    async def budget_computed() -> bool:
        st = (await kube.get(PDBS, "guarded", ns)).get("status") or {}
        return st.get("currentHealthy") == 2 and st.get("disruptionsAllowed") == 0

    await a.until("the PDB's status (0 disruptions allowed)", budget_computed)
    await kube.patch(DEPLOYMENTS, "demand", {"spec": {"replicas": 0}}, ns)

    async def blocked() -> bool:
        return any(e["reason"] == "EvictionBlocked"
                   for e in (await kube.list(EVENTS, ns)).items)

    await a.until("the drain blocked by the PodDisruptionBudget", blocked, 120)
    return up["metadata"]["name"], node, seen


async def relax_and_finish(a: Agent, ns: str, upcoming: str, node: str,
                           seen: list[dict[str, Any]], since: str) -> None:
    """Allow the disruption (the budget deleted: relaxing it would wait on the disruption
    controller's next status), wait for the drain to end (UpcomingNode Drained and deleted, the
    Node deleted by the shard) and check the audit log and the cluster (module docstring)."""
    kube = a.admin
    await kube.delete(PDBS, "guarded", ns)

    async def finished() -> bool:
        nodes = {n["metadata"]["name"] for n in (await kube.list(NODES)).items}
        ups = {u["metadata"]["name"] for u in (await kube.list(UPCOMING_NODES)).items}
        return upcoming not in ups and node not in nodes

    await a.until("the drain to finish and the shard to delete the Node", finished, 180)
    await a.until_recorded("the UpcomingNode's deletion", seen,
                           lambda seen: deleted(seen, upcoming))
    # no Pod left on the deleted Node (the guarded Pods were evicted, not orphaned)
    left = [p["metadata"]["name"] for p in (await kube.list(PODS, ns)).items
            if p["spec"].get("nodeName") == node]
    assert left == [], (left, a.logs())
    writes = read_writes(a.rk.cp.audit_log, since=since)
    evicted = evictions_by_pod(writes, ns)
    assert evicted == {"guarded-0": 1, "guarded-1": 1}, (evicted, a.logs())
    # the UpcomingNode walked its life in order to its end, and was not created again after
    phases = history(seen, upcoming)
    assert phases[-1] in ("Draining", "Drained") and _ordered(phases), phases
    lives = [w for w in writes if w.resource == "upcomingnodes" and w.name == upcoming
             and w.verb in ("create", "delete") and w.code < 300]
    assert [w.verb for w in lives][-1:] == ["delete"], lives


def _ordered(phases: list[str]) -> bool:
    ranks = [UPCOMING_ORDER.index(p) for p in phases if p in UPCOMING_ORDER]
    return ranks == sorted(ranks)


async def test_link_blackholed_60s_with_a_blocked_drain_in_flight(
    realkube: RealKube, tmp_path: Path
) -> None:
    async with proxied_agent(realkube, tmp_path, "blackhole") as (a, ns, links):
        upcoming, node, seen = await blocked_drain(a, ns)
        since = now()
        links.api.blackhole()
        await trio.sleep(60)  # the fault's length: a real partition, not simulated time
        links.api.heal()
        await relax_and_finish(a, ns, upcoming, node, seen, since)


async def test_kube_apiserver_restarted_mid_drain(realkube: RealKube, tmp_path: Path) -> None:
    async with proxied_agent(realkube, tmp_path, "apirestart") as (a, ns, _links):
        upcoming, node, seen = await blocked_drain(a, ns)
        since = now()
        await trio.to_thread.run_sync(realkube.cp.restart, "kube-apiserver")
        await relax_and_finish(a, ns, upcoming, node, seen, since)


async def test_etcd_restarted_mid_drain(realkube: RealKube, tmp_path: Path) -> None:
    async with proxied_agent(realkube, tmp_path, "etcdrestart") as (a, ns, _links):
        upcoming, node, seen = await blocked_drain(a, ns)
        since = now()
        await trio.to_thread.run_sync(realkube.cp.restart, "etcd")
        await relax_and_finish(a, ns, upcoming, node, seen, since)


def _second_operator_identity(rk: RealKube, sa: str) -> None:
    """ServiceAccount ``sa`` bound to exactly the operator's roles, so the audit log tells two
    replicas apart by user (replicas of one Deployment share a ServiceAccount; here they may
    not, or the log could not say who wrote)."""
    def ok(r: Any) -> None:
        assert r.status_code in (200, 201, 409), r.text

    ok(rk.cp.request("POST", f"/api/v1/namespaces/{NS}/serviceaccounts", {
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}}))
    subject = [{"kind": "ServiceAccount", "name": sa, "namespace": NS}]
    for kind, role in (("ClusterRole", "bigfleet-operator"),
                       ("ClusterRole", "bigfleet-metrics-auth")):
        ok(rk.cp.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{sa}-{role}"}, "subjects": subject,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role}}))
    ok(rk.cp.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": f"{sa}-leader-election"}, "subjects": subject,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "bigfleet-operator-leader-election"}}))


async def test_leader_partitioned_while_a_follower_waits(
    realkube: RealKube, tmp_path: Path
) -> None:
    """Two operators with --leader-elect, each behind its own proxy and under its own
    ServiceAccount; the leader's link is blackholed mid-drain. From the audit log: no write by
    the old leader lands after the new leader's first write (docs/rules.md#leadership-loss)."""
    rk = realkube
    rk.reset()
    ns = rk.namespace("partition")
    second = "bigfleet-operator-b"
    _second_operator_identity(rk, second)
    users = {"operator-0": f"system:serviceaccount:{NS}:{OPERATOR_SA}",
             "operator-1": f"system:serviceaccount:{NS}:{second}"}
    async with rk.client() as admin, trio.open_nursery() as nursery:
        a = Agent(rk, tmp_path, nursery, admin)
        try:
            await a.start_shard("--reclaim-grace", GRACE)
            api_port = int(urlparse(rk.cp.server).port or 0)
            links = {name: TcpProxy("127.0.0.1", api_port) for name in users}
            await a.start_pod_controller()
            for name, sa in ((("operator-0", OPERATOR_SA), ("operator-1", second))):
                port = await nursery.start(links[name].run)
                await a.start_operator(name, leader_elect=True,
                                       kubeconfig=_via(rk, tmp_path, sa, port))
            await a.ready("pod-controller")

            async def holder() -> str:
                lease = await admin.get(LEASES, "bigfleet-operator", NS)
                return str(lease["spec"].get("holderIdentity") or "").split("_")[0]

            async def held() -> bool:
                return bool(await holder())

            await a.until("a leader", held)
            first = await holder()
            other = next(n for n in users if n != first)
            await a.ready(first)
            upcoming, node, seen = await blocked_drain(a, ns)
            since = now()
            links[first].blackhole()  # kept for the rest of the test: never healed

            async def taken_over() -> bool:
                return await holder() == other

            await a.until(f"{other} to take the Lease", taken_over, 60)
            await relax_and_finish(a, ns, upcoming, node, seen, since)
            writes = read_writes(rk.cp.audit_log, since=since)
            new_first = min(w.at for w in writes if w.user == users[other])
            late = [w for w in writes if w.user == users[first] and w.at >= new_first]
            assert late == [], late
        finally:
            await a.stop()
            nursery.cancel_scope.cancel()
