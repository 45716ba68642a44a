"""The ``/events`` kinds published outside the session wiring: ``cr_acknowledged`` (Acknowledger,
one per batch) and ``upcoming_node_written`` (UpcomingNodeHandler, one per write); and the
UpcomingNode write log lines carrying ``machine_id`` as a JSON key."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import trio

from bigfleet_trio.kube.errors import ServerError
from bigfleet_trio.observability import events as kinds
from bigfleet_trio.observability.events import EventFeed, EventSubscription
from bigfleet_trio.observability.logs import JsonFormatter
from bigfleet_trio.operator.acknowledge import Acknowledger
from bigfleet_trio.operator.upcoming.handler import UpcomingNodeHandler
from bigfleet_trio.operator.upcoming.plan import DrainMemory
from tests.operator.test_acknowledge import T0, _cr, ack_kube
from tests.operator.test_upcoming import MS, NOW, nsu
from tests.support.kube import RecordingKube


def drain(sub: EventSubscription) -> list[dict[str, Any]]:
    out = []
    while True:
        try:
            out.append(sub.receive_nowait())
        except trio.WouldBlock:
            return out


def fields_of(kind: str) -> list[str]:
    """The field names the catalogue lists for ``kind`` (the parenthesised tail)."""
    text = kinds.KINDS[kind]
    return [f.split(":")[0].strip() for f in text[text.rindex("(") + 1 : -1].split(",")]


async def test_acknowledger_publishes_one_event_per_batch(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    # "d" is not Pending (the CRD allows only Pending and Acknowledged): no patch for it
    crs = [_cr("ns", "a"), _cr("ns", "b"), _cr("ns", "c"), _cr("ns", "d", "Acknowledged")]
    client = ack_kube(nursery, *crs)
    client.fail = {("patch", "b"): [ServerError(500, "InternalError", "boom")]}
    feed = EventFeed()
    ack = Acknowledger(client, now=lambda: T0, feed=feed)
    async with feed.subscribe(kinds=[kinds.CR_ACKNOWLEDGED]) as sub:
        async with trio.open_nursery() as inner:
            await inner.start(ack.run)
            ack.submit(crs)
            await trio.sleep(1)
            inner.cancel_scope.cancel()
        (event,) = drain(sub)
    assert event["kind"] == "cr_acknowledged"
    assert (event["count"], event["failed"], event["crs"]) == (2, 1, ["ns/a", "ns/c"])
    assert sorted(set(event) - {"seq", "ts", "kind"}) == sorted(fields_of(kinds.CR_ACKNOWLEDGED))


async def test_upcoming_handler_publishes_each_write(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    kube = RecordingKube.over_sim(nursery)
    feed = EventFeed()
    h = UpcomingNodeHandler(kube, DrainMemory(), now=lambda: NOW, feed=feed)
    async with feed.subscribe(kinds=[kinds.UPCOMING_NODE_WRITTEN]) as sub:
        await h.on_node_state_update(nsu(MS.CREATING))
        await h.on_node_state_update(nsu(MS.CREATING))  # nothing to write, nothing published
        await h.on_node_state_update(nsu(MS.CONFIGURED, labels={"zone": "a"}))
        await h.on_node_state_update(nsu(MS.DRAINING, labels={"zone": "a"}))
        await h.on_node_state_update(nsu(MS.IDLE, labels={"zone": "a"}))
        got = drain(sub)
    assert [(e["machine_id"], e["upcoming_node"], e["op"], e["phase"]) for e in got] == [
        ("m-1", "un-m-1", "create", "Provisioning"),
        ("m-1", "un-m-1", "status_update", "Provisioning"),
        ("m-1", "un-m-1", "spec_update", "Ready"),
        ("m-1", "un-m-1", "status_update", "Ready"),
        ("m-1", "un-m-1", "status_update", "Draining"),
        ("m-1", "un-m-1", "delete", "Drained"),
    ]
    for e in got:
        assert sorted(set(e) - {"seq", "ts", "kind"}) == sorted(
            fields_of(kinds.UPCOMING_NODE_WRITTEN))


async def test_upcoming_write_log_lines_carry_machine_id_as_json_keys(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    kube = RecordingKube.over_sim(nursery)
    h = UpcomingNodeHandler(kube, DrainMemory(), now=lambda: NOW)
    with caplog.at_level(logging.INFO, logger="bigfleet_trio.operator.upcoming"):
        await h.on_node_state_update(nsu(MS.CREATING, machine_id="m-7"))
        await h.on_node_state_update(nsu(MS.IDLE, machine_id="m-7"))
        await h.on_node_state_update(nsu(MS.DELETING, machine_id="m-7"))
    lines = {}
    for record in caplog.records:
        for word in ("created", "status written", "deleted"):
            if record.getMessage().startswith(f"upcoming: {word}"):
                lines[word] = json.loads(JsonFormatter().format(record))
                # an extra= key, not text the formatter lifts out of the message
                assert record.__dict__["machine_id"] == "m-7"
    assert set(lines) == {"created", "status written", "deleted"}
    for word, obj in lines.items():
        assert obj["machine_id"] == "m-7", word
        assert obj["upcoming_node"] == "un-m-7", word
        assert "phase" in obj, word
    assert lines["status written"]["phase"] == "Launched"
