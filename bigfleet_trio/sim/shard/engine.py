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
   not over-provision). A need first takes its own machines (sticky), then other unclaimed ones,
   until the sum of their allocatable covers ``aggregate_resources`` in every dimension (and at
   least one machine, since Pods without requests still need a node).
4. The deficit is bootstrapped from the free pool: cheapest price first, then the spread domain
   with the fewest of the need's machines, then already-created (Idle) before Speculative, then
   inventory (catalog) order. When the pool has nothing that fits, the need records a shortfall.
   A Same domain is chosen by: the need's own machines there (sticky), then existing supply
   there, then the cheapest free machine there, then the value; the first domain that can hold
   the whole need wins (else the best one, short).
5. Bound machines no need took are surplus: Configured ones are reclaimed (one
   ReclaimInstruction per machine, naming its Kubernetes node); provisioning ones finish and are
   reclaimed by a later roll-up if still surplus.

Lifecycle of a bound machine (each step one NodeStateUpdate):
Speculative -(create_delay)-> Creating -(boot_delay)-> Idle + BootstrapRequest
-(response)-> Configuring -(configure_delay)-> Configured [hook on_machine_configured];
a bootstrap error or no response within ``bootstrap_timeout`` -> Failed (machine back to the
pool, need short). Reclaim: instruction -(ack)-> wait ``drain_wait`` -> Draining -(drain_step)->
Idle [hook on_machine_released], machine back to the pool.
"""

from __future__ import annotations

import itertools
import logging
import random
import re
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from bigfleet_trio.proto import pb

from ._quantity import add_into, covers, parse_resources
from .catalog import (
    LABEL_HOSTNAME,
    LABEL_INSTANCE_TYPE,
    LABEL_ZONE,
    Catalog,
    MachineShape,
    ShapeTaint,
)

log = logging.getLogger(__name__)

State = pb.MachineState
Op = pb.NodeSelectorRequirementOperator
Confidence = pb.AvailableCapacityUpdateConfidence

ZERO = Fraction(0)

#: Grace ladder (seconds) by priority, like the real shard's 10 s / 30 s / 2 m / 10 m.
GRACE_LADDER: tuple[tuple[int, int], ...] = ((0, 10), (1000, 30), (1_000_000, 120))
GRACE_TOP = 600


def grace_for_priority(priority: int) -> int:
    """Reclaim grace in seconds for a need priority (a real shard's 10 s / 30 s / 2 m / 10 m).

    The sim's mapping: priority < 0 -> 10 s, < 1000 -> 30 s, < 1 000 000 -> 120 s, else 600 s.
    """
    for bound, grace in GRACE_LADDER:
        if priority < bound:
            return grace
    return GRACE_TOP


# --------------------------------------------------------------------------------------------
# Config, effects, snapshots
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineConfig:
    """Timing and policy knobs (seconds). Small defaults so the demo converges in seconds.

    Attributes:
        seed: seeds machine ids and node names.
        create_delay: Speculative -> Creating.
        boot_delay: Creating -> Idle (then the BootstrapRequest is sent).
        configure_delay: Configuring -> Configured (after a good bootstrap response).
        bootstrap_timeout: how long the pull waits for a response (one roll-up cycle).
        reclaim_grace_seconds: grace put in every ReclaimInstruction; None uses
            :func:`grace_for_priority` of the need the machine last served.
        reclaim_ack_timeout: re-issue an unacknowledged ReclaimInstruction after this long.
        drain_wait: after the ack, how long the agent gets to drain before Draining is sent.
        drain_step: Draining -> Idle.
        surplus_rollups: a Configured machine must be surplus in this many consecutive roll-ups
            before it is reclaimed (1 = at once).
        available_min_interval: at most one AvailableCapacityUpdate per shape per this interval
            (the real shard uses 5 s); 0 = send every change at once.
        coordinator_term, shard_epoch: echoed in every Acknowledgement (informational).
    """

    seed: int = 0
    create_delay: float = 0.3
    boot_delay: float = 0.5
    configure_delay: float = 0.5
    bootstrap_timeout: float = 10.0
    reclaim_grace_seconds: int | None = 2
    reclaim_ack_timeout: float = 10.0
    drain_wait: float = 1.0
    drain_step: float = 0.5
    surplus_rollups: int = 1
    available_min_interval: float = 0.0
    coordinator_term: int = 1
    shard_epoch: int = 1

    def __post_init__(self) -> None:
        for name in ("create_delay", "boot_delay", "configure_delay", "drain_wait", "drain_step",
                     "available_min_interval"):
            if getattr(self, name) < 0:
                raise ValueError(f"EngineConfig.{name} must be >= 0")
        for name in ("bootstrap_timeout", "reclaim_ack_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"EngineConfig.{name} must be > 0")
        if self.surplus_rollups < 1:
            raise ValueError("EngineConfig.surplus_rollups must be >= 1")
        if self.reclaim_grace_seconds is not None and self.reclaim_grace_seconds < 0:
            raise ValueError("EngineConfig.reclaim_grace_seconds must be >= 0 or None")


@dataclass(frozen=True)
class MachineInfo:
    """Immutable snapshot of a machine handed to node hooks and state views."""

    machine_id: str
    node_name: str
    provider_id: str
    instance_type: str
    zone: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, str]
    taints: tuple[ShapeTaint, ...]
    price_per_hour: float


@dataclass(frozen=True)
class SendFrame:
    """Effect: send this frame on the cluster's current session (dropped when none is up)."""

    frame: pb.ShardMessage


@dataclass(frozen=True)
class MachineConfigured:
    """Effect: a machine became Configured; register its Node (hook ``on_machine_configured``)."""

    machine: MachineInfo


@dataclass(frozen=True)
class MachineReleased:
    """Effect: a reclaimed machine went back to the pool; remove its Node."""

    machine: MachineInfo


Effect = SendFrame | MachineConfigured | MachineReleased


@dataclass(frozen=True)
class EngineEvent:
    """One line of the engine's event log: ``time`` (engine clock), ``kind``, identifying fields."""

    time: float
    kind: str
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class NeedStatus:
    """How one need of the last accepted roll-up was planned.

    ``machines``: ids serving it (bound, any lifecycle state); ``new``: how many were bootstrapped
    by that roll-up; ``short``: the dimensions still uncovered (empty = satisfied).
    """

    key: str
    priority: int
    group: str
    requirements: tuple[tuple[str, str, tuple[str, ...]], ...]
    aggregate: Mapping[str, str]
    min_unit: Mapping[str, str]
    machines: tuple[str, ...]
    new: int
    short: tuple[str, ...]


@dataclass(frozen=True)
class ReclaimRecord:
    """A ReclaimInstruction the engine issued (``acked_at`` None until the ReclaimAck)."""

    instruction_id: str
    machine_id: str
    node_name: str
    grace_seconds: int
    issued_at: float
    acked_at: float | None = None
    nodes_started: int | None = None


class InvalidRollup(ValueError):
    """The roll-up was rejected whole (bad quantity or penalty bucket); the last demand stays."""


# --------------------------------------------------------------------------------------------
# Matching (pure functions)
# --------------------------------------------------------------------------------------------


def requirement_matches(req: pb.NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    """Whether one machine's labels satisfy one requirement (Kubernetes node-affinity semantics).

    In: key present with a listed value. NotIn: key absent or value not listed. Exists: key
    present. DoesNotExist: key absent. Same: key present (the shared-value rule is a set rule,
    see :func:`same_keys`). UNSPECIFIED or unknown operators match nothing.
    """
    op = req.operator
    present = req.key in labels
    if op == Op.OPERATOR_IN:
        return present and labels[req.key] in req.values
    if op == Op.OPERATOR_NOT_IN:
        return not present or labels[req.key] not in req.values
    if op == Op.OPERATOR_EXISTS:
        return present
    if op == Op.OPERATOR_DOES_NOT_EXIST:
        return not present
    if op == Op.OPERATOR_SAME:
        return present
    return False


def labels_match(reqs: Iterable[pb.NodeSelectorRequirement], labels: Mapping[str, str]) -> bool:
    """All requirements hold for these labels (an empty list matches everything)."""
    return all(requirement_matches(r, labels) for r in reqs)


def same_keys(reqs: Iterable[pb.NodeSelectorRequirement]) -> list[str]:
    """The keys of the Same requirements, sorted and de-duplicated."""
    return sorted({r.key for r in reqs if r.operator == Op.OPERATOR_SAME})


def same_satisfied(
    reqs: Sequence[pb.NodeSelectorRequirement], machine_labels: Iterable[Mapping[str, str]]
) -> bool:
    """Whether a *set* of machines satisfies every Same requirement (one shared value per key)."""
    label_list = list(machine_labels)
    for key in same_keys(reqs):
        values = {lab.get(key) for lab in label_list}
        if None in values or len(values) > 1:
            return False
    return True


def profile_fingerprint(
    requirements: Iterable[pb.NodeSelectorRequirement],
    *,
    priority: int = 0,
    interruption_bucket: int = 0,
    reclamation_bucket: int = 0,
    spread: Iterable[pb.TopologySpread] = (),
) -> str:
    """The profile fingerprint (the shard's canonical text of a need's Profile).

    Example: ``p=0|ipb=0|rpb=0|reqs=node.kubernetes.io/instance-type:1:a;|spr=``.
    """
    reqs = sorted(
        ((r.key, int(r.operator), sorted(r.values)) for r in requirements),
        key=lambda t: (t[0], t[1]),
    )
    parts = [f"p={priority}|ipb={interruption_bucket}|rpb={reclamation_bucket}|reqs="]
    parts += [f"{k}:{op}:{','.join(vals)};" for k, op, vals in reqs]
    parts.append("|spr=")
    parts += [
        f"{s.topology_key}:{s.max_skew}:{int(s.when_unsatisfiable)};"
        for s in sorted(spread, key=lambda s: s.topology_key)
    ]
    return "".join(parts)


def need_key(need: pb.CapacityNeed) -> str:
    """Identity of a need across roll-ups: its profile fingerprint plus its co-location group."""
    fp = profile_fingerprint(
        need.requirements,
        priority=need.priority,
        interruption_bucket=int(need.interruption_penalty_bucket),
        reclamation_bucket=int(need.reclamation_penalty_bucket),
        spread=need.spread,
    )
    return f"{fp}|grp={need.group}"


_OP_NAMES = {
    Op.OPERATOR_IN: "In",
    Op.OPERATOR_NOT_IN: "NotIn",
    Op.OPERATOR_EXISTS: "Exists",
    Op.OPERATOR_DOES_NOT_EXIST: "DoesNotExist",
    Op.OPERATOR_SAME: "Same",
}


def _req_tuple(r: pb.NodeSelectorRequirement) -> tuple[str, str, tuple[str, ...]]:
    return (r.key, _OP_NAMES.get(r.operator, "Unspecified"), tuple(r.values))


# --------------------------------------------------------------------------------------------
# Machines
# --------------------------------------------------------------------------------------------

_NAME_BAD = re.compile(r"[^a-z0-9.-]+")


@dataclass
class Machine:
    """One machine of the inventory (mutable engine state; read it, do not change it).

    ``bound``: it belongs to the cluster (its NodeStateUpdates go to the agent). Unbound machines
    are the free pool, in state SPECULATIVE (not created yet) or IDLE (created, warm).
    """

    machine_id: str
    node_name: str
    provider_id: str
    shape: MachineShape
    state: pb.MachineState
    bound: bool = False
    need: str | None = None
    priority: int = 0
    due: float | None = None
    bootstrap_request_id: str | None = None
    reclaim: ReclaimRecord | None = None
    surplus_count: int = 0
    last_error: str = ""
    seq: int = 0
    index: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    alloc: dict[str, Fraction] = field(default_factory=dict)

    def info(self) -> MachineInfo:
        """An immutable snapshot for hooks and views."""
        return MachineInfo(
            machine_id=self.machine_id,
            node_name=self.node_name,
            provider_id=self.provider_id,
            instance_type=self.shape.instance_type,
            zone=self.shape.zone,
            labels=dict(self.labels),
            allocatable=dict(self.shape.allocatable),
            taints=self.shape.taints,
            price_per_hour=self.shape.price_per_hour,
        )

    @property
    def free(self) -> bool:
        """In the free pool and usable for new demand."""
        return not self.bound and self.state in (State.IDLE, State.SPECULATIVE)


_SUPPLY_RANK = {
    State.CONFIGURED: 0,
    State.CONFIGURING: 1,
    State.IDLE: 2,
    State.CREATING: 3,
    State.SPECULATIVE: 4,
}


@dataclass
class _Plan:
    take: list[Machine]
    new: list[Machine]
    short: list[str]


# --------------------------------------------------------------------------------------------
# Engine
# --------------------------------------------------------------------------------------------


class ShardEngine:
    """The simulated shard's state machine for one cluster (see the module docstring).

    Args:
        catalog: the machine shapes and counts of the inventory.
        config: timing and policy knobs.

    Public state (read-only): ``machines`` (all, catalog order), ``cluster_id`` (from the last
    Hello), ``last_rollup`` (last accepted ClusterCapacityNeeds), ``needs`` (list of
    :class:`NeedStatus` of that roll-up), ``reclaims`` (every :class:`ReclaimRecord`, issue order),
    ``shortfalls`` and ``events`` (bounded logs of :class:`EngineEvent`).
    """

    def __init__(self, catalog: Catalog, config: EngineConfig | None = None) -> None:
        self.catalog = catalog
        self.config = config or EngineConfig()
        self.cluster_id = ""
        self.last_rollup: pb.ClusterCapacityNeeds | None = None
        self.rollups_accepted = 0
        self.rollups_rejected = 0
        self.released = 0
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
        self.machines: list[Machine] = []
        rng = random.Random(self.config.seed)
        names: set[str] = set()
        for shape in catalog:
            for i in range(shape.count):
                machine_id = f"i-{rng.getrandbits(56):014x}"
                while True:
                    base = _NAME_BAD.sub("-", f"{shape.instance_type}-{shape.zone}".lower())
                    node_name = f"{base}-{rng.getrandbits(24):06x}"
                    if node_name not in names:
                        break
                names.add(node_name)
                m = Machine(
                    machine_id=machine_id,
                    node_name=node_name,
                    provider_id=f"sim://{shape.region}/{shape.zone}/{machine_id}",
                    shape=shape,
                    state=State(State.IDLE if i < shape.warm else State.SPECULATIVE),
                    index=len(self.machines),
                )
                m.labels = {**shape.labels(), LABEL_HOSTNAME: node_name}
                m.alloc = shape.allocatable_values
                self.machines.append(m)
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

    def bound_machines(self) -> list[Machine]:
        """Machines bound to the cluster, catalog order."""
        return [m for m in self.machines if m.bound]

    def machines_by_state(self) -> dict[str, int]:
        """Counts of bound machines per state name (``"CONFIGURED"``…) plus ``"FREE"`` (pool)."""
        out: Counter[str] = Counter()
        for m in self.machines:
            if m.bound:
                out[m.state.name or str(int(m.state))] += 1
            elif m.free:
                out["FREE"] += 1
        return dict(sorted(out.items()))

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`advance` has work to do, or None."""
        dues = [m.due for m in self.machines if m.due is not None]
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
        return self._plan(parsed, now)

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
             if x.reclaim is not None and x.reclaim.instruction_id == ack.instruction_id),
            None,
        )
        if m is None or m.reclaim is None:
            log.info("reclaim ack dropped: unknown instruction_id=%r", ack.instruction_id)
            self._event(now, "reclaim_ack_dropped", instruction_id=ack.instruction_id)
            return []
        if m.reclaim.acked_at is not None:
            log.info("duplicate reclaim ack instruction_id=%s", ack.instruction_id)
            return []
        rec = ReclaimRecord(
            instruction_id=m.reclaim.instruction_id,
            machine_id=m.machine_id,
            node_name=m.node_name,
            grace_seconds=m.reclaim.grace_seconds,
            issued_at=m.reclaim.issued_at,
            acked_at=now,
            nodes_started=ack.nodes_started,
        )
        m.reclaim = rec
        self.reclaims = [rec if r.instruction_id == rec.instruction_id else r
                         for r in self.reclaims]
        m.due = now + self.config.drain_wait
        self._event(now, "reclaim_acked", machine=m.machine_id, node=m.node_name,
                    instruction_id=rec.instruction_id, nodes_started=ack.nodes_started)
        return []

    def advance(self, now: float) -> list[Effect]:
        """Fire every timer due at or before ``now`` (in due-time order) and return the effects."""
        out: list[Effect] = []
        while True:
            due = [m for m in self.machines if m.due is not None and m.due <= now]
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

    # ---------------------------------------------------------------- lifecycle

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
            return [self._set_state(m, State.DRAINING, now, cfg.drain_step)]
        if m.state == State.DRAINING:
            frame = self._set_state(m, State.IDLE, now, None)
            info = m.info()
            self._event(now, "released", machine=m.machine_id, node=m.node_name)
            self.released += 1
            m.bound = False
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
        frame = self._set_state(m, State.FAILED, now, None)
        log.warning("machine failed machine=%s node=%s need=%s error=%s",
                    m.machine_id, m.node_name, m.need, error)
        ev = self._event(now, "shortfall", machine=m.machine_id, node=m.node_name, need=m.need,
                         reason=error)
        self.shortfalls.append(ev)
        # The machine exists (it was created); it goes back to the pool, warm.
        m.bound = False
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
            preemptor_priority=0,
        )))

    # ---------------------------------------------------------------- planning

    def _plan(
        self,
        parsed: list[tuple[pb.CapacityNeed, dict[str, Fraction], dict[str, Fraction]]],
        now: float,
    ) -> list[Effect]:
        order = sorted(range(len(parsed)), key=lambda i: (-parsed[i][0].priority, i))
        supply = [m for m in self.machines
                  if m.bound and m.reclaim is None and m.state in _SUPPLY_RANK]
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
            serves = self._serves_memo(need, unit)
            plan = None
            if not same_keys(need.requirements):
                # The machines this need already holds come first in _fill's order; when they
                # cover it, nothing else is looked at (the same plan, without scanning the fleet).
                own = [m for m in by_need.get(key, ())
                       if m.machine_id not in claimed and serves(m)]
                if own:
                    plan = self._fill(need, key, agg, own, [])
                    if plan.short:
                        plan = None
            if plan is None:
                sup = [m for m in supply if m.machine_id not in claimed and serves(m)]
                if same_keys(need.requirements) or any(
                        r.key == LABEL_HOSTNAME for r in need.requirements):
                    free = [m for m in pool if m.machine_id not in used_pool and serves(m)]
                    plan = self._plan_need(need, key, agg, sup, free)
                else:  # the pool per shape, in pick order, without a scan per need
                    streams = [lane for lanes in pool_lanes.values() if serves(lanes[0][0])
                               for lane in lanes]
                    plan = self._fill(need, key, agg, sup, [], streams=streams, skip=used_pool)
            for m in plan.take:
                claimed.add(m.machine_id)
                m.need = key
                m.priority = need.priority
                m.surplus_count = 0
            for m in plan.new:
                used_pool.add(m.machine_id)
                claimed.add(m.machine_id)
            statuses[i] = NeedStatus(
                key=key,
                priority=need.priority,
                group=need.group,
                requirements=tuple(_req_tuple(r) for r in need.requirements),
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
                log.warning("shortfall need=%s missing=%s", key, ",".join(plan.short))
            if plan.short:
                self._short_needs.add(key)
            else:
                self._short_needs.discard(key)
            # Bind the new machines (bootstrapping the deficit).
            for m in plan.new:
                m.bound = True
                m.need = key
                m.priority = need.priority
                m.seq = next(self._seq)
                m.surplus_count = 0
                self._event(now, "bind", machine=m.machine_id, node=m.node_name, need=key,
                            shape=m.shape.key)
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
            if not m.bound or m.machine_id in claimed or m.reclaim is not None:
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

    def _serves(self, m: Machine, need: pb.CapacityNeed, unit: Mapping[str, Fraction]) -> bool:
        return labels_match(need.requirements, m.labels) and covers(m.alloc, unit)

    def _serves_memo(self, need: pb.CapacityNeed,
                     unit: Mapping[str, Fraction]) -> Callable[[Machine], bool]:
        """:meth:`_serves` for one need, answered once per shape: machines of a shape share
        every label but the hostname and all their allocatable (a need naming the hostname label
        is checked per machine)."""
        reqs = list(need.requirements)
        if any(r.key == LABEL_HOSTNAME for r in reqs):
            return lambda m: self._serves(m, need, unit)
        memo: dict[str, bool] = {}

        def serves(m: Machine) -> bool:
            hit = memo.get(m.shape.key)
            if hit is None:
                hit = memo[m.shape.key] = labels_match(reqs, m.labels) and covers(m.alloc, unit)
            return hit

        return serves

    def _plan_need(
        self,
        need: pb.CapacityNeed,
        key: str,
        agg: dict[str, Fraction],
        sup: list[Machine],
        free: list[Machine],
    ) -> _Plan:
        skeys = same_keys(need.requirements)
        if not skeys:
            return self._fill(need, key, agg, sup, free)
        domains = [
            sorted({m.labels[k] for m in sup + free}) for k in skeys
        ]
        combos = list(itertools.product(*domains))
        if not combos:
            return _Plan([], [], sorted(agg) or ["machines"])

        def in_domain(m: Machine, combo: tuple[str, ...]) -> bool:
            return all(m.labels.get(k) == v for k, v in zip(skeys, combo, strict=True))

        def score(combo: tuple[str, ...]) -> tuple[int, int, float, tuple[str, ...]]:
            sticky = sum(1 for m in sup if m.need == key and in_domain(m, combo))
            existing = sum(1 for m in sup if in_domain(m, combo))
            prices = [m.shape.price_per_hour for m in free if in_domain(m, combo)]
            return (-sticky, -existing, min(prices) if prices else float("inf"), combo)

        first: _Plan | None = None
        for combo in sorted(combos, key=score):
            plan = self._fill(need, key, agg,
                              [m for m in sup if in_domain(m, combo)],
                              [m for m in free if in_domain(m, combo)])
            if not plan.short:
                return plan
            if first is None:
                first = plan
        assert first is not None
        return first

    def _fill(
        self,
        need: pb.CapacityNeed,
        key: str,
        agg: dict[str, Fraction],
        sup: list[Machine],
        free: list[Machine],
        *,
        streams: list[list[Machine]] | None = None,
        skip: set[str] | None = None,
    ) -> _Plan:
        """Cover ``agg``: ``sup`` first (own machines, then by supply rank), then new machines
        from ``free`` -- or from ``streams`` (lists each already in pick order and of one shape,
        machines in ``skip`` or no longer free passed over)."""
        covered: dict[str, Fraction] = {}
        take: list[Machine] = []

        def done() -> bool:
            return bool(take) and covers(covered, agg)

        sup_sorted = sorted(sup, key=lambda m: (m.need != key, _SUPPLY_RANK[m.state], m.seq,
                                                m.index))
        for m in sup_sorted:
            if done():
                break
            take.append(m)
            add_into(covered, m.alloc)
        spread_keys = [s.topology_key for s in need.spread
                       if s.when_unsatisfiable != pb.TopologySpreadWhenUnsatisfiable
                       .WHEN_UNSATISFIABLE_SCHEDULE_ANYWAY]
        new: list[Machine] = []
        # The cheapest machine by (price, load of its spread domains, not Idle, inventory index).
        # A fresh machine's hostname domain always has load 0 (its hostname is its own), so only
        # the other spread keys split the free machines into domains; within a domain the load
        # is the same, so each domain's best is the first in (price, not Idle, index) order.
        dom_keys = [k for k in spread_keys if k != LABEL_HOSTNAME]
        counts = [Counter(m.labels.get(k) for m in take) for k in dom_keys]
        lanes: list[tuple[tuple[str | None, ...], list[Machine]]] = []
        if streams is None:
            domains: dict[tuple[str | None, ...], list[Machine]] = {}
            for m in sorted(free, key=lambda m: (m.shape.price_per_hour, m.state != State.IDLE,
                                                 m.index)):
                domains.setdefault(tuple(m.labels.get(k) for k in dom_keys), []).append(m)
            lanes = list(domains.items())
        else:
            lanes = [(tuple(lane[0].labels.get(k) for k in dom_keys), lane)
                     for lane in streams if lane]
        heads = [0] * len(lanes)
        while not done():
            best_i: int | None = None
            best_key: tuple[Any, ...] | None = None
            for li, (d, lst) in enumerate(lanes):
                i = heads[li]
                if skip is not None:
                    while i < len(lst) and (lst[i].machine_id in skip or not lst[i].free):
                        i += 1
                    heads[li] = i
                if i >= len(lst):
                    continue
                m = lst[i]
                load = tuple(c[v] for c, v in zip(counts, d, strict=True))
                key_ = (m.shape.price_per_hour, load, m.state != State.IDLE, m.index)
                if best_key is None or key_ < best_key:
                    best_key, best_i = key_, li
            if best_i is None:
                break
            best_d, lane = lanes[best_i]
            best = lane[heads[best_i]]
            heads[best_i] += 1
            for c, v in zip(counts, best_d, strict=True):
                c[v] += 1
            new.append(best)
            take.append(best)
            add_into(covered, best.alloc)
        short: list[str] = []
        if not take:
            short = ["machines"]
        elif not covers(covered, agg):
            short = sorted(d for d, v in agg.items() if covered.get(d, ZERO) < v)
        return _Plan(take=[m for m in take if m not in new], new=new, short=short)

    def _issue_reclaim(self, m: Machine, now: float) -> list[Effect]:
        grace = (self.config.reclaim_grace_seconds
                 if self.config.reclaim_grace_seconds is not None
                 else grace_for_priority(m.priority))
        rec = ReclaimRecord(
            instruction_id=f"reclaim-{next(self._reclaim_seq):06d}",
            machine_id=m.machine_id,
            node_name=m.node_name,
            grace_seconds=grace,
            issued_at=now,
        )
        m.reclaim = rec
        m.due = now + self.config.reclaim_ack_timeout
        self.reclaims.append(rec)
        self._event(now, "reclaim_issued", machine=m.machine_id, node=m.node_name,
                    instruction_id=rec.instruction_id, grace_seconds=grace)
        log.info("reclaim issued instruction=%s machine=%s node=%s grace=%ss",
                 rec.instruction_id, m.machine_id, m.node_name, grace)
        return [self._reclaim_frame(m)]

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

    # ---------------------------------------------------------------- log

    def _event(self, now: float, kind: str, **fields: Any) -> EngineEvent:
        ev = EngineEvent(time=now, kind=kind, fields=fields)
        self.events.append(ev)
        return ev
