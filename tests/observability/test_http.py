"""Tests for bigfleet_trio.observability.http (the diagnostics listener): real loopback sockets.

These use trio.fail_after (real time, no autojump) because hypercorn and httpx do real I/O.
"""

from __future__ import annotations

import io
import json
from functools import partial

import httpx
import pytest
import trio
from prometheus_client import CollectorRegistry, Counter
from trio_websocket import open_websocket_url

from bigfleet_trio.knobs import ConfigError
from bigfleet_trio.observability.events import EventFeed, follow_events
from bigfleet_trio.observability.http import serve_observability
from tests.support.diagnostics import diagnostics_server as _server


async def _wait_subscribers(feed: EventFeed, n: int) -> None:
    """Poll (real time) until the server side has ``n`` subscriptions."""
    while feed.statistics().subscribers != n:  # noqa: ASYNC110 - state lives in another task
        await trio.sleep(0.005)


async def test_binds_free_port_and_serves_healthz() -> None:
    with trio.fail_after(10):
        async with _server() as addr, httpx.AsyncClient() as client:
            host, port = addr.rsplit(":", 1)
            assert host == "127.0.0.1" and int(port) > 0
            r = await client.get(f"http://{addr}/healthz")
            assert r.status_code == 200
            assert r.text == "ok\n"
            # no readiness callable: ready
            r = await client.get(f"http://{addr}/readyz")
            assert r.status_code == 200


async def test_readyz_flips_with_readiness_callable() -> None:
    state: dict[str, object] = {"ok": False, "detail": ["informers not synced", "no shard session"]}

    def readiness() -> tuple[bool, object]:
        return bool(state["ok"]), state["detail"]

    with trio.fail_after(10):
        async with _server(readiness=readiness) as addr, httpx.AsyncClient() as client:
            r = await client.get(f"http://{addr}/readyz")
            assert r.status_code == 503
            assert r.json() == {
                "ready": False,
                "reasons": ["informers not synced", "no shard session"],
            }
            state.update(ok=True, detail="session up")
            r = await client.get(f"http://{addr}/readyz")
            assert r.status_code == 200
            assert r.json() == {"ready": True, "detail": ["session up"]}
            # healthz does not care about readiness
            state.update(ok=False)
            assert (await client.get(f"http://{addr}/healthz")).status_code == 200


async def test_readyz_async_and_failing_probe() -> None:
    calls = 0

    async def readiness() -> tuple[bool, str]:
        nonlocal calls
        calls += 1
        await trio.lowlevel.checkpoint()
        if calls == 1:
            raise RuntimeError("probe broke")
        return True, ""

    with trio.fail_after(10):
        async with _server(readiness=readiness) as addr, httpx.AsyncClient() as client:
            r = await client.get(f"http://{addr}/readyz")
            assert r.status_code == 503
            assert r.json()["reasons"][0].startswith("readiness check failed: RuntimeError")
            r = await client.get(f"http://{addr}/readyz")
            assert r.status_code == 200
            assert r.json() == {"ready": True, "detail": []}


async def test_metrics_content_type_and_content() -> None:
    registry = CollectorRegistry()
    c = Counter("bigfleet_test_things_total", "things", registry=registry)
    c.inc(3)
    with trio.fail_after(10):
        async with _server(registry=registry) as addr, httpx.AsyncClient() as client:
            r = await client.get(f"http://{addr}/metrics")
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
            assert "bigfleet_test_things_total 3.0" in r.text


async def test_metrics_default_registry() -> None:
    with trio.fail_after(10):
        async with _server() as addr, httpx.AsyncClient() as client:
            r = await client.get(f"http://{addr}/metrics")
            assert r.status_code == 200
            assert "# TYPE" in r.text


async def test_events_websocket_receives_published_event() -> None:
    feed = EventFeed(clock=lambda: 5.0)
    with trio.fail_after(10):
        async with _server(feed=feed) as addr:
            async with open_websocket_url(f"ws://{addr}/events") as ws:
                # the server subscribes after the handshake; publish until it is listening
                await _wait_subscribers(feed, 1)
                feed.publish("cr_acknowledged", namespace="ns", name="cr-1")
                msg = await ws.get_message()
            assert json.loads(msg) == {
                "seq": 1,
                "ts": 5.0,
                "kind": "cr_acknowledged",
                "namespace": "ns",
                "name": "cr-1",
            }
            # the follower's disconnect ends the server-side subscription
            await _wait_subscribers(feed, 0)


async def test_events_kind_filter_and_follow_events() -> None:
    feed = EventFeed(clock=lambda: 5.0)
    out = io.StringIO()
    with trio.fail_after(10):
        async with _server(feed=feed) as addr, trio.open_nursery() as nursery:

            async def publisher() -> None:
                await _wait_subscribers(feed, 1)
                feed.publish("rollup_sent", needs=1)
                feed.publish("reclaim", node="n1")
                feed.publish("drain_finished", node="n1")

            nursery.start_soon(publisher)
            n = await follow_events(addr, out, kinds=["reclaim", "drain_finished"], max_events=2)
    assert n == 2
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [x["kind"] for x in lines] == ["reclaim", "drain_finished"]


async def test_events_stream_ends_when_feed_closes() -> None:
    feed = EventFeed()
    out = io.StringIO()
    with trio.fail_after(10):
        async with _server(feed=feed) as addr, trio.open_nursery() as nursery:

            async def closer() -> None:
                await _wait_subscribers(feed, 1)
                feed.publish("x")
                feed.close()

            nursery.start_soon(closer)
            n = await follow_events(addr, out)
    assert n == 1


async def test_no_feed_means_no_events_route() -> None:
    from trio_websocket import HandshakeError

    with trio.fail_after(10):
        async with _server() as addr:
            with pytest.raises(HandshakeError):
                async with open_websocket_url(f"ws://{addr}/events"):
                    pass  # pragma: no cover


async def test_zero_disables() -> None:
    async with trio.open_nursery() as nursery:
        assert await nursery.start(partial(serve_observability, "0")) is None


async def test_bad_addr() -> None:
    with pytest.raises(ConfigError):
        await serve_observability("nonsense")


async def test_cancellation_leaves_nothing_running() -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            addr = await nursery.start(partial(serve_observability, "127.0.0.1:0"))
            nursery.cancel_scope.cancel()
        host, port = addr.rsplit(":", 1)
        with pytest.raises(OSError):
            await trio.open_tcp_stream(host, int(port))


async def test_follow_events_errors_are_oserrors() -> None:
    with trio.fail_after(10):
        async with _server() as addr:
            with pytest.raises(OSError, match=r"server rejected the WebSocket \(HTTP 403\)"):
                await follow_events(addr, io.StringIO())
        with pytest.raises(OSError, match="cannot connect to ws://"):
            await follow_events(addr, io.StringIO())


async def test_address_in_use_names_the_address() -> None:
    import errno
    import socket

    with socket.socket() as taken, trio.fail_after(10):
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"127.0.0.1:{taken.getsockname()[1]}"
        async with trio.open_nursery() as nursery:
            with pytest.raises(OSError) as info:
                await nursery.start(partial(serve_observability, addr))
        assert str(info.value) == f"cannot listen on {addr}: Address already in use"
        assert info.value.errno == errno.EADDRINUSE


async def test_events_follower_says_when_the_agent_goes_away() -> None:
    feed = EventFeed()
    out, notice = io.StringIO(), io.StringIO()
    with trio.fail_after(10):
        async with _server(feed=feed) as addr, trio.open_nursery() as nursery:

            async def closer() -> None:
                await _wait_subscribers(feed, 1)
                feed.publish("x")
                feed.close()  # the operator stopping

            nursery.start_soon(closer)
            assert await follow_events(addr, out, notice=notice) == 1
    assert notice.getvalue() == (
        f"events: the agent at {addr} ended the feed (code 1001); 1 events received\n")


def test_a_dropped_feed_is_said_in_words_not_code_1006() -> None:
    from bigfleet_trio.observability.events import feed_ended_line

    assert feed_ended_line("a:1", 1001, "", 3) == (
        "events: the agent at a:1 ended the feed (code 1001); 3 events received\n")
    for code in (1006, None):
        line = feed_ended_line("a:1", code, "", 0)
        assert "1006" not in line and "dropped without a close" in line


def test_a_401_without_a_token_says_how_to_get_one() -> None:
    from bigfleet_trio.observability.events import rejected_hint

    assert "kubectl create token" in rejected_hint(401, token_sent=False)
    assert "client certificate is not enough" in rejected_hint(401, token_sent=False)
    assert "was not accepted" in rejected_hint(401, token_sent=True)
    assert "bigfleet-metrics-reader" in rejected_hint(403, token_sent=True)
    assert rejected_hint(404, token_sent=True) == ""
