"""The demo's live page: one HTML page, fed over a WebSocket, showing the fleet as it changes.

:func:`serve_page` serves, on one loopback listener (hypercorn, Starlette), ``GET /`` (the page),
``GET /page.js`` and ``GET /page.css`` (shipped in the package: ``sim/page/``, no build step,
nothing from a CDN) and ``WS /fleet`` (the fleet's state as one JSON message per change). The
WebSocket needs the run's token (``?token=``, printed in the URL; the page passes it on): a
loopback port is reachable by every local user, and the state shows the clusters' workloads.
The three files are the package's own, the same for everyone, so they are served to anyone.

The state (:func:`page_state`, pure over plain data) is, per cluster: demand by profile (the
last roll-up's needs), machines by UpcomingNode phase, reclaims and drains in flight, shortfalls,
cost per hour, and the last operator events, which :func:`follow_cluster_events` reads from each
cluster's ``/events`` WebSocket with trio-websocket, as ``bigfleet-trio events`` does; then the
timeline of machines moving between clusters.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bigfleet_trio.kube.resources import UPCOMING_NODES
from bigfleet_trio.sim.shard.fleet import Move
from bigfleet_trio.sim.shard.model import NeedStatus
from bigfleet_trio.sim.shard.session import SimShard

__all__ = ["PAGE_DIR", "ClusterFacts", "follow_cluster_events", "need_profile", "page_state",
           "serve_page"]

log = logging.getLogger(__name__)

#: The page's files, shipped as package data (pyproject ``[tool.setuptools.package-data]``).
PAGE_DIR = Path(__file__).resolve().parent / "page"

EVENTS_KEPT = 12
"""Operator events kept per cluster for the page."""

REFRESH = 0.5
"""Seconds between two reads of the clusters for the page."""

_SHORT_KEYS = {"node.kubernetes.io/instance-type": "type", "topology.kubernetes.io/zone": "zone",
               "kubernetes.io/hostname": "host", "cloud.google.com/gke-accelerator": "accel",
               "demo.bigfleet.io/pool": "pool"}
_OPS = {"OPERATOR_IN": "in", "OPERATOR_NOT_IN": "not in", "OPERATOR_EXISTS": "exists",
        "OPERATOR_DOES_NOT_EXIST": "absent", "OPERATOR_SAME": "same"}


@dataclass
class ClusterFacts:
    """What one cluster shows, as read: its needs, UpcomingNode phases, machines, reclaims."""

    name: str
    needs: Sequence[NeedStatus] = ()
    phases: Mapping[str, int] = field(default_factory=dict)
    machines: int = 0
    spot: int = 0
    cost_per_hour: float = 0.0
    reclaims_in_flight: int = 0
    drains_in_flight: int = 0
    events: Sequence[Mapping[str, Any]] = ()


def need_profile(need: NeedStatus) -> str:
    """A short label of a need's profile: its requirements, ``type exists, pool in fleet``."""
    parts = []
    for key, op, values in need.requirements:
        name = _SHORT_KEYS.get(key, key.rsplit("/", 1)[-1])
        word = _OPS.get(op, op.lower())
        parts.append(f"{name} {word}" + (f" {','.join(values)}" if values else ""))
    return ", ".join(parts) or "any machine"


def page_state(t: float, clusters: Iterable[ClusterFacts], moves: Sequence[Move],
               t0: float) -> dict[str, Any]:
    """The page's JSON state at ``t`` seconds into the run (``t0``: the run's start on the
    moves' clock). Pure."""
    out = []
    for c in clusters:
        demand = [{"profile": need_profile(n), "priority": n.priority,
                   "cpu": n.aggregate.get("cpu", "0"), "machines": len(n.machines),
                   "short": ",".join(n.short)} for n in c.needs]
        out.append({
            "name": c.name, "demand": demand, "phases": dict(sorted(c.phases.items())),
            "machines": c.machines, "spot": c.spot, "cost_per_hour": round(c.cost_per_hour, 2),
            "reclaims_in_flight": c.reclaims_in_flight, "drains_in_flight": c.drains_in_flight,
            "shortfalls": sum(1 for n in c.needs if n.short), "events": list(c.events),
        })
    timeline = [{"t": round(m.time - t0, 1), "machine": m.machine_id, "node": m.node_name,
                 "instance_type": m.instance_type, "from": m.from_cluster, "to": m.to_cluster,
                 "why": m.why, "spot": m.spot} for m in moves]
    return {"t": round(t, 1), "clusters": out, "moves": timeline}


def _event_line(event: Mapping[str, Any]) -> dict[str, Any]:
    """An operator event as the page lists it: kind and a few identifying fields."""
    keep = ("node", "machine_id", "state", "needs", "crs", "count", "error", "instruction_id")
    return {"kind": event.get("kind", "?"),
            "detail": " ".join(f"{k}={event[k]}" for k in keep if event.get(k) not in (None, ""))}


async def follow_cluster_events(addr: str, into: deque[dict[str, Any]]) -> None:
    """Follow a cluster's operator ``/events`` WebSocket (``HOST:PORT``) with trio-websocket,
    appending each event (:func:`_event_line`) to ``into``; reconnects after a second when the
    feed ends or cannot be reached, until cancelled."""
    from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

    from bigfleet_trio.observability.events import events_url

    url = events_url(addr, ())
    while True:
        try:
            async with open_websocket_url(url) as ws:
                while True:
                    into.append(_event_line(json.loads(await ws.get_message())))
        except (OSError, ConnectionClosed, HandshakeError, ValueError) as exc:
            log.debug("events of %s: %s; again in 1 s", addr, exc)
        await trio.sleep(1.0)


async def _facts(rig: Any, events: deque[dict[str, Any]]) -> ClusterFacts:
    """Read one cluster (its UpcomingNodes through the apiserver, the rest from the shard)."""
    eng = rig.view.engine
    try:
        upcoming = (await rig.client.list(UPCOMING_NODES)).items
    except Exception as exc:  # the page shows what it can; the next read tries again
        log.debug("page: UpcomingNodes of %s: %s", rig.name, exc)
        upcoming = []
    phases = Counter((u.get("status") or {}).get("phase") or "New" for u in upcoming)
    bound = eng.bound_machines()
    try:
        drains = int(rig.operator.statistics().drains_active)
    except Exception:  # statistics are informative only
        drains = 0
    return ClusterFacts(
        name=rig.name, needs=list(eng.needs), phases=phases,
        machines=sum(1 for m in bound if m.state.name == "CONFIGURED"),
        spot=sum(1 for m in bound if m.spot),
        cost_per_hour=float(sum(m.shape.price_per_hour for m in bound)),
        reclaims_in_flight=sum(1 for r in eng.reclaims if r.released_at is None),
        drains_in_flight=drains, events=list(events))


class _Broadcast:
    """The latest state, and an event set when it changes (each follower waits on it)."""

    def __init__(self) -> None:
        self.text = ""
        self.changed = trio.Event()

    def publish(self, text: str) -> None:
        if text != self.text:
            self.text = text
            self.changed.set()
            self.changed = trio.Event()


def _asset(name: str) -> bytes:
    return (PAGE_DIR / name).read_bytes()


def build_page_app(token: str, state: _Broadcast) -> Any:
    """The page's Starlette app (routes in the module docstring); ``WS /fleet`` checks the
    token (closed with 1008, policy violation, without it)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route, WebSocketRoute
    from starlette.websockets import WebSocket

    def allowed(params: Mapping[str, str]) -> bool:
        return hmac.compare_digest(params.get("token", ""), token)

    kinds = {"/": ("index.html", "text/html; charset=utf-8"),
             "/page.js": ("page.js", "text/javascript; charset=utf-8"),
             "/page.css": ("page.css", "text/css; charset=utf-8")}

    async def asset(request: Request) -> Response:
        name, media = kinds[request.url.path]
        return Response(_asset(name), media_type=media,
                        headers={"Cache-Control": "no-store"})

    async def fleet(websocket: WebSocket) -> None:
        if not allowed(websocket.query_params):
            await websocket.close(code=1008)
            return
        await websocket.accept()
        try:
            while True:
                waiter = state.changed
                if state.text:
                    await websocket.send_text(state.text)
                await waiter.wait()
        except Exception as exc:  # the browser went away
            log.debug("page follower ended: %r", exc)

    return Starlette(routes=[Route(p, asset, methods=["GET"]) for p in kinds]
                     + [WebSocketRoute("/fleet", fleet)])


async def serve_page(addr: str, shard: SimShard, rigs: Sequence[Any],
                     clock: Callable[[], float], *,
                     task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the live page on ``addr`` (``HOST:PORT``; port 0 picks one) until cancelled;
    ``task_status.started`` gets the page's URL with its token. ``rigs``: the demo's clusters
    (``name``, ``client``, ``view``, ``operator``, ``diagnostics``).

    Raises:
        OSError: the address cannot be bound.
    """
    from hypercorn.config import Config
    from hypercorn.trio import serve

    from bigfleet_trio.knobs import split_host_port

    token = secrets.token_urlsafe(16)
    state = _Broadcast()
    host, port = split_host_port(addr)
    config = Config()
    config.bind = [f"{host or '127.0.0.1'}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger(__name__ + ".server")
    config.graceful_timeout = 1.0
    events = {r.name: deque[dict[str, Any]](maxlen=EVENTS_KEPT) for r in rigs}
    async with trio.open_nursery() as nursery:
        for rig in rigs:
            if rig.diagnostics:
                nursery.start_soon(follow_cluster_events, rig.diagnostics, events[rig.name])
        binds: list[str] = await nursery.start(serve, build_page_app(token, state), config)
        bound = binds[0].split("://", 1)[-1]
        task_status.started(f"http://{bound}/?token={token}")
        t0 = trio.current_time() - clock()
        while True:
            facts = [await _facts(r, events[r.name]) for r in rigs]
            state.publish(json.dumps(page_state(clock(), facts, shard.fleet.moves, t0),
                                     separators=(",", ":")))
            await trio.sleep(REFRESH)
