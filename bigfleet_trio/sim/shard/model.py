"""Data model of the simulated shard's engine: config, effects, snapshots, machines, inventory.

Plain data the sans-IO :class:`~bigfleet_trio.sim.shard.engine.ShardEngine` works over: its
timing knobs (:class:`EngineConfig`), the :data:`Effect` values it returns, read-only snapshots
(:class:`MachineInfo`, :class:`NeedStatus`, :class:`ReclaimRecord`, :class:`EngineEvent`), the
mutable :class:`Machine` and :func:`build_inventory` (the seeded machines of a catalog).
Re-exported by :mod:`.engine` and the package.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from bigfleet_trio.proto import pb

from .catalog import LABEL_HOSTNAME, LABEL_SPOT, Catalog, MachineShape, ShapeTaint

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
        instruction_prefix: ReclaimInstruction ids are ``<prefix>-000001``, ... ; ``sim shard``
            gives each process a prefix of its own, so a restarted shard never re-uses an id
            for another reclaim (docs/rules.md#reclaim-instruction-ids).
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
    instruction_prefix: str = "reclaim"
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
    cluster_id: str = ""


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
    """A ReclaimInstruction the engine issued (``acked_at`` None until the ReclaimAck).

    ``binding``: which binding of the machine it ends (:attr:`Machine.binding`); ``released_at``:
    when the machine walked back to the pool (None while that binding lasts). A released machine
    may be bound again later (a warm one is the cheapest pick), so "reclaimed" is a fact about
    one binding, never about the machine for good. ``cluster_id``: the cluster it was reclaimed
    from; ``reason``: ``"surplus"`` (no need of that cluster took it) or ``"preempted"``
    (higher-priority demand of another cluster, ``preemptor_priority``, needs it for the need
    ``for_need``, ``<cluster>/<need key>``: docs/rules.md#simulated-fleet).
    """

    instruction_id: str
    machine_id: str
    node_name: str
    grace_seconds: int
    issued_at: float
    acked_at: float | None = None
    nodes_started: int | None = None
    binding: int = 0
    released_at: float | None = None
    cluster_id: str = ""
    reason: str = "surplus"
    preemptor_priority: int = 0
    for_need: str = ""


class InvalidRollup(ValueError):
    """The roll-up was rejected whole (bad quantity or penalty bucket); the last demand stays."""



# --------------------------------------------------------------------------------------------
# Machines
# --------------------------------------------------------------------------------------------

_NAME_BAD = re.compile(r"[^a-z0-9.-]+")


@dataclass
class Machine:
    """One machine of the inventory (mutable engine state; read it, do not change it).

    ``bound``: it belongs to the cluster (its NodeStateUpdates go to the agent). Unbound machines
    are the free pool, in state SPECULATIVE (not created yet) or IDLE (created, warm).
    ``binding``: how many times it was bound (0 = never); each binding is one life in the cluster,
    ended by a release or a failure. The node name stays the same across bindings.
    ``cluster``: the cluster it is bound to ("" in the pool); ``last_cluster``: the cluster of its
    previous binding (a machine bound elsewhere next has *moved*); ``interruption_bucket`` and
    ``reclamation_bucket``: the penalty buckets of the need it serves (preemption picks by them);
    ``left_because``: how its last binding ended (``surplus``, ``preempted``, ``failed``).
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
    binding: int = 0
    index: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    alloc: dict[str, Fraction] = field(default_factory=dict)
    cluster: str = ""
    last_cluster: str = ""
    interruption_bucket: int = 0
    reclamation_bucket: int = 0
    left_because: str = ""

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
            cluster_id=self.cluster,
        )

    @property
    def spot(self) -> bool:
        """A spot machine: cheaper, interruptible (its shape carries ``bigfleet.io/spot: "true"``;
        docs/rules.md#simulated-fleet)."""
        return self.labels.get(LABEL_SPOT) == "true"

    @property
    def free(self) -> bool:
        """In the free pool and usable for new demand."""
        return not self.bound and self.state in (State.IDLE, State.SPECULATIVE)



def build_inventory(catalog: Catalog, seed: int) -> list[Machine]:
    """Every machine of ``catalog``, catalog order, ids and node names drawn from ``seed``.

    Unbound; the first ``warm`` of each shape Idle (created), the rest Speculative.
    """
    machines: list[Machine] = []
    rng = random.Random(seed)
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
                index=len(machines),
            )
            m.labels = {**shape.labels(), LABEL_HOSTNAME: node_name}
            m.alloc = shape.allocatable_values
            machines.append(m)
    return machines
