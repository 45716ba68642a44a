"""The simulated shard as a fleet: one pool of machines, one engine per cluster (sans-IO).

:class:`FleetEngine` holds the inventory and a :class:`~.engine.ShardEngine` per cluster ID, all
over the same :class:`~.model.Machine` objects: a machine is in the pool or bound to exactly one
cluster. What the fleet adds to the engines (docs/rules.md#simulated-fleet):

- a machine one cluster gave back (surplus reclaim, preemption) is in the pool at once, and
  every other cluster short of demand it serves is planned again, highest short priority first,
  so it is bootstrapped into another cluster without waiting for that cluster's next roll-up;
- under scarcity (a need short after planning, nothing in the pool fits) Configured machines of
  other clusters serving lower-priority needs are preempted for it: lowest priority first, then
  lowest reclamation penalty bucket, then the most expensive, until the need would be covered
  (:func:`pick_victims`);
- every cluster hears the pool's AvailableCapacity when another cluster changed it.

Like the engine, no I/O and no clock: methods take ``now`` and return ``(cluster_id, effect)``
pairs; the first cluster to connect gets :attr:`FleetEngine.primary`, the engine a single-cluster
caller reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from bigfleet_trio.proto import pb

from ._quantity import add_into, covers
from .catalog import Catalog
from .engine import ShardEngine
from .matching import same_keys
from .model import Effect, EngineConfig, Machine, State, build_inventory
from .planning import serves_memo, whole_pods

__all__ = ["FleetEngine", "Move", "pick_victims", "victim_order"]

Tagged = list[tuple[str, Effect]]


@dataclass(frozen=True)
class Move:
    """A machine bound to ``to_cluster`` whose previous binding was in ``from_cluster``.

    ``why``: how it left ``from_cluster`` (``"surplus"``, ``"preempted"`` or ``"failed"``);
    ``spot``: it is a spot machine; ``time``: the fleet clock (seconds) of the new binding.
    """

    time: float
    machine_id: str
    node_name: str
    instance_type: str
    from_cluster: str
    to_cluster: str
    why: str
    spot: bool


def victim_order(m: Machine) -> tuple[int, int, float, int]:
    """Preemption order: lowest need priority, lowest reclamation penalty bucket (cheapest to
    take away), most expensive machine (the most it frees), inventory order."""
    return (m.priority, m.reclamation_bucket, -m.shape.price_per_hour, m.index)


def pick_victims(
    agg: dict[str, Fraction],
    unit: dict[str, Fraction],
    holding: Sequence[Machine],
    candidates: Sequence[Machine],
) -> list[Machine]:
    """The fewest of ``candidates`` (in their order) that, with ``holding`` (machines the need
    has, or has coming), cover ``agg`` in whole Pods of ``unit``; all of them when even that
    falls short (partial relief still runs Pods). Pure; machines are only read."""
    covered: dict[str, Fraction] = {}
    for m in holding:
        add_into(covered, whole_pods(m.alloc, unit))
    chosen: list[Machine] = []
    for m in candidates:
        if (holding or chosen) and covers(covered, agg):
            break
        chosen.append(m)
        add_into(covered, whole_pods(m.alloc, unit))
    return chosen


class FleetEngine:
    """One pool shared by every connected cluster (module docstring).

    Args:
        catalog: the inventory's shapes; config: the engines' knobs (each cluster after the
            first gets ``instruction_prefix`` ``<prefix>-<cluster_id>``, so ids never collide).

    Public state: ``machines`` (all, catalog order), ``engines`` (cluster ID -> engine, connect
    order), ``moves`` (every :class:`Move`, in order).
    """

    def __init__(self, catalog: Catalog, config: EngineConfig | None = None) -> None:
        self.catalog = catalog
        self.config = config or EngineConfig()
        self.machines: list[Machine] = build_inventory(catalog, self.config.seed)
        self._by_id = {m.machine_id: m for m in self.machines}
        self.engines: dict[str, ShardEngine] = {}
        # the first cluster's engine exists before any Hello, so views (inventory, FREE)
        # answer before a session
        self.primary = ShardEngine(catalog, self.config, pool=self.machines)
        self.moves: list[Move] = []
        self._where: dict[str, str] = {}  # machine id -> cluster of its current binding
        self._free: set[str] = {m.machine_id for m in self.machines if m.free}

    # ---------------------------------------------------------------- views

    def machine(self, machine_id: str) -> Machine | None:
        """The machine with this id, or None."""
        return self._by_id.get(machine_id)

    def engine(self, cluster_id: str) -> ShardEngine:
        """The cluster's engine, created (sharing the pool) on first use."""
        eng = self.engines.get(cluster_id)
        if eng is not None:
            return eng
        if not self.primary.cluster_id:
            eng = self.primary
            eng.cluster_id = cluster_id
        else:
            cfg = replace(self.config,
                          instruction_prefix=f"{self.config.instruction_prefix}-{cluster_id}")
            eng = ShardEngine(self.catalog, cfg, pool=self.machines, cluster_id=cluster_id)
        self.engines[cluster_id] = eng
        return eng

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`advance` has work to do, or None."""
        dues = [d for e in self._all() if (d := e.next_deadline()) is not None]
        return min(dues) if dues else None

    # ---------------------------------------------------------------- inputs

    def adopt(self, cluster_id: str, nodes: Iterable[tuple[str, str]], now: float) -> list[str]:
        """:meth:`ShardEngine.adopt` for the cluster (a restarted shard's bindings)."""
        adopted = self.engine(cluster_id).adopt(nodes, now)
        for mid in adopted:
            self._where[mid] = cluster_id
        return adopted

    def on_connect(self, cluster_id: str, now: float) -> Tagged:
        """A session with a valid Hello started: that cluster's replay."""
        return self._tag(cluster_id, self.engine(cluster_id).on_connect(cluster_id, now))

    def on_disconnect(self, cluster_id: str, now: float) -> None:
        """The cluster's session ended; its machines keep progressing."""
        self.engine(cluster_id).on_disconnect(now)

    def on_rollup(self, cluster_id: str, rollup: pb.ClusterCapacityNeeds, now: float) -> Tagged:
        """Plan the cluster's roll-up, then preempt for it under scarcity.

        Raises:
            InvalidRollup: as :meth:`ShardEngine.on_rollup` (nothing changes).
        """
        return self._settle(cluster_id, self.engine(cluster_id).on_rollup(rollup, now), now)

    def on_bootstrap_response(self, cluster_id: str, resp: pb.BootstrapBlobResponse,
                              now: float) -> Tagged:
        """:meth:`ShardEngine.on_bootstrap_response` (a failure returns the machine to the pool)."""
        eng = self.engine(cluster_id)
        return self._settle(cluster_id, eng.on_bootstrap_response(resp, now), now)

    def on_reclaim_ack(self, cluster_id: str, ack: pb.ReclaimAck, now: float) -> Tagged:
        """:meth:`ShardEngine.on_reclaim_ack`."""
        return self._tag(cluster_id, self.engine(cluster_id).on_reclaim_ack(ack, now))

    def advance(self, now: float) -> Tagged:
        """Fire every engine's due timers; machines that came back to the pool go to the
        clusters short of them."""
        out: Tagged = []
        for cid, eng in list(self.engines.items()):
            out += self._settle(cid, eng.advance(now), now)
        if not self.engines:
            out += self._tag("", self.primary.advance(now))
        return out

    # ---------------------------------------------------------------- fleet rules

    def _all(self) -> list[ShardEngine]:
        return list(self.engines.values()) or [self.primary]

    def _tag(self, cluster_id: str, effects: list[Effect]) -> Tagged:
        return [(cluster_id, e) for e in effects]

    def _settle(self, cluster_id: str, effects: list[Effect], now: float) -> Tagged:
        """After ``cluster_id`` acted: record moves, replan the other short clusters when the
        pool grew, preempt for short needs, refresh the others' AvailableCapacity."""
        out = self._tag(cluster_id, effects)
        if len(self.engines) < 2:  # one cluster: the engine alone decides
            self._record_moves(now)
            return out
        free = {m.machine_id for m in self.machines if m.free}
        returned = bool(free - self._free)
        if returned:
            for cid, eng in sorted(
                    ((c, e) for c, e in self.engines.items()
                     if c != cluster_id and e.short_priority() is not None),
                    key=lambda ce: -(ce[1].short_priority() or 0)):
                out += self._tag(cid, eng.replan(now))
        out += self._preempt(now)
        self._record_moves(now)
        self._free = {m.machine_id for m in self.machines if m.free}
        for cid, eng in self.engines.items():
            if cid != cluster_id:
                out += self._tag(cid, eng._available(now))
        return out

    def _record_moves(self, now: float) -> None:
        for m in self.machines:
            was = self._where.get(m.machine_id)
            if not m.bound:
                continue
            if was is not None and was != m.cluster:
                self.moves.append(Move(
                    time=now, machine_id=m.machine_id, node_name=m.node_name,
                    instance_type=m.shape.instance_type, from_cluster=was,
                    to_cluster=m.cluster, why=m.left_because or "surplus", spot=m.spot))
            self._where[m.machine_id] = m.cluster

    def _preempt(self, now: float) -> Tagged:
        """Preempt lower-priority machines of other clusters for every short need (highest
        priority first). Needs with Same requirements are left short: which domain would help
        is the co-location plan's question, not a machine count."""
        out: Tagged = []
        shorts: list[tuple[int, str, int]] = []
        for cid, eng in self.engines.items():
            for i, status in enumerate(eng.needs):
                if status.short and i < len(eng._parsed):
                    shorts.append((-status.priority, cid, i))
        for _, cid, i in sorted(shorts):
            eng = self.engines[cid]
            status = eng.needs[i]
            need, agg, unit = eng._parsed[i]
            if same_keys(need.requirements):
                continue
            serves = serves_memo(need, unit)
            mine = [m for mid in status.machines if (m := self._by_id[mid]).bound]
            coming = [m for m in self.machines
                      if m.reclaim is not None and m.reclaim.for_need == f"{cid}/{status.key}"]
            candidates = sorted(
                (m for m in self.machines
                 if m.bound and m.cluster != cid and m.state == State.CONFIGURED
                 and m.reclaim is None and m.priority < status.priority and serves(m)),
                key=victim_order)
            for victim in pick_victims(agg, unit, mine + coming, candidates):
                owner = self.engines[victim.cluster]
                out += self._tag(victim.cluster, owner.preempt(
                    victim, now, status.priority, for_need=f"{cid}/{status.key}"))
        return out
