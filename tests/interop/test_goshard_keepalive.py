"""HTTP/2 keepalive against grpc-go's server-side enforcement
(docs/wire.md#keepalive-against-a-go-shard).

grpc-go counts a strike for each client ping that comes sooner than ``MinTime`` (default 5 min)
after the previous one, unless the server wrote DATA or HEADERS in between, and answers the
third strike with GOAWAY ENHANCE_YOUR_CALM ``too_many_pings``. The downlink here stays idle
(the peer sends nothing at all), the case where nothing resets the strikes. The peer records the
PINGs it receives and any GOAWAY it sends, as seen on its own clock.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.interop._peer import GoPeer, world

pytestmark = [pytest.mark.interop, pytest.mark.slow]

#: The peer plays no downlink at all: Hello in, then silence.
IDLE = {"default": [{"await": "hello"}]}
#: Opt-in for the test that waits out grpc-go's real 5-minute MinTime (about 12 minutes).
LONG = "BIGFLEET_INTEROP_KEEPALIVE"


def client_pings(peer: GoPeer) -> list[float]:
    """Arrival times (ms, the peer's clock) of the operator's keepalive pings."""
    return [r["at_ms"] for r in peer.records("ping", dir="in", ack=False)]


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


async def test_tightened_enforcement_goaway_too_many_pings_is_a_clean_reconnect_reason_logged(
    tmp_path: Path, goshard: str
) -> None:
    # The shard allows one ping a minute; the operator is told to ping every second.
    async with world(tmp_path, goshard, IDLE, peer_flags=("-keepalive-min-time", "1m"),
                     operator_flags=("--keepalive-time", "1s")) as w:
        await w.until("GOAWAY too_many_pings", lambda: w.peer.records("goaway", dir="out"), 60)
        (goaway, *_) = w.peer.records("goaway", dir="out")
        assert (goaway["code"], goaway["debug"]) == (11, "too_many_pings")  # ENHANCE_YOUR_CALM
        # The fourth ping on that connection (the first sets the clock, three strikes follow).
        assert len([p for p in w.peer.records("ping", dir="in", ack=False)
                    if p["conn"] == goaway["conn"]]) == 4
        await w.until("a new session on a new connection",
                      lambda: w.peer.records("open", session=2) and w.peer.uplink("hello", 2))
        await w.until("the GOAWAY's reason in the operator's log",
                      lambda: "interval doubled" in w.operator_log())
        log = w.operator_log()
        assert "error=stream closed: GOAWAY ENHANCE_YOUR_CALM too_many_pings" in log
        # Like grpc-go's own client, the operator backs off: the next connection pings half
        # as often.
        assert "interval doubled to 2s for the next connections" in log
        assert "Traceback" not in log


async def test_idle_downlink_pings_at_or_above_min_time_get_no_goaway_scaled(
    tmp_path: Path, goshard: str
) -> None:
    # grpc-go's rule at a smaller scale: MinTime 3 s, the operator pings every 4 s; five pings
    # over an idle downlink, no strike, no GOAWAY, one session.
    async with world(tmp_path, goshard, IDLE, peer_flags=("-keepalive-min-time", "3s"),
                     operator_flags=("--keepalive-time", "4s")) as w:
        await w.until("five keepalive pings", lambda: len(client_pings(w.peer)) >= 5, 60)
        assert min(gaps(client_pings(w.peer))) >= 3000
        assert w.peer.records("goaway") == []
        assert len(w.peer.records("open")) == 1 and w.peer.records("end") == []


@pytest.mark.skipif(not os.environ.get(LONG), reason=f"about 12 minutes; set {LONG}=1 to run")
async def test_idle_downlink_longer_than_go_min_time_gets_no_goaway_default_keepalive(
    tmp_path: Path, goshard: str
) -> None:
    # grpc-go's default enforcement (no -keepalive-min-time) and the operator's default
    # keepalive: the second ping is the first one grpc-go checks against MinTime.
    async with world(tmp_path, goshard, IDLE, operator_flags=("--rollup-interval", "10s")) as w:
        await w.until("two keepalive pings", lambda: len(client_pings(w.peer)) >= 2, 800)
        assert min(gaps(client_pings(w.peer))) >= 300_000  # MinTime, on the shard's clock
        assert w.peer.records("goaway") == []
        assert len(w.peer.records("open")) == 1 and w.peer.records("end") == []
