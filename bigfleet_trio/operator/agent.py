"""The reconnect loop around shard sessions (``Operator.Run`` in the Go reference).

One outbound stream per cluster (docs/reference.md#session-and-reconnect): connect, run a
:class:`~bigfleet_trio.operator.session.core.Session`, back off, repeat. The backoff doubles from
0.5 s to 30 s with subtractive jitter and resets after a healthy session (:class:`Backoff`;
docs/deviations.md#1-session-stream-and-reconnect-operatoragentpy-session-shard).
Every transition goes to the optional ``on_session_change`` hook as a :class:`SessionChange`
and is one log line.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

import trio

from bigfleet_trio.knobs import DURATION, Settings, knob, nested, positive
from bigfleet_trio.kube.retry import Backoff as RetryBackoff
from bigfleet_trio.observability import metrics
from bigfleet_trio.operator.session.core import Session
from bigfleet_trio.operator.session.types import (
    Handlers,
    RollupSource,
    SessionConfig,
    SessionStats,
)
from bigfleet_trio.shard.transport import Connector, StreamClosed

log = logging.getLogger(__name__)


class Backoff:
    """The reconnect rule as an adapter over :class:`bigfleet_trio.kube.retry.Backoff`.

    After every session end or failed connect the agent waits ``base * (1 - jitter * U[0,1))``
    seconds; ``base`` starts at ``initial`` and doubles after each wait up to ``maximum``:
    nominal 0.5, 1, 2, 4, 8, 16, 30, 30 ... Jitter only shortens a wait, so the cap is never
    exceeded and reconnecting agents spread out. If the session that just ended had been
    established for at least ``healthy_after`` seconds, ``base`` first resets to ``initial``: a
    shard restart after a long healthy session is met with a quick reconnect, while a flapping
    shard (sessions dying young) still sees the growing backoff. The Go reference never resets
    (docs/reference.md#backoff-never-resets).

    The delay arithmetic is the package's one rule (``jitter_mode="down"``, no clock-based
    reset); this adapter adds the agent's reset condition, which depends on the last session's
    uptime rather than on the time since the last failure.

    Args:
        initial: first nominal wait, seconds (> 0).
        maximum: cap of the nominal wait, seconds (>= initial).
        jitter: fraction in [0, 1); each wait is ``base * (1 - jitter * rng.random())``.
        healthy_after: a session up at least this long resets the nominal wait to ``initial``.
        rng: random source (inject a seeded ``random.Random`` in tests).

    Raises:
        ValueError: a parameter out of range.
    """

    def __init__(
        self,
        initial: float = 0.5,
        maximum: float = 30.0,
        jitter: float = 0.2,
        healthy_after: float = 60.0,
        rng: random.Random | None = None,
    ) -> None:
        self.policy = RetryBackoff(
            initial,
            factor=2.0,
            cap=maximum,
            jitter=jitter,
            jitter_mode="down",
            reset_after=None,
            rng=(rng or random.Random()).random,
        )
        self.healthy_after = healthy_after

    def next_delay(self, uptime: float | None) -> float:
        """Wait before the next connect attempt.

        Args:
            uptime: seconds the last session was established, or None if it never was.

        Returns:
            Seconds to sleep, in ``(base * (1 - jitter), base]``.
        """
        if uptime is not None and uptime >= self.healthy_after:
            self.policy.reset()
        return self.policy.next_delay()


@dataclass(init=False, eq=True)
class AgentConfig(Settings):
    """The reconnect loop's settings plus the per-session :class:`SessionConfig`; its knobs are
    the operator's ``reconnect`` and ``shard session`` flags.

    Attributes:
        session: the per-session settings (cluster_id, rollup_interval, ...).
        initial_backoff / max_backoff / backoff_jitter / healthy_after: see :class:`Backoff`.
    """

    session: SessionConfig = nested(SessionConfig, title="shard session")
    initial_backoff: float = knob(0.5, "first redial delay", flag="--reconnect-initial-backoff",
                                  unit=DURATION, check=positive)
    max_backoff: float = knob(30.0, "redial delay cap", flag="--reconnect-max-backoff",
                              unit=DURATION, check=positive)
    backoff_jitter: float = 0.2
    healthy_after: float = 60.0

    def __init__(self, session: SessionConfig | None = None, **values: object) -> None:
        super().__init__(**values)
        if session is not None:
            self.session = session


@dataclass(frozen=True)
class SessionChange:
    """One session transition, for :attr:`Agent.on_session_change` hooks.

    Attributes:
        up: True when a session was just established (Hello sent), False when one ended, a
            connect failed, or the agent stopped.
        cluster_id: the agent's cluster.
        error: why it went down (``"stream closed: peer closed"``, ``"stream closed: send
            stalled: ..."``, ``"operator stopping"``); "" when up.
        retry_in: seconds until the next connect attempt (the backoff delay); None when up or
            when the agent is stopping.
        uptime: seconds the ended session had been established; None when up or when it never
            was (failed connect, Hello not sent).
    """

    up: bool
    cluster_id: str
    error: str = ""
    retry_in: float | None = None
    uptime: float | None = None


SessionChangeHook = Callable[[SessionChange], None]


@dataclass
class AgentState:
    """Snapshot for /readyz and debugging."""

    session_up: bool
    stats: SessionStats
    last_error: str = ""


class Agent:
    """Keeps one shard session alive: connect, run a :class:`Session`, back off, repeat.

    Args:
        connector: opens one stream per session (grpclib:
            :class:`bigfleet_trio.shard.grpc.GrpcConnector`; tests:
            :class:`bigfleet_trio.shard.transport.MemoryConnector`).
        source: the :class:`RollupSource`.
        handlers: the :class:`Handlers`.
        config: :class:`AgentConfig`.
        rng: random source for the backoff jitter.
        on_session_change: called (synchronously, in the agent task) with a
            :class:`SessionChange` when a session is established (Hello sent), after every
            session end or failed connect, and once when the agent is cancelled with a session
            up (``retry_in`` None); must not block. An exception it raises is logged and
            ignored. The operator publishes these as ``session_up`` / ``session_down`` events.

    Attributes:
        session_up: True while a session is established (Hello sent) -- the /readyz signal.
        stats: cumulative :class:`SessionStats` (frames in/out, drops, reconnects, ...).
        session: the running :class:`Session`, or None between sessions.
        last_error: why the last session ended ("" before the first end).
    """

    def __init__(
        self,
        connector: Connector,
        source: RollupSource,
        handlers: Handlers,
        config: AgentConfig,
        *,
        rng: random.Random | None = None,
        on_session_change: SessionChangeHook | None = None,
    ) -> None:
        # The operator's settings nest a SessionConfig without cluster_id and fill it from
        # --cluster-id (OperatorConfig.agent_config); an agent must never say Hello without one.
        if not config.session.cluster_id:
            raise ValueError("AgentConfig.session.cluster_id is required")
        self.config = config
        self.on_session_change = on_session_change
        self.stats = SessionStats()
        self.session_up = False
        self.session: Session | None = None
        self.last_error = ""
        self._replaced_in_a_row = 0
        self._connector = connector
        self._source = source
        self._handlers = handlers
        self._backoff = Backoff(
            config.initial_backoff,
            config.max_backoff,
            config.backoff_jitter,
            config.healthy_after,
            rng,
        )

    def state(self) -> AgentState:
        """A snapshot of :attr:`session_up`, :attr:`stats` and :attr:`last_error`."""
        return AgentState(self.session_up, self.stats, self.last_error)

    async def run(self) -> None:
        """Run sessions forever; returns only by cancellation (then no task is left running).

        With the grpclib connector, call this inside ``async with trio_asyncio.open_loop():``
        (or :func:`bigfleet_trio.shard.grpc.open_loop`) so every session shares one asyncio loop.

        An explicit loop rather than tenacity: a session never "succeeds" (every return is a
        reason to reconnect), and the next wait depends on the last session's uptime, not on an
        attempt counter. Only ``Exception`` is caught, so ``trio.Cancelled`` is never retried.
        """
        cluster = self.config.session.cluster_id
        while True:
            established_at: float | None = None

            def on_established() -> None:
                nonlocal established_at
                established_at = trio.current_time()
                self.session_up = True
                metrics.SESSION_UP.set(1)
                self.stats.sessions += 1
                self._notify(SessionChange(True, cluster))

            try:
                async with self._connector.connect() as stream:
                    session = Session(
                        stream, self.config.session, self._source, self._handlers, self.stats
                    )
                    self.session = session
                    await session.run(on_established)
            except Exception as exc:  # noqa: BLE001 - every failure means "reconnect"
                self.last_error = _describe(exc)
                reason = close_reason(exc, established=established_at is not None)
                metrics.SESSION_CLOSES.labels(reason).inc()
                self._replaced_in_a_row = self._replaced_in_a_row + 1 if reason == "aborted" else 0
            except BaseException:  # cancelled: the operator is stopping (or lost the lease)
                if established_at is not None:
                    up_for = trio.current_time() - established_at
                    log.info("shard session closed cluster=%s uptime=%.1fs: operator stopping",
                             cluster, up_for)
                    self._notify(SessionChange(False, cluster, "operator stopping", None, up_for))
                raise
            finally:
                self.session = None
                self.session_up = False
                metrics.SESSION_UP.set(0)
            uptime = None if established_at is None else trio.current_time() - established_at
            delay = self._backoff.next_delay(uptime)
            self.stats.reconnects += 1
            metrics.SESSION_RECONNECTS.inc()
            log.warning(
                "shard session ended cluster=%s uptime=%s error=%s; reconnecting in %.3fs",
                cluster, "never" if uptime is None else f"{uptime:.1f}s", self.last_error, delay,
            )
            self._notify(SessionChange(False, cluster, self.last_error, delay, uptime))
            if self._replaced_in_a_row >= REPLACED_IN_A_ROW:
                log.error(
                    "shard session for cluster=%s was replaced %d times in a row: another agent "
                    "with the same --cluster-id is connected to the shard; give each cluster "
                    "its own id, or run replicas with --leader-elect so only one holds the "
                    "session", cluster, self._replaced_in_a_row,
                    extra={"cluster": cluster, "replaced": self._replaced_in_a_row})
            await trio.sleep(delay)

    def _notify(self, change: SessionChange) -> None:
        if self.on_session_change is None:
            return
        try:
            self.on_session_change(change)
        except Exception:
            log.exception("session-change hook failed cluster=%s up=%s", change.cluster_id,
                          change.up)


REPLACED_IN_A_ROW = 3
"""Sessions ended in a row by the shard with ABORTED (replaced by a newer session for the
same cluster ID) before the agent says, at ERROR, that another agent uses this cluster ID."""


def close_reason(exc: BaseException, *, established: bool) -> str:
    """The ``reason`` label of a session end: the shard's gRPC status in lower case when it
    sent one (``aborted``), else ``peer_closed``, ``connect_failed`` or ``error``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, StreamClosed):
        if exc.grpc_status:
            return exc.grpc_status.lower()
        return "peer_closed" if established else "connect_failed"
    if isinstance(exc, OSError):
        return "connect_failed"
    return "error"


def _describe(exc: BaseException) -> str:
    """One-line reason, unwrapping single-exception groups from the session nursery."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, StreamClosed):
        return f"stream closed: {exc.reason}"
    return f"{type(exc).__name__}: {exc}"
