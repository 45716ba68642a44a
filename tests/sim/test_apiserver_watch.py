"""Watch semantics of the embedded apiserver: replay from a resourceVersion, 410 Expired,
bookmarks, watch-list, timeoutSeconds, filter enter/leave and dropped watches
and refusal of a resourceVersion the server has not reached."""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio

from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.testing import CR_PATH, PODS, cr_body, patch, pod_body, watch_lines


async def test_watch_resume_replays_in_order(
    client: httpx.AsyncClient, autojump_clock: Any
) -> None:
    rv = (await client.get(CR_PATH)).json()["metadata"]["resourceVersion"]
    await client.post(CR_PATH, json=cr_body("a"))
    await patch(client, f"{CR_PATH}/a", {"spec": {"priority": 2}})
    await client.delete(f"{CR_PATH}/a")
    events = await watch_lines(client, CR_PATH, resourceVersion=rv, timeoutSeconds="2")
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)
    assert events[2]["object"]["spec"]["priority"] == 2
    assert events[0]["object"]["kind"] == "CapacityRequest"


async def test_watch_without_rv_sends_synthetic_added(
    client: httpx.AsyncClient, autojump_clock: Any
) -> None:
    await client.post(CR_PATH, json=cr_body("a"))
    await client.post(CR_PATH, json=cr_body("b"))
    events = await watch_lines(client, CR_PATH, timeoutSeconds="1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
    ]


async def test_live_events_then_timeout(client: httpx.AsyncClient, autojump_clock: Any) -> None:
    rv = (await client.get(CR_PATH)).json()["metadata"]["resourceVersion"]
    got: list[dict[str, Any]] = []

    async def watcher() -> None:
        got.extend(await watch_lines(client, CR_PATH, resourceVersion=rv, timeoutSeconds="10"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watcher)
        await trio.sleep(1)
        await client.post(CR_PATH, json=cr_body("a"))
        await trio.sleep(1)
        await patch(client, f"{CR_PATH}/a", {"spec": {"priority": 1}})  # no-op: no event
        await patch(client, f"{CR_PATH}/a", {"spec": {"priority": 4}})
        start = trio.current_time()
    assert [e["type"] for e in got] == ["ADDED", "MODIFIED"]
    assert trio.current_time() - start <= 10


async def test_too_old_rv_gets_410_error_event(
    api: ApiServer, client: httpx.AsyncClient, autojump_clock: Any
) -> None:
    small = ApiServer(history=10)
    from bigfleet_trio.sim.apiserver.testing import open_client

    async with open_client(small) as c:
        first = (await c.post(CR_PATH, json=cr_body("a"))).json()["metadata"]["resourceVersion"]
        for i in range(20):
            await patch(c, f"{CR_PATH}/a", {"spec": {"priority": i + 10}})
        events = await watch_lines(c, CR_PATH, resourceVersion=first, timeoutSeconds="5")
        assert len(events) == 1
        err = events[0]
        assert err["type"] == "ERROR"
        assert err["object"]["code"] == 410 and err["object"]["reason"] == "Expired"
        assert err["object"]["message"].startswith(f"too old resource version: {first} (")
        cur = (await c.get(CR_PATH)).json()["metadata"]["resourceVersion"]
        assert await watch_lines(c, CR_PATH, resourceVersion=cur, timeoutSeconds="1") == []


async def test_compact_fault_forces_410(
    api: ApiServer, client: httpx.AsyncClient, autojump_clock: Any
) -> None:
    rv = (await client.post(CR_PATH, json=cr_body("a"))).json()["metadata"]["resourceVersion"]
    await patch(client, f"{CR_PATH}/a", {"spec": {"priority": 3}})
    api.faults.compact()
    events = await watch_lines(client, CR_PATH, resourceVersion=rv, timeoutSeconds="1")
    assert events[0]["object"]["code"] == 410


async def test_bookmarks(api: ApiServer, client: httpx.AsyncClient, autojump_clock: Any) -> None:
    api.bookmark_interval = 1.0
    await client.post(CR_PATH, json=cr_body("a"))
    rv = (await client.get(CR_PATH)).json()["metadata"]["resourceVersion"]
    events = await watch_lines(
        client, CR_PATH, resourceVersion=rv, allowWatchBookmarks="true", timeoutSeconds="3"
    )
    assert events and all(e["type"] == "BOOKMARK" for e in events)
    assert events[0]["object"] == {
        "kind": "CapacityRequest",
        "apiVersion": "bigfleet.lucy.sh/v1alpha1",
        "metadata": {"resourceVersion": rv},
    }


async def test_watch_list_initial_events_end(
    client: httpx.AsyncClient, autojump_clock: Any
) -> None:
    await client.post(CR_PATH, json=cr_body("a"))
    await client.post(CR_PATH, json=cr_body("b"))
    events = await watch_lines(
        client,
        CR_PATH,
        sendInitialEvents="true",
        resourceVersionMatch="NotOlderThan",
        allowWatchBookmarks="true",
        timeoutSeconds="1",
    )
    assert [e["type"] for e in events[:3]] == ["ADDED", "ADDED", "BOOKMARK"]
    assert events[2]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    r = await client.get(CR_PATH, params={"watch": "1", "sendInitialEvents": "true"})
    assert r.status_code == 422


async def test_filtered_watch_enter_and_leave(
    client: httpx.AsyncClient, autojump_clock: Any
) -> None:
    await client.post(PODS, json=pod_body("p", labels={"app": "web"}))
    rv = (await client.get(PODS)).json()["metadata"]["resourceVersion"]
    await patch(client, f"{PODS}/p", {"metadata": {"labels": {"app": None}}})
    await patch(client, f"{PODS}/p", {"metadata": {"labels": {"app": "web"}}})
    events = await watch_lines(
        client, PODS, resourceVersion=rv, labelSelector="app=web", timeoutSeconds="1"
    )
    assert [e["type"] for e in events] == ["DELETED", "ADDED"]


async def test_drop_watches_ends_streams(
    api: ApiServer, client: httpx.AsyncClient, autojump_clock: Any
) -> None:
    done = trio.Event()

    async def watcher() -> None:
        await watch_lines(client, CR_PATH, resourceVersion="1")
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watcher)
        await trio.sleep(1)
        assert api.faults.drop_watches() == 1
        with trio.fail_after(5):
            await done.wait()


async def test_watch_table_events(client: httpx.AsyncClient, autojump_clock: Any) -> None:
    rv = (await client.get("/apis/bigfleet.lucy.sh/v1alpha1/upcomingnodes")).json()["metadata"][
        "resourceVersion"
    ]
    upn = {"metadata": {"name": "u1"}, "spec": {"resources": {"cpu": "4"}}}
    await client.post("/apis/bigfleet.lucy.sh/v1alpha1/upcomingnodes", json=upn)
    await patch(
        client,
        "/apis/bigfleet.lucy.sh/v1alpha1/upcomingnodes/u1/status",
        {"status": {"phase": "Launched", "nodeRef": {"name": "n9"}}},
    )
    lines = []
    async with client.stream(
        "GET",
        "/apis/bigfleet.lucy.sh/v1alpha1/upcomingnodes",
        params={"watch": "1", "resourceVersion": rv, "timeoutSeconds": "1"},
        headers={"accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"},
    ) as resp:
        async for line in resp.aiter_lines():
            if line:
                lines.append(json.loads(line))
    assert lines[0]["object"]["kind"] == "Table"
    assert [c["name"] for c in lines[0]["object"]["columnDefinitions"]] == [
        "Name",
        "Phase",
        "Node",
        "Age",
        "Instance-Type",
        "Zone",
        "Last-Error",
    ]
    assert lines[1]["object"]["columnDefinitions"] == []
    assert lines[1]["object"]["rows"][0]["cells"][:3] == ["u1", "Launched", "n9"]


async def test_partial_object_metadata(client: httpx.AsyncClient, autojump_clock: Any) -> None:
    accept = {
        "accept": (
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
        )
    }
    rv = (await client.get(CR_PATH)).json()["metadata"]["resourceVersion"]
    await client.post(CR_PATH, json=cr_body("a"))
    lst = (await client.get(CR_PATH, headers=accept)).json()
    assert lst["kind"] == "PartialObjectMetadataList"
    assert lst["items"][0]["kind"] == "PartialObjectMetadata" and "spec" not in lst["items"][0]
    lines = []
    async with client.stream(
        "GET",
        CR_PATH,
        params={"watch": "1", "resourceVersion": rv, "timeoutSeconds": "1"},
        headers=accept,
    ) as resp:
        async for line in resp.aiter_lines():
            if line:
                lines.append(json.loads(line))
    assert lines[0]["object"] == {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": lines[0]["object"]["metadata"],
    }
    assert lines[0]["object"]["metadata"]["name"] == "a"


TOO_LARGE_CAUSES = [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]


async def test_watch_from_a_newer_resource_version_is_refused_as_too_large(
    client: httpx.AsyncClient, api: ApiServer
) -> None:
    # The shape of a restore with empty state: the client's last version is ahead of the
    # server's. A real apiserver refuses with 504 Timeout / ResourceVersionTooLarge.
    current = api.store.rv
    r = await client.get(CR_PATH, params={"watch": "true", "resourceVersion": str(current + 5)})
    assert r.status_code == 504
    assert r.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"Timeout: Too large resource version: {current + 5}, current: {current}",
        "reason": "Timeout",
        "details": {"causes": TOO_LARGE_CAUSES, "retryAfterSeconds": 1},
        "code": 504,
    }
    assert r.headers["retry-after"] == "1"


async def test_watch_list_from_a_newer_resource_version_is_refused(
    client: httpx.AsyncClient, api: ApiServer
) -> None:
    r = await client.get(
        CR_PATH,
        params={
            "watch": "true",
            "sendInitialEvents": "true",
            "resourceVersionMatch": "NotOlderThan",
            "allowWatchBookmarks": "true",
            "resourceVersion": str(api.store.rv + 1),
        },
    )
    assert r.status_code == 504
    assert r.json()["details"]["causes"] == TOO_LARGE_CAUSES


async def test_list_not_older_than_a_newer_resource_version_is_refused(
    client: httpx.AsyncClient, api: ApiServer
) -> None:
    current = api.store.rv
    for params in (
        {"resourceVersion": str(current + 1), "resourceVersionMatch": "NotOlderThan"},
        {"resourceVersion": str(current + 1)},
    ):
        r = await client.get(CR_PATH, params=params)
        assert r.status_code == 504, params
        assert r.json()["reason"] == "Timeout"
        assert r.json()["message"] == (
            f"Timeout: Too large resource version: {current + 1}, current: {current}"
        )


async def test_list_and_watch_at_the_current_resource_version_are_served(
    client: httpx.AsyncClient, api: ApiServer, autojump_clock: Any
) -> None:
    await client.post(CR_PATH, json=cr_body("a"))
    current = str(api.store.rv)
    r = await client.get(
        CR_PATH, params={"resourceVersion": current, "resourceVersionMatch": "NotOlderThan"}
    )
    assert r.status_code == 200
    assert [o["metadata"]["name"] for o in r.json()["items"]] == ["a"]
    assert await watch_lines(client, CR_PATH, resourceVersion=current, timeoutSeconds="1") == []


async def test_watch_resource_version_must_be_an_integer(client: httpx.AsyncClient) -> None:
    r = await client.get(CR_PATH, params={"watch": "true", "resourceVersion": "abc"})
    assert r.status_code == 400
    assert r.json()["message"] == "invalid resource version: 'abc'"
