"""kube.transport.KeepAlivePool against a raw HTTP/1.1 server on loopback."""

from __future__ import annotations

import json
import ssl
from collections.abc import Awaitable, Callable
from functools import partial

import httpx
import pytest
import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.errors import KubeTransportError
from bigfleet_trio.kube.resources import NODES
from bigfleet_trio.kube.transport import KeepAlivePool

Handler = Callable[[trio.SocketStream, int], Awaitable[None]]


async def _read_request(stream: trio.SocketStream, buf: bytearray) -> bytes | None:
    """One request head (+ Content-Length body) from ``stream``; None at EOF."""
    while b"\r\n\r\n" not in buf:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return None
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        rest += await stream.receive_some(65536)
    buf[:] = rest[length:]
    return head


def _answer(body: bytes, *, close: bool = False) -> bytes:
    extra = b"Connection: close\r\n" if close else b""
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


async def _serve(
    nursery: trio.Nursery, answers_per_connection: int | None, closed: trio.Semaphore | None = None
) -> tuple[int, list[int]]:
    """A server answering ``{"n": <request number on this connection>}``; after
    ``answers_per_connection`` answers it closes the connection without saying so (and
    releases ``closed``)."""
    connections: list[int] = []

    async def handler(stream: trio.SocketStream) -> None:
        connections.append(0)
        me = len(connections) - 1
        buf = bytearray()
        async with stream:
            while answers_per_connection is None or connections[me] < answers_per_connection:
                if await _read_request(stream, buf) is None:
                    return
                connections[me] += 1
                await stream.send_all(_answer(b'{"n": %d}' % connections[me]))
        if closed is not None:
            closed.release()

    listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    return listeners[0].socket.getsockname()[1], connections


async def _get(pool: KeepAlivePool, port: int, path: str = "/x") -> httpx.Response:
    resp = await pool.handle_async_request(httpx.Request("GET", f"http://127.0.0.1:{port}{path}"))
    await resp.aread()
    return resp


async def test_sequential_requests_share_one_connection() -> None:
    async with trio.open_nursery() as nursery:
        port, conns = await _serve(nursery, None)
        pool = KeepAlivePool()
        got = [(await _get(pool, port)).json()["n"] for _ in range(5)]
        assert got == [1, 2, 3, 4, 5]
        assert pool.opened == 1 and conns == [5]
        await pool.aclose()
        with pytest.raises(RuntimeError, match="closed"):
            await _get(pool, port)
        nursery.cancel_scope.cancel()


async def test_concurrent_requests_open_connections_and_keep_at_most_max_idle() -> None:
    async with trio.open_nursery() as nursery:
        port, conns = await _serve(nursery, None)
        pool = KeepAlivePool(max_idle=2)
        gate = trio.Event()
        started = 0

        async def one() -> None:
            nonlocal started
            started += 1
            if started == 4:
                gate.set()
            await gate.wait()
            await _get(pool, port)

        async with trio.open_nursery() as inner:
            for _ in range(4):
                inner.start_soon(one)
        assert pool.opened == 4
        # then sequential requests reuse the (at most 2) idle connections
        for _ in range(6):
            await _get(pool, port)
        assert pool.opened == 4 and sum(conns) == 10
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_a_connection_the_server_closed_is_not_reused() -> None:
    async with trio.open_nursery() as nursery:
        closed = trio.Semaphore(0)
        port, conns = await _serve(nursery, 1, closed)  # closes after every answer, silently
        pool = KeepAlivePool()
        for _ in range(3):
            assert (await _get(pool, port)).json() == {"n": 1}
            await closed.acquire()  # the server has closed its end
        assert pool.opened == 3 and conns == [1, 1, 1]
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_connect_error_is_httpx_connect_error_and_kube_transport_error() -> None:
    async with trio.open_nursery() as nursery:
        port, _ = await _serve(nursery, None)
        nursery.cancel_scope.cancel()

    pool = KeepAlivePool()
    with pytest.raises(httpx.ConnectError):
        await _get(pool, port)
    client = KubeClient(KubeConfig(server=f"http://127.0.0.1:{port}"), max_attempts=1)
    with pytest.raises(KubeTransportError, match="ConnectError"):
        await client.get(NODES, "n")
    await client.aclose()


async def test_a_cancelled_request_drops_its_connection(autojump_clock: object) -> None:
    async with trio.open_nursery() as nursery:
        silent_port: list[int] = []

        async def silent(stream: trio.SocketStream) -> None:
            await trio.sleep_forever()

        listeners = await nursery.start(partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
        silent_port.append(listeners[0].socket.getsockname()[1])
        pool = KeepAlivePool()
        with trio.move_on_after(5):
            await _get(pool, silent_port[0])
        assert pool.opened == 1 and pool._idle.get((b"http", b"127.0.0.1", silent_port[0]),
                                                   []) == []
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_client_requests_go_through_the_pool_with_auth_and_params() -> None:
    seen: list[bytes] = []
    async with trio.open_nursery() as nursery:

        async def handler(stream: trio.SocketStream) -> None:
            buf = bytearray()
            async with stream:
                while (head := await _read_request(stream, buf)) is not None:
                    seen.append(head)
                    await stream.send_all(_answer(b'{"kind": "Node"}'))

        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        cfg = KubeConfig(server=f"http://127.0.0.1:{port}", token="tok")
        async with KubeClient(cfg) as client:
            for _ in range(3):
                assert await client.get(NODES, "n 1") == {"kind": "Node"}
            await client.list(NODES, label_selector="a in (x,y)", limit=5)
            assert isinstance(client._transport, KeepAlivePool)
            assert client._transport.opened == 1
        nursery.cancel_scope.cancel()
    assert seen[0].startswith(b"GET /api/v1/nodes/n%201 HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer tok" in seen[0]
    assert b"\r\nAccept: application/json" in seen[0]
    assert seen[3].startswith(
        b"GET /api/v1/nodes?labelSelector=a%20in%20%28x%2Cy%29&limit=5 HTTP/1.1\r\n")


async def test_client_requests_on_the_pool_carry_host_length_path_prefix_and_errors() -> None:
    """KubeClient's hot path (KeepAlivePool.round_trip, no httpx Request): the request line
    keeps the server URL's path prefix and percent-encodes the query, Host and Content-Length
    are set, and an error answer's headers (Retry-After) still reach the error."""
    heads: list[bytes] = []

    async def handler(stream: trio.SocketStream) -> None:
        buf = bytearray()
        async with stream:
            while (head := await _read_request(stream, buf)) is not None:
                heads.append(head)
                if head.startswith(b"POST"):
                    await stream.send_all(_answer(b'{"kind": "Pod"}'))
                else:
                    err = (b'{"kind":"Status","code":429,"reason":"TooManyRequests",'
                           b'"message":"slow down"}')
                    await stream.send_all(
                        b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\n"
                        b"Content-Type: application/json\r\nContent-Length: "
                        + str(len(err)).encode() + b"\r\n\r\n" + err)

    from bigfleet_trio.kube.errors import TooManyRequests
    from bigfleet_trio.kube.resources import PODS

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        client = KubeClient(KubeConfig(server=f"http://127.0.0.1:{port}/prefix/", token="t"),
                            qps=0, burst=1, max_attempts=1)
        created = await client.create(PODS, {"metadata": {"name": "c"}, "data": {}}, "ns")
        assert created == {"kind": "Pod"}
        with pytest.raises(TooManyRequests) as err:
            await client.list(PODS, "ns", label_selector="a in (b c)")
        assert err.value.retry_after == 7
        await client.aclose()
        nursery.cancel_scope.cancel()
    post, get = (h.split(b"\r\n") for h in heads)
    assert post[0] == b"POST /prefix/api/v1/namespaces/ns/pods HTTP/1.1"
    assert f"Host: 127.0.0.1:{port}".encode() in post
    assert b"Authorization: Bearer t" in post and b"Content-Type: application/json" in post
    assert any(line.startswith(b"Content-Length: ") for line in post)
    assert get[0].startswith(b"GET /prefix/api/v1/namespaces/ns/pods?")
    assert b"labelSelector=a%20in%20%28b%20c%29" in get[0]


async def _tls_echo_server(nursery: trio.Nursery, ca: object) -> int:
    """A TLS server answering every request with ``{"len": <body length>, "body": <head of
    the body>}``; its port."""
    import ssl

    import trustme

    assert isinstance(ca, trustme.CA)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)

    async def handler(stream: trio.SSLStream[trio.SocketStream]) -> None:
        buf = bytearray()
        async with stream:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, rest = bytes(buf).partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(rest) < length:
                    rest += await stream.receive_some(65536)
                buf[:] = rest[length:]
                await stream.send_all(_answer(json.dumps(
                    {"len": length, "body": rest[:length][:20].decode()}).encode()))

    listeners = await nursery.start(partial(trio.serve_ssl_over_tcp, handler, 0, ctx,
                                            host="127.0.0.1"))
    return int(listeners[0].transport_listener.socket.getsockname()[1])


async def test_a_request_with_a_body_goes_out_in_one_tls_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Head and body of a request are one SSLStream.send_all (one TLS record, one send
    syscall), not one for the head and one for the body; the server gets both intact."""
    import trustme

    sent: list[bytes] = []
    real_send_all = trio.SSLStream.send_all

    async def recording_send_all(self: trio.SSLStream[trio.SocketStream], data: bytes) -> None:
        if not bytes(data).startswith(b"HTTP/1.1"):  # the server's answers are not counted
            sent.append(bytes(data))
        await real_send_all(self, data)

    monkeypatch.setattr(trio.SSLStream, "send_all", recording_send_all)
    ca = trustme.CA()
    with trio.fail_after(30):  # real sockets and TLS: a generous wall-clock bound
        async with trio.open_nursery() as nursery:
            port = await _tls_echo_server(nursery, ca)
            ctx = ssl.create_default_context()
            ca.configure_trust(ctx)
            pool = KeepAlivePool(ssl_context=ctx)
            url = httpx.URL(f"https://127.0.0.1:{port}")
            answers = []
            bodies = [b'{"n": %d, "pad": "%s"}' % (i, b"x" * 500) for i in range(3)]
            for body in bodies:
                status, _, data = await pool.round_trip(
                    b"POST", url, b"/x", [(b"Content-Type", b"application/json")], body)
                answers.append((status, json.loads(data)))
            await pool.aclose()
            nursery.cancel_scope.cancel()
    assert [a[1]["body"] for a in answers] == ['{"n": 0, "pad": "xxx', '{"n": 1, "pad": "xxx',
                                               '{"n": 2, "pad": "xxx']
    assert all(status == 200 and answer["len"] == 519 for status, answer in answers)
    assert len(sent) == 3 and pool.opened == 1
    for data, body in zip(sent, bodies, strict=True):
        assert data.startswith(b"POST /x HTTP/1.1\r\n")
        assert data.endswith(b"\r\n\r\n" + body)


async def test_a_body_larger_than_the_write_buffer_arrives_whole() -> None:
    """A body past the coalescing limit is sent as it comes (not copied whole) and arrives
    complete."""
    import trustme

    ca = trustme.CA()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            port = await _tls_echo_server(nursery, ca)
            ctx = ssl.create_default_context()
            ca.configure_trust(ctx)
            pool = KeepAlivePool(ssl_context=ctx)
            body = b"abcdefghij" * 30_000  # 300 KB
            status, _, data = await pool.round_trip(
                b"PUT", httpx.URL(f"https://127.0.0.1:{port}"), b"/big", [], body)
            await pool.aclose()
            nursery.cancel_scope.cancel()
    assert status == 200 and json.loads(data) == {"len": 300_000, "body": "abcdefghijabcdefghij"}


async def test_a_server_closing_without_an_answer_is_a_transport_error() -> None:
    async def read_then_close(stream: trio.SocketStream) -> None:
        async with stream:
            await _read_request(stream, bytearray())

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, read_then_close, 0,
                                                host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        pool = KeepAlivePool()
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            await pool.round_trip(b"POST", httpx.URL(f"http://127.0.0.1:{port}"), b"/x", [],
                                  b'{"a": 1}')
        assert pool._idle.get((b"http", b"127.0.0.1", port), []) == []
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_a_read_timeout_from_the_request_extensions_is_a_read_timeout(
    autojump_clock: object,
) -> None:
    async with trio.open_nursery() as nursery:

        async def silent(stream: trio.SocketStream) -> None:
            await trio.sleep_forever()

        listeners = await nursery.start(partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        pool = KeepAlivePool()
        request = httpx.Request("POST", f"http://127.0.0.1:{port}/x", content=b"{}",
                                extensions={"timeout": {"connect": 5, "read": 5, "write": 5,
                                                        "pool": 5}})
        with pytest.raises(httpx.ReadTimeout):
            await pool.handle_async_request(request)
        await pool.aclose()
        nursery.cancel_scope.cancel()
