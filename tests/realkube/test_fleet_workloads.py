"""The fleet bench's workload clones under the real kube-scheduler: a co-located clone (required
podAffinity kept from the MySQL router manifest) gets every Pod bound, which the sim's scheduler
stand-in cannot show (it does not filter on pod affinity; docs/deviations.md, "Not done")."""

from __future__ import annotations

import pytest

from bigfleet_trio.kube.resources import DEPLOYMENTS, PODS
from scripts.bench._fleet_workload import fleet_workloads
from tests.realkube.agent import phase
from tests.support.realkube import RealKube, until

pytestmark = pytest.mark.slow

ZONE = "topology.kubernetes.io/zone"


async def test_a_co_located_clone_is_scheduled_by_kube_scheduler(realkube: RealKube) -> None:
    realkube.reset()
    ns = realkube.namespace("coloc")
    nodes = realkube.cp.create_nodes(2, prefix=f"{ns}-node-")
    try:
        for node in nodes:  # the sim shard's Nodes carry a zone; kwok's carry only the hostname
            r = realkube.cp.request("PATCH", f"/api/v1/nodes/{node}",
                                    {"metadata": {"labels": {ZONE: "sim-zone-a"}}},
                                    content_type="application/merge-patch+json")
            assert r.is_success, r.text
        _, workloads = fleet_workloads(2000, 100, seed=1)
        clone = next(w for w in workloads if w.kind == "Deployment" and (
            w.body["spec"]["template"]["spec"].get("affinity") or {}).get("podAffinity"))
        body = clone.body
        body["metadata"]["namespace"] = ns
        body["spec"]["replicas"] = 3
        async with realkube.client() as kube:
            await kube.create(DEPLOYMENTS, body, ns)

            async def all_running() -> bool:
                pods = (await kube.list(PODS, ns, label_selector=f"app={clone.name}")).items
                return len(pods) == 3 and all(phase(p) == "Running" for p in pods)

            # before the fix the term selected `app In (mysql)`, no Pod of the fleet: every Pod
            # stayed Pending with "node(s) didn't match pod affinity rules"
            await until(f"the 3 Pods of {clone.name} Running", all_running, 60,
                        logs=lambda: realkube.kubectl_run(
                            "describe", "pods", "-n", ns, check=False).stdout[-3000:])
    finally:
        for node in nodes:
            realkube.cp.request("DELETE", f"/api/v1/nodes/{node}")


async def test_a_co_location_groups_growth_lands_where_kube_scheduler_can_use_it(
        realkube: RealKube) -> None:
    """The sim shard's plan for a growing co-location group against the real kube-scheduler
    (docs/rules.md#roll-up-same): the group runs in zone a and outgrows it; zone b, now empty,
    could hold the whole group. The growth must go to zone a, where kube-scheduler can put the
    group's next Pods; machines in zone b would leave them Pending with "didn't match pod
    affinity rules"."""
    from bigfleet_trio.proto import pb
    from bigfleet_trio.sim.shard.catalog import Catalog, MachineShape
    from bigfleet_trio.sim.shard.engine import EngineConfig, ShardEngine
    from bigfleet_trio.sim.shard.nodes import KubeNodeHooks

    op = pb.NodeSelectorRequirementOperator
    realkube.reset()
    ns = realkube.namespace("coloc")
    zone_a, zone_b = f"{ns}-a", f"{ns}-b"
    small = {"cpu": "2", "memory": "4Gi", "pods": "110"}
    engine = ShardEngine(Catalog([MachineShape("small", zone_a, small, 0.1, count=2),
                                  MachineShape("small", zone_b, small, 0.1, count=3)]),
                         EngineConfig(seed=11))
    engine.on_connect("c", 0.0)

    def group(replicas: int) -> pb.CapacityNeed:  # what the operator rolls the clone up to
        return pb.CapacityNeed(
            requirements=[pb.NodeSelectorRequirement(ZONE, op.OPERATOR_SAME)],
            aggregate_resources={"cpu": f"{900 * replicas}m"}, min_unit={"cpu": "900m"},
            group=f"{ZONE}\x00app=grp,;")

    # Zone b is busy for a higher priority need at first, so the group starts in zone a.
    busy_b = pb.CapacityNeed(
        requirements=[pb.NodeSelectorRequirement(ZONE, op.OPERATOR_IN, [zone_b])],
        aggregate_resources={"cpu": "6"}, min_unit={"cpu": "2"}, priority=100)
    engine.on_rollup(pb.ClusterCapacityNeeds(cluster_id="c", needs=[busy_b, group(2)]), 1.0)
    nodes: set[str] = set()
    term = {"labelSelector": {"matchLabels": {"app": "grp"}}, "topologyKey": ZONE}
    body = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "grp", "namespace": ns},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "grp"}}, "template": {
            "metadata": {"labels": {"app": "grp"}},
            "spec": {"affinity": {"podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [term]}},
                "containers": [{"name": "c", "image": "fake",
                                "resources": {"requests": {"cpu": "900m"}}}]}}}}
    async with realkube.client() as kube:
        hooks = KubeNodeHooks(kube)

        async def register_the_groups_machines() -> None:
            for mid in engine.needs[-1].machines:
                m = engine.machine(mid)
                assert m is not None
                if m.node_name not in nodes:
                    nodes.add(m.node_name)
                    await hooks.on_machine_configured(m.info())

        async def running() -> int:
            pods = (await kube.list(PODS, ns, label_selector="app=grp")).items
            return sum(1 for p in pods if phase(p) == "Running")

        def describe() -> str:  # each Pod's node and kube-scheduler's last word on it
            return realkube.kubectl_run(
                "get", "pods", "-n", ns, "-o", "jsonpath={range .items[*]}{.metadata.name} "
                "{.spec.nodeName} {.status.conditions[?(@.type=='PodScheduled')].message}{'\\n'}"
                "{end}", check=False).stdout[-3000:]

        try:
            await register_the_groups_machines()
            await kube.create(DEPLOYMENTS, body, ns)

            async def two_running() -> bool:
                return await running() == 2

            await until("the group's 2 Pods Running in zone a", two_running, 60, logs=describe)
            # The group grows to 5 Pods (4.5 cpu): zone a holds 4 cpu, zone b (free again) 6.
            engine.on_rollup(pb.ClusterCapacityNeeds(cluster_id="c", needs=[group(5)]), 2.0)
            await register_the_groups_machines()
            await kube.patch(DEPLOYMENTS, "grp", {"spec": {"replicas": 5}}, ns)

            async def four_running() -> bool:
                return await running() == 4

            # before the fix the shard moved the need to zone b: its three Nodes there took
            # none of the new Pods and only the first 2 ran
            await until("4 of the group's 5 Pods Running (zone a full: 1 short)", four_running,
                        60, logs=describe)
            assert {engine.machine(i).shape.zone for i in engine.needs[-1].machines} == {zone_a}
            assert engine.needs[-1].short == ("cpu",)
        finally:
            for node in nodes:
                realkube.cp.request("DELETE", f"/api/v1/nodes/{node}")
