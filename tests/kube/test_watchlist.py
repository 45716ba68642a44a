"""Streaming lists (docs/kube-api.md#streaming-lists): the initial-events state machine, and the
informer's watch-list against the embedded apiserver and against a server that ignores it."""

from __future__ import annotations

import random
from typing import Any

import httpx
import orjson
import pytest
import trio
import trio.testing

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.errors import ApiError
from bigfleet_trio.kube.informer import Informer, refuses_watch_list
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS
from bigfleet_trio.kube.retry import Backoff
from bigfleet_trio.kube.watch import InitialEvents, WatchEvent, is_initial_events_end
from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.testing import InProcessTransport

from .fakekube import FakeKube

CR = "capacityrequests"




def _obj(name: str, rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}


def _bookmark(rv: str, end: bool) -> WatchEvent:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return WatchEvent("BOOKMARK", {"metadata": meta})


def _keyed(raw: dict[str, Any]) -> tuple[str, Any] | None:
    name = raw["metadata"].get("name")
    return None if name is None else (f"ns/{name}", name)


# -- the state machine (pure) --------------------------------------------------------------------


def _gathering() -> tuple[InitialEvents, dict[str, Any]]:
    """An InitialEvents whose objects are gathered in a dict (set on ADDED/MODIFIED, popped on
    DELETED), as the informer's store receives them."""
    objects: dict[str, Any] = {}
    return InitialEvents(objects.__setitem__, lambda k, _o: objects.pop(k, None)), objects


def test_initial_events_gather_until_the_end_bookmark() -> None:
    ie, objects = _gathering()
    assert ie.feed(WatchEvent("ADDED", _obj("a", "3")), _keyed) == "more"
    assert ie.feed(WatchEvent("ADDED", _obj("b", "5")), _keyed) == "more"
    assert not ie.done
    assert ie.feed(_bookmark("9", end=True), _keyed) == "end"
    assert ie.done and ie.resource_version == "9"
    assert objects == {"ns/a": "a", "ns/b": "b"}
    with pytest.raises(RuntimeError):
        ie.feed(WatchEvent("ADDED", _obj("c")), _keyed)


def test_initial_events_go_to_the_callers_sink_as_they_arrive() -> None:
    got: list[tuple[str, str, Any]] = []
    ie = InitialEvents(lambda k, o: got.append(("set", k, o)),
                       lambda k, o: got.append(("delete", k, o)))
    ie.feed(WatchEvent("ADDED", _obj("a", "3")), _keyed)
    assert got == [("set", "ns/a", "a")]  # before the end BOOKMARK
    ie.feed(WatchEvent("DELETED", _obj("a", "4")), _keyed)
    assert ie.feed(_bookmark("9", end=True), _keyed) == "end"
    assert got == [("set", "ns/a", "a"), ("delete", "ns/a", "a")]


def test_a_plain_bookmark_before_the_end_means_the_server_ignored_send_initial_events() -> None:
    ie, _ = _gathering()
    ie.feed(WatchEvent("ADDED", _obj("a")), _keyed)
    assert ie.feed(_bookmark("4", end=False), _keyed) == "unsupported"
    assert not ie.done


def test_the_annotation_must_say_true() -> None:
    ev = WatchEvent(
        "BOOKMARK",
        {"metadata": {"resourceVersion": "2", "annotations": {"k8s.io/initial-events-end": "no"}}},
    )
    assert not is_initial_events_end(ev)
    assert not is_initial_events_end(WatchEvent("ADDED", _bookmark("2", True).object))
    assert is_initial_events_end(_bookmark("2", True))


def test_modified_and_deleted_before_the_end_apply_and_bad_objects_are_counted() -> None:
    ie, objects = _gathering()
    ie.feed(WatchEvent("ADDED", _obj("a")), _keyed)
    ie.feed(WatchEvent("ADDED", _obj("b")), _keyed)
    ie.feed(WatchEvent("MODIFIED", _obj("a", "7")), _keyed)
    ie.feed(WatchEvent("DELETED", _obj("b")), _keyed)
    ie.feed(WatchEvent("DELETED", _obj("never-seen")), _keyed)
    ie.feed(WatchEvent("ADDED", {"metadata": {}}), _keyed)
    assert objects == {"ns/a": "a"}
    assert ie.skipped == 1


def test_an_error_event_is_reported() -> None:
    ie, _ = _gathering()
    assert ie.feed(WatchEvent("ERROR", {"code": 410}), _keyed) == "error"


# -- the informer against the embedded apiserver -------------------------------------------------


def _cr(name: str, priority: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "bigfleet.lucy.sh/v1alpha1",
        "kind": "CapacityRequest",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"priority": priority, "resources": {"cpu": "1"}},
    }


def _slim(obj: dict[str, Any]) -> dict[str, Any]:
    return {"name": obj["metadata"]["name"], "priority": obj["spec"]["priority"]}


class _Log:
    def __init__(self, inf: Informer) -> None:
        self.log: list[tuple[str, str]] = []
        inf.add_handler(
            on_add=lambda o: self.log.append(("add", o["name"])),
            on_update=lambda old, new: self.log.append(("update", new["name"])),
            on_delete=lambda o: self.log.append(("delete", o["name"])),
        )


async def _sim(nursery: trio.Nursery, names: str) -> tuple[ApiServer, KubeClient]:
    server = ApiServer()
    c = KubeClient(
        KubeConfig(server="http://apiserver"), transport=InProcessTransport(server.app, nursery)
    )
    for n in names:
        await c.create(CAPACITY_REQUESTS, _cr(n))
    server.counters.reset()
    return server, c


def _inf(c: KubeClient, **kw: Any) -> Informer:
    return Informer(c, CAPACITY_REQUESTS, transform=_slim, backoff=Backoff(rng=lambda: 0.0),
                    rng=random.Random(3), page_size=2, **kw)


async def test_streaming_list_syncs_without_a_list_and_keeps_the_same_watch(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server, c = await _sim(nursery, "abc")
    inf = _inf(c, watch_list=True)
    rec = _Log(inf)
    await nursery.start(inf.run)
    await inf.wait_synced()
    assert rec.log == [("add", "a"), ("add", "b"), ("add", "c")]
    assert server.counters[("list", CR)] == 0 and server.counters[("watch", CR)] == 1
    assert inf.resource_version  # from the end bookmark
    await c.create(CAPACITY_REQUESTS, _cr("d"))
    await c.patch(CAPACITY_REQUESTS, "a", {"spec": {"priority": 4}}, "default")
    await trio.testing.wait_all_tasks_blocked()
    assert rec.log[3:] == [("add", "d"), ("update", "a")]
    assert server.counters[("watch", CR)] == 1 and inf.watch_list_refused is None


async def test_streaming_relist_after_410_diffs_against_the_store(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server, c = await _sim(nursery, "abc")
    inf = _inf(c, watch_list=True)
    rec = _Log(inf)
    await nursery.start(inf.run)
    await inf.wait_synced()
    server.faults.fail_next(1, code=500, verb="watch", resource=CR)
    server.faults.drop_watches()
    await trio.testing.wait_all_tasks_blocked()
    await c.delete(CAPACITY_REQUESTS, "a", "default")
    await c.patch(CAPACITY_REQUESTS, "b", {"spec": {"priority": 7}}, "default")
    server.faults.compact()  # the re-watch from before the changes gets 410
    await trio.sleep(10)
    assert rec.log[3:] == [("update", "b"), ("delete", "a")]  # applied as listed, deletions last
    assert sorted(inf.store.keys()) == ["default/b", "default/c"]
    assert server.counters[("list", CR)] == 0
    assert inf.relists == 2 and inf.watch_list_refused is None


async def test_paged_list_when_streaming_is_off(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server, c = await _sim(nursery, "abc")
    inf = _inf(c, watch_list=False)
    rec = _Log(inf)
    await nursery.start(inf.run)
    await inf.wait_synced()
    assert rec.log == [("add", "a"), ("add", "b"), ("add", "c")]
    assert server.counters[("list", CR)] == 2  # two pages of 2


@pytest.mark.parametrize("code", [400, 403, 422])
async def test_a_refused_streaming_list_falls_back_to_the_paged_list_and_remembers(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, code: int
) -> None:
    server, c = await _sim(nursery, "abc")
    server.faults.fail_next(1, code=code, verb="watch", resource=CR)
    inf = _inf(c, watch_list=True)
    rec = _Log(inf)
    await nursery.start(inf.run)
    await inf.wait_synced()
    assert rec.log == [("add", "a"), ("add", "b"), ("add", "c")]
    assert server.counters[("list", CR)] == 2
    assert inf.watch_list_refused is not None and str(code) in inf.watch_list_refused
    # a later relist remembers: paged LIST again, no second streaming attempt (a change while
    # the watch is down, then compaction: the re-watch from before it gets 410)
    server.faults.fail_next(1, code=500, verb="watch", resource=CR)
    server.faults.drop_watches()
    await c.patch(CAPACITY_REQUESTS, "a", {"spec": {"priority": 9}}, "default")
    server.faults.compact()
    await trio.sleep(10)
    assert server.counters[("list", CR)] == 4
    assert len(inf.store) == 3


async def test_a_server_error_on_the_streaming_list_retries_it(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server, c = await _sim(nursery, "ab")
    server.faults.fail_next(1, code=503, verb="watch", resource=CR)
    inf = _inf(c, watch_list=True)
    await nursery.start(inf.run)
    await inf.wait_synced()
    assert server.counters[("list", CR)] == 0 and inf.watch_list_refused is None


# -- a server that ignores sendInitialEvents (FakeKube replays history, never sends the end) ----


def _fake_informer(fake: FakeKube, **kw: Any) -> Informer:
    client = KubeClient(KubeConfig(server="http://kube.test"), transport=fake.transport())
    return Informer(client, CAPACITY_REQUESTS, transform=_slim, page_size=2,
                    backoff=Backoff(rng=lambda: 0.0), rng=random.Random(7), watch_list=True, **kw)


async def test_no_end_bookmark_within_the_deadline_falls_back(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    fake = FakeKube()
    fake.seed(CR, _cr("a"))
    fake.seed(CR, _cr("b"))
    inf = _fake_informer(fake, initial_events_timeout=5.0)
    rec = _Log(inf)
    await nursery.start(inf.run)
    start = trio.current_time()
    await inf.wait_synced()
    assert 5.0 <= trio.current_time() - start < 6.0
    assert rec.log == [("add", "a"), ("add", "b")]  # once: the ignored stream's ADDs were dropped
    assert inf.watch_list_refused is not None and "initial-events-end" in inf.watch_list_refused
    lists = [r for r in fake.requests if r.url.params.get("watch") != "1"]
    assert lists and all(r.url.params.get("sendInitialEvents") is None for r in lists)
    first = fake.watch_requests()[0].url.params
    assert first["sendInitialEvents"] == "true"
    assert first["resourceVersionMatch"] == "NotOlderThan"
    assert first["allowWatchBookmarks"] == "true"


async def test_a_plain_bookmark_during_the_initial_events_falls_back_at_once(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    fake = FakeKube()
    fake.seed(CR, _cr("a"))
    inf = _fake_informer(fake, initial_events_timeout=60.0)
    rec = _Log(inf)
    await nursery.start(inf.run)
    await trio.testing.wait_all_tasks_blocked()
    assert not inf.synced
    fake.bookmark()
    await inf.wait_synced()
    assert rec.log == [("add", "a")]
    assert inf.watch_list_refused is not None and "BOOKMARK" in inf.watch_list_refused


async def test_the_watch_ending_before_the_end_bookmark_falls_back(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeKube()
    fake.seed(CR, _cr("a"))
    inf = _fake_informer(fake, initial_events_timeout=60.0)
    rec = _Log(inf)
    caplog.set_level("INFO", logger="bigfleet_trio.kube.informer")
    await nursery.start(inf.run)
    await trio.testing.wait_all_tasks_blocked()
    fake.end_watches()
    await inf.wait_synced()
    assert rec.log == [("add", "a")]
    assert inf.watch_list_refused is not None and "ended" in inf.watch_list_refused
    refused = [r for r in caplog.records if "streaming list refused" in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelname == "INFO"
    # later watches are ordinary ones: no sendInitialEvents again
    await trio.testing.wait_all_tasks_blocked()
    fake.end_watches()
    await trio.sleep(5)
    assert [r.url.params.get("sendInitialEvents") for r in fake.watch_requests()][1:] == [
        None, None]


def _watch_body(*docs: dict[str, Any]) -> bytes:
    return b"".join(orjson.dumps(d) + b"\n" for d in docs)


def _added(fake: FakeKube, name: str) -> dict[str, Any]:
    return {"type": "ADDED", "object": fake.objects[(CR, "default", name)]}


async def test_a_410_during_the_initial_events_starts_the_streaming_list_again(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    fake = FakeKube()
    fake.seed(CR, _cr("a"))
    fake.seed(CR, _cr("b"))
    gone = {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                        "reason": "Expired", "code": 410, "message": "too old"}}
    end = {"type": "BOOKMARK", "object": {"metadata": {
        "resourceVersion": str(fake.rv), "annotations": {"k8s.io/initial-events-end": "true"}}}}
    fake.inject("GET", CR, httpx.Response(200, content=_watch_body(_added(fake, "a"), gone)))
    fake.inject("GET", CR, httpx.Response(
        200, content=_watch_body(_added(fake, "a"), _added(fake, "b"), end)))
    inf = _fake_informer(fake)
    rec = _Log(inf)
    await nursery.start(inf.run)
    await inf.wait_synced()
    assert rec.log == [("add", "a"), ("add", "b")]  # nothing from the stream that failed
    assert inf.watch_list_refused is None and inf.resource_version == str(fake.rv)
    assert all(r.url.params.get("watch") == "1" for r in fake.requests)  # no LIST
    first, second = (r.url.params for r in fake.watch_requests()[:2])
    assert first.get("sendInitialEvents") == second.get("sendInitialEvents") == "true"


async def test_a_5xx_error_event_during_the_initial_events_is_retried_not_refused(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    fake = FakeKube()
    fake.seed(CR, _cr("a"))
    boom = {"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "etcd"}}
    end = {"type": "BOOKMARK", "object": {"metadata": {
        "resourceVersion": str(fake.rv), "annotations": {"k8s.io/initial-events-end": "true"}}}}
    fake.inject("GET", CR, httpx.Response(200, content=_watch_body(boom)))
    fake.inject("GET", CR, httpx.Response(200, content=_watch_body(_added(fake, "a"), end)))
    inf = _fake_informer(fake)
    await nursery.start(inf.run)
    await inf.wait_synced()
    assert inf.watch_list_refused is None and sorted(inf.store.keys()) == ["default/a"]


@pytest.mark.parametrize(
    ("code", "refused"),
    [(400, True), (403, True), (422, True), (401, False), (404, False), (410, False),
     (429, False), (500, False), (503, False)],
)
def test_which_answers_refuse_a_streaming_list(code: int, refused: bool) -> None:
    assert refuses_watch_list(ApiError(code, "X", "m")) is refused


async def test_watches_ask_for_an_uncompressed_body(autojump_clock: trio.testing.MockClock) -> None:
    # kube-apiserver v1.37 gzips a streaming list as one gzip member per flush; httpx decodes
    # only the first member, so every event after the initial ones was lost.
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=b"")

    client = KubeClient(KubeConfig(server="http://kube.test"),
                        transport=httpx.MockTransport(handler))
    async with client.watch(CAPACITY_REQUESTS, resource_version="", send_initial_events=True,
                            retry=False) as stream:
        assert [e async for e in stream] == []
    assert seen[0].headers["accept-encoding"] == "identity"
