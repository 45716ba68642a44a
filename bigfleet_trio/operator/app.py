"""The operator process: informers, the shard session, operator-owned drains, diagnostics.

:class:`Operator` runs the parts :func:`~.runtime.build_operator` composes for one run (task tree
at :meth:`Operator.run`) and answers readiness and statistics from them;
:func:`serve_operator` / :func:`run_operator` are the ``bigfleet-trio operator`` process around
it: kubeconfig, KubeClient with qps/burst, the grpclib connector (TLS when configured) in one
trio-asyncio loop, the diagnostics listener(s), optional Lease leader election (only the leader
runs :meth:`Operator.run`, hence holds the shard session and writes the cluster) and
SIGINT/SIGTERM: the stream closes at once, running drains may finish for up to
``--drain-shutdown-timeout``, then the process exits with no task left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import uuid
from collections.abc import AsyncIterable, Awaitable, Callable
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig, load_kubeconfig
from bigfleet_trio.kube.leader import LeaderElector, lease_client, lease_namespace
from bigfleet_trio.kube.startup import REACH_BUDGET, check_reachable, sync_or_refused
from bigfleet_trio.observability import events as kinds
from bigfleet_trio.observability import stdmetrics
from bigfleet_trio.observability.events import EventFeed
from bigfleet_trio.observability.looplag import watch_loop_lag
from bigfleet_trio.operator.agent import Agent
from bigfleet_trio.operator.bootstrap import Renderer
from bigfleet_trio.operator.reclaim.drain import DrainManager
from bigfleet_trio.operator.reclaim.resume import apply_resume, plan_resume, utc_now
from bigfleet_trio.operator.runtime import (
    OperatorParts,
    OperatorStatistics,
    WatchedRenderer,
    build_operator,
    renderer_for,
)
from bigfleet_trio.operator.wiring import DEFAULT_CONSISTENCY_INTERVAL, CapacityRequestRollup
from bigfleet_trio.shard.transport import Connector

__all__ = ["Operator", "run_operator", "serve_operator"]

if TYPE_CHECKING:  # the binary's settings compose this package's own: no runtime import
    from bigfleet_trio.config import OperatorConfig

log = logging.getLogger(__name__)

class Operator:
    """The composed operator (one cluster, one shard session at a time).

    Args:
        cfg: validated :class:`OperatorConfig` (cluster_id, rollup_interval, ack/dispatch
            concurrency, bootstrap template/TTL, reconnect backoff, drain_shutdown_timeout).
        client: an open :class:`KubeClient` (owned by the caller).
        connector: opens shard streams (:class:`~bigfleet_trio.shard.grpc.GrpcConnector`, or
            :class:`~bigfleet_trio.shard.transport.MemoryConnector` in tests and the demo).
        feed: optional :class:`EventFeed` for the ``/events`` WebSocket.
        renderer: bootstrap renderer; None builds it from ``cfg`` (template text or file, else
            the stub).
        consistency_interval: seconds between from-scratch checks of the roll-up aggregate.
        wall_clock: the wall clock (aware) of recorded drain deadlines (tests inject one).
        freeze_heap: the informers keep their caches out of the garbage collector's full
            passes (docs/kube-api.md#garbage-collector; the binary sets it, tests do not).

    Raises:
        BootstrapTemplateError: the configured template does not parse (stop start-up).
    """

    def __init__(
        self,
        cfg: OperatorConfig,
        *,
        client: KubeClient,
        connector: Connector,
        feed: EventFeed | None = None,
        renderer: Renderer | None = None,
        consistency_interval: float = DEFAULT_CONSISTENCY_INTERVAL,
        wall_clock: Callable[[], datetime] = utc_now,
        freeze_heap: bool = False,
    ) -> None:
        if not cfg.cluster_id:
            raise ValueError("OperatorConfig.cluster_id is required")
        self.cfg = cfg
        self.client = client
        self.connector = connector
        self.feed = feed
        self.renderer = renderer if renderer is not None else renderer_for(cfg)
        self.watched_renderer = WatchedRenderer(self.renderer)
        self.consistency_interval = consistency_interval
        self.wall_clock = wall_clock
        self.freeze_heap = freeze_heap
        self._rt: OperatorParts | None = None
        self._running = False
        self._synced = False

    # ------------------------------------------------------------------ views
    @property
    def parts(self) -> OperatorParts | None:
        """Components of the current (or last) run: informers, agent, drains, source..."""
        return self._rt

    @property
    def agent(self) -> Agent | None:
        """The reconnect loop of the current run."""
        return self._rt.agent if self._rt is not None else None

    @property
    def drains(self) -> DrainManager | None:
        """The operator-owned DrainManager of the current run."""
        return self._rt.drains if self._rt is not None else None

    @property
    def rollup(self) -> CapacityRequestRollup | None:
        """The RollupSource of the current run."""
        return self._rt.source if self._rt is not None else None

    def ready(self) -> tuple[bool, list[str]]:
        """Readiness for ``/readyz``: informers synced AND a shard session up.

        Returns:
            ``(True, [what is up])`` or ``(False, [reasons])``.
        """
        rt = self._rt
        if rt is None or not self._running:
            return False, ["operator not running"]
        # a resource not served (a CRD deleted while running) makes the cache stale even
        # though it once synced (docs/crds.md#missing-crds)
        reasons = [p for p in (inf.problem() for inf in rt.informers) if p]
        if not rt.agent.session_up:
            why = f": {rt.agent.last_error}" if rt.agent.last_error else ""
            reasons.append(f"shard session not established{why}")
        if self.watched_renderer.last_error:
            reasons.append(
                f"bootstrap template render failing ({self.watched_renderer.failures} "
                f"failures): {self.watched_renderer.last_error}"
            )
        if reasons:
            return False, reasons
        return True, ["informers synced", "shard session up"]

    def statistics(self) -> OperatorStatistics:
        """A snapshot of counters across the components (see :class:`OperatorStatistics`)."""
        rt = self._rt
        if rt is None:
            return OperatorStatistics()
        src = rt.source.statistics()
        st = rt.agent.stats
        pending_rollup = 1 if rt.agent.session is not None and rt.agent.session.queues.rollup else 0
        return OperatorStatistics(
            running=self._synced and self._running,
            informers_synced={inf.res.plural: inf.synced for inf in rt.informers},
            session_up=rt.agent.session_up,
            sessions=st.sessions,
            reconnects=st.reconnects,
            last_session_error=rt.agent.last_error,
            rollups_built=st.rollups_built,
            rollups_sent=max(0, st.rollups_built - st.rollups_replaced - pending_rollup),
            needs_last_rollup=src.needs_last_rollup,
            crs_contributing=src.crs_contributing,
            crs_excluded=src.crs_excluded,
            crs_acknowledged=rt.acknowledger.acknowledged_total,
            ack_failures=rt.acknowledger.failed_total,
            drains_active=len(rt.drains.active),
            drains_completed=rt.drains.completed_total,
            drains_failed=rt.drains.failed_total,
            drains_abandoned=rt.drains.abandoned_total,
            frames_in=st.frames_in,
            frames_out=st.frames_out,
            handler_errors=st.handler_errors,
            outbox_dropped=st.outbox_dropped,
        )

    def _publish(self, kind: str, **fields: Any) -> None:
        if self.feed is not None:
            self.feed.publish(kind, **fields)

    # ------------------------------------------------------------------ the task
    def abandon(self) -> None:
        """Leadership lost: the drains stop now and no queued Event is flushed, so nothing
        this replica does outlives the cancellation that follows (docs/rules.md#leadership-loss).
        A no-op when not running. Never blocks."""
        rt = self._rt if self._running else None
        if rt is not None:
            rt.drains.abandon()
            rt.kube_events.abandon()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; ``task_status.started()`` once the informers are synced.

        Task tree (one nursery)::

            CapacityRequestRollup.run   exclusion Events, periodic consistency check
            Informer CapacityRequests   slim view -> RollupAggregator (incremental)
            Informer UpcomingNodes      indexed by status.nodeRef.name (NodeStateUpdates plan
                                        from it instead of a GET per frame)
            Informer Nodes              slim view, indexed by spec.providerID
                ... all three synced before ANY cluster write or roll-up: a roll-up is a full
                replacement, so one built from a half-listed cache would withdraw real demand
            EventRecorder.run           Kubernetes Events of reclaims, written in order
            DrainManager.run            operator-owned: a reconnect never cancels a drain;
                                        first resumes the Draining UpcomingNodes of the cache
            Acknowledger.run            Pending -> Acknowledged, never delays a tick
            FailedRetention.run         deletes long-Failed UpcomingNodes (from the cache)
            OutcomeWriter.run           CR conditions + Pod Events, a bounded pass per period
            Agent.run                   reconnect loop; one Session nursery per stream

        On cancellation the shard stream closes at once; running drains continue for up to
        ``cfg.drain_shutdown_timeout`` seconds (shielded inside the DrainManager); then every
        task has ended.

        Raises:
            RuntimeError: the operator is already running.
            SyncTimeout: the informer caches did not sync within ``cfg.sync_timeout`` seconds
                (nothing was written and the shard was never dialled).
            Unauthenticated: (a SyncTimeout) the apiserver answered 401 before they synced;
                raised at the first 401, not at the deadline.
        """
        if self._running:
            raise RuntimeError("Operator.run is already running")
        self._running = True
        self._synced = False
        rt = self._rt = self.build()
        cluster = self.cfg.cluster_id
        # A 401 from before this run (an earlier leadership term, a token since rotated) says
        # nothing about the credentials now; only one that arrives during this run fails it.
        stale_401 = self.client.unauthorized is not None
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(rt.source.run)
                for inf in rt.informers:
                    await nursery.start(inf.run)
                log.info("operator: waiting for informers to sync",
                         extra={"cluster": cluster, "timeout_s": self.cfg.sync_timeout})
                await self._wait_synced(rt, stale_401=stale_401)
                self._synced = True
                log.info(
                    "operator: informers synced",
                    extra={"cluster": cluster, "capacityrequests": len(rt.cr_informer.store),
                           "upcomingnodes": len(rt.un_informer.store),
                           "nodes": len(rt.node_informer.store)},
                )
                await nursery.start(rt.kube_events.run)
                await nursery.start(rt.drains.run)
                # before the agent: a re-issued instruction then finds the drain running
                # (docs/rules.md#reclaim-resume-after-restart)
                resumed = apply_resume(
                    rt.drains, plan_resume(rt.un_informer.store.list(), self.wall_clock())
                )
                if resumed:
                    log.info("operator: drains resumed", extra={"cluster": cluster,
                                                                "drains": resumed})
                await nursery.start(rt.acknowledger.run)
                await nursery.start(rt.retention.run)
                await nursery.start(rt.outcomes.run)
                self._publish(kinds.OPERATOR_STARTED, cluster=cluster)
                task_status.started()
                await rt.agent.run()
        finally:
            self._running = False
            self._synced = False
            log.info("operator: stopped", extra={"cluster": cluster})
            self._publish(kinds.OPERATOR_STOPPED, cluster=cluster)

    def build(self) -> OperatorParts:
        """A fresh set of parts for one run (:func:`~.runtime.build_operator`)."""
        return build_operator(
            self.cfg, client=self.client, connector=self.connector,
            renderer=self.watched_renderer, feed=self.feed,
            consistency_interval=self.consistency_interval, wall_clock=self.wall_clock,
            freeze_heap=self.freeze_heap,
        )

    async def _wait_synced(self, rt: OperatorParts, *, stale_401: bool) -> None:
        """Return once every informer synced; raise at the deadline or at the first 401.

        Raises:
            SyncTimeout: ``cfg.sync_timeout`` passed with an informer unsynced.
            Unauthenticated: the client's first 401 arrived during this run (``stale_401``:
                it had one before the run started, so only the deadline applies).
        """
        failed = await sync_or_refused(
            rt.informers, self.cfg.sync_timeout, self.client, stale_401=stale_401
        )
        if failed is not None:
            raise failed


# ---------------------------------------------------------------------- the process
def _identity() -> str:
    """Leader-election identity: ``$POD_NAME`` or the host name, plus a random suffix."""
    base = os.environ.get("POD_NAME") or socket.gethostname() or "bigfleet-operator"
    return f"{base}_{uuid.uuid4()}"


def not_leader_reason(elector: LeaderElector) -> str:
    """The /readyz reason of a standby: who leads, and the Lease error that needs a fix."""
    why = f"; {elector.last_error}" if elector.last_error else ""
    return f"not the leader (leader: {elector.leader or 'unknown'}{why})"


def _grpc_connector(cfg: OperatorConfig) -> Connector:
    from bigfleet_trio.shard.grpc import GrpcConnector, parse_address
    from bigfleet_trio.shard.tls import TLSFiles

    host, port = parse_address(cfg.shard_addr)
    tls = TLSFiles(
        ca=cfg.tls_ca or None,
        cert=cfg.tls_cert or None,
        key=cfg.tls_key or None,
        server_name=cfg.tls_server_name or None,
    )
    return GrpcConnector(host, port, tls=tls, keepalive_time=cfg.keepalive_time or None,
                         keepalive_timeout=cfg.keepalive_timeout)


async def _watch_signals(
    signals: Any, stop: Callable[[], None], everything: trio.CancelScope, grace: float
) -> None:
    first = True
    async for signum in signals:
        name = signal.Signals(signum).name
        if first:
            first = False
            log.info(
                "operator: %s received; closing the shard stream, letting drains finish "
                "(up to %gs)", name, grace, extra={"signal": name, "grace_s": grace},
            )
            stop()
        else:
            log.warning("operator: %s received again; stopping now", name,
                        extra={"signal": name})
            everything.cancel()


async def _supervise(
    nursery: trio.Nursery,
    work: Callable[[], Awaitable[object]],
    elector: LeaderElector | None,
    signals: AsyncIterable[int] | None,
    grace: float,
) -> None:
    """Run ``work`` (as the leader when ``elector`` is given) until it returns or a signal
    stops it; a second signal cancels ``nursery`` (everything).

    Args:
        nursery: the process nursery; the signal watcher runs in it.
        work: the operator's run (``Operator.run``).
        elector: the Lease elector (``--leader-elect``), or None.
        signals: SIGINT/SIGTERM numbers as they arrive, or None (no signal handling).
        grace: seconds drains may go on after the first signal (for the log line).
    """
    with trio.CancelScope() as scope:
        # With a Lease, the signal cancels the work and not the elector: renewals go on while
        # the drains finish (up to ``grace``), so no other replica takes over and starts the
        # same drains while this one still evicts (docs/rules.md#leader-hand-over-on-sigterm).
        stop = scope.cancel if elector is None else elector.step_down
        if signals is not None:
            nursery.start_soon(_watch_signals, signals, stop, nursery.cancel_scope, grace)
        if elector is not None:
            await elector.run(work)
        else:
            await work()


async def _start_diagnostics(
    nursery: trio.Nursery,
    cfg: OperatorConfig,
    reviews: KubeClient | None,
    readiness: Callable[[], tuple[bool, list[str]]],
    events: EventFeed,
) -> list[str | None]:
    """Start the diagnostics listener (and the separate probe listener if configured) in
    ``nursery``; returns their bound addresses (metrics first; None for a disabled one).
    ``reviews``: the review client (:func:`~bigfleet_trio.kube.authz.review_client`) with
    ``--metrics-auth``."""
    from bigfleet_trio.kube.authz import KubeAuthorizer
    from bigfleet_trio.observability.http import separate_probe_listener, serve_observability
    from bigfleet_trio.observability.metrics import BinaryRegistry
    from bigfleet_trio.observability.tls import serving_certificate

    auth = KubeAuthorizer(reviews) if reviews is not None else None
    tls = serving_certificate(cfg.metrics_tls(), cfg.metrics_addr)
    bound = [
        await nursery.start(
            partial(serve_observability, cfg.metrics_addr, readiness=readiness, feed=events,
                    registry=BinaryRegistry("operator"), auth=auth, tls=tls,
                    profiling=cfg.enable_profiling)
        )
    ]
    probe = cfg.health_probe_addr
    if probe is not None and separate_probe_listener(probe, cfg.metrics_addr):
        bound.append(
            await nursery.start(
                partial(serve_observability, probe, readiness=readiness, probes_only=True)
            )
        )
    return bound


async def serve_operator(
    cfg: OperatorConfig,
    *,
    kube_config: KubeConfig | None = None,
    connector: Connector | None = None,
    renderer: Renderer | None = None,
    feed: EventFeed | None = None,
    handle_signals: bool = True,
    on_operator: Callable[[Operator], None] | None = None,
    freeze_heap: bool = False,
    task_status: trio.TaskStatus[list[str | None]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The operator process body (everything :func:`run_operator` does inside ``trio.run``).

    Returns after SIGINT/SIGTERM (when ``handle_signals``) or raises; cancel it to stop.
    ``task_status.started(bound)`` fires once the diagnostics listener(s) are up, with their
    bound ``"host:port"`` addresses (metrics first, then the probe listener if separate; None
    for a disabled listener).

    Args:
        cfg: validated config.
        kube_config: parsed kubeconfig (default: ``load_kubeconfig(cfg.kubeconfig)``).
        connector: shard connector (default: grpclib to ``cfg.shard_addr`` with TLS if set).
        renderer: bootstrap renderer (default: from ``cfg``).
        feed: event feed for ``/events`` (default: a new one).
        handle_signals: install SIGINT/SIGTERM handling (main thread only).
        on_operator: called with the :class:`Operator` once built (tests, embedding).
        freeze_heap: keep the caches out of the garbage collector's full passes (the process
            entry point sets it; docs/kube-api.md#garbage-collector).

    Raises:
        KubeConfigError, TLSConfigError, BootstrapTemplateError, ValueError: bad configuration.
        OSError: a diagnostics address cannot be bound.
    """
    from bigfleet_trio.kube.authz import review_client
    from bigfleet_trio.shard.bridge import open_loop

    kcfg = kube_config if kube_config is not None else load_kubeconfig(cfg.kubeconfig)
    conn = connector if connector is not None else _grpc_connector(cfg)
    rend = renderer if renderer is not None else renderer_for(cfg)
    events = feed if feed is not None else EventFeed()
    with contextlib.ExitStack() as stack:
        sigs: Any = (
            stack.enter_context(trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM))
            if handle_signals
            else None
        )
        async with open_loop(), contextlib.AsyncExitStack() as clients:
            client = await clients.enter_async_context(
                KubeClient(kcfg, qps=cfg.qps, burst=cfg.burst, protobuf=cfg.kube_protobuf))
            op = Operator(cfg, client=client, connector=conn, feed=events, renderer=rend,
                          freeze_heap=freeze_heap)
            if on_operator is not None:
                on_operator(op)
            lease_ns, lease_ns_source = lease_namespace(cfg.leader_election_namespace)
            # Renewals on a client of their own (docs/rules.md#leadership-loss).
            elector = (
                LeaderElector(
                    await clients.enter_async_context(lease_client(kcfg)),
                    name=cfg.leader_election_id,
                    namespace=lease_ns,
                    identity=_identity(),
                    lease_duration=cfg.leader_elect_lease_duration,
                    renew_deadline=cfg.leader_elect_renew_deadline,
                    retry_period=cfg.leader_elect_retry_period,
                )
                if cfg.leader_elect
                else None
            )
            reviews = (await clients.enter_async_context(review_client(kcfg))
                       if cfg.metrics_auth else None)

            if elector is None:
                stdmetrics.acting_alone(cfg.leader_election_id)  # docs/operate.md#bigfleetnoleader
            else:
                elector.on_lost(op.abandon)

            def readiness() -> tuple[bool, list[str]]:
                if elector is not None and not elector.is_leader:
                    return False, [not_leader_reason(elector)]
                ok, detail = op.ready()
                # "leader" only when there is a lease to lead (--leader-elect)
                return ok, (["leader", *detail] if ok and elector is not None else detail)

            async with trio.open_nursery() as nursery:
                # Runs until the nursery is cancelled, like the diagnostics listeners.
                await nursery.start(watch_loop_lag)
                task_status.started(
                    await _start_diagnostics(nursery, cfg, reviews, readiness, events)
                )
                if elector is not None:
                    log.info(
                        "operator: campaigning for leadership",
                        extra={"cluster": cfg.cluster_id,
                               "lease": f"{lease_ns}/{cfg.leader_election_id}",
                               "lease_namespace_from": lease_ns_source,
                               "identity": elector.identity},
                    )
                await _supervise(nursery, op.run, elector, sigs, cfg.drain_shutdown_timeout)
                nursery.cancel_scope.cancel()
    events.close()
    log.info("operator: exited", extra={"cluster": cfg.cluster_id})


def run_operator(cfg: OperatorConfig) -> int:
    """``bigfleet-trio operator``: run until SIGINT/SIGTERM, then exit with no task left.

    Args:
        cfg: validated :class:`OperatorConfig` (the CLI calls ``cfg.validate()`` first).

    Returns:
        0 after an orderly shutdown.

    Raises:
        KubeConfigError / TLSConfigError / BootstrapTemplateError / ValueError / OSError /
            SyncTimeout: start-up problems (unwrapped from Trio's exception groups; an
            apiserver that takes no connection is :class:`~bigfleet_trio.kube.startup.Unreachable`
            within about 30 s); the CLI prints ``operator: <message>`` and exits 1.
    """
    from bigfleet_trio.observability.logs import setup_logging
    from bigfleet_trio.process import announce, run_trio

    setup_logging(cfg.log_format, cfg.log_level)
    # Fail fast, before any task starts: bad kubeconfig, TLS files, address, template.
    kcfg = load_kubeconfig(cfg.kubeconfig)
    connector = _grpc_connector(cfg)
    renderer = renderer_for(cfg)
    announce("operator")  # after the start-up checks: a failed one stays a single line

    async def main() -> None:
        # a dead apiserver ends the start in ~30 s, not --sync-timeout (docs/operate.md)
        await check_reachable(kcfg, budget=min(REACH_BUDGET, cfg.sync_timeout))
        await serve_operator(cfg, kube_config=kcfg, connector=connector, renderer=renderer,
                             freeze_heap=True)

    run_trio(main)
    return 0
