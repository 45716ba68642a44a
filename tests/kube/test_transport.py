"""kube.transport.KeepAlivePool against a raw HTTP/1.1 server on loopback."""

from __future__ import annotations

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
