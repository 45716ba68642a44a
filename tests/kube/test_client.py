"""KubeClient against the in-memory fake apiserver."""

from __future__ import annotations

import json

import httpx
import pytest
import trio
from prometheus_client import REGISTRY

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.errors import (
    AlreadyExists,
    Conflict,
    Expired,
    KubeTransportError,
    NotFound,
    ServerError,
    TooManyRequests,
    WatchInactivityTimeout,
)
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, LEASES, NODES, PODS

from .fakekube import FakeKube, status


def _client(fake: FakeKube, **kw: object) -> KubeClient:
    cfg = KubeConfig(server="https://kube.test", token="tok")
    return KubeClient(cfg, transport=fake.transport(), **kw)  # type: ignore[arg-type]


def _cr(name: str, ns: str = "default", cpu: str = "1") -> dict:
    return {
        "apiVersion": "bigfleet.lucy.sh/v1alpha1",
        "kind": "CapacityRequest",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"cpu": cpu},
    }


async def test_crud_roundtrip_and_error_mapping() -> None:
    fake = FakeKube()
    async with _client(fake) as c:
        created = await c.create(CAPACITY_REQUESTS, _cr("a"))
        assert created["metadata"]["resourceVersion"] == "101"
        req = fake.requests[-1]
        assert req.url.path == "/apis/bigfleet.lucy.sh/v1alpha1/namespaces/default/capacityrequests"
        assert req.headers["authorization"] == "Bearer tok"
        with pytest.raises(AlreadyExists):
            await c.create(CAPACITY_REQUESTS, _cr("a"))
        got = await c.get(CAPACITY_REQUESTS, "a", "default")
        assert got["spec"] == {"cpu": "1"}
        got["spec"]["cpu"] = "2"
        updated = await c.update(CAPACITY_REQUESTS, got)
        assert updated["metadata"]["resourceVersion"] == "102"
        with pytest.raises(Conflict):  # stale RV 101
            await c.update(CAPACITY_REQUESTS, got)
        patched = await c.patch(
            CAPACITY_REQUESTS,
            "a",
            {"status": {"phase": "Pending"}},
            "default",
            subresource="status",
        )
        assert fake.requests[-1].url.path.endswith("/capacityrequests/a/status")
        assert fake.requests[-1].headers["content-type"] == "application/merge-patch+json"
        assert patched["status"] == {"phase": "Pending"}
        with pytest.raises(Conflict):
            await c.delete(
                CAPACITY_REQUESTS, "a", "default", preconditions={"resourceVersion": "1"}
            )
        await c.delete(CAPACITY_REQUESTS, "a", "default", propagation_policy="Background")
        assert json.loads(fake.requests[-1].content)["propagationPolicy"] == "Background"
        with pytest.raises(NotFound):
            await c.get(CAPACITY_REQUESTS, "a", "default")


async def test_patch_types_and_cluster_scoped_paths() -> None:
    fake = FakeKube()
    fake.seed("nodes", {"metadata": {"name": "n1"}})
    async with _client(fake) as c:
        await c.patch(NODES, "n1", {"spec": {"unschedulable": True}}, patch_type="strategic")
        r = fake.requests[-1]
        assert r.url.path == "/api/v1/nodes/n1"
        assert r.headers["content-type"] == "application/strategic-merge-patch+json"
        fake.inject("PATCH", "/nodes/n1", httpx.Response(200, json={}))
        await c.patch(NODES, "n1", [{"op": "add", "path": "/x", "value": 1}], patch_type="json")
        assert fake.requests[-1].headers["content-type"] == "application/json-patch+json"
        with pytest.raises(ValueError):
            await c.patch(NODES, "n1", {}, patch_type="bogus")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await c.get(PODS, "p")  # namespaced without namespace


async def test_list_pagination_follows_continue() -> None:
    fake = FakeKube()
    for i in range(7):
        fake.seed("pods", {"metadata": {"name": f"p{i}", "namespace": "ns"}})
    async with _client(fake) as c:
        out = await c.list(PODS, "ns", limit=3, label_selector="app=x")
    assert [o["metadata"]["name"] for o in out.items] == [f"p{i}" for i in range(7)]
    assert out.resource_version == "107"
    assert all(o["kind"] == "Pod" and o["apiVersion"] == "v1" for o in out.items)
    lists = [r.url.params for r in fake.requests]
    assert [p.get("continue") for p in lists] == [None, "107:3", "107:6"]
    assert all(p["limit"] == "3" and p["labelSelector"] == "app=x" for p in lists)


async def test_list_restarts_when_continue_token_expires() -> None:
    fake = FakeKube()
    for i in range(5):
        fake.seed("pods", {"metadata": {"name": f"p{i}", "namespace": "ns"}})
    fake.expire_continue = True
    async with _client(fake) as c:
        out = await c.list(PODS, "ns", limit=2)
    assert [o["metadata"]["name"] for o in out.items] == ["p0", "p1", "p2", "p3", "p4"]
    # page1, page2 (410), restart: page1, page2, page3
    assert [r.url.params.get("continue") for r in fake.requests] == [
        None,
        "105:2",
        None,
        "105:2",
        "105:4",
    ]


async def test_429_retry_after_honoured(autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeKube()
    fake.seed("nodes", {"metadata": {"name": "n1"}})
    resp = status(429, "TooManyRequests", "slow down")
    resp.headers["Retry-After"] = "3"
    fake.inject("GET", "/nodes/n1", resp, times=2)
    async with _client(fake) as c:
        t0 = trio.current_time()
        got = await c.get(NODES, "n1")
        assert got["metadata"]["name"] == "n1"
        assert trio.current_time() - t0 == pytest.approx(6.0)
    assert len(fake.requests) == 3


async def test_429_gives_up_after_max_attempts(autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeKube()
    fake.inject("GET", "/nodes", status(429, "TooManyRequests", "no"), times=10)
    async with _client(fake, max_attempts=3) as c:
        with pytest.raises(TooManyRequests):
            await c.get(NODES, "n1")
    assert len(fake.requests) == 3


async def test_5xx_retried_for_reads_not_for_plain_writes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeKube()
    fake.seed("nodes", {"metadata": {"name": "n1"}})
    fake.inject("GET", "/nodes/n1", status(503, "ServiceUnavailable", "x"), times=2)
    async with _client(fake) as c:
        assert (await c.get(NODES, "n1"))["metadata"]["name"] == "n1"
        assert len(fake.requests) == 3
        fake.inject("POST", "/nodes", status(500, "InternalError", "x"))
        with pytest.raises(ServerError):
            await c.create(NODES, {"metadata": {"name": "n2"}})
        assert len(fake.requests) == 4


async def test_eviction_429_not_retried() -> None:
    fake = FakeKube()
    fake.inject(
        "POST",
        "/eviction",
        status(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
        ),
    )
    async with _client(fake) as c:
        with pytest.raises(TooManyRequests):
            await c.evict("p", "ns")
        with pytest.raises(NotFound):
            await c.evict("p", "ns")
    assert fake.requests[0].url.path == "/api/v1/namespaces/ns/pods/p/eviction"
    assert b'"policy/v1"' in fake.requests[0].content


async def test_transport_error_and_request_timeout(autojump_clock: trio.testing.MockClock) -> None:
    async def broken(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    cfg = KubeConfig(server="http://kube.test")
    async with KubeClient(cfg, transport=httpx.MockTransport(broken), max_attempts=2) as c:
        with pytest.raises(KubeTransportError, match="refused"):
            await c.get(NODES, "n")

    async def hang(request: httpx.Request) -> httpx.Response:
        await trio.sleep_forever()
        raise AssertionError

    async with KubeClient(
        cfg, transport=httpx.MockTransport(hang), max_attempts=1, request_timeout=7
    ) as c:
        t0 = trio.current_time()
        with pytest.raises(KubeTransportError, match="no answer within 7s"):
            await c.get(NODES, "n")
        assert trio.current_time() - t0 == pytest.approx(7.0)


async def test_rate_limit_token_bucket(autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeKube()
    fake.seed("nodes", {"metadata": {"name": "n1"}})
    async with _client(fake, qps=10, burst=2) as c:
        t0 = trio.current_time()
        stamps = []
        for _ in range(5):
            await c.get(NODES, "n1")
            stamps.append(round(trio.current_time() - t0, 6))
    assert stamps == [0.0, 0.0, 0.1, 0.2, 0.3]


async def test_create_event_best_effort() -> None:
    fake = FakeKube()
    fake.inject("POST", "/events", status(403, "Forbidden", "no"))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
    }
    async with _client(fake) as c:
        await c.create_event(pod, reason="Pending", message="waiting", component="bf")
        await c.create_event(
            pod, reason="Pending", message="waiting", component="bf", type="Warning"
        )
    ev = fake.objects[next(k for k in fake.objects if k[0] == "events")]
    assert ev["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p",
        "namespace": "ns",
        "uid": "u",
    }
    assert ev["type"] == "Warning" and ev["source"] == {"component": "bf"}


async def test_watch_stream_events_and_inactivity(autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeKube()
    fake.seed("leases", {"metadata": {"name": "l", "namespace": "ns"}})
    async with _client(fake) as c:
        async with c.watch(
            LEASES, "ns", resource_version="100", timeout_seconds=300, inactivity_timeout=90
        ) as stream:
            params = fake.requests[-1].url.params
            assert (
                params["watch"],
                params["resourceVersion"],
                params["allowWatchBookmarks"],
                params["timeoutSeconds"],
            ) == ("1", "100", "true", "300")
            ev = await stream.__anext__()
            assert (ev.type, ev.object["metadata"]["name"]) == ("ADDED", "l")
            fake.bookmark()
            ev = await stream.__anext__()
            assert ev.type == "BOOKMARK" and ev.object["metadata"]["resourceVersion"] == "101"
            t0 = trio.current_time()
            with pytest.raises(WatchInactivityTimeout):
                await stream.__anext__()
            assert trio.current_time() - t0 == pytest.approx(90.0)


async def test_watch_open_410_raises_expired_and_clean_end() -> None:
    fake = FakeKube()
    fake.inject("GET", "/leases", status(410, "Expired", "too old"))
    async with _client(fake) as c:
        with pytest.raises(Expired):
            async with c.watch(LEASES, "ns", resource_version="1"):
                pass
        async with c.watch(LEASES, "ns", resource_version="100") as stream:
            fake.end_watches()
            assert [e async for e in stream] == []


async def test_write_retries_only_when_safe(autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeKube()
    async with _client(fake) as c:
        # 429 on a create: the apiserver did not process it → retried.
        fake.inject("POST", "/capacityrequests", status(429, "TooManyRequests", "x"))
        await c.create(CAPACITY_REQUESTS, _cr("a"))
        assert [r.method for r in fake.requests] == ["POST", "POST"]
        # 503 on a PUT carrying metadata.resourceVersion: precondition makes a retry safe.
        got = await c.get(CAPACITY_REQUESTS, "a", "default")
        fake.inject("PUT", "/capacityrequests/a", status(503, "ServiceUnavailable", "x"))
        await c.update(CAPACITY_REQUESTS, got)
        assert [r.method for r in fake.requests][-2:] == ["PUT", "PUT"]
        # 503 on a PUT without resourceVersion (unconditional): not retried.
        del got["metadata"]["resourceVersion"]
        fake.inject("PUT", "/capacityrequests/a", status(503, "ServiceUnavailable", "x"))
        with pytest.raises(ServerError):
            await c.update(CAPACITY_REQUESTS, got)
        # 503 on DELETE with preconditions: retried.
        n = len(fake.requests)
        fake.inject("DELETE", "/capacityrequests/a", status(503, "ServiceUnavailable", "x"))
        await c.delete(CAPACITY_REQUESTS, "a", "default", preconditions={"uid": "uid-a-101"})
        assert len(fake.requests) - n == 2


async def test_watches_use_their_own_connection_pool_and_both_close() -> None:
    # A watch holds its connection for minutes; in the request pool it would add to httpcore's
    # O(connections x requests) bookkeeping on every write, so it gets a pool of its own.
    client = KubeClient(KubeConfig(server="http://127.0.0.1:1"))
    assert client._watch_http is not client._http
    assert client._http._transport is not client._watch_http._transport
    await client.aclose()
    assert client._http.is_closed and client._watch_http.is_closed
    # an injected transport (tests) is shared as is: one client
    mocked = KubeClient(
        KubeConfig(server="http://k"), transport=httpx.MockTransport(lambda r: httpx.Response(200))
    )
    assert mocked._watch_http is mocked._http
    await mocked.aclose()


async def test_429_retry_after_zero_still_backs_off(autojump_clock: trio.testing.MockClock) -> None:
    """``Retry-After: 0`` is a floor, not the wait: the retries still follow the exponential
    backoff instead of re-sending at once."""
    fake = FakeKube()
    fake.seed("nodes", {"metadata": {"name": "n1"}})
    resp = status(429, "TooManyRequests", "slow down")
    resp.headers["Retry-After"] = "0"
    fake.inject("GET", "/nodes/n1", resp, times=3)
    async with _client(fake) as c:
        await c.get(NODES, "n1")
    gaps = [b - a for a, b in zip(fake.times, fake.times[1:], strict=False)]
    # default backoff: 0.2 s doubling, jittered down by up to half
    assert [g >= lo for g, lo in zip(gaps, (0.1, 0.2, 0.4), strict=True)] == [True] * 3


async def test_429_retry_after_holds_every_request_of_the_client(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """APF refuses the client's flow, not one request: after a 429 with ``Retry-After: 5`` the
    client's other requests wait out the same 5 s instead of being refused in turn."""
    fake = FakeKube()
    for n in ("n1", "n2"):
        fake.seed("nodes", {"metadata": {"name": n}})
    resp = status(429, "TooManyRequests", "slow down")
    resp.headers["Retry-After"] = "5"
    fake.inject("GET", "/nodes/n1", resp)
    throttled = REGISTRY.get_sample_value("bigfleet_kube_client_throttled_total") or 0.0
    async with _client(fake, qps=0) as c, trio.open_nursery() as nursery:
        nursery.start_soon(c.get, NODES, "n1")
        await trio.sleep(1)
        await c.get(NODES, "n2")
    sent = {(r.url.path.rsplit("/", 1)[1], t) for r, t in zip(fake.requests, fake.times,
                                                              strict=True)}
    assert sorted(sent) == [("n1", 0.0), ("n1", pytest.approx(5.0)), ("n2", pytest.approx(5.0))]
    assert REGISTRY.get_sample_value("bigfleet_kube_client_throttled_total") == throttled + 1


async def test_eviction_429_does_not_hold_the_client(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A PodDisruptionBudget refusal (429 on an eviction) is about that Pod, not the server."""
    fake = FakeKube()
    fake.seed("nodes", {"metadata": {"name": "n1"}})
    pdb = status(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's "
                 "disruption budget.", retryAfterSeconds=10)
    fake.inject("POST", "/eviction", pdb)
    async with _client(fake) as c:
        with pytest.raises(TooManyRequests):
            await c.evict("p1", "default")
        t0 = trio.current_time()
        await c.get(NODES, "n1")
        assert trio.current_time() == t0


async def test_an_error_answer_leaves_no_reference_cycle() -> None:
    """The exception of an error answer (a 404 here) is raised without a frame of ours keeping
    it, so it goes as soon as the caller drops it. A cycle would wait for the cycle collector,
    and one frozen by docs/kube-api.md#garbage-collector while still live is never collected:
    a soak leaked one exception, its traceback and six frames per failed request."""
    import gc

    fake = FakeKube()
    async with _client(fake) as c:
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(5):
                try:
                    await c.get(CAPACITY_REQUESTS, "missing", "default")
                except NotFound:
                    pass
                else:
                    raise AssertionError("no NotFound")
            gc.collect()
            leaked = [type(o).__name__ for o in gc.garbage if isinstance(o, BaseException)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    assert leaked == []
