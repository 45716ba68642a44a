"""Kubernetes protobuf for Pods and Nodes: bytes recorded from kube-apiserver v1.37 decode to the
objects the informers' transforms read from the same server's JSON; broken bytes are refused
with a clear error; the client asks for protobuf only where it may and reads JSON wherever the
server answers JSON (docs/kube-api.md#protobuf).

The fixtures (tests/fixtures/kube-protobuf) are recorded by ``python -m
scripts.realkube.record_protobuf``.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trio

from bigfleet_trio.kube import protowire
from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.errors import KubeTransportError, NotFound, error_from_status
from bigfleet_trio.kube.informer import Informer
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, NODES, PODS
from bigfleet_trio.kube.watch import InitialEvents, is_initial_events_end
from bigfleet_trio.kube.watchstream import WatchStream
from bigfleet_trio.operator.wiring import slim_node
from bigfleet_trio.podcontroller.projections import slim_pod
from bigfleet_trio.podcontroller.scope import PodScope
from bigfleet_trio.proto.kube.v1 import objects_pb2 as pb

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kube-protobuf"


def _fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def _json_items(name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(_fixture(name))["items"]
    return items


def _frames(data: bytes) -> list[bytes]:
    buf = bytearray(data)
    frames = protowire.split_frames(buf)
    assert not buf, "a partial frame left at the end of a recorded stream"
    return frames


# ---- recorded from kube-apiserver ----------------------------------------------------------


def test_recorded_pod_list_decodes_to_what_the_json_list_projects_to() -> None:
    items, rv, token = protowire.decode_list(PODS, _fixture("pods-list.pb"))
    want = _json_items("pods-list.json")
    assert rv == json.loads(_fixture("pods-list.json"))["metadata"]["resourceVersion"]
    assert token == ""
    assert [i["metadata"]["name"] for i in items] == [i["metadata"]["name"] for i in want]
    scope = PodScope.parse()
    for got, full in zip(items, want, strict=True):
        assert slim_pod(got) == slim_pod(full)
        assert slim_pod(got, scope) == slim_pod(full, scope)
        assert got["metadata"]["resourceVersion"] == full["metadata"]["resourceVersion"]
    # the shapes the translation reads came through: init containers, affinity, spread
    by_name = {i["metadata"]["name"]: i for i in items}
    assert by_name["sidecar"]["spec"]["initContainers"][0]["restartPolicy"] == "Always"
    assert by_name["sidecar"]["spec"]["topologySpreadConstraints"][0]["maxSkew"] == 1
    aff = by_name["affine"]["spec"]["affinity"]
    assert aff["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
        "topologyKey"] == "kubernetes.io/hostname"
    assert by_name["plain"]["spec"]["containers"][0]["resources"]["limits"] == {"memory": "128Mi"}


def test_recorded_node_list_decodes_to_what_the_json_list_projects_to() -> None:
    items, _rv, _token = protowire.decode_list(NODES, _fixture("nodes-list.pb"))
    want = _json_items("nodes-list.json")
    assert len(items) == len(want) >= 2
    scope = PodScope.parse()
    for got, full in zip(items, want, strict=True):
        assert slim_node(got) == slim_node(full)
        assert scope.node_view(got) == scope.node_view(full)
    assert all(slim_node(n)["status"]["ready"] == "True" for n in items)


def test_recorded_watch_decodes_event_by_event() -> None:
    events = [protowire.decode_watch_frame(f) for f in _frames(_fixture("pods-watch.pb"))]
    types = [t for t, _ in events]
    assert types[0] == "MODIFIED" and "DELETED" in types
    labelled = events[0][1]
    assert labelled["metadata"]["name"] == "plain" and labelled["metadata"]["labels"]["tier"] == "1"
    assert any(o["metadata"]["name"] == "plain" and o["spec"].get("nodeName") == "kwok-node-0"
               for _, o in events)
    deleted = [o for t, o in events if t == "DELETED"]
    assert [o["metadata"]["name"] for o in deleted] == ["sidecar"]


def test_recorded_streaming_list_ends_at_its_bookmark() -> None:
    seen: dict[str, Any] = {}
    phase = InitialEvents(seen.__setitem__, lambda k, _o: seen.pop(k))
    steps = []
    for frame in _frames(_fixture("pods-watchlist.pb")):
        etype, obj = protowire.decode_watch_frame(frame)
        from bigfleet_trio.kube.watch import WatchEvent

        event = WatchEvent(etype, obj)  # type: ignore[arg-type]
        steps.append(phase.feed(event, lambda o: (o["metadata"]["name"], o)))
        if steps[-1] == "end":
            assert is_initial_events_end(event)
            break
    assert steps[-1] == "end" and set(seen) == {"plain", "affine"}
    assert phase.resource_version.isdigit()


def test_recorded_not_found_status_maps_to_not_found() -> None:
    status = protowire.decode_status(_fixture("pod-notfound.pb"))
    assert status["code"] == 404 and status["reason"] == "NotFound"
    err = error_from_status(404, status)
    assert isinstance(err, NotFound) and "missing" in err.message


def test_recorded_answers_show_the_json_fallback_for_custom_resources() -> None:
    answers = json.loads(_fixture("answers.json"))
    cr_both = answers[f"cr {protowire.ACCEPT}"]
    assert cr_both == [200, "application/json"]
    assert answers[f"cr {protowire.CONTENT_TYPE}"][0] == 406


# ---- refusing bad bytes ----------------------------------------------------------------------


def _pod_bytes(name: str = "a", kind: str = "Pod") -> bytes:
    p = pb.Pod()
    p.metadata.name = name
    p.metadata.namespace = "ns"
    p.spec.containers.add().resources.requests["cpu"].string = "1"
    u = pb.Unknown()
    u.typeMeta.apiVersion, u.typeMeta.kind = "v1", kind
    u.raw = p.SerializeToString()
    return protowire.MAGIC + u.SerializeToString()


def _frame(etype: str, obj: bytes) -> bytes:
    ev = pb.WatchEvent(type=etype)
    ev.object.raw = obj
    data = ev.SerializeToString()
    return struct.pack(">I", len(data)) + data


@pytest.mark.parametrize("data", [b"", b"{}", b"k8s\x00\xff\xff", b"k8s\x01" + _pod_bytes()[4:]])
def test_bodies_that_are_not_k8s_protobuf_are_refused(data: bytes) -> None:
    with pytest.raises(protowire.ProtobufDecodeError):
        protowire.decode_list(PODS, data)


def test_a_list_of_another_kind_is_refused() -> None:
    with pytest.raises(protowire.ProtobufDecodeError, match="expected a NodeList"):
        protowire.decode_list(NODES, _fixture("pods-list.pb"))


def test_a_watch_event_of_a_kind_without_schema_is_refused() -> None:
    frame = _frame("ADDED", _pod_bytes(kind="ConfigMap"))
    with pytest.raises(protowire.ProtobufDecodeError, match="ConfigMap"):
        protowire.decode_watch_frame(frame[4:])


def test_frames_split_anywhere_give_the_same_frames() -> None:
    body = _frame("ADDED", _pod_bytes("a")) + _frame("MODIFIED", _pod_bytes("b"))
    for size in (1, 3, 5, len(body)):
        buf, got = bytearray(), []
        for i in range(0, len(body), size):
            buf += body[i:i + size]
            got += protowire.split_frames(buf)
        assert [protowire.decode_watch_frame(f)[0] for f in got] == ["ADDED", "MODIFIED"], size
        assert not buf


def test_a_frame_length_beyond_the_limit_is_refused() -> None:
    with pytest.raises(protowire.ProtobufDecodeError, match="limit"):
        protowire.split_frames(bytearray(struct.pack(">I", protowire.MAX_FRAME + 1)))


def _stream(body: bytes) -> WatchStream:
    response = httpx.Response(200, content=body)
    return WatchStream(response, 90.0, protobuf=True)


async def test_watch_stream_of_frames_yields_events_and_refuses_a_cut_frame() -> None:
    body = _frame("ADDED", _pod_bytes("a")) + _frame("BOOKMARK", _pod_bytes("b"))
    events = [(e.type, e.object["metadata"]["name"]) async for e in _stream(body)]
    assert events == [("ADDED", "a"), ("BOOKMARK", "b")]
    with pytest.raises(KubeTransportError, match="inside a frame"):
        async for _ in _stream(body[:-3]):
            pass
    with pytest.raises(KubeTransportError, match="undecodable"):
        async for _ in _stream(_frame("ADDED", b"not k8s")):
            pass
    with pytest.raises(KubeTransportError, match="unknown watch event type"):
        async for _ in _stream(_frame("EXPLODED", _pod_bytes())):
            pass


# ---- the client: what it asks for, what it reads --------------------------------------------


class _Server:
    """Answers LIST and WATCH from recorded bytes, in protobuf when asked for it (as
    kube-apiserver does for built-in kinds) or always in JSON (``protobuf=False``: a server
    or resource without protobuf, as kube-apiserver for CRs)."""

    def __init__(self, *, protobuf: bool) -> None:
        self.protobuf = protobuf
        self.accepts: list[tuple[str, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        accept = request.headers.get("accept", "")
        watch = request.url.params.get("watch") == "1"
        self.accepts.append((request.url.path, accept))
        pb_ok = self.protobuf and protowire.CONTENT_TYPE in accept
        if request.url.path == "/api/v1/pods":
            if watch:
                return httpx.Response(200, content=b"", headers={
                    "content-type": f"{protowire.CONTENT_TYPE};stream=watch" if pb_ok
                    else "application/json"})
            if pb_ok:
                return httpx.Response(200, content=_fixture("pods-list.pb"),
                                      headers={"content-type": protowire.CONTENT_TYPE})
            return httpx.Response(200, content=_fixture("pods-list.json"),
                                  headers={"content-type": "application/json"})
        if request.url.path == "/api/v1/namespaces/pb/pods/missing":
            if pb_ok:
                return httpx.Response(404, content=_fixture("pod-notfound.pb"),
                                      headers={"content-type": protowire.CONTENT_TYPE})
            return httpx.Response(404, json={"kind": "Status", "code": 404,
                                             "reason": "NotFound", "message": "missing"})
        body = {"kind": "List", "metadata": {"resourceVersion": "7"}, "items": []}
        return httpx.Response(200, content=orjson.dumps(body),
                              headers={"content-type": "application/json"})


def _client(server: _Server, *, protobuf: bool = True) -> KubeClient:
    return KubeClient(KubeConfig(server="http://kube.test"),
                      transport=httpx.MockTransport(server), qps=0, protobuf=protobuf)


async def _cached(server: _Server, *, protobuf: bool = True) -> dict[str, Any]:
    async with _client(server, protobuf=protobuf) as client:
        inf = Informer(client, PODS, transform=slim_pod, protobuf=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(inf.run)
            await inf.wait_synced()
            nursery.cancel_scope.cancel()
        return dict(inf.store.items())


async def test_informer_caches_the_same_pods_from_protobuf_and_from_json(
        autojump_clock: trio.testing.MockClock) -> None:
    pb_server, json_server = _Server(protobuf=True), _Server(protobuf=False)
    from_pb = await _cached(pb_server)
    from_json = await _cached(json_server)
    assert from_pb == from_json and len(from_pb) == 3
    assert pb_server.accepts[0] == ("/api/v1/pods", protowire.ACCEPT)


async def test_client_with_protobuf_off_asks_for_json_only(
        autojump_clock: trio.testing.MockClock) -> None:
    server = _Server(protobuf=True)
    cached = await _cached(server, protobuf=False)
    assert len(cached) == 3
    assert {a for _p, a in server.accepts} == {"application/json"}


async def test_custom_resources_and_whole_object_reads_ask_for_json() -> None:
    server = _Server(protobuf=True)
    async with _client(server) as client:
        await client.list(CAPACITY_REQUESTS)
        await client.list(PODS)  # no protobuf=True: a caller reading whole objects
        await client.list_paged(CAPACITY_REQUESTS, on_items=lambda _i: None, protobuf=True)
    assert [a for _p, a in server.accepts] == ["application/json"] * 3


async def test_a_protobuf_error_answer_raises_its_status() -> None:
    server = _Server(protobuf=True)
    async with _client(server) as client:
        with pytest.raises(NotFound, match="missing"):
            await client.request("GET", "/api/v1/namespaces/pb/pods/missing",
                                 accept=protowire.ACCEPT)


async def test_a_406_to_protobuf_gets_json_from_then_on(
        autojump_clock: trio.testing.MockClock) -> None:
    """Something between the client and the apiserver that knows only JSON refuses the Accept
    with 406: the read is asked again in JSON, and every later read asks for JSON."""
    json_server = _Server(protobuf=False)

    def refusing(request: httpx.Request) -> httpx.Response:
        if protowire.CONTENT_TYPE in request.headers.get("accept", ""):
            json_server.accepts.append((request.url.path, "refused"))
            return httpx.Response(406, json={"kind": "Status", "code": 406,
                                             "reason": "NotAcceptable", "message": "no"})
        return json_server(request)

    async with KubeClient(KubeConfig(server="http://kube.test"), qps=0,
                          transport=httpx.MockTransport(refusing)) as client:
        inf = Informer(client, PODS, transform=slim_pod, protobuf=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(inf.run)
            await inf.wait_synced()
            nursery.cancel_scope.cancel()
        assert len(inf.store) == 3 and client.protobuf is False
    assert json_server.accepts[:2] == [("/api/v1/pods", "refused"),
                                       ("/api/v1/pods", "application/json")]
    assert all(a == "application/json" for _p, a in json_server.accepts[2:])
