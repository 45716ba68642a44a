"""Tests for bigfleet_trio.observability.events: the /events feed and its kind catalogue."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from bigfleet_trio.observability.events import DROPPED, EventFeed, events_url


def _clock() -> float:
    return 1000.0


async def test_publish_without_subscribers_is_cheap_and_counts() -> None:
    feed = EventFeed(clock=_clock)
    feed.publish("rollup_sent", needs=2)
    assert feed.statistics().published == 1
    assert feed.statistics().subscribers == 0


async def test_subscriber_receives_in_order_with_envelope() -> None:
    feed = EventFeed(clock=_clock)
    feed.publish("before", x=1)  # not seen: subscribe means "from now on"
    async with feed.subscribe() as sub:
        feed.publish("rollup_sent", cluster="c1", needs=3)
        feed.publish("reclaim", node="n1", kind="oops", seq=9)
        assert await sub.receive() == {
            "seq": 2,
            "ts": 1000.0,
            "kind": "rollup_sent",
            "cluster": "c1",
            "needs": 3,
        }
        assert await sub.receive() == {
            "seq": 3,
            "ts": 1000.0,
            "kind": "reclaim",
            "node": "n1",
            "kind_": "oops",
            "seq_": 9,
        }
        assert feed.statistics().subscribers == 1
    assert feed.statistics().subscribers == 0


async def test_fields_are_made_jsonable() -> None:
    feed = EventFeed(clock=_clock)
    async with feed.subscribe() as sub:
        feed.publish("x", t=(1, 2), s={"a": {3}}, b=b"abc", o=object, f=float("nan"))
        ev = await sub.receive()
    assert ev["t"] == [1, 2]
    assert ev["s"] == {"a": [3]}
    assert ev["b"] == "<3 bytes>"
    assert ev["o"] == "<class 'object'>"
    assert ev["f"] == "nan"


async def test_receive_waits_for_publish(autojump_clock: trio.testing.MockClock) -> None:
    feed = EventFeed(clock=_clock)
    got: list[str] = []
    async with feed.subscribe() as sub, trio.open_nursery() as nursery:

        async def reader() -> None:
            async for ev in sub:
                got.append(ev["kind"])
                if len(got) == 2:
                    return

        nursery.start_soon(reader)
        await trio.sleep(1)
        assert got == []
        feed.publish("a")
        await trio.sleep(1)
        assert got == ["a"]
        feed.publish("b")
    assert got == ["a", "b"]


async def test_slow_subscriber_drops_oldest_and_gets_marker() -> None:
    feed = EventFeed(buffer_size=3, clock=_clock)
    async with feed.subscribe() as slow, feed.subscribe(buffer_size=10) as fast:
        for i in range(5):
            feed.publish("e", i=i)
        # slow kept the newest 3 (i=2,3,4) and was told it missed 2.
        assert slow.dropped == 2
        first = await slow.receive()
        assert first["kind"] == DROPPED and first["count"] == 2 and first["seq"] is None
        assert [(await slow.receive())["i"] for _ in range(3)] == [2, 3, 4]
        assert [(await fast.receive())["i"] for _ in range(5)] == [0, 1, 2, 3, 4]
        assert feed.statistics().dropped == 2
        with pytest.raises(trio.WouldBlock):
            slow.receive_nowait()


async def test_kind_filter() -> None:
    feed = EventFeed(clock=_clock)
    async with feed.subscribe(kinds=["reclaim"]) as sub:
        feed.publish("rollup_sent")
        feed.publish("reclaim", node="n1")
        assert (await sub.receive())["node"] == "n1"
        with pytest.raises(trio.WouldBlock):
            sub.receive_nowait()


async def test_close_drains_then_end_of_channel() -> None:
    feed = EventFeed(clock=_clock)
    async with feed.subscribe() as sub:
        feed.publish("last")
        feed.close()
        feed.publish("ignored")
        assert [ev["kind"] async for ev in sub] == ["last"]


async def test_close_wakes_waiting_receiver(autojump_clock: trio.testing.MockClock) -> None:
    feed = EventFeed()
    async with feed.subscribe() as sub, trio.open_nursery() as nursery:
        done = trio.Event()

        async def reader() -> None:
            with pytest.raises(trio.EndOfChannel):
                await sub.receive()
            done.set()

        nursery.start_soon(reader)
        await trio.sleep(5)
        feed.close()
        with trio.fail_after(1):
            await done.wait()


async def test_closed_subscription_raises() -> None:
    feed = EventFeed()
    async with feed.subscribe() as sub:
        await sub.aclose()
        with pytest.raises(trio.ClosedResourceError):
            await sub.receive()
        feed.publish("x")  # no longer delivered, no error
    assert feed.statistics().subscribers == 0


async def test_receive_is_cancellable(autojump_clock: trio.testing.MockClock) -> None:
    feed = EventFeed()
    async with feed.subscribe() as sub:
        with trio.move_on_after(3) as scope:
            await sub.receive()
        assert scope.cancelled_caught
        feed.publish("after")
        assert (await sub.receive())["kind"] == "after"


async def test_receive_checkpoints_even_when_ready() -> None:
    feed = EventFeed()
    async with feed.subscribe() as sub:
        feed.publish("x")
        with trio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(trio.Cancelled):
                await sub.receive()
        assert (await sub.receive())["kind"] == "x"  # not lost by the cancelled receive


def test_publish_outside_trio_never_fails() -> None:
    feed = EventFeed()
    feed.publish("x", a=1)  # the default clock needs Trio: publish swallows that
    assert feed.statistics().published == 1


def test_bad_buffer_size() -> None:
    with pytest.raises(ValueError):
        EventFeed(buffer_size=0)


@pytest.mark.parametrize(
    ("addr", "url"),
    [
        ("127.0.0.1:8770", "ws://127.0.0.1:8770/events"),
        (":8770", "ws://127.0.0.1:8770/events"),
        ("http://h:1/", "ws://h:1/events"),
        ("https://h:1", "wss://h:1/events"),
        ("ws://h:1/events", "ws://h:1/events"),
    ],
)
def test_events_url(addr: str, url: str) -> None:
    assert events_url(addr) == url


def test_events_url_kinds() -> None:
    assert events_url("h:1", ["a", "b"]) == "ws://h:1/events?kind=a,b"


def test_every_published_kind_is_in_the_catalogue() -> None:
    """A kind published anywhere in the package is listed in KINDS (what ``events --help``
    prints and ``events --kind`` accepts)."""
    import pathlib
    import re

    from bigfleet_trio.observability import events

    root = pathlib.Path(events.__file__).resolve().parents[1]
    literal = re.compile(r"""publish\(\s*["']([a-z_]+)["']""")
    constant = re.compile(r"publish\(\s*(?:\w+\.)?([A-Z][A-Z_]+)\b")
    seen: set[str] = set()
    for path in root.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        seen.update(literal.findall(text))
        for name in constant.findall(text):
            value = getattr(events, name, None)
            assert isinstance(value, str), f"{path.name}: publish({name}) is not an events kind"
            seen.add(value)
    assert seen, "no publisher found: the scan is broken"
    assert sorted(seen - set(events.KINDS)) == []


def test_unknown_kinds() -> None:
    from bigfleet_trio.observability.events import KINDS, unknown_kinds

    assert unknown_kinds(["rollup", "nope", "drain_finished", "Rollup"]) == ["nope", "Rollup"]
    assert {"cr_acknowledged", "upcoming_node_written", "drain_started", "drain_finished"} <= set(
        KINDS
    )
