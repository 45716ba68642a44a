"""An informer drops MODIFIED events that change nothing it keeps before projecting them, on JSON
and on protobuf watches; the protobuf decoder then never converts the Pod's spec
(docs/kube-api.md#unchanged-pod-events)."""

from __future__ import annotations

import struct
from typing import Any

import httpx
import orjson
import pytest
import trio
import trio.testing

from bigfleet_trio.kube import protowire
from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.informer import Informer
from bigfleet_trio.kube.resources import PODS
from bigfleet_trio.kube.watchstream import WatchStream
from bigfleet_trio.observability import metrics
from bigfleet_trio.podcontroller.projections import pod_unchanged, slim_pod
from bigfleet_trio.proto.kube.v1 import objects_pb2 as pb

# (resourceVersion, generation, phase, what the event is)
EVENTS = [
    ("11", 1, "Pending", "heartbeat"),
    ("12", 1, "Running", "phase"),
    ("13", 1, "Running", "heartbeat"),
    ("14", 2, "Running", "resize"),
    ("15", 2, "Running", "heartbeat"),
]


def _json_pod(rv: str, generation: int, phase: str) -> dict[str, Any]:
    cpu = "2" if generation > 1 else "1"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": rv,
                         "generation": generation},
            "spec": {"containers": [{"resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": phase}}


def _pb_pod(rv: str, generation: int, phase: str) -> bytes:
    p = pb.Pod()
    p.metadata.name, p.metadata.namespace, p.metadata.uid = "p", "ns", "u"
    p.metadata.resourceVersion, p.metadata.generation = rv, generation
    p.spec.containers.add().resources.requests["cpu"].string = (
        "2" if generation > 1 else "1")
    p.status.phase = phase
    u = pb.Unknown()
    u.typeMeta.apiVersion, u.typeMeta.kind = "v1", "Pod"
    u.raw = p.SerializeToString()
    return protowire.MAGIC + u.SerializeToString()


def _pb_watch() -> bytes:
    out = b""
    for rv, gen, phase, _ in EVENTS:
        ev = pb.WatchEvent(type="MODIFIED")
        ev.object.raw = _pb_pod(rv, gen, phase)
        data = ev.SerializeToString()
        out += struct.pack(">I", len(data)) + data
    return out


def _json_watch() -> bytes:
    return b"".join(orjson.dumps({"type": "MODIFIED", "object": _json_pod(rv, gen, phase)})
                    + b"\n" for rv, gen, phase, _ in EVENTS)


class _Server:
    """A LIST of one Pod at resourceVersion 10, then one watch carrying :data:`EVENTS`
    (later watches are empty), in protobuf when ``protobuf`` and the client asks for it."""

    def __init__(self, *, protobuf: bool) -> None:
        self.protobuf = protobuf
        self.watches = 0
        self.rewatched = trio.Event()  # the informer watches again: the events were read

    def __call__(self, request: httpx.Request) -> httpx.Response:
        pb_ok = self.protobuf and protowire.CONTENT_TYPE in request.headers.get("accept", "")
        if request.url.params.get("watch") == "1":
            self.watches += 1
            if self.watches > 1:
                self.rewatched.set()
            body = b"" if self.watches > 1 else (_pb_watch() if pb_ok else _json_watch())
            ctype = f"{protowire.CONTENT_TYPE};stream=watch" if pb_ok else "application/json"
            return httpx.Response(200, content=body, headers={"content-type": ctype})
        listed = {"kind": "PodList", "metadata": {"resourceVersion": "10"},
                  "items": [_json_pod("10", 1, "Pending")]}
        return httpx.Response(200, content=orjson.dumps(listed),
                              headers={"content-type": "application/json"})


@pytest.mark.parametrize("protobuf", [True, False], ids=["protobuf", "json"])
async def test_heartbeats_are_skipped_and_changes_reach_the_handlers(
        autojump_clock: trio.testing.MockClock, protobuf: bool) -> None:
    server = _Server(protobuf=protobuf)
    updates: list[tuple[str, int]] = []
    before = metrics.INFORMER_UNCHANGED.labels("pods")._value.get()
    async with KubeClient(KubeConfig(server="http://kube.test"), qps=0,
                          transport=httpx.MockTransport(server)) as client:
        inf = Informer(client, PODS, transform=slim_pod, protobuf=True, unchanged=pod_unchanged)
        inf.add_handler(on_update=lambda _old, new: updates.append(
            (new["status"]["phase"], new["metadata"]["generation"])))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(inf.run)
            await inf.wait_synced()
            await server.rewatched.wait()
            nursery.cancel_scope.cancel()
    assert updates == [("Running", 1), ("Running", 2)]
    assert inf.unchanged_events == 3
    assert metrics.INFORMER_UNCHANGED.labels("pods")._value.get() - before == 3
    cached = inf.store.get("ns/p")
    assert cached == slim_pod(_json_pod("15", 2, "Running"))
    assert cached["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "2"
    assert inf._rv.resource_version == "15"  # a skipped event still moves the watch on


async def test_without_the_check_every_event_is_projected(
        autojump_clock: trio.testing.MockClock) -> None:
    server = _Server(protobuf=True)
    async with KubeClient(KubeConfig(server="http://kube.test"), qps=0,
                          transport=httpx.MockTransport(server)) as client:
        inf = Informer(client, PODS, transform=slim_pod, protobuf=True)
        seen: list[str] = []
        inf.add_handler(on_update=lambda _o, new: seen.append(new["status"]["phase"]))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(inf.run)
            await inf.wait_synced()
            await server.rewatched.wait()
            nursery.cancel_scope.cancel()
    assert len(seen) == len(EVENTS) and inf.unchanged_events == 0


async def test_the_protobuf_stream_hands_a_head_for_a_skipped_pod() -> None:
    """What the decoder returns for an unchanged Pod: its head, no containers converted."""
    stream = WatchStream(httpx.Response(200, content=_pb_watch()), 90.0, protobuf=True)
    asked: list[dict[str, Any]] = []

    def unchanged(head: dict[str, Any]) -> bool:
        asked.append(head)
        return head["status"]["phase"] == "Pending"

    stream.unchanged = unchanged
    got = [(e.unchanged, e.object) async for e in stream]
    assert len(asked) == len(EVENTS)
    assert [v for v, _ in got] == [True, False, False, False, False]
    head = got[0][1]
    assert head["metadata"]["generation"] == 1 and head["metadata"]["resourceVersion"] == "11"
    assert "containers" not in head.get("spec", {})
    assert got[1][1]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"


async def test_a_failing_check_projects_the_event(autojump_clock: trio.testing.MockClock) -> None:
    server = _Server(protobuf=True)

    def broken(_old: Any, _new: dict[str, Any]) -> bool:
        raise KeyError("boom")

    async with KubeClient(KubeConfig(server="http://kube.test"), qps=0,
                          transport=httpx.MockTransport(server)) as client:
        inf = Informer(client, PODS, transform=slim_pod, protobuf=True, unchanged=broken)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(inf.run)
            await inf.wait_synced()
            await server.rewatched.wait()
            nursery.cancel_scope.cancel()
    assert inf.unchanged_events == 0
    assert inf.store.get("ns/p")["metadata"]["generation"] == 2
