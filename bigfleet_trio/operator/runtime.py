"""The operator's composition root: :func:`build_operator` returns the :class:`OperatorParts`.

:class:`~bigfleet_trio.operator.app.Operator` calls :func:`build_operator` at the start of each
:meth:`~bigfleet_trio.operator.app.Operator.run` (informers, roll-up source, drains,
acknowledger, retention, handlers, agent: one plain function, every part given what it needs,
the handlers the informer stores they read) and reads :class:`OperatorStatistics` from the
parts; the bootstrap renderer it hands the handlers is wrapped in a :class:`WatchedRenderer`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.informer import Informer, Store, drop_managed_fields
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, NODES, UPCOMING_NODES
from bigfleet_trio.observability import events as kinds
from bigfleet_trio.observability import metrics
from bigfleet_trio.observability.events import EventFeed
from bigfleet_trio.operator.acknowledge import Acknowledger
from bigfleet_trio.operator.agent import Agent, SessionChange, SessionChangeHook
from bigfleet_trio.operator.available import AvailableCapacityHandler
from bigfleet_trio.operator.bootstrap import (
    BootstrapHandler,
    FileRenderer,
    Renderer,
    Requirement,
    make_renderer,
)
from bigfleet_trio.operator.crview import slim
from bigfleet_trio.operator.kubeevents import EventRecorder
from bigfleet_trio.operator.outcomes import OutcomeWriter
from bigfleet_trio.operator.reclaim.drain import DrainManager
from bigfleet_trio.operator.reclaim.handler import ReclaimHandler
from bigfleet_trio.operator.retention import FailedRetention
from bigfleet_trio.operator.upcoming.handler import UpcomingNodeHandler
from bigfleet_trio.operator.upcoming.plan import DrainMemory, converges_back
from bigfleet_trio.operator.wiring import (
    CapacityRequestRollup,
    OperatorHandlers,
    node_ref_index,
    provider_id_index,
    slim_node,
)

if TYPE_CHECKING:  # the binary's settings compose this package's own: no runtime import
    from bigfleet_trio.config import OperatorConfig
    from bigfleet_trio.shard.transport import Connector

__all__ = [
    "NODE_REF_INDEX",
    "PROVIDER_ID_INDEX",
    "OperatorParts",
    "OperatorStatistics",
    "WatchedRenderer",
    "build_operator",
    "by_index",
    "cached",
    "renderer_for",
    "session_change_publisher",
]

NODE_REF_INDEX = "nodeRef"
"""Index name of the UpcomingNode informer: Node name -> UpcomingNodes pointing at it."""
PROVIDER_ID_INDEX = "providerID"
"""Index name of the Node informer: ``spec.providerID`` -> Nodes (reclaim by machine id)."""


@dataclass
class OperatorStatistics:
    """Snapshot from :meth:`Operator.statistics` (the demo's progress view, debugging).

    Attributes:
        running: :meth:`Operator.run` is past start-up (informers synced).
        informers_synced: plural -> synced.
        session_up: a shard session is established (Hello sent).
        sessions / reconnects: shard sessions opened / ended.
        last_session_error: why the last session ended ("" before any).
        rollups_built: roll-ups handed to the session.
        rollups_sent: roll-up frames written to the stream (older unsent ones are replaced).
        needs_last_rollup: CapacityNeeds in the last roll-up (None before the first).
        crs_contributing / crs_excluded: CapacityRequests in / left out of the aggregate.
        crs_acknowledged / ack_failures: Pending -> Acknowledged patches done / failed.
        drains_active: nodes draining now.
        drains_completed / drains_failed / drains_abandoned: finished drains by outcome
            (cumulative over this run's DrainManager).
        frames_in / frames_out: shard frames received / sent.
        handler_errors: inbound handlers that raised.
        outbox_dropped: responses dropped because the outbox was full.
    """

    running: bool = False
    informers_synced: dict[str, bool] = field(default_factory=dict)
    session_up: bool = False
    sessions: int = 0
    reconnects: int = 0
    last_session_error: str = ""
    rollups_built: int = 0
    rollups_sent: int = 0
    needs_last_rollup: int | None = None
    crs_contributing: int = 0
    crs_excluded: int = 0
    crs_acknowledged: int = 0
    ack_failures: int = 0
    drains_active: int = 0
    drains_completed: int = 0
    drains_failed: int = 0
    drains_abandoned: int = 0
    frames_in: int = 0
    frames_out: int = 0
    handler_errors: int = 0
    outbox_dropped: int = 0


def renderer_for(cfg: OperatorConfig) -> Renderer:
    """The bootstrap renderer ``cfg`` names: template text, else template file, else the stub."""
    if cfg.bootstrap_template is not None:
        return FileRenderer(
            cfg.bootstrap_template, name=cfg.bootstrap_template_file or "<bootstrap template>"
        )
    return make_renderer(cfg.bootstrap_template_file)


class WatchedRenderer:
    """A renderer that counts its failures and remembers whether the last render failed.

    The start-up test render catches templates that can never render, but a template may
    still fail on some requests (a filter on an unexpected value); each failure only becomes a
    shortfall on the shard, so it is counted here and ``/readyz`` reports it until a render
    succeeds again.
    """

    def __init__(self, inner: Renderer) -> None:
        self.inner = inner
        self.failures = 0
        self.last_error = ""

    def render(
        self, cluster_id: str, request_id: str, requirements: Sequence[Requirement]
    ) -> bytes:
        try:
            data = self.inner.render(cluster_id, request_id, requirements)
        except Exception as exc:
            self.failures += 1
            self.last_error = " ".join(str(exc).split()) or type(exc).__name__
            metrics.BOOTSTRAP_RENDER_FAILURES.inc()
            raise
        self.last_error = ""
        return data


def by_index(store: Store, index: str, value: str) -> list[dict[str, Any]]:
    """The cached objects whose ``index`` maps to ``value`` (an informer index lookup)."""
    return list(store.by_index(index, value))


def cached(store: Store, name: str) -> dict[str, Any] | None:
    """The cluster-scoped object ``name`` from an informer cache, or None."""
    obj = store.get(name)
    return obj if isinstance(obj, dict) else None


def session_change_publisher(feed: EventFeed | None) -> SessionChangeHook:
    """The agent's hook: ``session_up`` / ``session_down`` feed events (the agent logs each)."""

    def publish(change: SessionChange) -> None:
        if feed is None:
            return
        if change.up:
            feed.publish(kinds.SESSION_UP, cluster=change.cluster_id)
        else:
            feed.publish(
                kinds.SESSION_DOWN, cluster=change.cluster_id, error=change.error,
                retry_in=change.retry_in, uptime=change.uptime,
            )

    return publish


@dataclass
class OperatorParts:
    """Everything one :meth:`~bigfleet_trio.operator.app.Operator.run` owns (rebuilt per run,
    e.g. per leadership term); :func:`build_operator` makes it."""

    memory: DrainMemory
    kube_events: EventRecorder
    drains: DrainManager
    acknowledger: Acknowledger
    source: CapacityRequestRollup
    cr_informer: Informer
    un_informer: Informer
    node_informer: Informer
    retention: FailedRetention
    outcomes: OutcomeWriter
    handlers: OperatorHandlers
    agent: Agent

    @property
    def informers(self) -> tuple[Informer, Informer, Informer]:
        """The three informers, in start order (CapacityRequests, UpcomingNodes, Nodes)."""
        return (self.cr_informer, self.un_informer, self.node_informer)


def _upcoming_deleted(upcoming: UpcomingNodeHandler, memory: DrainMemory, agent: Agent,
                      obj: Any) -> None:
    """controller-runtime's ``Owns()``: an UpcomingNode deleted by someone else while its
    machine is live is reconciled again from the machine's latest frame; the ones the operator
    deletes itself (at Drained, Failed retention) stay gone (:func:`~.upcoming.plan.
    converges_back`; docs/rules.md#level-triggered-operator)."""
    name = converges_back(obj, memory)
    machine_id = upcoming.machine_of.get(name) if name is not None else None
    if machine_id is not None and agent.session is not None:
        agent.session.requeue_machine(machine_id)


def build_operator(
    cfg: OperatorConfig,
    *,
    client: KubeClient,
    connector: Connector,
    renderer: WatchedRenderer,
    feed: EventFeed | None = None,
    consistency_interval: float,
    wall_clock: Callable[[], datetime],
    freeze_heap: bool = False,
) -> OperatorParts:
    """Build one run's parts from ``cfg`` (validated) and the process's client and connector.

    The handlers read the informer caches directly: reclaim finds UpcomingNodes by
    ``status.nodeRef.name`` and Nodes by ``spec.providerID``, NodeStateUpdates plan from the
    cached UpcomingNode (docs/architecture.md#operator-tasks-and-nurseries).
    """
    memory = DrainMemory()
    kube_events = EventRecorder(client)
    drains = DrainManager(
        client, memory, shutdown_timeout=cfg.drain_shutdown_timeout, events=kube_events,
        feed=feed, disruption_annotations=cfg.disruption_annotations, wall_clock=wall_clock,
    )
    acknowledger = Acknowledger(client, concurrency=cfg.ack_concurrency or 16, feed=feed)
    source = CapacityRequestRollup(
        cfg.cluster_id, events=client, acknowledger=acknowledger, feed=feed,
        consistency_interval=consistency_interval,
    )
    # freeze_heap: the caches stay out of the collector's full passes
    # (docs/kube-api.md#garbage-collector)
    wl, fz = cfg.watch_list, freeze_heap
    cr_informer = Informer(client, CAPACITY_REQUESTS, transform=slim, watch_list=wl,
                           freeze_heap=fz)
    source.attach(cr_informer)
    un_informer = Informer(client, UPCOMING_NODES, transform=drop_managed_fields,
                           indexers={NODE_REF_INDEX: node_ref_index}, watch_list=wl,
                           freeze_heap=fz)
    node_informer = Informer(
        client, NODES, transform=slim_node, indexers={PROVIDER_ID_INDEX: provider_id_index},
        watch_list=wl, freeze_heap=fz, protobuf=True,  # slim_node: schema fields only
    )
    upcoming = UpcomingNodeHandler(
        client, memory, get_cached=partial(cached, un_informer.store), feed=feed,
        events=kube_events,
    )
    upcoming.attach(un_informer)  # the overlay lives only as long as the watch lags
    handlers = OperatorHandlers(
        bootstrap=BootstrapHandler(renderer, cfg.cluster_id, ttl_seconds=int(cfg.bootstrap_ttl)),
        reclaim=ReclaimHandler(
            client, drains, memory,
            upcoming_lookup=partial(by_index, un_informer.store, NODE_REF_INDEX),
            node_lookup=partial(by_index, node_informer.store, PROVIDER_ID_INDEX),
            node_get=partial(cached, node_informer.store),
            upcoming_get=partial(cached, un_informer.store),
            events=kube_events, wall_clock=wall_clock,
        ),
        upcoming=upcoming,
        available=(available := AvailableCapacityHandler(client, events=kube_events)),
        feed=feed,
    )
    agent = Agent(connector, source, handlers, cfg.agent_config(),
                  on_session_change=session_change_publisher(feed))
    un_informer.add_handler(on_delete=partial(_upcoming_deleted, upcoming, memory, agent))
    return OperatorParts(
        memory=memory,
        kube_events=kube_events,
        drains=drains,
        acknowledger=acknowledger,
        source=source,
        cr_informer=cr_informer,
        un_informer=un_informer,
        node_informer=node_informer,
        retention=FailedRetention(
            client, un_informer.store.list, retention=cfg.failed_retention,
            cluster=cfg.cluster_id,
        ),
        outcomes=OutcomeWriter(
            client, crs=cr_informer.store.list, upcoming=un_informer.store.list,
            offers=available.offers, events=kube_events, wait=cfg.outcome_wait,
            now=wall_clock,
        ),
        handlers=handlers,
        agent=agent,
    )
