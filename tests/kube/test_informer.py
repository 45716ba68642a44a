"""Informer: list+watch, resume, bookmarks, 410 relist diff, inactivity, backoff."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio
import trio.testing

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.informer import Informer, drop_managed_fields
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, UPCOMING_NODES
from bigfleet_trio.kube.retry import Backoff

from .fakekube import FakeKube, status

CR = "capacityrequests"


def _cr(name: str, cpu: str = "1", owner: str = "o1", ns: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "bigfleet.lucy.sh/v1alpha1",
        "kind": "CapacityRequest",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {"pool": "p1"},
            "ownerReferences": [{"uid": owner}],
        },
        "spec": {"priority": 1, "resources": {"cpu": cpu}},
    }


def _slim(obj: dict[str, Any]) -> dict[str, Any]:
    m = obj["metadata"]
    return {
        "name": m["name"],
        "rv": m["resourceVersion"],
        "cpu": obj["spec"]["resources"]["cpu"],
        "owner": m["ownerReferences"][0]["uid"],
    }


class Recorder:
    def __init__(self, inf: Informer):
        self.log: list[tuple[str, str, str]] = []
        inf.add_handler(
            on_add=lambda o: self.log.append(("add", o["name"], o["cpu"])),
            on_update=lambda old, new: self.log.append(("update", new["name"], new["cpu"])),
            on_delete=lambda o: self.log.append(("delete", o["name"], o["cpu"])),
        )

    def take(self) -> list[tuple[str, str, str]]:
        out, self.log = self.log, []
        return out


def _client(fake: FakeKube) -> KubeClient:
    return KubeClient(KubeConfig(server="http://kube.test"), transport=fake.transport())


def _informer(fake: FakeKube, **kw: Any) -> Informer:
    kw.setdefault("transform", _slim)
    kw.setdefault("page_size", 2)
    kw.setdefault("backoff", Backoff(rng=lambda: 0.0))
    kw.setdefault("rng", random.Random(7))
    return Informer(_client(fake), CAPACITY_REQUESTS, **kw)


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


async def test_initial_sync_paginated_indexed_and_live_events(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    fake = FakeKube()
    for i in range(5):
        fake.seed(CR, _cr(f"r{i}", owner="o1" if i < 3 else "o2"))
    inf = _informer(fake, indexers={"owner": lambda o: [o["owner"]]})
    rec = Recorder(inf)
    await nursery.start(inf.run)
    assert not inf.synced
    await inf.wait_synced()
    assert inf.synced and inf.resource_version == "105"
    assert rec.take() == [("add", f"r{i}", "1") for i in range(5)]
    lists = [r for r in fake.requests if "watch" not in r.url.params]
    assert [r.url.params.get("continue") for r in lists] == [None, "105:2", "105:4"]
    assert inf.store.get("default/r0") == {"name": "r0", "rv": "101", "cpu": "1", "owner": "o1"}
    assert len(inf.store) == 5
    assert [o["name"] for o in inf.store.by_index("owner", "o2")] == ["r3", "r4"]
    await settle()
    w = fake.watch_requests()[0].url.params
    assert w["resourceVersion"] == "105" and w["allowWatchBookmarks"] == "true"
    assert 300 <= int(w["timeoutSeconds"]) <= 600
    fake.seed(CR, _cr("r5", owner="o2"))
    fake.modify(CR, "default", "r0", {"spec": {"resources": {"cpu": "2"}}})
    fake.modify(CR, "default", "r3", {"metadata": {"ownerReferences": [{"uid": "o1"}]}})
    fake.remove(CR, "default", "r1")
    await settle()
    assert rec.take() == [
        ("add", "r5", "1"),
        ("update", "r0", "2"),
        ("update", "r3", "1"),
        ("delete", "r1", "1"),
    ]
    assert [o["name"] for o in inf.store.by_index("owner", "o1")] == ["r0", "r2", "r3"]
    assert [o["name"] for o in inf.store.by_index("owner", "o2")] == ["r4", "r5"]
    assert inf.resource_version == "109"


async def test_resume_after_dropped_connection_no_missed_or_duplicate_events(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    fake = FakeKube()
    fake.seed(CR, _cr("a"))
    fake.seed(CR, _cr("b"))
    inf = _informer(fake)
    rec = Recorder(inf)
    await nursery.start(inf.run)
    await inf.wait_synced()
    await settle()
    fake.modify(CR, "default", "a", {"spec": {"resources": {"cpu": "2"}}})  # rv 103
    await settle()
    t_drop = trio.current_time()
    fake.drop_watches()
    await settle()  # informer now backing off
    # Changes while disconnected:
    fake.seed(CR, _cr("c"))  # 104
    fake.modify(CR, "default", "b", {"spec": {"resources": {"cpu": "3"}}})  # 105
    fake.remove(CR, "default", "a")  # 106
    await trio.sleep(5)
    watches = fake.watch_requests()
    assert [w.url.params["resourceVersion"] for w in watches] == ["102", "103"]
    assert fake.watch_times()[1] - t_drop == pytest.approx(0.8)  # first backoff step
    assert rec.take() == [
        ("add", "a", "1"),
        ("add", "b", "1"),
        ("update", "a", "2"),
        ("add", "c", "1"),
        ("update", "b", "3"),
        ("delete", "a", "2"),
    ]
    assert sorted(inf.store.keys()) == ["default/b", "default/c"]
    assert inf.relists == 1 and inf.resource_version == "106"


async def test_bookmarks_advance_resource_version(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    fake = FakeKube()
    fake.seed(CR, _cr("a"))
    inf = _informer(fake)
    await nursery.start(inf.run)
    await inf.wait_synced()
    await settle()
    for i in range(3):  # unrelated kind bumps the global RV to 104
        fake.seed("nodes", {"metadata": {"name": f"n{i}"}})
    fake.bookmark()
    await settle()
    assert inf.resource_version == "104"
    fake.end_watches()  # clean end: re-watch at once from the bookmark's RV
    t_end = trio.current_time()
    await settle()
    assert [w.url.params["resourceVersion"] for w in fake.watch_requests()] == ["101", "104"]
    assert fake.watch_times()[-1] == t_end


async def test_410_relist_recovers_deletions_made_while_disconnected(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    fake = FakeKube()
    for n in "abc":
        fake.seed(CR, _cr(n))
    inf = _informer(fake)
    rec = Recorder(inf)
    await nursery.start(inf.run)
    await inf.wait_synced()
    await settle()
    rec.take()
    fake.drop_watches()
    await settle()
    fake.remove(CR, "default", "a")
    fake.modify(CR, "default", "b", {"spec": {"resources": {"cpu": "9"}}})
    fake.seed(CR, _cr("d"))
    fake.compact()  # the history the watch would need is gone → ERROR 410 on re-watch
    await trio.sleep(5)
    # Synthesised from the relist as it is applied: the list's (name) order, deletions last.
    assert rec.take() == [("update", "b", "9"), ("add", "d", "1"), ("delete", "a", "1")]
    assert sorted(inf.store.keys()) == ["default/b", "default/c", "default/d"]
    assert inf.relists == 2
    watches = fake.watch_requests()
    assert [w.url.params["resourceVersion"] for w in watches] == ["103", "103", "106"]


async def test_http_410_on_watch_open_relists_immediately(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    fake = FakeKube()
    fake.seed(CR, _cr("a"))
    inf = _informer(fake)
    await nursery.start(inf.run)
    await inf.wait_synced()
    await settle()
    fake.inject("GET", "/capacityrequests", status(410, "Expired", "too old resource version"))
    fake.drop_watches()
    await trio.sleep(5)
    assert inf.relists == 2
    pairs = zip(fake.requests[-3:], fake.times[-3:], strict=True)
    tail = [("watch" in r.url.params, t) for r, t in pairs]
    assert tail == [(True, 0.8), (False, 0.8), (True, 0.8)]  # 410 watch, relist, watch: no wait


async def test_inactivity_timeout_rewatches(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    fake = FakeKube()
    fake.seed(CR, _cr("a"))
    inf = _informer(fake, inactivity_timeout=90.0)
    await nursery.start(inf.run)
    await inf.wait_synced()
    await trio.sleep(89)
    assert len(fake.watch_requests()) == 1
    await trio.sleep(2)
    assert fake.watch_times() == [0.0, 90.0]
    fake.seed(CR, _cr("b"))  # the new watch is live
    await settle()
    assert "default/b" in inf.store
    assert inf.relists == 1


async def test_errors_back_off_exponentially_and_honour_retry_after(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    fake = FakeKube()
    fake.seed(CR, _cr("a"))
    inf = _informer(fake)
    await nursery.start(inf.run)
    await inf.wait_synced()
    await settle()
    fake.inject("GET", "/capacityrequests", status(503, "ServiceUnavailable", "x"), times=3)
    too_many = status(429, "TooManyRequests", "x")
    too_many.headers["Retry-After"] = "20"
    fake.inject("GET", "/capacityrequests", too_many)
    fake.drop_watches()
    await trio.sleep(60)
    times = fake.watch_times()
    gaps = [round(b - a, 6) for a, b in zip(times, times[1:], strict=False)]
    # drop → 0.8; 503 ×3 → 1.6, 3.2, 6.4; 429 Retry-After 20 beats the 12.8 s backoff step.
    assert gaps == [0.8, 1.6, 3.2, 6.4, 20.0]
    assert len(times) == 6  # last one is live
    fake.seed(CR, _cr("b"))
    await settle()
    assert "default/b" in inf.store


async def test_error_event_other_than_410_backs_off_and_resumes(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    fake = FakeKube()
    fake.seed(CR, _cr("a"))
    inf = _informer(fake)
    await nursery.start(inf.run)
    await inf.wait_synced()
    await settle()
    for w in fake.watchers:
        fake._send(
            w,
            {
                "type": "ERROR",
                "object": {
                    "kind": "Status",
                    "code": 500,
                    "reason": "InternalError",
                    "message": "etcd hiccup",
                },
            },
        )
    await trio.sleep(2)
    assert [w.url.params["resourceVersion"] for w in fake.watch_requests()] == ["101", "101"]
    assert inf.relists == 1


async def test_handler_errors_and_bad_objects_do_not_kill_informer(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    fake = FakeKube()
    fake.seed(CR, _cr("a"))
    broken = _cr("broken")
    del broken["spec"]  # the slim transform raises KeyError on it
    fake.seed(CR, broken)
    inf = _informer(fake)
    seen: list[str] = []

    def boom(obj: dict[str, Any]) -> None:
        raise RuntimeError("handler bug")

    inf.add_handler(on_add=boom)
    inf.add_handler(on_add=lambda o: seen.append(o["name"]))
    await nursery.start(inf.run)
    await inf.wait_synced()
    assert seen == ["a"] and sorted(inf.store.keys()) == ["default/a"]
    await settle()
    fake.seed(CR, _cr("b"))
    await settle()
    assert seen == ["a", "b"]


async def test_cluster_scoped_keys_without_transform(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    fake = FakeKube()
    fake.seed(
        "upcomingnodes", {"metadata": {"name": "u1"}, "status": {"nodeRef": {"name": "node-1"}}}
    )
    fake.seed("upcomingnodes", {"metadata": {"name": "u2"}, "status": {}})
    inf = Informer(
        _client(fake),
        UPCOMING_NODES,
        indexers={
            "node": lambda o: (
                [o["status"]["nodeRef"]["name"]] if o.get("status", {}).get("nodeRef") else []
            )
        },
    )
    await nursery.start(inf.run)
    await inf.wait_synced()
    assert inf.store.keys() == ["u1", "u2"]
    assert [o["metadata"]["name"] for o in inf.store.by_index("node", "node-1")] == ["u1"]
    assert inf.store.by_index("node", "node-2") == []
    with pytest.raises(KeyError):
        inf.store.by_index("nope", "x")


def test_drop_managed_fields_keeps_everything_else_and_the_input() -> None:
    obj = {"kind": "UpcomingNode", "spec": {"a": 1}, "metadata": {
        "name": "un-1", "resourceVersion": "7", "labels": {"x": "y"},
        "managedFields": [{"manager": "bigfleet-operator", "fieldsV1": {"f:status": {}}}]}}
    out = drop_managed_fields(obj)
    assert out == {"kind": "UpcomingNode", "spec": {"a": 1}, "metadata": {
        "name": "un-1", "resourceVersion": "7", "labels": {"x": "y"}}}
    assert out["spec"] is obj["spec"]  # a shallow copy: the rest is shared, not copied
    assert "managedFields" in obj["metadata"]  # the input is not mutated
    bare = {"metadata": {"name": "n"}}
    assert drop_managed_fields(bare) is bare  # nothing to drop: the same object
    assert drop_managed_fields({"kind": "X"}) == {"kind": "X"}
