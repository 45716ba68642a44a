"""The pod controller pins a co-location group's CRs to the zone its Pods run in, and unpins them
when they stop running there, on the Pod events alone (no resync): embedded apiserver,
``autojump_clock`` (docs/rules.md#pod-translation-co-location-zone-pin)."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, PODS
from bigfleet_trio.podcontroller.zonepin import ZONE_LABEL
from bigfleet_trio.sim.apiserver import ApiServer
from tests.podcontroller.test_controller import eventually, pod, running

REQ = "requiredDuringSchedulingIgnoredDuringExecution"
PIN = {"key": ZONE_LABEL, "operator": "In", "values": ["z-a"]}


def db(name: str, **spec: Any) -> dict[str, Any]:
    body = pod(name, affinity={"podAffinity": {REQ: [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": ZONE_LABEL}]}}, **spec)
    body["metadata"]["labels"] = {"app": "db"}
    return body


async def requirements(client: KubeClient, pod_name: str) -> list[dict[str, Any]] | None:
    uid = (await client.get(PODS, pod_name, "default"))["metadata"]["uid"]
    try:
        cr = await client.get(CAPACITY_REQUESTS, f"cr-{uid}", "default")
    except Exception:  # noqa: BLE001 - not created yet
        return None
    return list(cr["spec"].get("requirements", []))


async def test_a_group_running_in_one_zone_pins_its_crs_and_unpins_when_it_stops(
        autojump_clock: trio.testing.MockClock) -> None:
    server = ApiServer()
    async with running(server, resync_period=1e9) as (ctl, client):
        await client.create(PODS, db("db-1"))

        async def pinned(name: str, want: bool) -> bool:
            reqs = await requirements(client, name)
            return reqs is not None and (PIN in reqs) is want

        await eventually(lambda: pinned("db-1", False))
        # a group member bound in z-a (PodTopologyLabels copied its Node's zone)
        running_pod = db("db-0", nodeName="node-a")
        running_pod["metadata"]["labels"][ZONE_LABEL] = "z-a"
        await client.create(PODS, running_pod)
        await eventually(lambda: pinned("db-1", True))
        await eventually(lambda: pinned("db-0", True))  # the group's CRs are one need

        # a Pod bound later (its update) pins the Pods that were pending without it
        await client.delete(PODS, "db-0", "default")
        await eventually(lambda: pinned("db-1", False))
        await client.create(PODS, db("db-2"))
        await eventually(lambda: pinned("db-2", False))
        await client.patch(PODS, "db-2", {"metadata": {"labels": {ZONE_LABEL: "z-a"}},
                                          "spec": {"nodeName": "node-a"}}, "default")
        await eventually(lambda: pinned("db-1", True))
        # the second zone: nothing pinned (kube-scheduler accepts either)
        elsewhere = db("db-3", nodeName="node-b")
        elsewhere["metadata"]["labels"][ZONE_LABEL] = "z-b"
        await client.create(PODS, elsewhere)
        await eventually(lambda: pinned("db-1", False))
        assert ctl.outcomes["cr_updated"] >= 4
