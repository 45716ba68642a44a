"""Least privilege, proven: the operator and the pod controller run with ServiceAccount tokens
bound only to the shipped RBAC, against the RBAC-enforcing embedded apiserver and a simulated
shard, through Pods -> CapacityRequests -> roll-up -> UpcomingNodes -> reclaim -> drain, and
the server refuses nothing. With one rule removed, the refused binary's log names the verb and
resource.

Both binaries run in process (the composed ``Operator`` and ``PodController`` over in-process
HTTP with their own bearer tokens) on the mock clock; the shard registers Nodes and the test
writes Pods as the admin user (they stand for the cloud and the users, not for our binaries).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
import yaml

from bigfleet_trio.config import OperatorConfig
from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.resources import EVENTS, NODES, PODS, UPCOMING_NODES
from bigfleet_trio.observability.events import EventFeed
from bigfleet_trio.operator.app import Operator
from bigfleet_trio.podcontroller.controller import PodController
from bigfleet_trio.shard.transport import MemoryConnector
from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.rbac import Attributes
from bigfleet_trio.sim.apiserver.testing import InProcessTransport
from bigfleet_trio.sim.shard.catalog import Catalog, MachineShape
from bigfleet_trio.sim.shard.engine import EngineConfig
from bigfleet_trio.sim.shard.nodes import KubeNodeHooks
from bigfleet_trio.sim.shard.session import SimShard

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NS = "bigfleet-system"
OPERATOR_SA = "bigfleet-operator"
POD_CONTROLLER_SA = "bigfleet-pod-controller"


def rbac_documents() -> list[dict[str, Any]]:
    """The shipped Namespace, ServiceAccounts, Roles and bindings (wherever they live now)."""
    candidates = [REPO / "bigfleet_trio" / "manifests", REPO / "config" / "rbac",
                  REPO / "config" / "default"]
    kinds = {"Namespace", "ServiceAccount", "Role", "ClusterRole", "RoleBinding",
             "ClusterRoleBinding"}
    for directory in candidates:
        docs = [
            d
            for path in sorted(directory.glob("*.yaml"))
            for d in yaml.safe_load_all(path.read_text())
            if isinstance(d, dict) and d.get("kind") in kinds
        ]
        if any(d["kind"] == "ClusterRole" for d in docs):
            if not any(d["kind"] == "Namespace" for d in docs):
                docs.insert(0, {"apiVersion": "v1", "kind": "Namespace",
                                "metadata": {"name": NS}})
            return docs
    raise AssertionError(f"no RBAC manifests under {candidates}")


def without_rule(
    docs: list[dict[str, Any]], role: str, resource: str, verb: str
) -> list[dict[str, Any]]:
    """``docs`` with ``verb`` on ``resource`` taken out of the ClusterRole ``role``."""
    out = copy.deepcopy(docs)
    found = False
    for d in out:
        if d["kind"] != "ClusterRole" or d["metadata"]["name"] != role:
            continue
        for rule in d["rules"]:
            if resource in rule.get("resources", ()) and verb in rule.get("verbs", ()):
                rule["verbs"] = [v for v in rule["verbs"] if v != verb]
                found = True
    assert found, f"{role} grants no {verb} {resource}"
    return out


def install(server: ApiServer, docs: list[dict[str, Any]]) -> None:
    for d in docs:
        group, _, version = d["apiVersion"].rpartition("/")
        res = next(r for r in server.resources.values()
                   if (r.group, r.version, r.kind) == (group, version, d["kind"]))
        server.create(res, d["metadata"].get("namespace"), copy.deepcopy(d))


def pod(name: str, cpu: str, node: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x",
                                            "resources": {"requests": {"cpu": cpu}}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": spec}


@dataclass
class World:
    server: ApiServer
    admin: KubeClient
    shard: SimShard
    operator: Operator
    pod_controller: PodController

    async def wait(self, predicate: Callable[[], Any], limit: float = 300.0) -> None:
        with trio.fail_after(limit):
            while not predicate():  # noqa: ASYNC110 - conditions span components
                await trio.sleep(0.1)

    async def wait_async(self, predicate: Callable[[], Any], limit: float = 300.0) -> None:
        with trio.fail_after(limit):
            while not await predicate():  # noqa: ASYNC110
                await trio.sleep(0.1)

    @property
    def denials(self) -> list[Attributes]:
        return self.server.access.denials


@asynccontextmanager
async def world(docs: list[dict[str, Any]]) -> AsyncIterator[World]:
    server = ApiServer(authorization_mode="RBAC")
    install(server, docs)
    tokens = {sa: server.issue_token(NS, sa)["status"]["token"]
              for sa in (OPERATOR_SA, POD_CONTROLLER_SA)}
    async with trio.open_nursery() as nursery:

        def client(token: str) -> KubeClient:
            return KubeClient(KubeConfig(server="http://apiserver", token=token),
                              transport=InProcessTransport(server.app, nursery))

        admin = client(server.access.admin_token)
        catalog = Catalog([MachineShape("sim-4", "z-a", {"cpu": "4", "memory": "16Gi"}, 0.2,
                                        count=4)])
        shard = SimShard(catalog, EngineConfig(seed=3, reclaim_grace_seconds=10),
                         hooks=KubeNodeHooks(admin))
        connector = MemoryConnector()

        async def accept() -> None:
            async with trio.open_nursery() as sessions:
                async for end in connector.accepted:
                    sessions.start_soon(shard.serve_session, end)

        await nursery.start(shard.run)
        nursery.start_soon(accept)
        operator = Operator(
            OperatorConfig(cluster_id="c1", shard_addr="shard:1", rollup_interval=1.0,
                           reconnect_initial_backoff=0.5, reconnect_max_backoff=4.0),
            client=client(tokens[OPERATOR_SA]), connector=connector, feed=EventFeed())
        pod_controller = PodController(client(tokens[POD_CONTROLLER_SA]), orphan_grace=1.0,
                                       sync_timeout=30.0)
        nursery.start_soon(pod_controller.run)
        nursery.start_soon(operator.run)
        yield World(server, admin, shard, operator, pod_controller)
        nursery.cancel_scope.cancel()


async def run_flow(w: World) -> None:
    """Two Pods -> two machines; an untranslatable Pod bound to one Node (an Event, no CR);
    demand withdrawn (one Pod Succeeded, one deleted) -> both machines reclaimed, the bound Pod
    evicted, the UpcomingNodes deleted."""
    await w.admin.create(PODS, pod("a", "3"), "default")
    await w.admin.create(PODS, pod("b", "3"), "default")

    async def two_ready() -> bool:
        uns = (await w.admin.list(UPCOMING_NODES)).items
        return len(uns) == 2 and all((u.get("status") or {}).get("phase") == "Ready"
                                     for u in uns)

    await w.wait_async(two_ready)
    nodes = sorted(n["metadata"]["name"] for n in (await w.admin.list(NODES)).items)
    # A Pod no CR can be made for, on a machine being reclaimed. kube-apiserver (and the sim,
    # docs/deviations.md#pod-quantities) refuses its quantity on a write, so it is put past
    # validation, in one step with no checkpoint between, as a store written by an older server
    # could hold it.
    pods_res = w.server.find("pods")
    stored = w.server.create(pods_res, "default", pod("stray", "1", node=nodes[0]))
    stray = copy.deepcopy(stored)
    stray["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    # a spec change moves the generation, as on any server (the pod controller skips a
    # MODIFIED Pod whose generation did not: docs/kube-api.md#unchanged-pod-events)
    stray["metadata"]["generation"] = stored["metadata"]["generation"] + 1
    w.server.store.put(pods_res, stray, stored)
    await w.admin.patch(PODS, "a", {"status": {"phase": "Succeeded"}}, "default",
                        subresource="status")
    await w.admin.delete(PODS, "b", "default")

    async def drained() -> bool:
        return (await w.admin.list(UPCOMING_NODES)).items == []

    await w.wait_async(drained)
    await w.wait(lambda: w.shard.engine.released == 2)


async def test_shipped_rbac_is_enough_for_the_whole_flow(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with world(rbac_documents()) as w:
        await run_flow(w)
        names = {p["metadata"]["name"] for p in (await w.admin.list(PODS, "default")).items}
        assert names == {"a"}  # "stray" was evicted by the drain; "a" is Succeeded
        events = (await w.admin.list(EVENTS, "default")).items
        assert any(e["involvedObject"]["name"] == "stray" for e in events)

        async def operator_events() -> bool:  # the reclaim's story, written with the operator's SA
            seen = {(e["involvedObject"]["kind"], e["reason"])
                    for e in (await w.admin.list(EVENTS, "default")).items
                    if e["source"]["component"] == "bigfleet-operator"}
            return {("Node", "Reclaim"), ("Node", "Cordoned"), ("Pod", "Evicted"),
                    ("Node", "Drained")} <= seen

        await w.wait_async(operator_events)
        counted = w.server.counters
        for key in (("create", "pods/eviction"), ("patch", "nodes"), ("create", "upcomingnodes"),
                    ("create", "capacityrequests"), ("delete", "capacityrequests"),
                    ("patch", "capacityrequests/status"), ("delete", "upcomingnodes")):
            assert counted[key] >= 1, key
        assert w.denials == [], [
            (a.user.name, a.verb, a.resource, a.subresource) for a in w.denials
        ]


@pytest.mark.parametrize(
    ("role", "resource", "verb", "logged"),
    [
        (OPERATOR_SA, "pods/eviction", "create", 'cannot create resource "pods/eviction"'),
        (POD_CONTROLLER_SA, "capacityrequests", "create",
         'cannot create resource "capacityrequests"'),
    ],
)
async def test_a_removed_rule_is_named_in_the_binary_log(
    role: str, resource: str, verb: str, logged: str,
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    docs = without_rule(rbac_documents(), role, resource, verb)
    async with world(docs) as w:
        async with trio.open_nursery() as flow:
            flow.start_soon(run_flow, w)
            await w.wait(lambda: w.denials, limit=300)
            await trio.sleep(5)
            flow.cancel_scope.cancel()
        refused = {(a.user.name, a.verb, a.resource + (f"/{a.subresource}" if a.subresource
                                                        else "")) for a in w.denials}
        assert refused == {(f"system:serviceaccount:{NS}:{role}", verb, resource)}
        ours = [r for r in caplog.records
                if r.name.startswith(("bigfleet_trio.operator", "bigfleet_trio.podcontroller",
                                      "bigfleet_trio.kube"))]
        assert any(logged in r.getMessage() for r in ours), [r.getMessage() for r in ours][-20:]
