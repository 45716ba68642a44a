"""Sans-IO engine of the simulated shard: inventory, demand planning, machine lifecycle, reclaim.

It behaves like a real shard where the agent can tell: state replayed on reconnect, NodeStateUpdates
with ``supersedes_key = "node:<machine_id>"``, one ReclaimInstruction per machine with a
priority-scaled grace, AvailableCapacity with a confidence ladder and cost sent only on change, a
bootstrap pull with a one-cycle deadline (an error becomes a shortfall).

The engine never does I/O and never reads a clock: every method takes ``now`` (seconds, any
monotonic origin) and returns a list of :data:`Effect` (frames to send, node hooks to call).
:meth:`ShardEngine.next_deadline` says when :meth:`ShardEngine.advance` must be called next.
Everything is deterministic for a given catalog, config (``seed``) and input sequence.

Planning, on every accepted roll-up (the roll-up is the cluster's complete desired state):

1. Needs are planned in priority order (highest first, then roll-up order).
2. A machine *can serve* a need when its labels satisfy every requirement
   (In / NotIn / Exists / DoesNotExist per Kubernetes node-affinity semantics; Same = the key
   exists) and its allocatable holds ``min_unit`` in every dimension. For Same requirements all
   machines serving the need must share one value of the key (one domain is chosen per need).
3. Supply = machines already bound to the cluster and not being reclaimed (Configured and
   Configuring ones, and those still provisioning, so that a roll-up arriving mid-provisioning does
   not over-provision). A need first takes its own machines (sticky), then other unclaimed ones
   (each time running before still being created, then the zone holding fewest of the need's
   machines), until what they hold covers ``aggregate_resources`` in every dimension (and at
   least one machine, since Pods without requests still need a node); a machine holds whole
   Pods of the need's ``min_unit`` (``planning.whole_pods``), not its whole allocatable.
4. The deficit is bootstrapped from the free pool: cheapest price first, then the spread domain
   (and zone, spread or not) with the fewest of the need's machines, then already-created (Idle)
   before Speculative, then inventory (catalog) order. When the pool has nothing that fits, the
   need records a shortfall.
   A Same need that holds machines in a domain grows there only (short when it cannot); a new
   one takes the domain with the most room for it, then existing supply, then the cheapest free
   machine, then the value; the first domain that can hold the whole need wins (else the best
   one, short). Why: docs/rules.md#roll-up-same.
5. Bound machines no need took are surplus: Configured ones are reclaimed (one
   ReclaimInstruction per machine, naming its Kubernetes node); provisioning ones finish and are
   reclaimed by a later roll-up if still surplus.

Lifecycle of a bound machine (each step one NodeStateUpdate):
Speculative -(create_delay)-> Creating -(boot_delay)-> Idle + BootstrapRequest
-(response)-> Configuring -(configure_delay)-> Configured [hook on_machine_configured];
a bootstrap error or no response within ``bootstrap_timeout`` -> Failed (machine back to the
pool, need short). Reclaim: instruction -(ack)-> wait ``drain_wait`` -> Draining -(drain_step)->
Idle [hook on_machine_released], machine back to the pool.

Parts: :mod:`.model` (config, effects, machines), :mod:`.matching` (requirements),
:mod:`.planning` (steps 2-4, pure), :mod:`.lifecycle` (the steps above and the frames).
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import replace
from fractions import Fraction

from bigfleet_trio.proto import pb

from ._quantity import parse_resources
from .catalog import LABEL_HOSTNAME, LABEL_INSTANCE_TYPE, LABEL_ZONE, Catalog, MachineShape
from .lifecycle import MachineLifecycle
from .matching import (
    labels_match,
    need_key,
    profile_fingerprint,
    req_tuple,
    requirement_matches,
    same_keys,
    same_satisfied,
)
from .model import (
    GRACE_LADDER,
    GRACE_TOP,
    Confidence,
    Effect,
    EngineConfig,
    EngineEvent,
    InvalidRollup,
    Machine,
    MachineConfigured,
    MachineInfo,
    MachineReleased,
    NeedStatus,
    Op,
    ReclaimRecord,
    SendFrame,
    State,
    build_inventory,
    grace_for_priority,
)
from .planning import SUPPLY_RANK, fill, plan_need, serves_memo

__all__ = [
    "GRACE_LADDER", "GRACE_TOP", "Effect", "EngineConfig", "EngineEvent", "InvalidRollup",
    "Machine", "MachineConfigured", "MachineInfo", "MachineReleased", "NeedStatus",
    "ReclaimRecord", "SendFrame", "ShardEngine", "grace_for_priority", "labels_match",
    "need_key", "profile_fingerprint", "requirement_matches", "same_keys", "same_satisfied",
]

log = logging.getLogger(__name__)


class ShardEngine(MachineLifecycle):
    """The simulated shard's state machine for one cluster (see the module docstring).

    Args:
        catalog: the machine shapes and counts of the inventory.
        config: timing and policy knobs.

    Public state (read-only): ``machines`` (all, catalog order), ``cluster_id`` (from the last
    Hello), ``last_rollup`` (last accepted ClusterCapacityNeeds), ``needs`` (list of
    :class:`NeedStatus` of that roll-up), ``reclaims`` (every :class:`ReclaimRecord`, issue order),
    ``shortfalls`` and ``events`` (bounded logs of :class:`EngineEvent`).
    """

    def __init__(self, catalog: Catalog, config: EngineConfig | None = None, *,
                 pool: list[Machine] | None = None, cluster_id: str = "") -> None:
        self.catalog = catalog
        self.config = config or EngineConfig()
        self.cluster_id = cluster_id
        # A fleet member (pool given) shares the inventory with the other clusters' engines and
        # owns only the machines bound to its cluster (docs/rules.md#simulated-fleet).
        self._fleet = pool is not None
        self.last_rollup: pb.ClusterCapacityNeeds | None = None
        self.rollups_accepted = 0
        self.rollups_rejected = 0
        self.released = 0
        self.binds = 0  # bindings started (a machine bound again counts again)
        self.failed = 0  # bindings ended by a failure (bootstrap error or timeout)
        self.needs: list[NeedStatus] = []
        self.reclaims: list[ReclaimRecord] = []
        self.shortfalls: deque[EngineEvent] = deque(maxlen=1000)
        self.events: deque[EngineEvent] = deque(maxlen=5000)
        self._short_needs: set[str] = set()
        self._seq = itertools.count(1)
        self._bootstrap_seq = itertools.count(1)
        self._reclaim_seq = itertools.count(1)
        self._ac_sent: dict[str, tuple[int, int, float]] = {}
        self._ac_last: dict[str, float] = {}
        self._ac_due: float | None = None
        self._need_reqs: dict[str, list[pb.NodeSelectorRequirement]] = {}
        self._parsed: list[tuple[pb.CapacityNeed, dict[str, Fraction], dict[str, Fraction]]] = []
        self.machines: list[Machine] = (
            pool if pool is not None else build_inventory(catalog, self.config.seed))
        self._by_id = {m.machine_id: m for m in self.machines}
        self._by_shape: dict[str, list[Machine]] = {}
        for m in self.machines:
            self._by_shape.setdefault(m.shape.key, []).append(m)
        # indexes so a fleet-sized inventory answers responses and acks without a scan
        self._pulls: dict[str, Machine] = {}

    # ---------------------------------------------------------------- views

    def machine(self, machine_id: str) -> Machine | None:
        """The machine with this id, or None."""
        return self._by_id.get(machine_id)

    def owns(self, m: Machine) -> bool:
        """``m`` is bound to this engine's cluster (alone: bound at all)."""
        return m.bound and (not self._fleet or m.cluster == self.cluster_id)

    def bound_machines(self) -> list[Machine]:
        """Machines bound to the cluster, catalog order."""
        return [m for m in self.machines if self.owns(m)]

    def machines_by_state(self) -> dict[str, int]:
        """Counts of bound machines per state name (``"CONFIGURED"``…) plus ``"FREE"`` (pool)."""
        out: Counter[str] = Counter()
        for m in self.machines:
            if self.owns(m):
                out[m.state.name or str(int(m.state))] += 1
            elif m.free:
                out["FREE"] += 1
        return dict(sorted(out.items()))

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`advance` has work to do, or None."""
        dues = [m.due for m in self.machines if m.due is not None and self.owns(m)]
        if self._ac_due is not None:
            dues.append(self._ac_due)
        return min(dues) if dues else None

    # ---------------------------------------------------------------- inputs

    def on_connect(self, cluster_id: str, now: float) -> list[Effect]:
        """A session with a valid Hello started: replay state (ADR-0057).

        Returns the current NodeStateUpdate of every bound machine, the still-pending
        BootstrapRequests and unacknowledged ReclaimInstructions (same ids), and a fresh
        AvailableCapacityUpdate per shape (the change cache resets on reconnect).
        The caller sends the ``Ack{echo:"hello"}`` first.
        """
        if self.cluster_id and cluster_id != self.cluster_id:
            if self._fleet:
                raise ValueError(f"engine of cluster {self.cluster_id!r} got {cluster_id!r}")
            self._event(now, "cluster_changed", old=self.cluster_id, new=cluster_id)
        self.cluster_id = cluster_id
        self._event(now, "connected", cluster=cluster_id)
        out: list[Effect] = []
        for m in self.bound_machines():
            out.append(self._nsu(m))
            if m.bootstrap_request_id is not None and m.state == State.IDLE:
                out.append(self._bootstrap_frame(m))
            if m.reclaim is not None and m.reclaim.acked_at is None:
                out.append(self._reclaim_frame(m))
        self._ac_sent.clear()
        self._ac_last.clear()
        self._ac_due = None
        out += self._available(now)
        return out

    def on_disconnect(self, now: float) -> None:
        """The session ended. Machines keep progressing; frames produced meanwhile are dropped."""
        self._event(now, "disconnected", cluster=self.cluster_id)

    def ack(self, echo: str) -> pb.ShardMessage:
        """An Acknowledgement frame carrying the configured term and epoch."""
        return pb.ShardMessage(
            ack=pb.Acknowledgement(
                echo=echo,
                coordinator_term=self.config.coordinator_term,
                shard_epoch=self.config.shard_epoch,
            )
        )

    def on_rollup(self, rollup: pb.ClusterCapacityNeeds, now: float) -> list[Effect]:
        """Plan a roll-up (complete desired state). See the module docstring for the policy.

        Raises:
            InvalidRollup: a quantity in ``aggregate_resources``/``min_unit`` does not parse or a
                penalty bucket is outside 0..27; nothing changes.
        """
        parsed: list[tuple[pb.CapacityNeed, dict[str, Fraction], dict[str, Fraction]]] = []
        for i, need in enumerate(rollup.needs):
            try:
                agg = parse_resources(need.aggregate_resources)
                unit = parse_resources(need.min_unit)
            except ValueError as exc:
                self.rollups_rejected += 1
                self._event(now, "rollup_rejected", need=i, reason=str(exc))
                raise InvalidRollup(f"need {i}: {exc}") from None
            for name, bucket in (("interruption", need.interruption_penalty_bucket),
                                 ("reclamation", need.reclamation_penalty_bucket)):
                if not 0 <= int(bucket) <= 27:
                    self.rollups_rejected += 1
                    reason = f"need {i}: {name} penalty bucket {int(bucket)} outside 0..27"
                    self._event(now, "rollup_rejected", need=i, reason=reason)
                    raise InvalidRollup(reason)
            parsed.append((need, agg, unit))
        if rollup.cluster_id and self.cluster_id and rollup.cluster_id != self.cluster_id:
            log.warning("rollup cluster_id %r differs from the session's %r; using the session's",
                        rollup.cluster_id, self.cluster_id)
        self.last_rollup = rollup
        self.rollups_accepted += 1
        self._parsed = parsed
        return self._plan(parsed, now)

    def replan(self, now: float) -> list[Effect]:
        """Plan the last accepted roll-up again (the fleet calls it when machines came back to
        the pool and this cluster is short); nothing before the first roll-up."""
        if self.last_rollup is None:
            return []
        return self._plan(self._parsed, now)

    def short_priority(self) -> int | None:
        """The highest priority among the short needs of the last plan, or None."""
        return max((n.priority for n in self.needs if n.short), default=None)

    def adopt(self, nodes: Iterable[tuple[str, str]], now: float) -> list[str]:
        """Rebuild bindings from the cluster's Nodes after a restart: every free machine whose
        ``(node_name, provider_id)`` is among ``nodes`` is bound Configured to this cluster, as
        it was before (its next roll-up keeps it or reclaims it). Called before
        :meth:`on_connect`, so the agent hears CONFIGURED, never an Idle machine it holds Ready.
        Nodes of no machine here are left alone. Returns the adopted machine ids.
        """
        wanted = dict(nodes)
        adopted: list[str] = []
        for m in self.machines:
            if not m.free or wanted.get(m.node_name) != m.provider_id:
                continue
            m.bound = True
            m.cluster = self.cluster_id
            m.binding += 1
            m.state = State(State.CONFIGURED)
            m.due = None
            m.seq = next(self._seq)
            m.need = None
            adopted.append(m.machine_id)
            self._event(now, "adopted", machine=m.machine_id, node=m.node_name,
                        cluster=self.cluster_id)
        return adopted

    def preempt(self, m: Machine, now: float, preemptor_priority: int,
                for_need: str = "") -> list[Effect]:
        """Reclaim ``m`` (Configured, bound here) for higher-priority demand elsewhere
        (``for_need``: ``<cluster>/<need key>``); the instruction carries the preemptor's
        priority.

        Raises:
            ValueError: ``m`` is not a Configured machine of this cluster without a reclaim.
        """
        if not self.owns(m) or m.reclaim is not None or m.state != State.CONFIGURED:
            raise ValueError(f"machine {m.machine_id} cannot be preempted from {self.cluster_id}")
        m.need = None
        return self._issue_reclaim(m, now, reason="preempted",
                                   preemptor_priority=preemptor_priority, for_need=for_need)

    def on_bootstrap_response(self, resp: pb.BootstrapBlobResponse, now: float) -> list[Effect]:
        """The agent answered a BootstrapRequest.

        A non-empty ``error`` fails the machine (NodeStateUpdate FAILED with last_error, machine
        back to the pool, shortfall logged). A response nobody waits for (late, unknown id) is
        dropped with a log line. Otherwise the machine goes Configuring.
        """
        m = self._pulls.get(resp.request_id) if resp.request_id else None
        if m is not None and not (m.bootstrap_request_id == resp.request_id and m.bound
                                  and m.state == State.IDLE):
            m = None
        if m is None or not resp.request_id:
            log.info("bootstrap response dropped: no pull waits for request_id=%r", resp.request_id)
            self._event(now, "bootstrap_response_dropped", request_id=resp.request_id)
            return []
        m.bootstrap_request_id = None
        self._pulls.pop(resp.request_id, None)
        if resp.error:
            out = self._fail(m, f"bootstrap: {resp.error}", now)
            return out + self._available(now)
        self._event(now, "bootstrap_ok", machine=m.machine_id, node=m.node_name,
                    request_id=resp.request_id, user_data_bytes=len(resp.user_data),
                    ttl_seconds=resp.ttl_seconds)
        out = [self._set_state(m, State.CONFIGURING, now, self.config.configure_delay)]
        return out + self._available(now)

    def on_reclaim_ack(self, ack: pb.ReclaimAck, now: float) -> list[Effect]:
        """The agent cordoned the node and started the drain: wait ``drain_wait``, then Draining."""
        m = next(
            (x for x in self.machines
             if x.reclaim is not None and x.reclaim.instruction_id == ack.instruction_id
             and self.owns(x)),
            None,
        )
        if m is None or m.reclaim is None:
            log.info("reclaim ack dropped: unknown instruction_id=%r", ack.instruction_id)
            self._event(now, "reclaim_ack_dropped", instruction_id=ack.instruction_id)
            return []
        if m.reclaim.acked_at is not None:
            log.info("duplicate reclaim ack instruction_id=%s", ack.instruction_id)
            return []
        rec = replace(m.reclaim, acked_at=now, nodes_started=ack.nodes_started)
        self._record_reclaim(m, rec)
        m.due = now + self.config.drain_wait
        self._event(now, "reclaim_acked", machine=m.machine_id, node=m.node_name,
                    instruction_id=rec.instruction_id, nodes_started=ack.nodes_started)
        return []

    def advance(self, now: float) -> list[Effect]:
        """Fire every timer due at or before ``now`` (in due-time order) and return the effects."""
        out: list[Effect] = []
        while True:
            due = [m for m in self.machines
                   if m.due is not None and m.due <= now and self.owns(m)]
            if not due:
                break
            due.sort(key=lambda m: (m.due, m.seq, m.machine_id))
            # Fire them in order; a step that sets a new timer due by now (a zero delay) is
            # picked up by the next round, after the timers that were already due.
            for m in due:
                if m.due is None or m.due > now:
                    continue
                m.due = None
                out += self._step(m, now)
        if self._ac_due is not None and self._ac_due <= now:
            self._ac_due = None
        out += self._available(now)
        return out

    # ---------------------------------------------------------------- planning

    def _plan(
        self,
        parsed: list[tuple[pb.CapacityNeed, dict[str, Fraction], dict[str, Fraction]]],
        now: float,
    ) -> list[Effect]:
        order = sorted(range(len(parsed)), key=lambda i: (-parsed[i][0].priority, i))
        supply = [m for m in self.machines
                  if self.owns(m) and m.reclaim is None and m.state in SUPPLY_RANK]
        claimed: set[str] = set()
        pool = [m for m in self.machines if m.free]
        pool_lanes: dict[str, list[list[Machine]]] = {}
        for m in pool:  # per shape: Idle machines, then the others, each by inventory index
            lanes = pool_lanes.setdefault(m.shape.key, [[], []])
            lanes[0 if m.state == State.IDLE else 1].append(m)
        for key_, lanes in list(pool_lanes.items()):
            pool_lanes[key_] = [lane for lane in lanes if lane]
        by_need: dict[str, list[Machine]] = {}
        for m in supply:
            if m.need is not None:
                by_need.setdefault(m.need, []).append(m)
        used_pool: set[str] = set()
        statuses: dict[int, NeedStatus] = {}
        need_reqs: dict[str, list[pb.NodeSelectorRequirement]] = {}
        out: list[Effect] = []
        seen_keys: set[str] = set()
        for i in order:
            need, agg, unit = parsed[i]
            key = need_key(need)
            if key in seen_keys:  # an operator never sends this; keep keys unique anyway
                key = f"{key}#{i}"
            seen_keys.add(key)
            need_reqs[key] = list(need.requirements)
            serves = serves_memo(need, unit)
            plan = None
            if not same_keys(need.requirements):
                # The machines this need already holds come first in _fill's order; when they
                # cover it, nothing else is looked at (the same plan, without scanning the fleet).
                own = [m for m in by_need.get(key, ())
                       if m.machine_id not in claimed and serves(m)]
                if own:
                    plan = fill(need, key, agg, own, [], unit=unit)
                    if plan.short:
                        plan = None
            if plan is None:
                sup = [m for m in supply if m.machine_id not in claimed and serves(m)]
                if same_keys(need.requirements) or any(
                        r.key == LABEL_HOSTNAME for r in need.requirements):
                    free = [m for m in pool if m.machine_id not in used_pool and serves(m)]
                    plan = plan_need(need, key, agg, sup, free, unit)
                else:  # the pool per shape, in pick order, without a scan per need
                    streams = [lane for lanes in pool_lanes.values() if serves(lanes[0][0])
                               for lane in lanes]
                    plan = fill(need, key, agg, sup, [], streams=streams, skip=used_pool,
                                unit=unit)
            for m in plan.take:
                claimed.add(m.machine_id)
                m.need = key
                m.priority = need.priority
                m.interruption_bucket = int(need.interruption_penalty_bucket)
                m.reclamation_bucket = int(need.reclamation_penalty_bucket)
                m.surplus_count = 0
            for m in plan.new:
                used_pool.add(m.machine_id)
                claimed.add(m.machine_id)
            statuses[i] = NeedStatus(
                key=key,
                priority=need.priority,
                group=need.group,
                requirements=tuple(req_tuple(r) for r in need.requirements),
                aggregate=dict(need.aggregate_resources),
                min_unit=dict(need.min_unit),
                machines=tuple(m.machine_id for m in plan.take + plan.new),
                new=len(plan.new),
                short=tuple(plan.short),
            )
            if plan.short and key not in self._short_needs:
                ev = self._event(now, "shortfall", need=key, reason="no machine fits",
                                 missing=",".join(plan.short))
                self.shortfalls.append(ev)
                # INFO: under scarcity a shortfall is the fleet working as meant (preemption,
                # waiting low-priority work), and the agent hears of it; a warning per short
                # need filled the demo's --quiet output
                log.info("shortfall need=%s missing=%s", key, ",".join(plan.short))
            if plan.short:
                self._short_needs.add(key)
            else:
                self._short_needs.discard(key)
            # Bind the new machines (bootstrapping the deficit).
            for m in plan.new:
                m.bound = True
                m.cluster = self.cluster_id
                m.binding += 1
                self.binds += 1
                m.need = key
                m.priority = need.priority
                m.interruption_bucket = int(need.interruption_penalty_bucket)
                m.reclamation_bucket = int(need.reclamation_penalty_bucket)
                m.seq = next(self._seq)
                m.surplus_count = 0
                self._event(now, "bind", machine=m.machine_id, node=m.node_name, need=key,
                            shape=m.shape.key, cluster=self.cluster_id,
                            previous=m.last_cluster, spot=m.spot)
        self._need_reqs.update(need_reqs)
        # Start the lifecycle of newly bound machines (after planning, so frames follow the plan).
        for i in order:
            for mid in statuses[i].machines[len(statuses[i].machines) - statuses[i].new:]:
                m = self._by_id[mid]
                if m.state == State.SPECULATIVE:
                    out.append(self._nsu(m))
                    m.due = now + self.config.create_delay
                else:  # warm (already created): straight to the pull
                    out.append(self._nsu(m))
                    out += self._pull(m, now)
        self.needs = [statuses[i] for i in range(len(parsed))]
        self._short_needs &= {s.key for s in self.needs}
        # Surplus: bound machines no need took.
        for m in self.machines:
            if not self.owns(m) or m.machine_id in claimed or m.reclaim is not None:
                continue
            m.need = None
            if m.state != State.CONFIGURED:
                continue  # still provisioning (or draining): a later roll-up decides
            m.surplus_count += 1
            if m.surplus_count < self.config.surplus_rollups:
                continue
            out += self._issue_reclaim(m, now)
        self._event(now, "rollup", needs=len(parsed),
                    short=sum(1 for s in self.needs if s.short),
                    new=sum(s.new for s in self.needs))
        return out + self._available(now)

    # ---------------------------------------------------------------- available capacity

    def available_snapshot(self) -> dict[str, tuple[int, int, float]]:
        """Per shape key: ``(available_count, confidence, cost_per_hour)`` as it would be sent now.

        Confidence ladder: HIGH if a free Idle machine exists, MEDIUM if only
        Speculative ones do, NONE otherwise. Cost: the cheapest free Idle machine's price, else 0.
        """
        out: dict[str, tuple[int, int, float]] = {}
        for shape in self.catalog:
            free = [m for m in self._by_shape.get(shape.key, ()) if m.shape is shape and m.free]
            idle = [m for m in free if m.state == State.IDLE]
            if idle:
                conf = Confidence.CONFIDENCE_HIGH
            elif free:
                conf = Confidence.CONFIDENCE_MEDIUM
            else:
                conf = Confidence.CONFIDENCE_NONE
            cost = min((m.shape.price_per_hour for m in idle), default=0.0)
            out[shape.key] = (len(free), int(conf), cost)
        return out

    def _available(self, now: float) -> list[Effect]:
        out: list[Effect] = []
        interval = self.config.available_min_interval
        snaps = self.available_snapshot()
        for shape in self.catalog:
            snap = snaps[shape.key]
            if self._ac_sent.get(shape.key) == snap:
                continue
            last = self._ac_last.get(shape.key)
            if last is not None and now - last < interval:
                due = last + interval
                self._ac_due = due if self._ac_due is None else min(self._ac_due, due)
                continue
            self._ac_sent[shape.key] = snap
            self._ac_last[shape.key] = now
            out.append(SendFrame(pb.ShardMessage(
                available_capacity=self.available_update(shape, snap))))
        return out

    def available_update(self, shape: MachineShape,
                         snap: tuple[int, int, float] | None = None) -> pb.AvailableCapacityUpdate:
        """The AvailableCapacityUpdate for one shape as of now (``supersedes_key`` per shape)."""
        reqs = [
            pb.NodeSelectorRequirement(key=LABEL_INSTANCE_TYPE, operator=Op(Op.OPERATOR_IN),
                                       values=[shape.instance_type]),
            pb.NodeSelectorRequirement(key=LABEL_ZONE, operator=Op(Op.OPERATOR_IN),
                                       values=[shape.zone]),
        ]
        count, conf, cost = snap if snap is not None else self.available_snapshot()[shape.key]
        return pb.AvailableCapacityUpdate(
            supersedes_key="available:" + profile_fingerprint(reqs),
            requirements=reqs,
            resources=pb.Resources(resources=dict(shape.allocatable)),
            available_count=count,
            confidence=Confidence(conf),
            cost_per_hour=cost,
        )
