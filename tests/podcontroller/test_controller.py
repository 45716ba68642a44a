"""Pod controller on the embedded apiserver (integration).

The apiserver runs in-process (``InProcessTransport``: the ASGI app on Trio, no sockets), so
``autojump_clock`` drives informer, queue and resync timing. One test uses a real loopback socket.
Expected CR specs are worked out by hand from the Pod manifests below.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig, load_kubeconfig
from bigfleet_trio.kube.informer import SyncTimeout
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, EVENTS, PODS
from bigfleet_trio.kube.startup import Unauthenticated
from bigfleet_trio.podcontroller.controller import PodController
from bigfleet_trio.podcontroller.defaults import parse_priority_class_defaults
from bigfleet_trio.podcontroller.keys import StampKey
from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig
from bigfleet_trio.sim.apiserver.testing import InProcessTransport

LABEL = "bigfleet.lucy.sh/owned-by-pod"


def pod(
    name: str,
    *,
    cpu: str = "500m",
    memory: str = "1Gi",
    ns: str = "default",
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": cpu, "memory": memory}},
                }
            ],
            **spec,
        },
    }


def client_for(server: ApiServer, nursery: trio.Nursery) -> KubeClient:
    return KubeClient(
        KubeConfig(server="http://apiserver"),
        qps=1e6,
        burst=1_000_000,
        transport=InProcessTransport(server.app, nursery),
    )


async def eventually(check: Callable[[], Any], limit: float = 30.0, step: float = 0.05) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy."""
    with trio.fail_after(limit):
        while True:
            value = check()
            if hasattr(value, "__await__"):
                value = await value
            if value:
                return value
            await trio.sleep(step)


async def crs(client: KubeClient, ns: str = "default") -> list[dict[str, Any]]:
    return (await client.list(CAPACITY_REQUESTS, ns)).items


@asynccontextmanager
async def running(
    server: ApiServer, **kwargs: Any
) -> AsyncIterator[tuple[PodController, KubeClient]]:
    async with trio.open_nursery() as nursery:
        client = client_for(server, nursery)
        ctl = PodController(client, **kwargs)
        await nursery.start(ctl.run)
        yield ctl, client
        nursery.cancel_scope.cancel()


async def test_pods_become_crs_with_owner_refs_and_pending(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
) -> None:
    server = ApiServer()
    setup = client_for(server, nursery)
    p1 = await setup.create(PODS, pod("web-1"))
    async with running(server) as (ctl, client):
        p2 = await client.create(
            PODS, pod("web-2", cpu="2", memory="512Mi", priority=1000, nodeSelector={"zone": "a"})
        )
        await eventually(lambda: _pending_count(client, 2))
        by_owner = {cr["metadata"]["labels"][LABEL]: cr for cr in await crs(client)}
        assert set(by_owner) == {p1["metadata"]["uid"], p2["metadata"]["uid"]}
        cr1 = by_owner[p1["metadata"]["uid"]]
        assert cr1["metadata"]["name"] == "cr-" + p1["metadata"]["uid"]
        assert cr1["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": "web-1",
                "uid": p1["metadata"]["uid"],
                "controller": True,
            }
        ]
        assert cr1["spec"] == {
            "priority": 0,
            "resources": {"cpu": "500m", "memory": "1Gi"},
            "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "Exists"}],
        }
        assert cr1["status"] == {"phase": "Pending"}
        cr2 = by_owner[p2["metadata"]["uid"]]
        assert cr2["spec"] == {
            "priority": 1000,
            "resources": {"cpu": "2", "memory": "512Mi"},
            "requirements": [{"key": "zone", "operator": "In", "values": ["a"]}],
        }
        assert ctl.outcomes["cr_created"] == 2
        assert ctl.readiness() == (True, "leader")


async def _pending_count(client: KubeClient, n: int) -> bool:
    items = await crs(client)
    return len(items) == n and all((c.get("status") or {}).get("phase") == "Pending" for c in items)


async def test_deleted_pod_gc_and_terminal_pod_cleanup(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
) -> None:
    server = ApiServer()
    setup = client_for(server, nursery)
    await setup.create(PODS, pod("done"))  # already Failed when the controller first sees it
    await setup.patch(
        PODS, "done", {"status": {"phase": "Failed"}}, "default", subresource="status"
    )
    async with running(server) as (ctl, client):
        await client.create(PODS, pod("gone"))
        job = await client.create(PODS, pod("job"))
        await eventually(lambda: _pending_count(client, 2))
        await client.delete(PODS, "gone", "default")
        await eventually(lambda: ctl.outcomes["pod_gone"] >= 1)
        items = await crs(client)
        assert [c["metadata"]["labels"][LABEL] for c in items] == [job["metadata"]["uid"]]
        collections = server.counters[("deletecollection", "capacityrequests")]
        deletes_before = server.counters[("delete", "capacityrequests")]
        await client.patch(
            PODS, "job", {"status": {"phase": "Succeeded"}}, "default", subresource="status"
        )
        await eventually(lambda: _count(client, 0))
        # the Pod's one CR by name, not a deletecollection (a scan of the namespace's CRs)
        assert server.counters[("delete", "capacityrequests")] == deletes_before + 1
        assert server.counters[("deletecollection", "capacityrequests")] == collections
        assert ctl.outcomes["pod_terminal"] >= 1
        # a terminal Pod never gets a CR, not even on resync
        await ctl.resync()
        await trio.sleep(5)
        assert await crs(client) == []
        assert server.counters[("create", "capacityrequests")] == 2


async def _count(client: KubeClient, n: int) -> bool:
    return len(await crs(client)) == n


async def test_resize_and_new_annotation_update_the_cr(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = ApiServer()
    defaults = parse_priority_class_defaults('batch: {interruptionPenalty: "16"}\n')
    async with running(server, defaults=defaults) as (ctl, client):
        created = await client.create(
            PODS,
            pod(
                "r",
                priorityClassName="batch",
                topologySpreadConstraints=[
                    {
                        "maxSkew": 1,
                        "topologyKey": "zone",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": {"matchLabels": {"a": "b"}},
                    }
                ],
            ),
        )
        name = "cr-" + created["metadata"]["uid"]
        await eventually(lambda: _pending_count(client, 1))
        cr = await client.get(CAPACITY_REQUESTS, name, "default")
        assert cr["spec"]["interruptionPenalty"] == "16"
        assert cr["spec"]["topologySpread"] == [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
        ]
        # in-place resize (the sim accepts the spec change) + a penalty annotation + no spread
        await client.patch(
            PODS,
            "r",
            {
                "metadata": {"annotations": {"bigfleet.lucy.sh/reclamation-penalty": "2500m"}},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "image": "busybox",
                            "resources": {"requests": {"cpu": "3", "memory": "1Gi"}},
                        }
                    ],
                    "topologySpreadConstraints": None,
                },
            },
            "default",
        )

        async def updated() -> bool:
            got = await client.get(CAPACITY_REQUESTS, name, "default")
            return got["spec"] == {
                "priority": 0,
                "resources": {"cpu": "3", "memory": "1Gi"},
                "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "Exists"}],
                "interruptionPenalty": "16",
                "reclamationPenalty": "2500m",
            }

        await eventually(updated)
        assert ctl.outcomes["cr_updated"] == 1
        assert (await client.get(CAPACITY_REQUESTS, name, "default"))["status"] == {
            "phase": "Pending"
        }
        # a hand edit of the spec is put back
        await client.patch(CAPACITY_REQUESTS, name, {"spec": {"priority": 7}}, "default")
        await eventually(updated)
        assert ctl.outcomes["cr_updated"] == 2
        assert server.counters[("create", "capacityrequests")] == 1


async def test_hand_deleted_cr_is_recreated(autojump_clock: trio.testing.MockClock) -> None:
    server = ApiServer()
    async with running(server, resync_period=60.0) as (ctl, client):
        created = await client.create(PODS, pod("p"))
        name = "cr-" + created["metadata"]["uid"]
        await eventually(lambda: _pending_count(client, 1))
        await client.delete(CAPACITY_REQUESTS, name, "default")
        await eventually(lambda: _pending_count(client, 1))
        assert server.counters[("create", "capacityrequests")] == 2
        assert ctl.outcomes["cr_created"] == 2
        # The delete happens while the CR watch is down and its history is compacted: the
        # informer relists (410), synthesises the DELETED, and the CR comes back.
        server.faults.fail_next(1, code=500, verb="watch", resource="capacityrequests")
        server.faults.drop_watches()
        await client.delete(CAPACITY_REQUESTS, name, "default")
        server.faults.compact()
        await eventually(lambda: ctl.crs.relists == 2)
        await eventually(lambda: _pending_count(client, 1))
        assert server.counters[("create", "capacityrequests")] == 3
        # resync re-enqueues every Pod; with nothing to do it writes nothing
        writes = server.counters.total("create") + server.counters.total("patch")
        before = ctl.outcomes["cr_exists"]
        await trio.sleep(60)
        assert ctl.outcomes["cr_exists"] == before + 1
        assert server.counters.total("create") + server.counters.total("patch") == writes


async def test_restart_creates_no_duplicates(autojump_clock: trio.testing.MockClock) -> None:
    server = ApiServer()
    async with running(server) as (ctl, client):
        for i in range(20):
            await client.create(PODS, pod(f"p{i}"))
        await eventually(lambda: _pending_count(client, 20))
    creates = server.counters[("create", "capacityrequests")]
    assert creates == 20
    # two controllers at once (e.g. a restart overlapping the old process) + one later restart
    async with running(server) as (a, _), running(server) as (b, client):
        await trio.sleep(10)
        assert await _pending_count(client, 20)
        assert a.outcomes["cr_exists"] == 20 and b.outcomes["cr_exists"] == 20
    async with running(server) as (c, client):
        await client.create(PODS, pod("late"))
        await eventually(lambda: _pending_count(client, 21))
        await trio.sleep(5)
    assert server.counters[("create", "capacityrequests")] == 21


async def test_racing_create_already_exists_is_success(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = ApiServer()
    async with running(server) as (ctl, client):
        created = await client.create(PODS, pod("p"))
        await eventually(lambda: _pending_count(client, 1))
        cr = (await crs(client))[0]
        # Pretend the cache has not seen the CR yet: reconcile goes down the create path.
        ctl.crs.store._pop(f"default/{cr['metadata']['name']}")
        assert await ctl.reconciler.reconcile_pod("default/p") == "cr_exists"
        assert await _count(client, 1)
        assert created["metadata"]["uid"] == cr["metadata"]["labels"][LABEL]


async def test_unparseable_annotation_event_and_fallback(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = ApiServer()
    defaults = parse_priority_class_defaults('gold: {interruptionPenalty: "100"}\n')
    async with running(server, defaults=defaults) as (ctl, client):
        created = await client.create(
            PODS,
            pod(
                "bad",
                priorityClassName="gold",
                annotations={"bigfleet.lucy.sh/interruption-penalty": "lots"},
            ),
        )
        await eventually(lambda: _pending_count(client, 1))
        cr = (await crs(client))[0]
        assert cr["spec"]["interruptionPenalty"] == "100"  # fell through to the class default
        events = (await client.list(EVENTS, "default")).items
        assert len(events) == 1
        ev = events[0]
        assert ev["type"] == "Warning"
        assert ev["reason"] == "CapacityRequestWarning"
        assert ev["involvedObject"]["name"] == "bad"
        assert ev["involvedObject"]["uid"] == created["metadata"]["uid"]
        assert "bigfleet.lucy.sh/interruption-penalty" in ev["message"]
        # resync does not repeat the Event for the same warning
        await ctl.resync()
        await trio.sleep(5)
        assert len((await client.list(EVENTS, "default")).items) == 1


async def test_invalid_pod_gets_event_and_no_cr(autojump_clock: trio.testing.MockClock) -> None:
    server = ApiServer()
    # kube-apiserver (and the sim, docs/deviations.md#pod-quantities) refuses this quantity on a
    # write, so the Pod is put past validation, as a store written by an older server could hold
    # it: the controller must still refuse it with an Event, not crash
    stored = server.create(server.find("pods"), "default", pod("bad"))
    bad = copy.deepcopy(stored)
    bad["spec"]["overhead"] = {"cpu": "a lot"}
    server.store.put(server.find("pods"), bad, stored)
    async with running(server) as (ctl, client):
        await client.create(PODS, pod("good"))
        await eventually(lambda: _pending_count(client, 1))
        await eventually(lambda: ctl.outcomes["invalid_pod"] >= 1)
        events = (await client.list(EVENTS, "default")).items
        assert [(e["reason"], e["involvedObject"]["name"]) for e in events] == [
            ("CapacityRequestFailed", "bad")
        ]
        assert "spec.overhead" in events[0]["message"]


async def test_orphan_cr_is_cleaned_up_after_sync(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    server = ApiServer(gc_dangling=False)
    setup = client_for(server, nursery)
    live = await setup.create(PODS, pod("live"))
    dead_uid = "00000000-0000-4000-8000-000000000000"
    for name, uid, owner in (
        ("cr-orphan", dead_uid, "dead"),
        ("cr-" + live["metadata"]["uid"], live["metadata"]["uid"], "live"),
    ):
        await setup.create(
            CAPACITY_REQUESTS,
            {
                "apiVersion": "bigfleet.lucy.sh/v1alpha1",
                "kind": "CapacityRequest",
                "metadata": {
                    "name": name,
                    "namespace": "default",
                    "labels": {LABEL: uid},
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "name": owner,
                            "uid": uid,
                            "controller": True,
                        }
                    ],
                },
                "spec": {
                    "priority": 0,
                    "resources": {"cpu": "500m", "memory": "1Gi"},
                    "requirements": [
                        {"key": "node.kubernetes.io/instance-type", "operator": "Exists"}
                    ],
                },
            },
        )
    async with running(server) as (ctl, client):
        await eventually(lambda: ctl.outcomes["orphan_deleted"] == 1)
        names = [c["metadata"]["name"] for c in await crs(client)]
        assert names == ["cr-" + live["metadata"]["uid"]]
        assert ctl.outcomes["cr_exists"] == 1
        assert server.counters[("create", "capacityrequests")] == 2  # only the two above


async def test_errors_requeue_with_backoff(autojump_clock: trio.testing.MockClock) -> None:
    server = ApiServer()
    async with running(server) as (ctl, client):
        server.faults.fail_next(3, code=409, verb="create", resource="capacityrequests")
        await client.create(PODS, pod("p"))
        await eventually(lambda: _pending_count(client, 1))
        assert ctl.outcomes["error"] == 3
        assert ctl.outcomes["cr_created"] == 1
        # the Pending stamp failing is non-fatal
        server.faults.fail_next(1, code=500, verb="patch", resource="capacityrequests/status")
        server.faults.fail_next(10, code=500, verb="patch", resource="capacityrequests/status")
        await client.create(PODS, pod("q"))
        await eventually(lambda: _count(client, 2))
        await eventually(lambda: ctl.outcomes["cr_created"] == 2)
        assert ctl.outcomes["error"] == 3


async def test_sync_timeout(autojump_clock: trio.testing.MockClock) -> None:
    server = ApiServer()
    # Both lists fail: no watch is ever opened, so the in-process transport has nothing
    # to tear down.
    server.faults.fail_next(10_000, code=500, verb="list")
    async with trio.open_nursery() as nursery:  # owns the in-process apiserver's tasks
        ctl = PodController(client_for(server, nursery), sync_timeout=30)
        with pytest.raises(SyncTimeout, match=r"after 30s .*\(pods, capacityrequests\)"):
            await ctl.run()
        assert trio.current_time() == pytest.approx(30)
        assert ctl.readiness() == (  # each with its last error (what to fix)
            False,
            ["informer pods not synced: 500 InternalError: injected fault (list pods)",
             "informer capacityrequests not synced: 500 InternalError: injected fault (list "
             "capacityrequests)"],
        )
        nursery.cancel_scope.cancel()


async def test_401_during_sync_is_reported_at_once_not_after_the_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = ApiServer()
    server.faults.fail_next(10_000, code=401, verb="list", resource="capacityrequests")
    async with trio.open_nursery() as nursery:
        ctl = PodController(client_for(server, nursery), sync_timeout=600)
        with pytest.raises(Unauthenticated, match=r"^401 Unauthorized: ") as caught:
            await ctl.run()
        assert isinstance(caught.value, SyncTimeout)  # callers reporting a failed sync see it
        assert trio.current_time() < 600  # not the sync deadline
        assert ctl.crs.synced is False
        nursery.cancel_scope.cancel()


async def test_leader_election_only_leader_writes(autojump_clock: trio.testing.MockClock) -> None:
    from bigfleet_trio.kube.leader import LeaderElector

    server = ApiServer()
    async with trio.open_nursery() as nursery:
        client = client_for(server, nursery)
        await client.create(PODS, pod("p"))
        a = PodController(client)
        b = PodController(client)
        ea = LeaderElector(client, name="upc", namespace="default", identity="a", rng=lambda: 0.0)
        eb = LeaderElector(client, name="upc", namespace="default", identity="b", rng=lambda: 0.0)
        scope_a = trio.CancelScope()

        async def run_a() -> None:
            with scope_a:
                await a.run(elector=ea)

        nursery.start_soon(run_a)
        await eventually(lambda: a.leading)
        await nursery.start(partial(b.run, elector=eb))
        await eventually(lambda: _pending_count(client, 1))
        assert b.readiness() == (True, "synced (standby)")
        await client.create(PODS, pod("q"))
        await eventually(lambda: _pending_count(client, 2))
        assert sum(b.outcomes.values()) == 0
        scope_a.cancel()  # a exits and releases; b takes over
        await eventually(lambda: b.leading)
        await client.create(PODS, pod("r"))
        await eventually(lambda: _pending_count(client, 3))
        assert b.outcomes["cr_created"] == 1
        assert server.counters[("create", "capacityrequests")] == 3
        nursery.cancel_scope.cancel()


async def watch_crs_until(client: KubeClient,
                          done: Callable[[dict[str, dict[str, Any]]], bool]) -> None:
    """Follow the default namespace's CRs (a list, then a watch from it) until ``done(CRs by
    name)`` holds: each check on an event, no polling (for tests on the real clock)."""
    listing = await client.list(CAPACITY_REQUESTS, "default")
    state = {cr["metadata"]["name"]: cr for cr in listing.items}
    rv = listing.resource_version
    while not done(state):
        async with client.watch(CAPACITY_REQUESTS, "default", resource_version=rv) as stream:
            async for event in stream:
                assert event.type != "ERROR", event.object
                rv = event.object["metadata"]["resourceVersion"]
                if event.type == "BOOKMARK":
                    continue
                name = event.object["metadata"]["name"]
                if event.type == "DELETED":
                    state.pop(name, None)
                else:
                    state[name] = event.object
                if done(state):
                    return


def _all_pending(n: int) -> Callable[[dict[str, dict[str, Any]]], bool]:
    return lambda crs: len(crs) == n and all(
        (cr.get("status") or {}).get("phase") == "Pending" for cr in crs.values())


async def test_real_socket_end_to_end(nursery: trio.Nursery, tmp_path: Path) -> None:
    """Over a real loopback socket (so on the real clock: a virtual one would jump past the
    socket's answers), waiting on watch events, never on a sleep."""
    server = ApiServer()
    url = await nursery.start(serve, server)
    kc = tmp_path / "kubeconfig"
    write_kubeconfig(url, str(kc))
    with trio.fail_after(20):
        async with KubeClient(load_kubeconfig(str(kc), env={})) as client:
            ctl = PodController(client)
            async with trio.open_nursery() as inner:
                await inner.start(ctl.run)
                uids = [(await client.create(PODS, pod(f"s{i}")))["metadata"]["uid"]
                        for i in range(5)]
                await watch_crs_until(client, _all_pending(5))
                await client.delete(PODS, "s0", "default")
                await watch_crs_until(client, lambda crs: len(crs) == 4)
                owners = {cr["metadata"]["labels"][LABEL] for cr in await crs(client)}
                assert owners == set(uids[1:])  # the deleted Pod's CR went, no other
                inner.cancel_scope.cancel()


async def test_pending_stamp_never_overwrites_a_newer_phase(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = ApiServer()
    async with running(server) as (ctl, client):
        created = await client.create(PODS, pod("p"))
        name = "cr-" + created["metadata"]["uid"]
        await eventually(lambda: _pending_count(client, 1))
        # Replay a stale stamp (resourceVersion from before the operator acknowledged) with
        # the cache not showing the phase yet: the guarded patch conflicts and is dropped.
        stale_rv = (await client.get(CAPACITY_REQUESTS, name, "default"))["metadata"][
            "resourceVersion"
        ]
        await client.patch(
            CAPACITY_REQUESTS,
            name,
            {"status": {"phase": "Acknowledged"}},
            "default",
            subresource="status",
        )
        await eventually(
            lambda: (
                (ctl.crs.store.get(f"default/{name}") or {}).get("status")
                == {"phase": "Acknowledged"}
            )
        )
        ctl.crs.store._pop(f"default/{name}")
        ctl.applier.stamp_rv[StampKey("default", name)] = stale_rv
        await ctl.reconciler.reconcile(StampKey("default", name))
        got = await client.get(CAPACITY_REQUESTS, name, "default")
        assert got["status"]["phase"] == "Acknowledged"
        # a CR that really has no phase yet is stamped even with a stale resourceVersion
        await client.patch(
            CAPACITY_REQUESTS, name, {"status": None}, "default", subresource="status"
        )
        ctl.applier.stamp_rv[StampKey("default", name)] = stale_rv
        await ctl.reconciler.reconcile(StampKey("default", name))
        got = await client.get(CAPACITY_REQUESTS, name, "default")
        assert got["status"]["phase"] == "Pending"


# --------------------------------------------------------------------------------------------
# demand a CR cannot carry: reported on the Pod, never silently lost

RECONCILES = "bigfleet_unschedulable_pod_controller_reconciles_total"


def _reconciles(outcome: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(RECONCILES, {"outcome": outcome}) or 0.0


def _node_affinity(*exprs: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": list(exprs)}]
            }
        }
    }


GT_GEN = {"key": "example.com/gen", "operator": "Gt", "values": ["3"]}
LT_CORES = {"key": "example.com/cores", "operator": "Lt", "values": ["64"]}
# not a NodeSelectorOperator: a real apiserver would refuse the Pod; the embedded one keeps it
NEAR_GEN = {"key": "example.com/gen", "operator": "Near", "values": ["3"]}
IN_GEN = {"key": "example.com/gen", "operator": "In", "values": ["4", "5"]}


async def _events_for(client: KubeClient, name: str) -> list[dict[str, Any]]:
    items = (await client.list(EVENTS, "default")).items
    return [e for e in items if e["involvedObject"]["name"] == name]


async def test_gt_lt_requirements_are_copied_into_the_cr_verbatim(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = ApiServer()  # the shipped CRD: requirements[].operator is any string
    async with running(server) as (ctl, client):
        created = await client.create(
            PODS, pod("p", affinity=_node_affinity(IN_GEN, GT_GEN, LT_CORES))
        )
        await eventually(lambda: _pending_count(client, 1))
        cr = await client.get(CAPACITY_REQUESTS, "cr-" + created["metadata"]["uid"], "default")
        assert cr["spec"]["requirements"] == [IN_GEN, GT_GEN, LT_CORES]
        assert ctl.outcomes["cr_created"] == 1
        assert ctl.outcomes["unsupported_requirement"] == 0
        assert await _events_for(client, "p") == []


async def test_unknown_operator_is_one_event_no_cr_no_retry_then_fixed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = ApiServer()
    metric_before = _reconciles("unsupported_requirement")
    async with running(server, resync_period=60.0) as (ctl, client):
        gt = await client.create(PODS, pod("gt", affinity=_node_affinity(NEAR_GEN)))
        ok = await client.create(PODS, pod("ok"))
        await eventually(lambda: _pending_count(client, 1))
        await eventually(lambda: ctl.outcomes["unsupported_requirement"] == 1)
        # the only CR is the good Pod's; the other Pod's create was never even attempted
        assert [c["metadata"]["labels"][LABEL] for c in await crs(client)] == [
            ok["metadata"]["uid"]
        ]
        assert server.counters[("create", "capacityrequests")] == 1
        assert _reconciles("unsupported_requirement") == metric_before + 1
        (ev,) = await _events_for(client, "gt")
        assert ev["type"] == "Warning"
        assert ev["reason"] == "UnsupportedRequirement"
        assert ev["involvedObject"]["uid"] == gt["metadata"]["uid"]
        assert "example.com/gen" in ev["message"] and "Near" in ev["message"]
        assert "not sent to BigFleet" in ev["message"]
        # no retry loop: nothing happens until the resync, which writes nothing and repeats
        # no Event
        await trio.sleep(59)
        assert ctl.outcomes["unsupported_requirement"] == 1
        assert ctl.outcomes["error"] == 0
        await trio.sleep(2)  # one resync
        assert ctl.outcomes["unsupported_requirement"] == 2
        assert server.counters[("create", "capacityrequests")] == 1
        assert server.counters[("patch", "capacityrequests")] == 0  # (stamps are .../status)
        assert len(await _events_for(client, "gt")) == 1
        # the Pod is fixed (Near replaced with In): the Pod update re-triggers, the CR appears
        await client.patch(PODS, "gt", {"spec": {"affinity": _node_affinity(IN_GEN)}}, "default")
        await eventually(lambda: _pending_count(client, 2))
        cr = await client.get(CAPACITY_REQUESTS, "cr-" + gt["metadata"]["uid"], "default")
        assert cr["spec"]["requirements"] == [IN_GEN]
        assert server.counters[("create", "capacityrequests")] == 2
        assert len(await _events_for(client, "gt")) == 1
        # broken again (Far this time): reported again, once
        await client.patch(
            PODS,
            "gt",
            {
                "spec": {
                    "affinity": _node_affinity(
                        {"key": "example.com/cores", "operator": "Far", "values": ["64"]}
                    )
                }
            },
            "default",
        )
        await eventually(lambda: _count(client, 1))
        events = await _events_for(client, "gt")
        assert [e["reason"] for e in events] == ["UnsupportedRequirement"] * 2
        assert any("'example.com/cores' Far" in e["message"] for e in events)


async def test_existing_cr_is_deleted_when_the_pod_gains_an_unknown_operator(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = ApiServer()
    async with running(server) as (ctl, client):
        created = await client.create(PODS, pod("p", affinity=_node_affinity(IN_GEN)))
        await eventually(lambda: _pending_count(client, 1))
        await client.patch(
            PODS, "p", {"spec": {"affinity": _node_affinity(IN_GEN, NEAR_GEN)}}, "default"
        )
        # a stale CR would carry the demand with constraints the Pod no longer has: removed
        await eventually(lambda: _count(client, 0))
        await eventually(lambda: ctl.outcomes["unsupported_requirement"] == 1)
        assert ctl.outcomes["cr_updated"] == 0
        assert server.counters[("patch", "capacityrequests")] == 0
        (ev,) = await _events_for(client, "p")
        assert ev["reason"] == "UnsupportedRequirement"
        assert ev["involvedObject"]["uid"] == created["metadata"]["uid"]
        await trio.sleep(30)
        assert await _count(client, 0)
        assert server.counters[("create", "capacityrequests")] == 1


async def test_invalid_on_create_is_permanent_event_once_no_hot_retry(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = ApiServer()
    metric_before = _reconciles("cr_rejected")
    async with running(server, resync_period=60.0) as (ctl, client):
        server.faults.fail_next(2, code=422, verb="create", resource="capacityrequests")
        created = await client.create(PODS, pod("p"))
        await eventually(lambda: ctl.outcomes["cr_rejected"] == 1)
        await trio.sleep(30)  # no backoff retry
        assert server.counters[("create", "capacityrequests")] == 1
        assert ctl.outcomes["error"] == 0
        assert _reconciles("cr_rejected") == metric_before + 1
        (ev,) = await _events_for(client, "p")
        assert ev["type"] == "Warning"
        assert ev["reason"] == "CapacityRequestRejected"
        assert ev["involvedObject"]["uid"] == created["metadata"]["uid"]
        assert "not sent to BigFleet" in ev["message"]
        # the periodic resync tries again; the same rejection of the same spec is not
        # reported twice
        await trio.sleep(31)
        assert server.counters[("create", "capacityrequests")] == 2
        assert ctl.outcomes["cr_rejected"] == 2
        assert len(await _events_for(client, "p")) == 1
        # a Pod change is a new spec version: tried at once, succeeds now
        await client.patch(PODS, "p", {"spec": {"priority": 5}}, "default")
        await eventually(lambda: _pending_count(client, 1))
        assert server.counters[("create", "capacityrequests")] == 3
        assert len(await _events_for(client, "p")) == 1


async def _cap_priority(client: KubeClient, maximum: int) -> None:
    """Install a stricter CapacityRequest CRD (spec.priority <= maximum): a real 422."""
    import copy

    from bigfleet_trio.kube.resources import CRDS

    crd = copy.deepcopy(await client.get(CRDS, "capacityrequests.bigfleet.lucy.sh"))
    for version in crd["spec"]["versions"]:
        props = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        props["priority"]["maximum"] = maximum
    await client.update(CRDS, crd)


async def test_invalid_on_update_is_permanent_and_reported_per_spec_version(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = ApiServer()
    async with running(server) as (ctl, client):
        await _cap_priority(client, 100)
        created = await client.create(PODS, pod("p"))
        await eventually(lambda: _pending_count(client, 1))
        creates = server.counters[("create", "capacityrequests")]
        patches = server.counters[("patch", "capacityrequests")]
        await client.patch(PODS, "p", {"spec": {"priority": 500}}, "default")
        await eventually(lambda: ctl.outcomes["cr_rejected"] == 1)
        # the CR no longer carries the Pod's spec: removed, not left with the old demand, and
        # not recreated at once (that create would be rejected just the same)
        await eventually(lambda: _count(client, 0))
        await trio.sleep(30)  # no backoff retry
        assert server.counters[("patch", "capacityrequests")] == patches + 1
        assert server.counters[("create", "capacityrequests")] == creates
        assert ctl.outcomes["cr_rejected"] == 1
        assert ctl.outcomes["error"] == 0
        (ev,) = await _events_for(client, "p")
        assert ev["reason"] == "CapacityRequestRejected"
        assert ev["involvedObject"]["uid"] == created["metadata"]["uid"]
        assert "spec.priority" in ev["message"]  # the apiserver's message
        assert "not sent to BigFleet" in ev["message"]
        # another spec version, rejected again (on create now): reported again
        await client.patch(PODS, "p", {"spec": {"priority": 600}}, "default")
        await eventually(lambda: ctl.outcomes["cr_rejected"] == 2)
        assert [e["reason"] for e in await _events_for(client, "p")] == [
            "CapacityRequestRejected"
        ] * 2
        assert server.counters[("create", "capacityrequests")] == creates + 1
        assert await _count(client, 0)
        # back within the CRD's limits: the CR is created
        await client.patch(PODS, "p", {"spec": {"priority": 50}}, "default")
        await eventually(lambda: _pending_count(client, 1))
        assert (await crs(client))[0]["spec"]["priority"] == 50
        assert ctl.outcomes["error"] == 0


async def test_cr_gc_before_the_pod_delete_reaches_the_cache_does_not_recreate(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The Pod is deleted, garbage collection deletes its CR, and the CR watch delivers that
    before the Pod watch delivers the Pod's deletion: the cache still shows the Pod. Found by
    the fleet soak: the controller re-created the CR, GC deleted it again, and so on until the
    Pod watch caught up (2,453 creates for one Pod in 2 s with a 4 s Pod-watch lag). A CR
    deletion the cache cannot explain is now checked against a live GET of the Pod first."""
    server = ApiServer()
    async with running(server) as (ctl, client):
        created = await client.create(PODS, pod("p"))
        await eventually(lambda: _pending_count(client, 1))
        [cr] = await crs(client)
        stale = ctl.pods.store.get("default/p")
        await client.delete(PODS, "p", "default")
        await eventually(lambda: _count(client, 0))  # GC removed the CR
        await eventually(lambda: ctl.pods.store.get("default/p") is None)
        creates = server.counters[("create", "capacityrequests")]
        # Replay the order the soak saw: the Pod cache still holds the Pod when the CR's
        # DELETED arrives.
        ctl.pods.store._set("default/p", stale)
        ctl._on_cr_delete(cr)
        # Without the check the create/GC loop runs at one instant of the mock clock, so watch
        # it step by step (bounded) before letting time pass.
        for _ in range(2000):
            await trio.lowlevel.checkpoint()
            if server.counters[("create", "capacityrequests")] != creates:
                break
        assert server.counters[("create", "capacityrequests")] == creates
        await trio.sleep(10)
        assert server.counters[("create", "capacityrequests")] == creates
        assert await crs(client) == []
        assert created["metadata"]["uid"] == stale["metadata"]["uid"]


async def test_hand_deleted_cr_of_a_live_pod_is_still_recreated_after_the_check(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = ApiServer()
    async with running(server) as (ctl, client):
        await client.create(PODS, pod("p"))
        await eventually(lambda: _pending_count(client, 1))
        [cr] = await crs(client)
        gets = server.counters[("get", "pods")]
        await client.delete(CAPACITY_REQUESTS, cr["metadata"]["name"], "default")
        await eventually(lambda: _pending_count(client, 1))
        assert server.counters[("get", "pods")] == gets + 1  # the one live check
