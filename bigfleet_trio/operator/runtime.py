"""What one operator run is made of: the components :class:`OperatorRuntime` builds per run.

:class:`~bigfleet_trio.operator.app.Operator` builds an :class:`OperatorRuntime` at the start of
each :meth:`~bigfleet_trio.operator.app.Operator.run` (informers, roll-up source, drains,
acknowledger, retention, handlers, agent) and reads :class:`OperatorStatistics` from it; the
bootstrap renderer it hands the handlers is wrapped in a :class:`WatchedRenderer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bigfleet_trio.kube.informer import Informer
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, NODES, UPCOMING_NODES
from bigfleet_trio.observability import metrics
from bigfleet_trio.operator.acknowledge import Acknowledger
from bigfleet_trio.operator.agent import Agent
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
from bigfleet_trio.operator.reclaim.drain import DrainManager
from bigfleet_trio.operator.reclaim.handler import ReclaimHandler
from bigfleet_trio.operator.retention import FailedRetention
from bigfleet_trio.operator.upcoming.handler import UpcomingNodeHandler
from bigfleet_trio.operator.upcoming.plan import DrainMemory
from bigfleet_trio.operator.wiring import (
    CapacityRequestRollup,
    OperatorHandlers,
    node_ref_index,
    provider_id_index,
    slim_node,
)

if TYPE_CHECKING:  # the binary's settings compose this package's own: no runtime import
    from bigfleet_trio.config import OperatorConfig
    from bigfleet_trio.operator.app import Operator

__all__ = [
    "NODE_REF_INDEX",
    "PROVIDER_ID_INDEX",
    "OperatorRuntime",
    "OperatorStatistics",
    "WatchedRenderer",
    "renderer_for",
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


class OperatorRuntime:
    """Everything one :meth:`Operator.run` owns (rebuilt per run, e.g. per leadership term)."""

    def __init__(self, op: Operator) -> None:
        cfg = op.cfg
        client = op.client
        self.memory = DrainMemory()
        self.kube_events = EventRecorder(client)
        self.drains = DrainManager(
            client, self.memory, shutdown_timeout=cfg.drain_shutdown_timeout,
            events=self.kube_events, feed=op.feed,
        )
        self.acknowledger = Acknowledger(
            client, concurrency=cfg.ack_concurrency or 16, feed=op.feed
        )
        self.source = CapacityRequestRollup(
            cfg.cluster_id,
            events=client,
            acknowledger=self.acknowledger,
            feed=op.feed,
            consistency_interval=op.consistency_interval,
        )
        self.cr_informer = Informer(client, CAPACITY_REQUESTS, transform=slim)
        self.source.attach(self.cr_informer)
        self.un_informer = Informer(
            client, UPCOMING_NODES, indexers={NODE_REF_INDEX: node_ref_index}
        )
        self.node_informer = Informer(
            client, NODES, transform=slim_node, indexers={PROVIDER_ID_INDEX: provider_id_index}
        )
        self.informers = (self.cr_informer, self.un_informer, self.node_informer)
        self.retention = FailedRetention(
            client, self.un_informer.store.list, retention=cfg.failed_retention,
            cluster=cfg.cluster_id,
        )
        self.handlers = OperatorHandlers(
            bootstrap=BootstrapHandler(
                op.watched_renderer, cfg.cluster_id, ttl_seconds=int(cfg.bootstrap_ttl)
            ),
            reclaim=ReclaimHandler(
                client,
                self.drains,
                self.memory,
                upcoming_lookup=op.upcoming_for_node,
                node_lookup=op.nodes_for_provider_id,
                events=self.kube_events,
                wall_clock=op.wall_clock,
            ),
            upcoming=UpcomingNodeHandler(
                client, self.memory, get_cached=op.cached_upcoming, feed=op.feed
            ),
            available=AvailableCapacityHandler(client),
            feed=op.feed,
        )
        self.agent = Agent(
            op.connector,
            self.source,
            self.handlers,
            cfg.agent_config(),
            on_session_change=op._on_session_change,
        )
