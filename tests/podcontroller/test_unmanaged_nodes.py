"""Pods on Nodes BigFleet does not manage, and opted-out Pods, get no CR (integration, on the
embedded apiserver; docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, NAMESPACES, NODES, PODS
from bigfleet_trio.podcontroller.controller import PodController
from bigfleet_trio.podcontroller.scope import PodScope
from bigfleet_trio.sim.apiserver import ApiServer

from .test_controller import client_for, eventually, pod

UNMANAGED = "bigfleet.lucy.sh/unmanaged"


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


async def owners(client: KubeClient) -> set[str]:
    """The names of the Pods that own a CR, in every namespace."""
    items = (await client.list(CAPACITY_REQUESTS, None)).items
    return {ref["name"] for cr in items for ref in cr["metadata"].get("ownerReferences", [])}


async def owners_are(client: KubeClient, want: set[str]) -> bool:
    return await owners(client) == want


@asynccontextmanager
async def running(server: ApiServer, scope: PodScope,
                  **kwargs: Any) -> AsyncIterator[tuple[PodController, KubeClient]]:
    async with trio.open_nursery() as nursery:
        client = client_for(server, nursery)
        ctl = PodController(client, scope=scope, **kwargs)
        await nursery.start(ctl.run)
        yield ctl, client
        nursery.cancel_scope.cancel()


async def test_pods_on_unmanaged_nodes_lose_their_cr_and_get_it_back(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    server = ApiServer()
    setup = client_for(server, nursery)
    await setup.create(NODES, node("worker"))
    await setup.create(NODES, node("system", **{UNMANAGED: "true"}))
    await setup.create(PODS, pod("on-worker", nodeName="worker"))
    await setup.create(PODS, pod("on-system", nodeName="system"))
    await setup.create(PODS, pod("pending"))
    await setup.create(PODS, pod("on-unknown", nodeName="not-seen-yet"))
    async with running(server, PodScope.parse()) as (ctl, client):
        await eventually(lambda: owners_are(client, {"on-worker", "pending", "on-unknown"}))
        assert ctl.outcomes["unmanaged_node"] >= 1
        # the Node is relabelled managed: its Pod's CR comes back
        await client.patch(NODES, "system", {"metadata": {"labels": {UNMANAGED: "false"}}})
        await eventually(lambda: owners_are(
            client, {"on-worker", "on-system", "pending", "on-unknown"}))
        # the unknown Node appears, unmanaged: its Pod's CR goes
        await client.create(NODES, node("not-seen-yet", **{UNMANAGED: "true"}))
        await eventually(lambda: owners_are(client, {"on-worker", "on-system", "pending"}))
        # and when that Node is deleted, the Pod counts as managed again
        await client.delete(NODES, "not-seen-yet")
        await eventually(lambda: owners_are(
            client, {"on-worker", "on-system", "pending", "on-unknown"}))
        # a Node turning unmanaged takes the CRs of the Pods bound to it, not of others
        await client.patch(NODES, "worker", {"metadata": {"labels": {
            "node-role.kubernetes.io/control-plane": ""}}})
        await eventually(lambda: owners_are(client, {"on-system", "pending", "on-unknown"}))
        # and it stays that way (no re-create of the CRs deleted on purpose)
        await trio.sleep(5)
        assert await owners(client) == {"on-system", "pending", "on-unknown"}


async def test_a_pod_bound_later_to_an_unmanaged_node_loses_its_cr(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    server = ApiServer()
    setup = client_for(server, nursery)
    await setup.create(NODES, node("cp", **{"node-role.kubernetes.io/control-plane": ""}))
    await setup.create(PODS, pod("p"))
    async with running(server, PodScope.parse()) as (_ctl, client):
        await eventually(lambda: owners_are(client, {"p"}))
        await client.delete(PODS, "p", "default")
        await client.create(PODS, pod("p", nodeName="cp"))
        await eventually(lambda: owners_are(client, set()))
        assert await owners(client) == set()


async def test_excluded_namespace_and_selector_pods_get_no_cr(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    server = ApiServer()
    setup = client_for(server, nursery)
    await setup.create(NAMESPACES, {"metadata": {"name": "batch"}})
    await setup.create(PODS, pod("kept"))
    await setup.create(PODS, pod("in-batch", ns="batch"))
    labelled = pod("labelled")
    labelled["metadata"]["labels"] = {"bigfleet.lucy.sh/exclude": "yes"}
    await setup.create(PODS, labelled)
    scope = PodScope.parse([""], ["batch"], "bigfleet.lucy.sh/exclude=yes")
    async with running(server, scope) as (ctl, client):
        assert ctl.nodes is None  # no unmanaged-node selector: no Node cache
        await eventually(lambda: owners_are(client, {"kept"}))
        assert ctl.outcomes["excluded"] >= 2
        # the label goes: the Pod is no longer opted out
        await client.patch(PODS, "labelled", {"metadata": {"labels": {
            "bigfleet.lucy.sh/exclude": None}}}, "default")
        await eventually(lambda: owners_are(client, {"kept", "labelled"}))
        # and back: its CR is deleted
        await client.patch(PODS, "labelled", {"metadata": {"labels": {
            "bigfleet.lucy.sh/exclude": "yes"}}}, "default")
        await eventually(lambda: owners_are(client, {"kept"}))


async def test_existing_crs_of_unmanaged_or_excluded_pods_are_deleted_at_start(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    server = ApiServer()
    setup = client_for(server, nursery)
    await setup.create(NODES, node("system", **{UNMANAGED: "true"}))
    await setup.create(PODS, pod("a", nodeName="system"))
    await setup.create(PODS, pod("b"))
    async with running(server, PodScope()) as (_ctl, client):  # the old behaviour: CRs for all
        await eventually(lambda: owners_are(client, {"a", "b"}))
    async with running(server, PodScope.parse(exclude_namespaces=["default"])) as (_c, client):
        await eventually(lambda: owners_are(client, set()))
        assert await owners(client) == set()


async def test_a_refused_node_watch_is_one_error_and_every_node_managed(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        caplog: pytest.LogCaptureFixture) -> None:
    server = ApiServer()
    setup = client_for(server, nursery)
    await setup.create(NODES, node("system", **{UNMANAGED: "true"}))
    await setup.create(PODS, pod("a", nodeName="system"))
    server.faults.fail_next(10**6, code=403, verb="list", resource="nodes")
    server.faults.fail_next(10**6, code=403, verb="watch", resource="nodes")
    with caplog.at_level(logging.ERROR, logger="bigfleet_trio.podcontroller.nodes"):
        async with running(server, PodScope.parse()) as (ctl, client):
            await eventually(lambda: owners_are(client, {"a"}))
            await trio.sleep(120)
            assert ctl.nodes is not None and ctl.nodes.refused
            assert await owners(client) == {"a"}
            ready, _ = ctl.readiness()
            assert ready
    errors = [r for r in caplog.records if r.levelno == logging.ERROR
              and r.name == "bigfleet_trio.podcontroller.nodes"]
    assert len(errors) == 1 and "403" in errors[0].getMessage()
