"""The opt-in request trace (docs/kube-api.md#request-trace): what a line names, and that the
client writes one line per request, failed ones included."""

from __future__ import annotations

import httpx
import orjson
import pytest

from bigfleet_trio.kube import reqtrace
from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.errors import NotFound


@pytest.mark.parametrize(("method", "path", "body", "name"), [
    ("PATCH", "/api/v1/nodes/n1", None, "n1"),
    ("POST", "/api/v1/namespaces/ns/pods/p1/eviction", {"metadata": {"name": "p1"}}, "p1"),
    ("POST", "/api/v1/namespaces/ns/pods/p1/eviction", None, "p1"),
    ("POST", "/apis/bigfleet.lucy.sh/v1alpha1/namespaces/ns/capacityrequests",
     {"metadata": {"name": "cr-u1"}}, "cr-u1"),
    ("GET", "/apis/bigfleet.lucy.sh/v1alpha1/upcomingnodes", None, ""),
    ("GET", "/api/v1/namespaces/ns/pods", None, ""),
    ("GET", "/api/v1/namespaces/ns", None, "ns"),
    ("PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l1", {}, "l1"),
])
def test_object_name(method: str, path: str, body: object, name: str) -> None:
    assert reqtrace.object_name(method, path, body) == name


async def test_the_client_traces_each_request_with_its_status(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    out = Path(str(tmp_path)) / "trace.jsonl"
    trace = reqtrace.RequestTrace(str(out))
    monkeypatch.setattr(reqtrace, "trace", trace)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/missing"):
            return httpx.Response(404, json={"kind": "Status", "reason": "NotFound", "code": 404})
        return httpx.Response(200, json={"kind": "Node"})

    cfg = KubeConfig(server="http://k8s.test")
    async with KubeClient(cfg, qps=0, transport=httpx.MockTransport(handler)) as client:
        await client.request("GET", "/api/v1/nodes/n1")
        with pytest.raises(NotFound):
            await client.request("GET", "/api/v1/nodes/missing")
    trace.close()
    lines = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert [(x[2], x[3], x[4], x[5]) for x in lines] == [
        ("GET", "/api/v1/nodes/n1", "n1", 200), ("GET", "/api/v1/nodes/missing", "missing", 404)]
    assert all(x[0] <= x[1] for x in lines)

