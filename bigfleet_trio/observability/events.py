"""In-process event feed: what the agent decides, as small JSON-able dicts, for live followers.

The operator serves it as a WebSocket (``/events``, one JSON object per decision) and
``bigfleet-trio events --addr`` follows it. Publishers call :meth:`EventFeed.publish` with one
of the kinds in :data:`KINDS` (the catalogue ``events --help`` prints); the HTTP layer
(:mod:`bigfleet_trio.observability.http`) streams a subscription to each WebSocket client.

Semantics:

* ``publish`` is a plain function: it never blocks, never raises and costs almost nothing when
  nobody listens.
* Each subscriber has its own bounded buffer. When a subscriber falls behind, the *oldest*
  buffered events are dropped and the subscriber's next receive returns a marker
  ``{"kind": "dropped", "count": N, ...}`` in their place, so a follower always knows it missed
  something and always sees the newest state.
* Events carry ``seq`` (feed-wide, from 1), ``ts`` (Unix seconds, wall clock) and ``kind``, then
  the publisher's fields (converted to JSON-able values).
"""

from __future__ import annotations

import json
import logging
import math
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import IO, Any

import trio

__all__ = [
    "EventFeed",
    "EventSubscription",
    "FeedStatistics",
    "feed_ended_line",
    "follow_events",
    "rejected_hint",
    "token_may_travel",
    "DROPPED",
    "KINDS",
    "unknown_kinds",
]

log = logging.getLogger(__name__)

DROPPED = "dropped"

# Event kinds. Publishers use these names; a kind is listed here before anything publishes it.
OPERATOR_STARTED = "operator_started"
OPERATOR_STOPPED = "operator_stopped"
SESSION_UP = "session_up"
SESSION_DOWN = "session_down"
ROLLUP = "rollup"
CAPACITYREQUEST_EXCLUDED = "capacityrequest_excluded"
CR_ACKNOWLEDGED = "cr_acknowledged"
BOOTSTRAP = "bootstrap"
NODE_STATE = "node_state"
UPCOMING_NODE_WRITTEN = "upcoming_node_written"
RECLAIM = "reclaim"
RECLAIM_ACK = "reclaim_ack"
DRAIN_STARTED = "drain_started"
DRAIN_FINISHED = "drain_finished"
AVAILABLE_CAPACITY = "available_capacity"

KINDS: Mapping[str, str] = {
    OPERATOR_STARTED: "informers synced, the operator starts working (cluster)",
    OPERATOR_STOPPED: "the operator stopped (cluster)",
    SESSION_UP: "shard session established (cluster)",
    SESSION_DOWN: "shard session ended (cluster, error, retry_in, uptime)",
    ROLLUP: "roll-up built (cluster, needs, crs, excluded, pending)",
    CAPACITYREQUEST_EXCLUDED: "a CapacityRequest left out of the roll-up (cr, reason, field)",
    CR_ACKNOWLEDGED: "a batch of CapacityRequests went Pending -> Acknowledged (count, failed, "
    "crs: up to 20 ns/name keys of those acknowledged)",
    BOOTSTRAP: "bootstrap blob rendered or refused (request_id, bytes, error)",
    NODE_STATE: "a machine's state reflected into its UpcomingNode (machine_id, node, state)",
    UPCOMING_NODE_WRITTEN: "an UpcomingNode created, updated or deleted (machine_id, "
    "upcoming_node, op, phase)",
    RECLAIM: "reclaim instruction received (instruction_id, nodes, grace_seconds)",
    RECLAIM_ACK: "reclaim acknowledged to the shard (instruction_id, nodes_started)",
    DRAIN_STARTED: "a node drain started (node, instruction_id, grace_seconds)",
    DRAIN_FINISHED: "a node drain ended (node, instruction_id, outcome, error, pods_left)",
    AVAILABLE_CAPACITY: "AvailableCapacity upserted (supersedes_key, count)",
    DROPPED: "marker: this follower missed count events (it fell behind)",
}
"""Every event kind with what it means and its fields (``events --help`` prints this)."""


def unknown_kinds(kinds: Iterable[str]) -> list[str]:
    """The given kinds that are not in :data:`KINDS`, in order."""
    return [k for k in kinds if k not in KINDS]
_RESERVED = ("seq", "ts", "kind")


def _jsonable(value: Any, depth: int = 0) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth > 8:
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v, depth + 1) for v in value]
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return str(value)


@dataclass(frozen=True)
class FeedStatistics:
    """Snapshot of an :class:`EventFeed` (trio-style ``statistics()``)."""

    published: int
    """Events published since the feed was created."""
    subscribers: int
    """Currently open subscriptions."""
    dropped: int
    """Events dropped across all subscribers (slow followers)."""


class EventSubscription(trio.abc.ReceiveChannel[dict[str, Any]]):
    """One follower's view of the feed: a receive channel with a drop-oldest bounded buffer.

    Obtain it from :meth:`EventFeed.subscribe`. ``receive()`` returns the next event dict (or a
    ``dropped`` marker), raises ``trio.EndOfChannel`` after the feed is closed and drained, and
    ``trio.ClosedResourceError`` after ``aclose()``. Iterate with ``async for``.
    """

    def __init__(self, feed: EventFeed, maxlen: int, kinds: frozenset[str] | None) -> None:
        self._feed = feed
        self._maxlen = maxlen
        self._kinds = kinds
        self._buf: deque[dict[str, Any]] = deque()
        self._missed = 0
        self._lot = trio.lowlevel.ParkingLot()
        self._closed = False

    @property
    def dropped(self) -> int:
        """Events dropped for this subscriber that it has not yet been told about."""
        return self._missed

    def _push(self, event: dict[str, Any]) -> None:
        if self._kinds is not None and event["kind"] not in self._kinds:
            return
        if len(self._buf) >= self._maxlen:
            self._buf.popleft()
            self._missed += 1
            self._feed._dropped_total += 1
        self._buf.append(event)
        self._wake()

    def _wake(self) -> None:
        if self._lot.statistics().tasks_waiting:
            self._lot.unpark_all()

    def receive_nowait(self) -> dict[str, Any]:
        """Return the next event or marker without waiting.

        Raises:
            trio.WouldBlock: nothing buffered.
            trio.EndOfChannel: the feed is closed and everything was delivered.
            trio.ClosedResourceError: this subscription was closed.
        """
        if self._closed:
            raise trio.ClosedResourceError("subscription is closed")
        if self._missed:
            count, self._missed = self._missed, 0
            return {"seq": None, "ts": time.time(), "kind": DROPPED, "count": count}
        if self._buf:
            return self._buf.popleft()
        if self._feed._closed:
            raise trio.EndOfChannel
        raise trio.WouldBlock

    async def receive(self) -> dict[str, Any]:
        """Wait for the next event (a checkpoint whether or not one is ready)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            try:
                value = self.receive_nowait()
            except trio.WouldBlock:
                await self._lot.park()
                continue
            await trio.lowlevel.cancel_shielded_checkpoint()
            return value

    async def aclose(self) -> None:
        """Stop receiving; buffered events are discarded."""
        self._close()
        await trio.lowlevel.checkpoint()

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self._buf.clear()
            self._feed._subs.discard(self)
            self._lot.unpark_all()


class EventFeed:
    """Fan-out of decision events to any number of bounded subscribers.

    Args:
        buffer_size: default per-subscriber buffer (events) before drop-oldest kicks in.
        clock: wall-clock source for ``ts`` (Unix seconds); injectable for tests.
    """

    def __init__(self, buffer_size: int = 1024, *, clock: Callable[[], float] = time.time) -> None:
        if buffer_size < 1:
            raise ValueError("buffer_size must be >= 1")
        self._buffer_size = buffer_size
        self._clock = clock
        self._subs: set[EventSubscription] = set()
        self._seq = 0
        self._dropped_total = 0
        self._closed = False

    def publish(self, kind: str, /, **fields: Any) -> None:
        """Publish one event to every current subscriber. Never blocks, never raises.

        Args:
            kind: event kind, e.g. ``"rollup_sent"``, ``"reclaim"``, ``"drain_finished"``.
            **fields: identifying fields (cluster, node, machine, request_id, counts…); values
                that are not JSON-able are stringified. ``seq``/``ts``/``kind`` are reserved and
                a field with one of those names is renamed with a trailing underscore.
        """
        try:
            self._seq += 1
            if not self._subs or self._closed:
                return
            event: dict[str, Any] = {"seq": self._seq, "ts": self._clock(), "kind": str(kind)}
            for key, value in fields.items():
                name = key + "_" if key in _RESERVED else key
                event[name] = _jsonable(value)
            for sub in list(self._subs):
                sub._push(event)
        except Exception:  # pragma: no cover - defensive: publishing must never fail
            log.debug("event publish failed", exc_info=True, extra={"event_kind": kind})

    @asynccontextmanager
    async def subscribe(
        self, *, buffer_size: int | None = None, kinds: Iterable[str] | None = None
    ) -> AsyncIterator[EventSubscription]:
        """Follow the feed from now on.

        Usage::

            async with feed.subscribe() as events:
                async for event in events:
                    ...

        Args:
            buffer_size: this subscriber's buffer (default: the feed's).
            kinds: only these kinds (``None`` = all); ``dropped`` markers always come through.

        Yields:
            An :class:`EventSubscription` (a ``trio.abc.ReceiveChannel[dict]``), closed on exit.
        """
        size = self._buffer_size if buffer_size is None else buffer_size
        if size < 1:
            raise ValueError("buffer_size must be >= 1")
        sub = EventSubscription(self, size, frozenset(kinds) if kinds is not None else None)
        self._subs.add(sub)
        try:
            await trio.lowlevel.checkpoint()
            yield sub
        finally:
            sub._close()

    def close(self) -> None:
        """End the feed: subscribers drain their buffers, then get ``trio.EndOfChannel``."""
        self._closed = True
        for sub in list(self._subs):
            sub._wake()

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def statistics(self) -> FeedStatistics:
        """Counters for diagnostics."""
        return FeedStatistics(
            published=self._seq, subscribers=len(self._subs), dropped=self._dropped_total
        )


_default_feed: EventFeed | None = None


def default_feed() -> EventFeed:
    """The process-wide feed, for code that has no feed injected (created on first use)."""
    global _default_feed
    if _default_feed is None:
        _default_feed = EventFeed()
    return _default_feed


def events_url(addr: str, kinds: Iterable[str] = (), *, tls: bool = False) -> str:
    """Turn ``HOST:PORT`` (or an http(s)/ws(s) URL) into the ``/events`` WebSocket URL.

    Examples: ``"127.0.0.1:8770" -> "ws://127.0.0.1:8770/events"``,
    ``"http://h:1" -> "ws://h:1/events"``, ``":8770" -> "ws://127.0.0.1:8770/events"``; with
    ``tls`` (TLS options given) a bare ``HOST:PORT`` becomes ``wss://``.
    """
    a = addr.strip()
    scheme = "wss" if tls else "ws"
    for prefix, sch in (("https://", "wss"), ("wss://", "wss"), ("http://", "ws"), ("ws://", "ws")):
        if a.startswith(prefix):
            a, scheme = a[len(prefix) :], sch
            break
    a = a.rstrip("/")
    if a.endswith("/events"):
        a = a[: -len("/events")]
    if a.startswith(":"):
        a = "127.0.0.1" + a
    url = f"{scheme}://{a}/events"
    kinds = list(kinds)
    if kinds:
        url += "?kind=" + ",".join(kinds)
    return url


async def follow_events(
    addr: str,
    out: IO[str],
    *,
    kinds: Iterable[str] = (),
    max_events: int = 0,
    token: str | None = None,
    notice: IO[str] | None = None,
    tls: ssl.SSLContext | None = None,
) -> int:
    """Follow a server's ``/events`` WebSocket and write each event as one JSON line to ``out``.

    Args:
        addr: ``HOST:PORT`` of the metrics/health listener (or a URL).
        out: text stream (flushed after each line).
        kinds: only these event kinds (server-side filter).
        max_events: stop after this many lines (0 = until the server closes).
        token: bearer token sent with the upgrade (a listener with ``--metrics-auth`` checks
            it; docs/crds.md#diagnostics-access).
        notice: where to say, in one line, that the agent ended the feed (None: silent).
        tls: client context for ``wss://`` (``observability.tls.client_context``); given, a
            bare ``HOST:PORT`` means ``wss://``. An ``https://``/``wss://`` address without one
            verifies against the system's CAs. The token is never sent over plain ``ws://``
            beyond loopback (docs/crds.md#diagnostics-tls).

    Returns:
        Number of lines written.

    Raises:
        OSError: cannot connect, or the server refused the WebSocket (no ``/events`` there).
    """
    from trio_websocket import ConnectionClosed

    url = events_url(addr, kinds, tls=tls is not None)
    written = 0
    if token and not token_may_travel(url):
        token = None
        if notice is not None:
            notice.write(f"events: not sending the kubeconfig's token over plain ws:// to "
                         f"{addr}; use https://{_host_port(url)} (an agent with --metrics-auth "
                         "serves TLS)\n")
            notice.flush()
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else None
    async with _connect(url, headers, tls) as ws:
        while max_events <= 0 or written < max_events:
            try:
                message = await ws.get_message()
            except ConnectionClosed as exc:
                if notice is not None:
                    reason = exc.reason
                    notice.write(feed_ended_line(
                        addr, reason.code if reason is not None else None,
                        (reason.reason or "") if reason is not None else "", written))
                    notice.flush()
                break
            text = message.decode("utf-8", "replace") if isinstance(message, bytes) else message
            for line in text.splitlines():
                line = line.strip()
                if not line or (max_events > 0 and written >= max_events):
                    continue
                try:
                    json.loads(line)
                except ValueError:
                    line = json.dumps({"kind": "raw", "text": line})
                out.write(line + "\n")
                out.flush()
                written += 1
    return written


def feed_ended_line(addr: str, code: int | None, reason: str, written: int) -> str:
    """The one line ``events`` prints when the feed ends (``code``: the WebSocket close code).

    1006 is no close code at all: the connection dropped without a goodbye (the agent was
    killed, restarted or lost its network), said in words rather than as a number.
    """
    if code == 1006 or code is None:
        return (f"events: the connection to the agent at {addr} dropped without a close "
                f"(the agent stopped, restarted or is unreachable); {written} events received\n")
    why = f" (code {code}{': ' + reason if reason else ''})"
    return f"events: the agent at {addr} ended the feed{why}; {written} events received\n"


def rejected_hint(status: int, token_sent: bool) -> str:
    """What to do about an ``/events`` upgrade refused with ``status``
    (docs/crds.md#diagnostics-access)."""
    if status == 401 and not token_sent:
        return ("; the agent checks a bearer token (TokenReview), and the kubeconfig has none "
                "(a client certificate is not enough): use a kubeconfig with a token, e.g. "
                "from `kubectl create token <serviceaccount> -n <namespace>`, whose subject "
                "is bound to the ClusterRole bigfleet-metrics-reader")
    if status == 401:
        return ("; the kubeconfig's bearer token (--kubeconfig) was not accepted (expired? "
                "`kubectl create token` issues a new one)")
    if status == 403:
        return "; bind your user to the ClusterRole bigfleet-metrics-reader"
    return ""


def _host_port(url: str) -> str:
    return url.split("://", 1)[-1].split("/", 1)[0]


def token_may_travel(url: str) -> bool:
    """Whether a bearer token may be sent to ``url``: over ``wss://``, or over ``ws://`` to a
    loopback address (a port-forward); never in clear text across a network."""
    from bigfleet_trio.knobs import loopback_addr

    return url.startswith("wss://") or loopback_addr(_host_port(url))


_TLS_HINT = ("; the agent's certificate is not trusted: pass --certificate-authority with the CA "
             "that signed it (and --tls-server-name if it names another host), or "
             "--insecure-skip-tls-verify for a self-signed one")
_PLAIN_HINT = ("; does the agent serve TLS (an agent with --metrics-auth does)? use "
               "https://{addr}")


def _why(exc: BaseException) -> tuple[str, str]:
    """The innermost cause of a failed connection and the hint that goes with it."""
    seen: BaseException | None = exc
    last = exc
    while seen is not None:
        last = seen
        if isinstance(seen, ssl.SSLCertVerificationError):
            return f"certificate verify failed: {seen.verify_message}", _TLS_HINT
        seen = seen.__cause__ or seen.__context__
    return str(last) or type(last).__name__, ""


async def _preflight(url: str, tls: ssl.SSLContext | None) -> None:
    """Check the transport before the WebSocket handshake: trio-websocket (0.12) waits out its
    60 s connect timeout when the connection fails under it (its reader stops without waking
    the opener), so an untrusted certificate, or plain HTTP to a TLS listener, would hang
    instead of saying so. ``wss://``: one TLS handshake; ``ws://``: one ``GET /healthz``, whose
    answer must be HTTP.

    Raises:
        trio.BrokenResourceError (cause: the ssl error), OSError: no usable connection.
    """
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    if parts.scheme == "wss":
        tls_stream = await trio.open_ssl_over_tcp_stream(
            host, parts.port or 443, ssl_context=tls or ssl.create_default_context(),
            https_compatible=True)
        try:
            await tls_stream.do_handshake()
        finally:
            await tls_stream.aclose()
        return
    stream = await trio.open_tcp_stream(host, parts.port or 80)
    try:
        await stream.send_all(f"GET /healthz HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                              "Connection: close\r\n\r\n".encode())
        head = b""
        with trio.move_on_after(10):
            while len(head) < 5:
                chunk = await stream.receive_some(5 - len(head))
                if not chunk:
                    break
                head += chunk
    except trio.BrokenResourceError:
        head = b""
    finally:
        await stream.aclose()
    if not head.startswith(b"HTTP/"):
        raise OSError("the listener did not answer plain HTTP")


@asynccontextmanager
async def _connect(url: str, headers: list[tuple[bytes, bytes]] | None = None,
                   tls: ssl.SSLContext | None = None) -> AsyncIterator[Any]:
    """``open_websocket_url`` with connection/handshake failures turned into one-line OSErrors."""
    from trio_websocket import ConnectionRejected, HandshakeError, open_websocket_url

    entered = False
    secure = url.startswith("wss://")
    try:
        await _preflight(url, tls if secure else None)
        async with open_websocket_url(url, tls if secure else None,
                                      extra_headers=headers) as ws:
            entered = True
            yield ws
    except ConnectionRejected as exc:
        if entered:  # pragma: no cover - only raised during the handshake
            raise
        said = " ".join((exc.body or b"").decode("utf-8", "replace").split())[:300]
        hint = rejected_hint(exc.status_code, headers is not None)
        raise OSError(f"{url}: server rejected the WebSocket (HTTP {exc.status_code}"
                      f"{': ' + said if said else ''}){hint}") from exc
    except HandshakeError as exc:
        if entered:  # pragma: no cover
            raise
        why, hint = _why(exc)
        if not hint and url.startswith("ws://"):
            # a TLS listener drops a plain HTTP upgrade without an answer
            hint = _PLAIN_HINT.format(addr=_host_port(url))
        raise OSError(f"cannot connect to {url}: {why}{hint}") from exc
    except (trio.BrokenResourceError, OSError) as exc:
        if entered:
            raise
        why, hint = _why(exc)
        if not hint and not secure and "did not answer plain HTTP" in why:
            hint = _PLAIN_HINT.format(addr=_host_port(url))
        raise OSError(f"cannot connect to {url}: {why}{hint}") from exc
