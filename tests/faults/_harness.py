"""Shared fault-test harness: the composed Operator on the embedded apiserver (in-process ASGI,
autojump clock) against the simulated shard over the in-memory connector, with a fault proxy
around every shard end and a switchable "apiserver down" transport.

Nothing here touches a real socket, so every test runs on the mock clock.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import betterproto
import httpx
import trio

from bigfleet_trio.config import OperatorConfig
from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.errors import NotFound
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, UPCOMING_NODES
from bigfleet_trio.observability.events import EventFeed
from bigfleet_trio.operator.app import Operator
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.transport import MemoryConnector, ShardStream, StreamClosed
from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.testing import InProcessTransport
from bigfleet_trio.sim.shard.catalog import Catalog, MachineShape
from bigfleet_trio.sim.shard.engine import EngineConfig
from bigfleet_trio.sim.shard.nodes import KubeNodeHooks
from bigfleet_trio.sim.shard.session import SimShard

Need = tuple[int, dict[str, str], dict[str, str]]


def needs_of(rollup: pb.ClusterCapacityNeeds | None) -> list[Need]:
    if rollup is None:
        return []
    return sorted(
        ((n.priority, dict(n.aggregate_resources), dict(n.min_unit)) for n in rollup.needs),
        key=repr,
    )


def kind_of(msg: Any) -> str:
    try:
        return betterproto.which_one_of(msg, "payload")[0]
    except Exception:  # noqa: BLE001 - garbage frames have no oneof
        return ""


@dataclass
class Trigger:
    """Reset the stream once, right after the ``nth`` frame of ``kind`` went by.

    ``direction`` "down" = a ShardMessage the shard sent; "up" = an OperatorMessage the shard
    received (the operator's frame was delivered first, then the stream dies).
    """

    direction: str
    kind: str
    nth: int = 1
    seen: int = 0
    fired_at: float | None = None

    def hit(self, direction: str, kind: str) -> bool:
        if self.fired_at is not None or direction != self.direction or kind != self.kind:
            return False
        self.seen += 1
        if self.seen >= self.nth:
            self.fired_at = trio.current_time()
            return True
        return False


@dataclass
class SessionLog:
    """What one stream carried, as seen by the shard end."""

    started_at: float
    up: list[tuple[float, str]] = field(default_factory=list)
    down: list[tuple[float, str]] = field(default_factory=list)
    first_rollup: pb.ClusterCapacityNeeds | None = None
    first_rollup_at: float | None = None


class FaultyEnd:
    """A :class:`ShardStream` proxy that records frames and resets per :class:`Trigger`."""

    def __init__(self, inner: ShardStream, trigger: Trigger | None, log: SessionLog) -> None:
        self._inner = inner
        self._trigger = trigger
        self.log = log
        self._reset_pending = False

    async def _reset(self) -> None:
        await self._inner.aclose()
        raise StreamClosed("injected reset")

    async def send(self, msg: pb.ShardMessage) -> None:
        if self._reset_pending:
            await self._reset()
        await self._inner.send(msg)
        kind = kind_of(msg)
        self.log.down.append((trio.current_time(), kind))
        if self._trigger is not None and self._trigger.hit("down", kind):
            await self._reset()

    async def receive(self) -> pb.OperatorMessage:
        if self._reset_pending:
            await self._reset()
        msg = await self._inner.receive()
        kind = kind_of(msg)
        self.log.up.append((trio.current_time(), kind))
        if kind == "rollup" and self.log.first_rollup is None:
            self.log.first_rollup = msg.rollup
            self.log.first_rollup_at = trio.current_time()
        if self._trigger is not None and self._trigger.hit("up", kind):
            self._reset_pending = True  # deliver this frame, then the stream dies
        return msg

    async def aclose(self) -> None:
        await self._inner.aclose()


class SwitchableTransport(InProcessTransport):
    """The in-process ASGI transport, plus ``down``: every request fails to connect; every
    request is recorded in ``requests`` as (method, path, query params)."""

    down = False

    def __init__(self, app: Any, nursery: trio.Nursery) -> None:
        super().__init__(app, nursery)
        self.requests: list[tuple[str, str, httpx.QueryParams]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.path, request.url.params))
        if self.down:
            await trio.lowlevel.checkpoint()
            raise httpx.ConnectError("apiserver down (injected)", request=request)
        return await super().handle_async_request(request)


@dataclass
class Harness:
    server: ApiServer
    client: KubeClient
    transport: SwitchableTransport
    shard: SimShard
    connector: MemoryConnector
    operator: Operator
    feed: EventFeed
    sessions: list[SessionLog]
    trigger: Trigger | None
    nursery: trio.Nursery

    async def wait(self, predicate: Callable[[], Any], limit: float = 120.0) -> None:
        """Poll ``predicate`` on the mock clock (conditions span several components)."""
        with trio.fail_after(limit):
            while not predicate():  # noqa: ASYNC110
                await trio.sleep(0.05)

    async def wait_async(self, predicate: Callable[[], Any], limit: float = 120.0) -> None:
        with trio.fail_after(limit):
            while not await predicate():  # noqa: ASYNC110
                await trio.sleep(0.05)

    async def phase(self, name: str) -> str | None:
        try:
            obj = await self.client.get(CAPACITY_REQUESTS, name, "default")
        except NotFound:
            return None
        return (obj.get("status") or {}).get("phase")

    async def upcoming(self) -> dict[str, dict[str, Any]]:
        items = (await self.client.list(UPCOMING_NODES)).items
        return {o["metadata"]["name"]: o for o in items}


@asynccontextmanager
async def harness(
    *,
    trigger: Trigger | None = None,
    shapes: int = 4,
    engine: EngineConfig | None = None,
    client_kwargs: dict[str, Any] | None = None,
    **cfg: Any,
) -> AsyncIterator[Harness]:
    server = ApiServer()
    async with trio.open_nursery() as nursery:
        transport = SwitchableTransport(server.app, nursery)
        client = KubeClient(KubeConfig(server="http://apiserver"), transport=transport,
                            **(client_kwargs or {}))
        # the shard's own Node writes use a separate, never-failing client: only the operator
        # sees the injected apiserver trouble
        shard_client = KubeClient(KubeConfig(server="http://apiserver"),
                                  transport=InProcessTransport(server.app, nursery))
        catalog = Catalog(
            [MachineShape("sim-4", "z-a", {"cpu": "4", "memory": "16Gi"}, 0.2, count=shapes)]
        )
        shard = SimShard(catalog, engine or EngineConfig(seed=3),
                         hooks=KubeNodeHooks(shard_client))
        connector = MemoryConnector()
        sessions: list[SessionLog] = []

        async def accept() -> None:
            async with trio.open_nursery() as running:
                async for end in connector.accepted:
                    log = SessionLog(started_at=trio.current_time())
                    sessions.append(log)
                    running.start_soon(shard.serve_session, FaultyEnd(end, trigger, log))

        await nursery.start(shard.run)
        nursery.start_soon(accept)
        options: dict[str, Any] = {"cluster_id": "c1", "shard_addr": "shard:1",
                                   "rollup_interval": 1.0, "reconnect_initial_backoff": 0.5,
                                   "reconnect_max_backoff": 4.0}
        options.update(cfg)
        feed = EventFeed()
        op = Operator(OperatorConfig(**options), client=client, connector=connector, feed=feed)
        yield Harness(server, client, transport, shard, connector, op, feed, sessions, trigger,
                      nursery)
        nursery.cancel_scope.cancel()


class TaskTracker(trio.abc.Instrument):
    """Live tasks, to prove nothing outlives the operator."""

    def __init__(self) -> None:
        self.live: set[trio.lowlevel.Task] = set()

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.live.add(task)

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self.live.discard(task)

    def descendants(self, ancestor: trio.lowlevel.Task) -> list[trio.lowlevel.Task]:
        out = []
        for task in self.live:
            t: trio.lowlevel.Task | None = task
            while t is not None:
                if t is ancestor and task is not ancestor:
                    out.append(task)
                    break
                nursery = t.parent_nursery
                t = nursery.parent_task if nursery is not None else None
        return out


INF = math.inf
