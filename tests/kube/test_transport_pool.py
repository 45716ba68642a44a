"""The keep-alive pool's bookkeeping (docs/kube-api.md#connections): dead idle connections are
reaped wherever they sit in the stack, a request that fails on a reused connection before any
answer byte is sent once more on a fresh one when that is safe (``replay_safe``), the open
connections are capped, and ``tls_server_name`` is the name the certificate is checked against.
Raw HTTP/1.1 servers on loopback."""

from __future__ import annotations

import ssl
from functools import partial
from typing import Any

import httpx
import pytest
import trio
import trio.testing
import trustme
from prometheus_client import REGISTRY

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.errors import KubeTransportError
from bigfleet_trio.kube.resources import NODES
from bigfleet_trio.kube.transport import KeepAlivePool, replay_safe
from bigfleet_trio.observability.metrics import KUBE_STALE_REPLAYS

from .test_transport import _answer, _read_request

URL = "http://127.0.0.1:{}"


async def _listen(nursery: trio.Nursery, handler: Any) -> int:
    listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    return int(listeners[0].socket.getsockname()[1])


def _key(port: int) -> tuple[bytes, bytes, int]:
    return (b"http", b"127.0.0.1", port)


async def test_dead_idle_connections_under_a_live_one_are_reaped() -> None:
    """Three connections go idle; the server closes the two at the bottom of the stack. Requests
    keep using the live one on top, and the dead two are closed all the same."""
    count = closed = 0
    release, all_started, drop = trio.Event(), trio.Event(), trio.Event()
    two_closed = trio.Event()

    async def handler(stream: trio.SocketStream) -> None:
        nonlocal count, closed
        me, count = count, count + 1
        if count == 3:
            all_started.set()
        buf = bytearray()
        async with stream:
            await _read_request(stream, buf)
            await release.wait()  # the three requests overlap: three connections
            await stream.send_all(_answer(b"{}"))
            if me >= 2:
                while await _read_request(stream, buf) is not None:
                    await stream.send_all(_answer(b"{}"))
                return
            await drop.wait()
        # closed, silently, once idle
        closed += 1
        if closed == 2:
            two_closed.set()

    async with trio.open_nursery() as nursery:
        port = await _listen(nursery, handler)
        pool = KeepAlivePool(sweep_interval=0.0)
        url = httpx.URL(URL.format(port))

        async def first() -> None:
            await pool.round_trip(b"GET", url, b"/", [], None)

        async with trio.open_nursery() as inner:
            for _ in range(3):
                inner.start_soon(first)
            await all_started.wait()
            release.set()
        assert len(pool._idle[_key(port)]) == 3
        drop.set()
        await two_closed.wait()  # the server has closed two of them
        for _ in range(3):
            await pool.round_trip(b"GET", url, b"/", [], None)
        assert len(pool._idle[_key(port)]) == 1
        assert pool.opened == 3
        await pool.aclose()
        nursery.cancel_scope.cancel()


def _stale_second_request_server(answered: list[int]) -> Any:
    """Answers the first request of each connection; reads the second and closes without an
    answer (a server that dropped the idle connection as the request arrived)."""

    async def handler(stream: trio.SocketStream) -> None:
        buf = bytearray()
        async with stream:
            await _read_request(stream, buf)
            answered.append(1)
            await stream.send_all(_answer(b'{"kind": "Node"}'))
            await _read_request(stream, buf)

    return handler


@pytest.mark.parametrize("replayable", [True, False])
async def test_a_request_failing_on_a_reused_connection_is_replayed_once_when_safe(
    replayable: bool,
) -> None:
    answered: list[int] = []
    before = KUBE_STALE_REPLAYS._value.get()
    async with trio.open_nursery() as nursery:
        port = await _listen(nursery, _stale_second_request_server(answered))
        pool = KeepAlivePool()
        url = httpx.URL(URL.format(port))
        await pool.round_trip(b"POST", url, b"/a", [], b"{}", replayable=replayable)
        if replayable:
            status, _, body = await pool.round_trip(b"POST", url, b"/b", [], b"{}",
                                                    replayable=True)
            assert (status, body) == (200, b'{"kind": "Node"}')
            assert pool.opened == 2 and len(answered) == 2
            assert KUBE_STALE_REPLAYS._value.get() - before == 1
        else:
            with pytest.raises(httpx.RemoteProtocolError):
                await pool.round_trip(b"POST", url, b"/b", [], b"{}", replayable=False)
            assert pool.opened == 1
            assert KUBE_STALE_REPLAYS._value.get() == before
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_a_failure_after_answer_bytes_arrived_is_not_replayed() -> None:
    async def handler(stream: trio.SocketStream) -> None:
        buf = bytearray()
        async with stream:
            await _read_request(stream, buf)
            await stream.send_all(_answer(b"{}"))
            await _read_request(stream, buf)
            await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Len")  # then gone

    async with trio.open_nursery() as nursery:
        port = await _listen(nursery, handler)
        pool = KeepAlivePool()
        url = httpx.URL(URL.format(port))
        await pool.round_trip(b"GET", url, b"/", [], None, replayable=True)
        with pytest.raises(httpx.TransportError):
            await pool.round_trip(b"GET", url, b"/", [], None, replayable=True)
        assert pool.opened == 1
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_a_fresh_connection_is_not_replayed() -> None:
    async def handler(stream: trio.SocketStream) -> None:
        async with stream:
            await _read_request(stream, bytearray())

    async with trio.open_nursery() as nursery:
        port = await _listen(nursery, handler)
        pool = KeepAlivePool()
        with pytest.raises(httpx.RemoteProtocolError):
            await pool.round_trip(b"GET", httpx.URL(URL.format(port)), b"/", [], None,
                                  replayable=True)
        assert pool.opened == 1
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_the_client_replays_a_get_on_a_stale_connection() -> None:
    answered: list[int] = []
    async with trio.open_nursery() as nursery:
        port = await _listen(nursery, _stale_second_request_server(answered))
        async with KubeClient(KubeConfig(server=URL.format(port)), max_attempts=1) as client:
            await client.get(NODES, "n1")
            assert (await client.get(NODES, "n1"))["kind"] == "Node"
        nursery.cancel_scope.cancel()


async def test_open_connections_are_capped() -> None:
    active = peak = 0
    gate = trio.Event()

    async def handler(stream: trio.SocketStream) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        buf = bytearray()
        try:
            async with stream:
                while await _read_request(stream, buf) is not None:
                    await gate.wait()
                    await stream.send_all(_answer(b"{}"))
        finally:
            active -= 1

    async with trio.open_nursery() as nursery:
        port = await _listen(nursery, handler)
        pool = KeepAlivePool(max_connections=2)
        url = httpx.URL(URL.format(port))
        done: list[int] = []

        async def one() -> None:
            done.append((await pool.round_trip(b"GET", url, b"/", [], None))[0])

        async with trio.open_nursery() as inner:
            for _ in range(6):
                inner.start_soon(one)
            # Every request task is parked: on the server's gate or on the cap. A third
            # connection would have been counted before its connect blocked.
            await trio.testing.wait_all_tasks_blocked()
            assert pool.opened == 2
            gate.set()
        assert done == [200] * 6 and peak == 2 and pool.opened == 2
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_tls_server_name_is_the_name_the_certificate_is_checked_against(
    tmp_path: Any,
) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("kube.internal")  # not 127.0.0.1
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))

    async def handler(stream: trio.SSLStream[trio.SocketStream]) -> None:
        buf = bytearray()
        try:
            async with stream:
                while await _read_request(stream, buf) is not None:  # type: ignore[arg-type]
                    await stream.send_all(_answer(b'{"kind": "Node"}'))
        except trio.BrokenResourceError:
            pass

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(
            trio.serve_ssl_over_tcp, handler, 0, server_ctx, host="127.0.0.1"))
        port = listeners[0].transport_listener.socket.getsockname()[1]
        server = f"https://127.0.0.1:{port}"
        named = KubeConfig(server=server, ca_file=str(ca_file), tls_server_name="kube.internal")
        async with KubeClient(named, max_attempts=1) as client:
            assert (await client.get(NODES, "n1"))["kind"] == "Node"
        unnamed = KubeConfig(server=server, ca_file=str(ca_file))
        async with KubeClient(unnamed, max_attempts=1) as client:
            with pytest.raises(KubeTransportError):
                await client.get(NODES, "n1")
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(("method", "path", "body", "safe"), [
    ("GET", "/api/v1/pods", None, True),
    ("HEAD", "/api/v1/pods", None, True),
    ("POST", "/api/v1/namespaces/d/pods", {"metadata": {"name": "p"}}, True),
    ("POST", "/api/v1/namespaces/d/pods", {"metadata": {"generateName": "p-"}}, False),
    ("POST", "/api/v1/namespaces/d/events", {"metadata": {}}, False),
    ("POST", "/api/v1/namespaces/d/pods/p/eviction", {"metadata": {"name": "p"}}, True),
    ("POST", "/apis/authentication.k8s.io/v1/tokenreviews", {"spec": {"token": "t"}}, True),
    ("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {"spec": {}}, True),
    ("PUT", "/api/v1/nodes/n", {"metadata": {"name": "n", "resourceVersion": "7"}}, True),
    ("PUT", "/api/v1/nodes/n", {"metadata": {"name": "n"}}, False),
    ("PATCH", "/api/v1/nodes/n", {"metadata": {"resourceVersion": "7"}, "spec": {}}, True),
    ("PATCH", "/api/v1/nodes/n", {"spec": {"unschedulable": True}}, False),
    ("PATCH", "/api/v1/nodes/n", [{"op": "test", "path": "/metadata/resourceVersion",
                                   "value": "7"}], True),
    ("PATCH", "/api/v1/nodes/n", [{"op": "replace", "path": "/spec", "value": {}}], False),
    ("DELETE", "/api/v1/nodes/n", {"preconditions": {"uid": "u"}}, True),
    ("DELETE", "/api/v1/nodes/n", None, False),
    ("POST", "/api/v1/namespaces/d/pods", b'{"metadata":{"name":"p"}}', False),
])
def test_replay_safe(method: str, path: str, body: Any, safe: bool) -> None:
    assert replay_safe(method, path, body) is safe


async def test_closed_tls_connections_are_freed_without_the_garbage_collector(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request connection and a watch connection, once closed, are freed by reference
    counting: the informers freeze the heap, and a TLS stream that needed the cyclic collector
    (trio's SSLStream is a reference cycle) was never freed after a freeze
    (docs/kube-api.md#garbage-collector)."""
    import gc
    import weakref

    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    event = (b'{"type": "ADDED", "object": {"kind": "Node", "metadata": '
             b'{"name": "n1", "resourceVersion": "8"}}}\n')

    async def handler(stream: trio.SSLStream[trio.SocketStream]) -> None:
        buf = bytearray()
        try:
            async with stream:
                while (head := await _read_request(stream, buf)) is not None:  # type: ignore[arg-type]
                    watch = b"watch=1" in head.split(b"\r\n", 1)[0]
                    await stream.send_all(_answer(event if watch else b'{"kind": "Node"}'))
        except trio.BrokenResourceError:
            pass

    clients: list[weakref.ref[trio.SSLStream[Any]]] = []
    real_init = trio.SSLStream.__init__

    def recording_init(self: trio.SSLStream[Any], *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        if not kwargs.get("server_side"):
            clients.append(weakref.ref(self))

    monkeypatch.setattr(trio.SSLStream, "__init__", recording_init)
    with trio.fail_after(30):  # real sockets and TLS: a generous wall-clock bound
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(
                trio.serve_ssl_over_tcp, handler, 0, server_ctx, host="127.0.0.1"))
            port = listeners[0].transport_listener.socket.getsockname()[1]
            config = KubeConfig(server=f"https://127.0.0.1:{port}", ca_file=str(ca_file))
            opened = {pool: REGISTRY.get_sample_value(
                "bigfleet_kube_client_connections_opened_total", {"pool": pool}) or 0.0
                for pool in ("requests", "watches")}
            gc.collect()
            gc.disable()
            try:
                async with KubeClient(config, max_attempts=1) as client:
                    assert (await client.get(NODES, "n1"))["kind"] == "Node"
                    async with client.watch(NODES, resource_version="7") as events:
                        assert [e.object["metadata"]["name"] async for e in events] == ["n1"]
                    del events  # the watch's response (with its connection) is let go of
                assert len(clients) == 2
                assert [ref() for ref in clients] == [None, None]
                assert {pool: REGISTRY.get_sample_value(
                    "bigfleet_kube_client_connections_opened_total", {"pool": pool}) - n
                    for pool, n in opened.items()} == {"requests": 1.0, "watches": 1.0}
            finally:
                gc.enable()
            nursery.cancel_scope.cancel()
