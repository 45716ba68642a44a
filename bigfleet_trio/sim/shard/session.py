"""Trio layer of the simulated shard: sessions over a ShardStream, the engine clock, node hooks.

Shard-side session rules, as a real shard applies them: the first
frame must be a Hello with a non-empty ``cluster_id`` (else the stream is closed with
InvalidArgument); the shard answers ``Ack{echo:"hello"}`` and then ``Ack{echo:"rollup"}`` for each
roll-up it accepts; a new session for the cluster replaces (and closes) the previous one; on each
(re)connect the current NodeStateUpdate of every bound machine is replayed. Sessions are keyed
by cluster ID: several clusters are served at once from one pool
(:class:`~.fleet.FleetEngine`, docs/rules.md#simulated-fleet). A cluster's first session in this
process rebuilds its bindings from the cluster's Nodes when the hooks can list them
(:class:`NodeLister`), so a restarted shard never replays a machine the agent holds Ready as Idle.

All decisions live in :class:`~bigfleet_trio.sim.shard.engine.ShardEngine` (sans-IO). This module
only moves frames: one task per session receives frames and feeds the engine, one clock task calls
``engine.advance`` at the engine's deadlines, and one executor task performs the engine's effects
in order (send a frame on the session that was current when it was produced, or start a node
hook; a failed hook is retried in the background by :class:`~.noderetry.NodeHookRunner`). A node
hook holds only its own machine's later effects (:func:`effect_machine`), never the others'.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, runtime_checkable

import betterproto
import trio
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from bigfleet_trio.proto import pb
from bigfleet_trio.shard.transport import ShardStream, StreamClosed, close_with_status

from .catalog import Catalog, default_catalog
from .engine import (
    Effect,
    EngineConfig,
    EngineEvent,
    InvalidRollup,
    MachineConfigured,
    MachineInfo,
    MachineReleased,
    ReclaimRecord,
    SendFrame,
    ShardEngine,
)
from .fleet import FleetEngine
from .noderetry import HookKind, NodeHookRunner, node_hook_due
from .stats import ShardStats

log = logging.getLogger(__name__)

PROTOCOL_VERSION = "v1alpha1"

HOOK_CONCURRENCY = 64
"""At most this many node hook first attempts in flight (the apiserver's APF paces them)."""


@dataclass(frozen=True)
class _HookDone:
    """Executor-internal: the first attempt of ``machine_id``'s node hook returned."""

    machine_id: str


def effect_machine(eff: Effect) -> str | None:
    """The machine whose order ``eff`` belongs to: a node hook's machine, or a
    NodeStateUpdate's ``machine_id``; None for frames of no single machine (Acks, roll-up
    answers, BootstrapRequests, ReclaimInstructions, AvailableCapacity)."""
    if isinstance(eff, (MachineConfigured, MachineReleased)):
        return eff.machine.machine_id
    if betterproto.which_one_of(eff.frame, "payload")[0] != "node_state_update":
        return None
    return eff.frame.node_state_update.machine_id or None


class NodeHooks(Protocol):
    """Called when a machine's Kubernetes Node should appear or disappear.

    The demo implements this by creating/deleting a Node through the Kubernetes API. Calls are
    made in engine order per machine, before that machine's frames that follow them (so the Node
    exists when the agent hears Configured); other machines' frames do not wait for them. A call
    that raises is retried by the shard with capped exponential backoff, as a kubelet retries its
    registration, until it succeeds or the machine leaves the state (docs/deviations.md,
    "Simulated shard: Node registration retried"), so a hook must be idempotent; errors never
    stop the shard.
    """

    async def on_machine_configured(self, machine: MachineInfo) -> None:
        """The machine reached Configured: register its Node (name ``machine.node_name``)."""

    async def on_machine_released(self, machine: MachineInfo) -> None:
        """The machine was reclaimed and drained back to Idle: delete its Node."""


@runtime_checkable
class HeartbeatNodeHooks(NodeHooks, Protocol):
    """:class:`NodeHooks` that also keep their Nodes alive, as a kubelet does (Lease renewals,
    status reports: :class:`~bigfleet_trio.sim.shard.nodes.KubeNodeHooks`); :meth:`SimShard.run`
    runs their :meth:`run` beside the engine."""

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the registered Nodes alive until cancelled."""


@runtime_checkable
class NodeLister(Protocol):
    """:class:`NodeHooks` that can list the Nodes they registered in a cluster earlier (by this
    process or one before it): what a restarted shard rebuilds its bindings from."""

    async def existing_nodes(self, cluster_id: str) -> list[tuple[str, str]]:
        """``(node name, spec.providerID)`` of every Node in the cluster with a ``sim://``
        provider ID."""


class NoopNodeHooks:
    """:class:`NodeHooks` that does nothing (the default)."""

    async def on_machine_configured(self, machine: MachineInfo) -> None:
        """Do nothing."""

    async def on_machine_released(self, machine: MachineInfo) -> None:
        """Do nothing."""


def replaced_message(cluster_id: str) -> str:
    """The status message of a session ended by a newer one for the same cluster ID."""
    return (f"session replaced: a newer session for cluster {cluster_id!r} connected "
            "(another agent with the same cluster ID?)")


class SessionRejected(GRPCError):
    """The session's first frame was not a valid Hello; the stream was closed.

    A ``grpclib`` ``GRPCError`` with status INVALID_ARGUMENT, so a grpclib server handler that lets
    it propagate answers the agent with that status (as the real shard does).
    """

    def __init__(self, reason: str, status: Status = Status.INVALID_ARGUMENT) -> None:
        super().__init__(status, reason)
        self.reason = reason


@dataclass
class _Session:
    stream: ShardStream
    gen: int
    cluster_id: str
    cancel_scope: trio.CancelScope
    replaced: bool = False


class SimShard:
    """A simulated shard: a :class:`~.fleet.FleetEngine` driven on the Trio clock, serving one
    session per cluster from one pool.

    Usage::

        shard = SimShard(config=EngineConfig(seed=1), hooks=my_hooks)
        async with trio.open_nursery() as nursery:
            await nursery.start(shard.run)          # engine clock + effect executor
            nursery.start_soon(shard.serve_session, shard_stream)   # one per accepted stream

    Args:
        catalog: machine shapes (default :func:`default_catalog`).
        config: engine knobs (default :class:`EngineConfig`).
        hooks: node registration callbacks (default :class:`NoopNodeHooks`).
        hello_timeout: seconds to wait for the first frame (default ``config.bootstrap_timeout``,
            one cycle).
        hook_timeout: a node hook attempt taking longer than this is cancelled and counted as
            failed, then retried (frames queue behind the first attempt, so a stuck apiserver
            must not stall the shard).
        stats: shard-side timestamps to record (:class:`~.stats.ShardStats`; benchmarks).
    """

    def __init__(
        self,
        catalog: Catalog | None = None,
        config: EngineConfig | None = None,
        *,
        hooks: NodeHooks | None = None,
        hello_timeout: float | None = None,
        hook_timeout: float = 30.0,
        stats: ShardStats | None = None,
    ) -> None:
        self.fleet = FleetEngine(catalog or default_catalog(), config)
        self.hooks: NodeHooks = hooks or NoopNodeHooks()
        self.node_hooks = NodeHookRunner(self.hooks, self._hook_due, timeout=hook_timeout,
                                         on_change=self._pulse)
        self.hello_timeout = (
            hello_timeout if hello_timeout is not None else self.fleet.config.bootstrap_timeout
        )
        self.stats = stats
        self.sessions_started = 0
        self.rejections: list[str] = []
        self._gen = 0
        self._sessions: dict[str, _Session] = {}  # cluster ID -> its current session
        self._live: dict[int, _Session] = {}  # generation -> current session
        self._adopted: set[str] = set()  # clusters whose Nodes were read back
        self._running = False
        self._wake = trio.Event()
        self._changed = trio.Event()
        self._fx_send, self._fx_recv = trio.open_memory_channel[tuple[int, Effect | _HookDone]](
            math.inf)
        self._hook_limit = trio.CapacityLimiter(HOOK_CONCURRENCY)

    # ---------------------------------------------------------------- views for the demo

    @property
    def engine(self) -> ShardEngine:
        """The first cluster's engine (the only one of a single-cluster shard)."""
        return self.fleet.primary

    def engine_of(self, cluster_id: str) -> ShardEngine:
        """The engine of ``cluster_id`` (created, sharing the pool, on first use)."""
        return self.fleet.engine(cluster_id)

    @property
    def hook_timeout(self) -> float:
        """Seconds one node hook attempt may take (settable)."""
        return self.node_hooks.timeout

    @hook_timeout.setter
    def hook_timeout(self, value: float) -> None:
        self.node_hooks.timeout = value

    @property
    def hook_errors(self) -> int:
        """Failed node hook attempts (retries included)."""
        return self.node_hooks.errors

    @property
    def connected(self) -> bool:
        """A session with a valid Hello is up (for any cluster)."""
        return bool(self._sessions)

    @property
    def clusters(self) -> list[str]:
        """Cluster IDs with a session up, in connect order."""
        return list(self._sessions)

    @property
    def cluster_id(self) -> str:
        """The cluster of the last valid Hello ("" before any)."""
        return self.engine.cluster_id

    def machines_by_state(self) -> dict[str, int]:
        """Bound machines per state name (``"CONFIGURED"``, ...) plus ``"FREE"`` for the pool."""
        return self.engine.machines_by_state()

    @property
    def last_rollup(self) -> pb.ClusterCapacityNeeds | None:
        """The last roll-up the engine accepted."""
        return self.engine.last_rollup

    @property
    def reclaims_issued(self) -> list[ReclaimRecord]:
        """Every ReclaimInstruction issued so far (one per machine), in order."""
        return list(self.engine.reclaims)

    @property
    def reclaims_acked(self) -> list[ReclaimRecord]:
        """The issued instructions the agent acknowledged."""
        return [r for r in self.engine.reclaims if r.acked_at is not None]

    @property
    def events(self) -> list[EngineEvent]:
        """The engine's event log (bounded), oldest first."""
        return list(self.engine.events)

    def snapshot(self, cluster_id: str | None = None) -> dict[str, Any]:
        """A JSON-ready summary for progress displays, of ``cluster_id`` (default: the first
        cluster's engine).

        Keys: ``connected``, ``cluster_id``, ``machines`` (:meth:`machines_by_state`), ``needs``
        (in the last accepted roll-up), ``short_needs``, ``reclaims_issued``, ``reclaims_acked``,
        ``released`` (machines walked back to Idle), ``shortfalls``, ``rollups_accepted``,
        ``rollups_rejected``, ``hook_errors`` (failed node hook attempts), ``node_hook_retries``
        (attempts after a failure), ``node_hooks_pending`` (Nodes with a retry waiting),
        ``rejections``.
        """
        eng = self.engine if cluster_id is None else self.fleet.engine(cluster_id)
        return {
            "connected": (self.connected if cluster_id is None
                          else cluster_id in self._sessions),
            "cluster_id": eng.cluster_id,
            "machines": eng.machines_by_state(),
            "needs": len(eng.needs),
            "short_needs": sum(1 for n in eng.needs if n.short),
            "reclaims_issued": len(eng.reclaims),
            "reclaims_acked": sum(1 for r in eng.reclaims if r.acked_at is not None),
            "released": eng.released,
            "shortfalls": len(eng.shortfalls),
            "rollups_accepted": eng.rollups_accepted,
            "rollups_rejected": eng.rollups_rejected,
            "hook_errors": self.hook_errors,
            "node_hook_retries": self.node_hooks.retries,
            "node_hooks_pending": self.node_hooks.pending,
            "rejections": len(self.rejections),
        }

    async def wait_until(self, predicate: Callable[[SimShard], bool]) -> None:
        """Block until ``predicate(self)`` is true (re-checked after every engine change)."""
        while not predicate(self):
            await self._changed.wait()

    # ---------------------------------------------------------------- background

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Run the engine clock, the effect executor, the node hook retries and the hooks' Node
        heartbeats (:class:`HeartbeatNodeHooks`) until cancelled."""
        if self._running:
            raise RuntimeError("SimShard.run() is already running")
        self._running = True
        try:
            async with trio.open_nursery() as nursery:
                # owner of every node hook retry task: cancelling run() (SIGTERM) ends them
                await nursery.start(self.node_hooks.run)
                if isinstance(self.hooks, HeartbeatNodeHooks):
                    await nursery.start(self.hooks.run)
                nursery.start_soon(self._clock)
                nursery.start_soon(self._executor)
                task_status.started()
        finally:
            self._running = False

    async def _clock(self) -> None:
        while True:
            deadline = self.fleet.next_deadline()
            with trio.move_on_at(deadline if deadline is not None else math.inf):
                await self._wake.wait()
            self._wake = trio.Event()
            self._enqueue_tagged(self.fleet.advance(trio.current_time()))

    async def _executor(self) -> None:
        # A real shard does not wait on one machine's kubelet to talk to the agent: a Node
        # registration the apiserver takes seconds over holds that machine's later effects
        # (its CONFIGURED follows its Node), never another machine's frames. One executor
        # ran every hook inline once, and at 1,000 machines on a loaded apiserver the
        # BootstrapRequests queued behind Node POSTs missed their 10 s deadline by thousands.
        held: dict[str, list[tuple[int, Effect]]] = {}  # machine id -> effects behind its hook
        async with trio.open_nursery() as hooks:  # owner of the hooks' first attempts
            async for gen, item in self._fx_recv:
                if isinstance(item, _HookDone):
                    await self._release(held.pop(item.machine_id, []), held, hooks)
                else:
                    mid = effect_machine(item)
                    if mid is not None and mid in held:
                        held[mid].append((gen, item))
                    else:
                        await self._apply(gen, item, held, hooks)
                self._pulse()

    async def _release(self, queue: list[tuple[int, Effect]],
                       held: dict[str, list[tuple[int, Effect]]], hooks: trio.Nursery) -> None:
        """Apply a machine's effects that waited for its hook, until one starts a hook again."""
        for i, (gen, eff) in enumerate(queue):
            mid = effect_machine(eff)
            if mid is not None and mid in held:
                held[mid].extend(queue[i:])
                return
            await self._apply(gen, eff, held, hooks)

    async def _apply(self, gen: int, eff: Effect,
                     held: dict[str, list[tuple[int, Effect]]], hooks: trio.Nursery) -> None:
        if isinstance(eff, SendFrame):
            cur = self._live.get(gen)
            if cur is None:
                log.debug("frame dropped (no session for it): %s",
                          betterproto.which_one_of(eff.frame, "payload")[0])
                return
            try:
                await cur.stream.send(eff.frame)
            except StreamClosed as exc:
                log.info("send failed, session ending: %s", exc.reason)
            else:
                if self.stats is not None:
                    self.stats.sent(eff.frame)
            return
        kind: HookKind = "register" if isinstance(eff, MachineConfigured) else "deregister"
        held[eff.machine.machine_id] = []
        hooks.start_soon(self._hook, kind, eff.machine)

    async def _hook(self, kind: HookKind, machine: MachineInfo) -> None:
        try:
            async with self._hook_limit:
                await self.node_hooks.call(kind, machine)
        finally:
            self._fx_send.send_nowait((0, _HookDone(machine.machine_id)))

    def _hook_due(self, kind: HookKind, machine: MachineInfo) -> bool:
        # Not tied to the agent's session: the machine stays bound (and is replayed on
        # reconnect) while no agent is connected, and so does its Node.
        return node_hook_due(kind, self.fleet.machine(machine.machine_id), machine.cluster_id)

    def _enqueue(self, gen: int, effects: list[Effect]) -> None:
        for eff in effects:
            self._fx_send.send_nowait((gen, eff))
        self._pulse()

    def _pulse(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _kick(self) -> None:
        self._wake.set()

    def _enqueue_tagged(self, effects: list[tuple[str, Effect]]) -> None:
        """Effects of several clusters: each to its cluster's current session."""
        for cluster_id, eff in effects:
            self._fx_send.send_nowait((self._gen_of(cluster_id), eff))
        self._pulse()

    def _gen_of(self, cluster_id: str) -> int:
        cur = self._sessions.get(cluster_id)
        return cur.gen if cur is not None else 0

    # ---------------------------------------------------------------- sessions

    async def serve_session(self, stream: ShardStream) -> None:
        """Serve one ``Shard.Session`` stream until it ends, is replaced, or is cancelled.

        Closes the stream on return.

        Raises:
            SessionRejected: the first frame was missing (``hello_timeout``), not a Hello, had an
                empty ``cluster_id`` or a ``protocol_version`` other than ``"v1alpha1"``.
            RuntimeError: :meth:`run` is not running.
        """
        if not self._running:
            raise RuntimeError("SimShard.run() must be running before serving sessions")
        try:
            first: Any = None
            with trio.move_on_after(self.hello_timeout):
                first = await stream.receive()
            if first is None:
                await self._reject(stream, f"no Hello within {self.hello_timeout:g}s")
            try:
                kind, hello = betterproto.which_one_of(first, "payload")
            except Exception:
                kind, hello = "", None
            if kind != "hello" or not isinstance(hello, pb.Hello):
                await self._reject(stream, f"first frame must be Hello, got {kind or 'nothing'!r}")
            assert isinstance(hello, pb.Hello)
            if not hello.cluster_id:
                await self._reject(stream, "Hello.cluster_id is empty")
            if hello.protocol_version != PROTOCOL_VERSION:
                await self._reject(
                    stream,
                    f"Hello.protocol_version {hello.protocol_version!r} "
                    f"is not {PROTOCOL_VERSION!r}",
                )
        except StreamClosed as exc:
            log.info("session ended before Hello: %s", exc.reason)
            await self._close(stream)
            return

        # Sessions are keyed by cluster ID: another cluster never replaces this one.
        previous = self._sessions.get(hello.cluster_id)
        if previous is not None:
            log.warning("session for cluster=%s replaced by a newer one for the same cluster",
                        previous.cluster_id)
            previous.replaced = True
            previous.cancel_scope.cancel()
        if hello.cluster_id not in self._adopted:
            self._adopted.add(hello.cluster_id)
            await self._adopt(hello.cluster_id)
        self._gen += 1
        self.sessions_started += 1
        session = _Session(stream, self._gen, hello.cluster_id, trio.CancelScope())
        if previous is not None:
            self._live.pop(previous.gen, None)
        self._sessions[hello.cluster_id] = session
        self._live[session.gen] = session
        now = trio.current_time()
        log.info("session up cluster=%s", hello.cluster_id)
        replay: list[Effect] = [SendFrame(self.fleet.engine(hello.cluster_id).ack("hello"))]
        replay += [e for _, e in self.fleet.on_connect(hello.cluster_id, now)]
        self._enqueue(session.gen, replay)
        self._kick()
        try:
            with session.cancel_scope:
                while True:
                    msg = await stream.receive()
                    if self.stats is not None:
                        self.stats.received(msg)
                    self._handle(msg, session)
        except StreamClosed as exc:
            log.info("session closed cluster=%s: %s", session.cluster_id, exc.reason)
        finally:
            self._live.pop(session.gen, None)
            if self._sessions.get(session.cluster_id) is session:
                del self._sessions[session.cluster_id]
                self.fleet.on_disconnect(session.cluster_id, trio.current_time())
                self._pulse()
            if session.replaced:
                # Say why: a bare close reads "peer closed" on the agent, and two agents with
                # one cluster ID would kick each other off forever without knowing it.
                with trio.CancelScope(shield=True):
                    await close_with_status(stream, "ABORTED", replaced_message(session.cluster_id))
            await self._close(stream)

    def _handle(self, msg: Any, session: _Session) -> None:
        now = trio.current_time()
        val: Any
        try:
            kind, val = betterproto.which_one_of(msg, "payload")
        except Exception:
            log.warning("ignored a frame that is not an OperatorMessage: %r", type(msg).__name__)
            return
        cid = session.cluster_id
        effects: list[tuple[str, Effect]] = []
        if kind == "rollup":
            try:
                effects = [(cid, SendFrame(self.fleet.engine(cid).ack("rollup")))]
                effects += self.fleet.on_rollup(cid, val, now)
            except InvalidRollup as exc:
                log.warning("rollup rejected cluster=%s: %s (keeping the last good demand)",
                            cid, exc)
                return
        elif kind == "bootstrap_response":
            effects = self.fleet.on_bootstrap_response(cid, val, now)
        elif kind == "reclaim_ack":
            effects = self.fleet.on_reclaim_ack(cid, val, now)
        elif kind == "hello":
            log.warning("duplicate Hello ignored cluster=%s", cid)
        else:
            log.warning("unknown OperatorMessage payload %r ignored", kind)
        # frames of this session go to it even if a newer one for the cluster came meanwhile
        self._fx_send_all(session, effects)
        self._kick()

    def _fx_send_all(self, session: _Session, effects: list[tuple[str, Effect]]) -> None:
        for cluster_id, eff in effects:
            gen = session.gen if cluster_id == session.cluster_id else self._gen_of(cluster_id)
            self._fx_send.send_nowait((gen, eff))
        self._pulse()

    async def _adopt(self, cluster_id: str) -> None:
        """Read back the cluster's Nodes of this shard's machines (restart); best effort: an
        unreachable apiserver leaves the cluster with no bindings, as before, with one line."""
        if not isinstance(self.hooks, NodeLister):
            return
        try:
            with trio.fail_after(self.hook_timeout):
                nodes = await self.hooks.existing_nodes(cluster_id)
        except Exception as exc:  # a restart must not fail on the apiserver
            log.warning("could not list the Nodes of cluster=%s to rebuild bindings: %s; "
                        "machines bound before a restart are not known", cluster_id, exc)
            return
        adopted = self.fleet.adopt(cluster_id, nodes, trio.current_time())
        if adopted:
            log.info("rebuilt %d bindings of cluster=%s from its Nodes", len(adopted), cluster_id)

    async def _reject(self, stream: ShardStream, reason: str,
                      status: Status = Status.INVALID_ARGUMENT) -> NoReturn:
        log.error("session rejected: %s", reason)
        self.rejections.append(reason)
        self.fleet.primary.events.append(
            EngineEvent(time=trio.current_time(), kind="session_rejected",
                        fields={"reason": reason})
        )
        with trio.CancelScope(shield=True):
            await close_with_status(stream, status.name, reason)
        self._pulse()
        raise SessionRejected(reason, status)

    @staticmethod
    async def _close(stream: ShardStream) -> None:
        with trio.CancelScope(shield=True):
            try:
                await stream.aclose()
            except Exception:  # closing is best effort
                log.debug("stream close failed", exc_info=True)


def run_cli(port: int, kubeconfig: str | None) -> int:
    """``bigfleet-trio sim shard --port PORT [--kubeconfig PATH]`` (see :func:`.cli.run_cli`)."""
    from .cli import run_cli as _run_cli

    return _run_cli(port, kubeconfig)
