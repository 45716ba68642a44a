"""Both binaries on the real control plane, as users run them (tests/realkube/agent.py): CLI
processes with ServiceAccount tokens under the shipped RBAC, the sim shard registering Nodes,
kube-scheduler binding, kwok running the Pods, the real controllers (Deployment, ReplicaSet, Job,
garbage collector, disruption) doing the rest.

Every wait is a bounded poll on what the cluster shows; no test asserts how long anything took.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.resources import (
    CAPACITY_REQUESTS,
    DEPLOYMENTS,
    EVENTS,
    JOBS,
    NODES,
    PDBS,
    PODS,
    UPCOMING_NODES,
)
from tests.realkube.agent import (
    acknowledged,
    agent_in_namespace,
    container,
    deleted,
    deployment,
    history,
    phase,
)
from tests.support.realkube import RealKube

UPCOMING_ORDER = ["Provisioning", "Launched", "Registered", "Ready", "Draining", "Drained"]


def job(name: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"completions": 1, "backoffLimit": 0,
                     "template": {"metadata": {"labels": {"job": name}},
                                  "spec": {"restartPolicy": "Never",
                                           "containers": [container("1")]}}}}


def is_ordered(seen: list[str], order: list[str]) -> bool:
    """Each phase in ``seen`` is at or after the previous one in ``order``."""
    idx = [order.index(p) for p in seen]
    return idx == sorted(idx)


async def test_deployment_crs_acknowledged_job_finishes_gc_removes_crs(
    realkube: RealKube, tmp_path: Path
) -> None:
    async with agent_in_namespace(realkube, tmp_path, "loop") as (a, ns):
        kube = a.admin
        crs_seen = await a.record(CAPACITY_REQUESTS, ns)
        await kube.create(DEPLOYMENTS, deployment("web", 3), ns)
        await acknowledged(a, ns, "web", 3)
        pods = {p["metadata"]["uid"]: p for p in (await kube.list(PODS, ns)).items}
        crs = (await kube.list(CAPACITY_REQUESTS, ns)).items
        await a.until_recorded("each CR's Acknowledged", crs_seen, lambda seen: all(
            history(seen, c["metadata"]["name"])[-1:] == ["Acknowledged"] for c in crs))
        for cr in crs:
            (ref,) = cr["metadata"]["ownerReferences"]
            assert (ref["kind"], ref["apiVersion"]) == ("Pod", "v1")
            assert ref["name"] == pods[ref["uid"]]["metadata"]["name"]
            # created without a phase (the apiserver drops status on create), stamped Pending
            # by the pod controller, Acknowledged by the operator after a roll-up
            assert history(crs_seen, cr["metadata"]["name"]) == ["Pending", "Acknowledged"], (
                history(crs_seen, cr["metadata"]["name"]))

        # The Pods run on Nodes the shard registered for the roll-up's demand.
        async def running() -> bool:
            got = (await kube.list(PODS, ns, label_selector="app=web")).items
            return len(got) == 3 and all(phase(p) == "Running" for p in got)

        await a.until("the web Pods Running", running)

        # A Job: its Pod runs and succeeds (kwok), the Job completes, and no CR is left for it
        # (one may never have been written: a Pod that is already terminal when the pod
        # controller reconciles it gets none, and where a free machine exists that can be at once).
        await kube.create(JOBS, job("once"), ns)

        async def job_complete() -> bool:
            status = (await kube.get(JOBS, "once", ns)).get("status") or {}
            conds = {c["type"]: c["status"] for c in status.get("conditions") or []}
            return conds.get("Complete") == "True"

        await a.until("the Job Complete", job_complete)

        async def no_job_cr() -> bool:
            crs = (await kube.list(CAPACITY_REQUESTS, ns)).items
            return not any(r["name"].startswith("once-")
                           for c in crs for r in c["metadata"].get("ownerReferences", []))

        await a.until("no CR left for the finished Job's Pod", no_job_cr)

        # The real garbage collector: with the pod controller stopped, deleting the Pods
        # (via their Deployment) removes their CRs through the ownerReferences alone.
        a.procs["pod-controller"].terminate()
        await a.procs["pod-controller"].wait()
        await kube.delete(DEPLOYMENTS, "web", ns, propagation_policy="Foreground")

        async def crs_collected() -> bool:
            return (await kube.list(CAPACITY_REQUESTS, ns)).items == []

        await a.until("the garbage collector to delete every CR", crs_collected)


async def test_node_state_updates_walk_upcoming_nodes_and_register_nodes(
    realkube: RealKube, tmp_path: Path
) -> None:
    async with agent_in_namespace(realkube, tmp_path, "nsu") as (a, ns):
        kube = a.admin
        seen = await a.record(UPCOMING_NODES)
        await kube.create(DEPLOYMENTS, deployment("demand", 2, "3"), ns)

        async def ready_with_nodes() -> bool:
            ups = (await kube.list(UPCOMING_NODES)).items
            nodes = {n["metadata"]["name"] for n in (await kube.list(NODES)).items}
            return bool(ups) and all(
                phase(u) == "Ready" and (u["status"].get("nodeRef") or {}).get("name") in nodes
                for u in ups)

        await a.until("UpcomingNodes Ready with their Nodes registered", ready_with_nodes)
        ups = (await kube.list(UPCOMING_NODES)).items
        await a.until_recorded("each UpcomingNode's Ready", seen, lambda seen: all(
            history(seen, u["metadata"]["name"])[-1:] == ["Ready"] for u in ups))
        for up in ups:
            phases = history(seen, up["metadata"]["name"])
            assert phases[-1] == "Ready" and is_ordered(phases, UPCOMING_ORDER), phases
            node = await kube.get(NODES, up["status"]["nodeRef"]["name"])
            assert up["spec"]["labels"].items() <= node["metadata"]["labels"].items()

        # Demand withdrawn: the machines are reclaimed, drained, their UpcomingNodes deleted
        # after Drained, their Nodes deleted by the shard.
        names = {u["metadata"]["name"] for u in (await kube.list(UPCOMING_NODES)).items}
        await kube.patch(DEPLOYMENTS, "demand", {"spec": {"replicas": 0}}, ns)

        async def all_gone() -> bool:
            return (await kube.list(UPCOMING_NODES)).items == []

        await a.until("every UpcomingNode deleted", all_gone, 120)
        await a.until_recorded("each UpcomingNode's deletion", seen,
                               lambda seen: all(deleted(seen, name) for name in names))
        for name in names:
            phases = history(seen, name)
            assert is_ordered(phases, UPCOMING_ORDER), phases
            assert phases[-1] in ("Draining", "Drained"), phases


async def test_reclaim_cordons_and_drains_against_a_real_pod_disruption_budget(
    realkube: RealKube, tmp_path: Path
) -> None:
    """Two guarded Pods on a machine, a PDB allowing no disruption: the reclaim cordons the
    Node, the apiserver answers the evictions 429 (EvictionBlocked Events), an unguarded Pod
    is evicted, and the UpcomingNode is walked to Drained or Failed and deleted."""
    async with agent_in_namespace(realkube, tmp_path, "pdb") as (a, ns):
        kube = a.admin
        seen = await a.record(UPCOMING_NODES)
        await kube.create(DEPLOYMENTS, deployment("demand", 1, "1"), ns)

        async def one_ready() -> bool:
            ups = (await kube.list(UPCOMING_NODES)).items
            return len(ups) == 1 and phase(ups[0]) == "Ready"

        await a.until("one UpcomingNode Ready", one_ready)
        (up,) = (await kube.list(UPCOMING_NODES)).items
        node = up["status"]["nodeRef"]["name"]
        # Pods the agent does not count as demand (a Gt requirement the wire cannot carry: no
        # CR, an UnsupportedRequirement Event), placed on the machine directly.
        gt = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "bigfleet.test/generation", "operator": "Gt", "values": ["0"]}]}]}}}
        for name, labels in (("guarded-0", {"app": "guarded"}), ("guarded-1", {"app": "guarded"}),
                             ("loose", {"app": "loose"})):
            await kube.create(PODS, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
                "spec": {"nodeName": node, "affinity": gt, "containers": [container("100m")]},
            }, ns)
        await kube.create(PDBS, {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "guarded"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "guarded"}}}}, ns)

        async def budget_computed() -> bool:  # the disruption controller's status
            pdb = await kube.get(PDBS, "guarded", ns)
            st = pdb.get("status") or {}
            return (st.get("observedGeneration") == pdb["metadata"]["generation"]
                    and st.get("currentHealthy") == 2 and st.get("disruptionsAllowed") == 0)

        await a.until("the PDB's status (2 healthy, 0 disruptions allowed)", budget_computed)
        await kube.patch(DEPLOYMENTS, "demand", {"spec": {"replicas": 0}}, ns)

        async def reasons(kind: str, name: str) -> set[str]:
            return {e["reason"] for e in (await kube.list(EVENTS, ns)).items
                    + (await kube.list(EVENTS, "default")).items
                    if e["involvedObject"]["kind"] == kind
                    and e["involvedObject"]["name"] == name
                    and e.get("source", {}).get("component") == "bigfleet-operator"}

        async def blocked() -> bool:
            return "EvictionBlocked" in await reasons("Pod", "guarded-0") | await reasons(
                "Pod", "guarded-1")

        await a.until("an eviction refused by the PodDisruptionBudget", blocked, 120)
        blocked_events = [e for e in (await kube.list(EVENTS, ns)).items
                          if e["reason"] == "EvictionBlocked"]
        assert any("disruption budget" in e["message"] for e in blocked_events), blocked_events
        # the Event names the budget, read from kube-apiserver's own refusal
        assert any(f"refused by PodDisruptionBudget {ns}/guarded: The disruption budget guarded "
                   "needs 2 healthy pods and has 2 currently (429: " in e["message"]
                   for e in blocked_events), blocked_events

        async def loose_evicted() -> bool:
            return "Evicted" in await reasons("Pod", "loose")

        await a.until("the unguarded Pod evicted", loose_evicted, 120)

        async def upcoming_deleted() -> bool:
            return deleted(seen, up["metadata"]["name"])

        await a.until("the UpcomingNode deleted after Drained", upcoming_deleted, 120)
        phases = history(seen, up["metadata"]["name"])
        # the budget never allows: the drain ends Failed at its deadline, or the shard takes the
        # machine (Idle -> Drained) at the same moment, its grace window's end (2 s here)
        assert "Draining" in phases and is_ordered(phases, [*UPCOMING_ORDER, "Failed"]), phases
        # (Events are written beside the work, not before it: wait for them too. The Node's
        # name is this test's own, so are its Events: the shard's seed is per test.)
        async def node_reclaimed_and_cordoned() -> bool:
            return {"Reclaim", "Cordoned"} <= set(await node_events(kube, node))

        await a.until(f"the Reclaim and Cordoned Events on Node {node}",
                      node_reclaimed_and_cordoned)
        # the budget held: neither guarded Pod was evicted
        assert "Evicted" not in await reasons("Pod", "guarded-0") | await reasons(
            "Pod", "guarded-1")


async def node_events(kube: KubeClient, node: str) -> list[str]:
    return [e["reason"] for e in (await kube.list(EVENTS, "default")).items
            if e["involvedObject"]["kind"] == "Node" and e["involvedObject"]["name"] == node]

