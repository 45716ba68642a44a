"""The session's frame router: each downlink frame to the worker pool by its kind's route.

:class:`FrameRouter` is one part of a :class:`~bigfleet_trio.operator.session.core.Session`: it
counts the frame, looks its kind up in the route table
(:data:`~bigfleet_trio.operator.session.types.ROUTES`), refuses frames carrying enum values this
build does not know (``docs/wire.md#unknown-enum-values``), and hands the rest to the
:class:`~bigfleet_trio.operator.session.work.WorkerPool`. Nothing here knows a frame kind by name.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import betterproto
import trio

from bigfleet_trio.observability import metrics
from bigfleet_trio.operator.session.send import SendSide
from bigfleet_trio.operator.session.types import Dispatch, Route, SessionConfig, SessionStats
from bigfleet_trio.operator.session.work import WorkerPool
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.codec import NodeStateFrame
from bigfleet_trio.shard.enums import REPORTER, UnknownEnum, describe, unknown_enum_values

__all__ = ["FrameRouter"]

log = logging.getLogger(__name__)

_NODE_STATE = "node_state_update"  # the kind a deferred NodeStateFrame stands for


class FrameRouter:
    """Routes downlink frames by kind (see the module docstring).

    Args:
        routes: kind -> :class:`Route`.
        work: the session's :class:`WorkerPool`.
        send: the session's :class:`SendSide` (error answers to refused requests).
        config: the session's :class:`SessionConfig`.
        stats: the session's counters (shared).
    """

    def __init__(
        self,
        routes: Mapping[str, Route],
        work: WorkerPool,
        send: SendSide,
        config: SessionConfig,
        stats: SessionStats,
    ) -> None:
        self._routes = routes
        self._work = work
        self._send = send
        self.config = config
        self.stats = stats
        self._frames_in = {k: metrics.FRAMES.labels("in", k) for k in [*routes, "unknown"]}

    async def dispatch(self, msg: pb.ShardMessage | NodeStateFrame, nursery: trio.Nursery) -> None:
        """Route one frame; waits only when the worker pool applies backpressure."""
        self.stats.frames_in += 1
        value: Any
        if isinstance(msg, NodeStateFrame):
            kind, value = _NODE_STATE, msg
        else:
            kind, value = betterproto.which_one_of(msg, "payload")
        route = self._routes.get(kind)
        if route is None:
            self._frames_in["unknown"].inc()
            log.warning("unknown ShardMessage payload ignored cluster=%s",
                        self.config.cluster_id)
            return
        self._frames_in[kind].inc()
        unknown = unknown_enum_values(kind, value)
        if unknown:
            self._refuse_unknown_enums(kind, route, value, unknown)
            return
        await self._work.submit(kind, route, value, nursery)

    def _refuse_unknown_enums(
        self, kind: str, route: Route, value: Any, unknown: list[UnknownEnum]
    ) -> None:
        """A frame carrying enum values this build does not know never reaches its handler.

        Mapping an unknown value to a known one would write a wrong phase or availability
        (docs/wire.md#unknown-enum-values); the frame is skipped instead, and the shard's next
        frame for the same key supersedes it. A request that waits for an answer
        (BootstrapRequest) is answered with an error so the shard falls back at once instead
        of waiting out its deadline.
        """
        self.stats.unknown_enum_frames += 1
        if route.dispatch is Dispatch.ANSWER:
            REPORTER.report(kind, unknown, "answered with an error")
            answer = pb.BootstrapBlobResponse(
                request_id=value.request_id,
                error=f"operator: unknown enum values: {describe(unknown)}",
            )
            self._send.enqueue_bootstrap(pb.OperatorMessage(bootstrap_response=answer),
                                         trio.current_time())
        else:
            REPORTER.report(kind, unknown, "frame skipped")
