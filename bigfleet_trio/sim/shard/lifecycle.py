"""Machine lifecycle of the simulated shard: timed state steps, bootstrap pulls, reclaims, frames.

:class:`MachineLifecycle` is the part of :class:`~bigfleet_trio.sim.shard.engine.ShardEngine`
that moves one machine along Speculative -> Creating -> Idle (+ BootstrapRequest) -> Configuring
-> Configured and back through a reclaim (Draining -> Idle), each step one NodeStateUpdate, and
builds the frames the engine sends. Sans-IO like the engine (mixed into it; never used alone).
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from dataclasses import replace
from typing import Any

from bigfleet_trio.proto import pb

from .model import (
    Effect,
    EngineConfig,
    EngineEvent,
    Machine,
    MachineConfigured,
    MachineReleased,
    ReclaimRecord,
    SendFrame,
    State,
    grace_for_priority,
)

# The engine's logger (these lines were the engine's before the split; filters keep matching).
log = logging.getLogger("bigfleet_trio.sim.shard.engine")


class MachineLifecycle:
    """Lifecycle steps and frames over the engine's state (set by ``ShardEngine.__init__``)."""

    config: EngineConfig
    cluster_id: str
    released: int
    failed: int
    reclaims: list[ReclaimRecord]
    shortfalls: deque[EngineEvent]
    events: deque[EngineEvent]
    _bootstrap_seq: itertools.count[int]
    _reclaim_seq: itertools.count[int]
    _need_reqs: dict[str, list[pb.NodeSelectorRequirement]]
    _pulls: dict[str, Machine]

    def _step(self, m: Machine, now: float) -> list[Effect]:
        cfg = self.config
        if m.state == State.SPECULATIVE:
            return [self._set_state(m, State.CREATING, now, cfg.boot_delay)]
        if m.state == State.CREATING:
            out: list[Effect] = [self._set_state(m, State.IDLE, now, None)]
            return out + self._pull(m, now)
        if m.state == State.IDLE and m.bootstrap_request_id is not None:
            self._pulls.pop(m.bootstrap_request_id, None)
            m.bootstrap_request_id = None
            return self._fail(m, f"bootstrap: no response within {cfg.bootstrap_timeout:g}s", now)
        if m.state == State.CONFIGURING:
            out = [MachineConfigured(m.info())]
            out.append(self._set_state(m, State.CONFIGURED, now, None))
            return out
        if m.state == State.CONFIGURED and m.reclaim is not None:
            if m.reclaim.acked_at is None:
                self._event(now, "reclaim_reissued", machine=m.machine_id,
                            instruction_id=m.reclaim.instruction_id)
                m.due = now + cfg.reclaim_ack_timeout
                return [self._reclaim_frame(m)]
            # Idle (the machine taken, its Node deleted) no earlier than the grace window's
            # end: the grace period is the agent's time to drain (docs/deviations.md 13.5)
            window_end = m.reclaim.acked_at + m.reclaim.grace_seconds
            return [self._set_state(m, State.DRAINING, now,
                                    max(cfg.drain_step, window_end - now))]
        if m.state == State.DRAINING:
            frame = self._set_state(m, State.IDLE, now, None)
            info = m.info()
            self._event(now, "released", machine=m.machine_id, node=m.node_name)
            self.released += 1
            if m.reclaim is not None:
                self._record_reclaim(m, replace(m.reclaim, released_at=now))
            m.bound = False
            m.last_cluster, m.cluster = m.cluster, ""
            m.left_because = m.reclaim.reason if m.reclaim is not None else "surplus"
            m.need = None
            m.reclaim = None
            m.surplus_count = 0
            return [frame, MachineReleased(info)]
        log.warning("timer fired for machine %s in state %s with nothing to do",
                    m.machine_id, m.state.name)
        return []

    def _pull(self, m: Machine, now: float) -> list[Effect]:
        m.bootstrap_request_id = f"bootstrap-{next(self._bootstrap_seq):06d}"
        self._pulls[m.bootstrap_request_id] = m
        m.due = now + self.config.bootstrap_timeout
        self._event(now, "bootstrap_requested", machine=m.machine_id, node=m.node_name,
                    request_id=m.bootstrap_request_id)
        return [self._bootstrap_frame(m)]

    def _fail(self, m: Machine, error: str, now: float) -> list[Effect]:
        m.last_error = error
        self.failed += 1
        frame = self._set_state(m, State.FAILED, now, None)
        log.warning("machine failed machine=%s node=%s need=%s error=%s",
                    m.machine_id, m.node_name, m.need, error)
        ev = self._event(now, "shortfall", machine=m.machine_id, node=m.node_name, need=m.need,
                         reason=error)
        self.shortfalls.append(ev)
        # The machine exists (it was created); it goes back to the pool, warm.
        m.bound = False
        m.last_cluster, m.cluster = m.cluster, ""
        m.left_because = "failed"
        m.need = None
        m.state = State(State.IDLE)
        m.due = None
        m.surplus_count = 0
        return [frame]

    def _set_state(self, m: Machine, new_state: pb.MachineState | int, now: float,
                   delay: float | None) -> SendFrame:
        old = m.state
        state = State(new_state)
        m.state = state
        m.due = None if delay is None else now + delay
        if state != State.FAILED:
            m.last_error = ""
        self._event(now, "machine_state", machine=m.machine_id, node=m.node_name,
                    old=old.name, new=state.name, need=m.need)
        log.info("machine state machine=%s node=%s %s -> %s", m.machine_id, m.node_name,
                 old.name, state.name)
        return self._nsu(m)

    # ---------------------------------------------------------------- frames

    def _nsu(self, m: Machine) -> SendFrame:
        return SendFrame(pb.ShardMessage(node_state_update=pb.NodeStateUpdate(
            supersedes_key=f"node:{m.machine_id}",
            machine_id=m.machine_id,
            cluster_id=self.cluster_id,
            state=m.state,
            node_name=m.node_name,
            provider_id=m.provider_id,
            last_error=m.last_error,
            labels=dict(m.labels),
            resources=pb.Resources(resources=dict(m.shape.allocatable)),
            taints=[pb.Taint(key=t.key, value=t.value, effect=t.effect) for t in m.shape.taints],
        )))

    def _bootstrap_frame(self, m: Machine) -> SendFrame:
        reqs = self._need_reqs.get(m.need or "", [])
        return SendFrame(pb.ShardMessage(bootstrap_request=pb.BootstrapRequest(
            request_id=m.bootstrap_request_id or "",
            requirements=[pb.NodeSelectorRequirement(key=r.key, operator=r.operator,
                                                     values=list(r.values)) for r in reqs],
            cluster_id=self.cluster_id,
        )))

    def _reclaim_frame(self, m: Machine) -> SendFrame:
        assert m.reclaim is not None
        return SendFrame(pb.ShardMessage(reclaim_instruction=pb.ReclaimInstruction(
            instruction_id=m.reclaim.instruction_id,
            nodes=[m.node_name],
            grace_period_seconds=m.reclaim.grace_seconds,
            preemptor_priority=m.reclaim.preemptor_priority,
        )))

    def _issue_reclaim(self, m: Machine, now: float, *, reason: str = "surplus",
                       preemptor_priority: int = 0, for_need: str = "") -> list[Effect]:
        grace = (self.config.reclaim_grace_seconds
                 if self.config.reclaim_grace_seconds is not None
                 else grace_for_priority(m.priority))
        rec = ReclaimRecord(
            instruction_id=f"{self.config.instruction_prefix}-{next(self._reclaim_seq):06d}",
            machine_id=m.machine_id,
            node_name=m.node_name,
            grace_seconds=grace,
            issued_at=now,
            binding=m.binding,
            cluster_id=self.cluster_id,
            reason=reason,
            preemptor_priority=preemptor_priority,
            for_need=for_need,
        )
        m.reclaim = rec
        m.due = now + self.config.reclaim_ack_timeout
        self.reclaims.append(rec)
        self._event(now, "reclaim_issued", machine=m.machine_id, node=m.node_name,
                    instruction_id=rec.instruction_id, grace_seconds=grace, reason=reason,
                    cluster=self.cluster_id)
        log.info("reclaim issued instruction=%s machine=%s node=%s grace=%ss",
                 rec.instruction_id, m.machine_id, m.node_name, grace)
        return [self._reclaim_frame(m)]

    def _record_reclaim(self, m: Machine, rec: ReclaimRecord) -> None:
        """Store an updated record (acked, released) on the machine and in the issue-order list."""
        m.reclaim = rec
        self.reclaims = [rec if r.instruction_id == rec.instruction_id else r
                         for r in self.reclaims]

    # ---------------------------------------------------------------- log

    def _event(self, now: float, kind: str, **fields: Any) -> EngineEvent:
        ev = EngineEvent(time=now, kind=kind, fields=fields)
        self.events.append(ev)
        return ev
