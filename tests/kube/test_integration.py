"""The kube layer against the embedded apiserver (bigfleet_trio.sim.apiserver).

One test goes over a real loopback socket (serve + write_kubeconfig + load_kubeconfig, real
clock, short), on both backends (the embedded apiserver and the real one); the rest use the
in-process ASGI transport so ``autojump_clock`` drives time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig, load_kubeconfig
from bigfleet_trio.kube.errors import AlreadyExists, Conflict, Invalid, NotFound
from bigfleet_trio.kube.informer import Informer
from bigfleet_trio.kube.leader import LeaderElector
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, LEASES, PODS
from bigfleet_trio.kube.retry import Backoff
from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.testing import InProcessTransport
from tests.support.realkube import RealKube, backend_kubeconfig


def _cr(name: str, priority: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "bigfleet.lucy.sh/v1alpha1",
        "kind": "CapacityRequest",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"priority": priority, "resources": {"cpu": "1"}},
    }


def _slim(obj: dict[str, Any]) -> dict[str, Any]:
    return {"name": obj["metadata"]["name"], "priority": obj["spec"]["priority"]}


@pytest.mark.parametrize("watch_list", [False, True], ids=["paged-list", "watch-list"])
async def test_real_socket_crud_list_informer(
    nursery: trio.Nursery, tmp_path: Path, kube_backend: RealKube | None, watch_list: bool
) -> None:
    # both backends (tests/support/realkube.py): the embedded apiserver, or the real one
    kc = await backend_kubeconfig(nursery, tmp_path, kube_backend, token="t0k")
    cfg = load_kubeconfig(str(kc), env={})
    with trio.fail_after(20):
        async with KubeClient(cfg) as c:
            created = await c.create(CAPACITY_REQUESTS, _cr("a"))
            assert created["metadata"]["uid"]
            with pytest.raises(AlreadyExists):
                await c.create(CAPACITY_REQUESTS, _cr("a"))
            with pytest.raises(Invalid):
                await c.create(CAPACITY_REQUESTS, {**_cr("bad"), "spec": {"priority": "x"}})
            stale = dict(created)
            await c.patch(CAPACITY_REQUESTS, "a", {"spec": {"priority": 5}}, "default")
            with pytest.raises(Conflict):
                await c.update(CAPACITY_REQUESTS, stale)
            st = await c.patch(
                CAPACITY_REQUESTS,
                "a",
                {"status": {"phase": "Acknowledged"}},
                "default",
                subresource="status",
            )
            assert st["status"]["phase"] == "Acknowledged"
            for i in range(5):
                await c.create(CAPACITY_REQUESTS, _cr(f"p{i}"))
            out = await c.list(CAPACITY_REQUESTS, "default", limit=2)
            assert [o["metadata"]["name"] for o in out.items] == ["a", "p0", "p1", "p2", "p3", "p4"]

            inf = Informer(c, CAPACITY_REQUESTS, transform=_slim, page_size=2,
                           watch_list=watch_list)
            added = trio.Event()
            inf.add_handler(on_add=lambda o: added.set() if o["name"] == "late" else None)
            async with trio.open_nursery() as n:
                await n.start(inf.run)
                await inf.wait_synced()
                assert inf.store.get("default/a") == {"name": "a", "priority": 5}
                await c.create(CAPACITY_REQUESTS, _cr("late"))
                await added.wait()
                gone = trio.Event()
                inf.add_handler(on_delete=lambda o: gone.set() if o["name"] == "late" else None)
                await c.delete(CAPACITY_REQUESTS, "late", "default")
                await gone.wait()
                assert "default/late" not in inf.store
                n.cancel_scope.cancel()
            with pytest.raises(NotFound):
                await c.get(CAPACITY_REQUESTS, "late", "default")


@pytest.mark.parametrize("watch_list", [False, True], ids=["paged-list", "watch-list"])
async def test_informer_recovers_deletions_across_410(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, watch_list: bool
) -> None:
    server = ApiServer()
    c = KubeClient(
        KubeConfig(server="http://apiserver"), transport=InProcessTransport(server.app, nursery)
    )
    for n in "abc":
        await c.create(CAPACITY_REQUESTS, _cr(n))
    inf = Informer(c, CAPACITY_REQUESTS, transform=_slim, backoff=Backoff(rng=lambda: 0.0),
                   watch_list=watch_list)
    log: list[tuple[str, str]] = []
    inf.add_handler(
        on_add=lambda o: log.append(("add", o["name"])),
        on_update=lambda old, new: log.append(("update", new["name"])),
        on_delete=lambda o: log.append(("delete", o["name"])),
    )
    await nursery.start(inf.run)
    await inf.wait_synced()
    await trio.testing.wait_all_tasks_blocked()
    # Next watch open fails → informer backs off; meanwhile a deleted, b changed, history gone.
    server.faults.fail_next(1, code=500, verb="watch", resource="capacityrequests")
    server.faults.drop_watches()
    await trio.testing.wait_all_tasks_blocked()
    await c.delete(CAPACITY_REQUESTS, "a", "default")
    await c.patch(CAPACITY_REQUESTS, "b", {"spec": {"priority": 7}}, "default")
    server.faults.compact()
    await trio.sleep(10)
    assert log == [("add", "a"), ("add", "b"), ("add", "c"), ("update", "b"), ("delete", "a")]
    assert sorted(inf.store.keys()) == ["default/b", "default/c"]
    assert inf.relists == 2 and inf.watch_list_refused is None
    assert server.counters[("list", "capacityrequests")] == (0 if watch_list else 2)
    await c.create(CAPACITY_REQUESTS, _cr("d"))
    await trio.testing.wait_all_tasks_blocked()
    assert log[-1] == ("add", "d")


async def test_leader_handover_and_eviction(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = ApiServer()

    def client() -> KubeClient:
        return KubeClient(
            KubeConfig(server="http://apiserver"), transport=InProcessTransport(server.app, nursery)
        )

    a = LeaderElector(client(), name="bf", namespace="kube-system", identity="a", rng=lambda: 0.0)
    b = LeaderElector(client(), name="bf", namespace="kube-system", identity="b", rng=lambda: 0.0)
    order: list[tuple[str, float]] = []
    async with a.leading():
        order.append(("a", trio.current_time()))
        nursery.start_soon(b.run, lambda: _mark(order, "b"))
        await trio.sleep(20.5)
        assert not b.is_leader
    await trio.sleep(3)
    assert [who for who, _ in order] == ["a", "b"]
    assert 20.5 <= order[1][1] <= 22.5
    c = client()
    lease = await c.get(LEASES, "bf", "kube-system")
    assert lease["spec"]["leaseTransitions"] == 1
    # eviction of a missing pod maps to NotFound
    with pytest.raises(NotFound):
        await c.evict("nope", "default")
    await c.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        },
    )
    await c.evict("p", "default")


async def _mark(order: list[tuple[str, float]], who: str) -> None:
    order.append((who, trio.current_time()))
    await trio.sleep_forever()
