"""KubeClient.delete_collection (deletecollection verb).

The request shape is checked against a recording ``httpx.MockTransport`` (as in test_client.py);
the selector semantics against the embedded apiserver over the in-process ASGI transport (as in
test_integration.py).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
import trio.testing

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.errors import Forbidden, NotFound, ServerError, TooManyRequests
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, NAMESPACES, NODES, PODS, UPCOMING_NODES
from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.testing import InProcessTransport

from .fakekube import status

_OK = {"kind": "Status", "apiVersion": "v1", "status": "Success"}


class Recorder:
    """Answers every request with the next canned response (default 200 Success); keeps them."""

    def __init__(self, *answers: httpx.Response) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def transport(self) -> httpx.MockTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            self.requests.append(request)
            if self.answers:
                return self.answers.pop(0)
            return httpx.Response(200, json=_OK)

        return httpx.MockTransport(handler)


def _client(rec: Recorder, **kw: Any) -> KubeClient:
    return KubeClient(
        KubeConfig(server="https://kube.test", token="tok"), transport=rec.transport(), **kw
    )


async def test_namespaced_request_method_path_and_label_selector() -> None:
    rec = Recorder()
    async with _client(rec) as c:
        await c.delete_collection(
            CAPACITY_REQUESTS, "team", label_selector="bigfleet.lucy.sh/owned-by-pod=uid-1"
        )
    [req] = rec.requests
    assert req.method == "DELETE"
    assert req.url.path == "/apis/bigfleet.lucy.sh/v1alpha1/namespaces/team/capacityrequests"
    # only the selector that was given; None selectors are not sent as empty parameters
    assert dict(req.url.params) == {"labelSelector": "bigfleet.lucy.sh/owned-by-pod=uid-1"}
    assert req.headers["authorization"] == "Bearer tok"
    assert req.content == b""  # no DeleteOptions body


async def test_both_selectors_are_sent() -> None:
    rec = Recorder()
    async with _client(rec) as c:
        await c.delete_collection(
            PODS, "ns", label_selector="app=x,tier!=db", field_selector="status.phase=Failed"
        )
    [req] = rec.requests
    assert req.url.path == "/api/v1/namespaces/ns/pods"
    assert dict(req.url.params) == {
        "labelSelector": "app=x,tier!=db",
        "fieldSelector": "status.phase=Failed",
    }


async def test_cluster_scoped_ignores_namespace_and_no_selector_sends_no_query() -> None:
    rec = Recorder()
    async with _client(rec) as c:
        # a namespace given for a cluster-scoped kind is dropped, not a ValueError
        await c.delete_collection(NODES, "ignored", label_selector="pool=spot")
        await c.delete_collection(UPCOMING_NODES)
    first, second = rec.requests
    assert (first.method, first.url.path) == ("DELETE", "/api/v1/nodes")
    assert dict(first.url.params) == {"labelSelector": "pool=spot"}
    assert (second.method, second.url.path) == (
        "DELETE",
        "/apis/bigfleet.lucy.sh/v1alpha1/upcomingnodes",
    )
    assert second.url.query == b""


async def test_forbidden_and_not_found_map_to_errors_without_retry() -> None:
    rec = Recorder(
        status(403, "Forbidden", 'cannot deletecollection resource "capacityrequests"'),
        status(404, "NotFound", "the server could not find the requested resource"),
    )
    async with _client(rec) as c:
        with pytest.raises(Forbidden, match="deletecollection"):
            await c.delete_collection(CAPACITY_REQUESTS, "ns", label_selector="a=b")
        with pytest.raises(NotFound):
            await c.delete_collection(CAPACITY_REQUESTS, "ns", label_selector="a=b")
    assert len(rec.requests) == 2


async def test_5xx_not_retried_429_retried_after_retry_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A deletecollection may have removed part of the set before a 5xx: not retried (a write).
    rec = Recorder(status(500, "InternalError", "etcd timeout"))
    async with _client(rec) as c:
        with pytest.raises(ServerError):
            await c.delete_collection(CAPACITY_REQUESTS, "ns", label_selector="a=b")
    assert len(rec.requests) == 1

    # 429: the apiserver did nothing -> retried after the server's Retry-After (4 s), then OK.
    slow = status(429, "TooManyRequests", "slow down")
    slow.headers["Retry-After"] = "4"
    rec = Recorder(slow)
    async with _client(rec) as c:
        t0 = trio.current_time()
        await c.delete_collection(CAPACITY_REQUESTS, "ns", label_selector="a=b")
        assert trio.current_time() - t0 == pytest.approx(4.0)
    assert [r.method for r in rec.requests] == ["DELETE", "DELETE"]
    assert rec.requests[0].url == rec.requests[1].url

    # 429 on every attempt: gives up after max_attempts and raises TooManyRequests.
    rec = Recorder(*(status(429, "TooManyRequests", "no") for _ in range(5)))
    async with _client(rec, max_attempts=3) as c:
        with pytest.raises(TooManyRequests):
            await c.delete_collection(CAPACITY_REQUESTS, "ns", label_selector="a=b")
    assert len(rec.requests) == 3


def _cr(name: str, ns: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "bigfleet.lucy.sh/v1alpha1",
        "kind": "CapacityRequest",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"priority": 1, "resources": {"cpu": "1"}},
    }


async def test_embedded_apiserver_deletes_only_matches_in_that_namespace(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = ApiServer()
    c = KubeClient(
        KubeConfig(server="http://apiserver"), transport=InProcessTransport(server.app, nursery)
    )
    await c.create(
        NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}}
    )
    owned = {"bigfleet.lucy.sh/owned-by-pod": "u1"}
    await c.create(CAPACITY_REQUESTS, _cr("a", "default", owned))
    await c.create(CAPACITY_REQUESTS, _cr("b", "default", owned))
    await c.create(CAPACITY_REQUESTS, _cr("c", "default", {"bigfleet.lucy.sh/owned-by-pod": "u2"}))
    await c.create(CAPACITY_REQUESTS, _cr("d", "default", {}))
    await c.create(CAPACITY_REQUESTS, _cr("e", "other", owned))  # same label, other namespace

    await c.delete_collection(
        CAPACITY_REQUESTS, "default", label_selector="bigfleet.lucy.sh/owned-by-pod=u1"
    )

    left = await c.list(CAPACITY_REQUESTS)
    assert sorted((o["metadata"]["namespace"], o["metadata"]["name"]) for o in left.items) == [
        ("default", "c"),
        ("default", "d"),
        ("other", "e"),
    ]
    with pytest.raises(NotFound):
        await c.get(CAPACITY_REQUESTS, "a", "default")
    await c.aclose()
