"""The simulated kubelet's heartbeats: each registered Node's Lease renewed every 10 s and its
Ready condition re-reported every 5 minutes, as a kubelet does, until the machine is released.

:func:`due_beats`, :func:`next_due` and :func:`after_beat` are the pure schedule over plain
:class:`Beat` records; :class:`NodeHeartbeats` applies it (one task, writes bounded in
number). Rule: docs/deviations.md#simulated-shard-node-heartbeats.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import trio

from .noderetry import retry_delay

log = logging.getLogger(__name__)

NODE_LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_SECONDS = 40
"""kubelet's ``nodeLeaseDurationSeconds`` default."""
LEASE_RENEW_INTERVAL = 10.0
"""Seconds between Lease renewals: kubelet renews at a quarter of the Lease's duration."""
STATUS_REPORT_INTERVAL = 300.0
"""kubelet's ``nodeStatusReportFrequency`` (5 min): the Node status is re-posted this often when
nothing in it changed (a simulated Node's status never changes)."""
WRITE_CONCURRENCY = 64
"""Heartbeat writes in flight at once."""

BeatKind = Literal["lease", "status"]


@dataclass(frozen=True)
class HeartbeatTiming:
    """How often the simulated kubelets beat (seconds).

    Attributes:
        lease_duration: the Lease's ``leaseDurationSeconds`` (kubelet's default 40); it is
            renewed at a quarter of it, as kubelet does. A fleet-scale bench sets it longer, as
            for kwok's Nodes, with the node lifecycle controller's grace period to match.
        status_interval: seconds between two Ready reports of an unchanged Node.

    Raises:
        ValueError: ``lease_duration`` < 4 or ``status_interval`` <= 0.
    """

    lease_duration: int = LEASE_DURATION_SECONDS
    status_interval: float = STATUS_REPORT_INTERVAL

    def __post_init__(self) -> None:
        if self.lease_duration < 4:
            raise ValueError(f"lease_duration must be >= 4 s (got {self.lease_duration})")
        if self.status_interval <= 0:
            raise ValueError(f"status_interval must be > 0 (got {self.status_interval})")

    @property
    def renew_interval(self) -> float:
        """Seconds between two renewals of a Lease."""
        return self.lease_duration / 4


DEFAULT_TIMING = HeartbeatTiming()


@dataclass(frozen=True)
class Beat:
    """When one Node's next heartbeats are due (seconds on the Trio clock).

    Attributes:
        uid: the Node's uid (the Lease is owned by the Node, so it goes with it).
        lease_due / status_due: when the Lease renewal / the status report is due.
        failures: heartbeat writes that failed in a row (backoff, :func:`after_beat`).
    """

    uid: str
    lease_due: float
    status_due: float
    failures: int = 0


def registered_beat(uid: str, now: float, timing: HeartbeatTiming = DEFAULT_TIMING) -> Beat:
    """The schedule of a Node just registered at ``now`` (its Lease and status just written)."""
    return Beat(uid, now + timing.renew_interval, now + timing.status_interval)


def due_beats(beats: Mapping[str, Beat], now: float) -> list[tuple[str, BeatKind]]:
    """Every heartbeat due at ``now``: ``(node name, "lease" | "status")``, by Node name, the
    Lease before the status of the same Node."""
    out: list[tuple[str, BeatKind]] = []
    for name in sorted(beats):
        beat = beats[name]
        if beat.lease_due <= now:
            out.append((name, "lease"))
        if beat.status_due <= now:
            out.append((name, "status"))
    return out


def next_due(beats: Mapping[str, Beat]) -> float:
    """The earliest due time of any heartbeat; ``math.inf`` when there is no Node."""
    return min((min(b.lease_due, b.status_due) for b in beats.values()), default=math.inf)


def after_beat(beat: Beat, kind: BeatKind, now: float, ok: bool,
               timing: HeartbeatTiming = DEFAULT_TIMING) -> Beat:
    """The schedule after a ``kind`` write at ``now``: the next one a full interval later on
    success; on failure again after the registration backoff (0.1 s doubling to 7 s, never
    later than the interval), as kubelet retries a failed renewal soon."""
    interval = timing.renew_interval if kind == "lease" else timing.status_interval
    failures = 0 if ok else beat.failures + 1
    delay = interval if ok else min(retry_delay(failures), interval)
    if kind == "lease":
        return replace(beat, failures=failures, lease_due=now + delay)
    return replace(beat, failures=failures, status_due=now + delay)


def lease_manifest(name: str, uid: str, renew_time: str,
                   timing: HeartbeatTiming = DEFAULT_TIMING) -> dict[str, Any]:
    """The kubelet's Lease ``kube-node-lease/<name>``, owned by the Node ``name``/``uid``;
    ``renew_time`` is RFC 3339 with microseconds.

    It names no holder: a kubelet stand-in that runs the Node's Pods (kwok) runs only the Nodes
    whose Lease it holds, and takes a Lease at once only when it has no holder (else when it
    expires, which the renewals never let happen)."""
    return {
        "metadata": {"name": name, "namespace": NODE_LEASE_NAMESPACE,
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node",
                                          "name": name, "uid": uid}]},
        "spec": {"leaseDurationSeconds": timing.lease_duration, "renewTime": renew_time},
    }


def ready_heartbeat(stamp: str) -> dict[str, Any]:
    """The strategic-merge status patch re-reporting Ready=True with ``lastHeartbeatTime`` =
    ``stamp`` (RFC 3339); other conditions and the transition time stay as they are."""
    return {"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "simulated kubelet is posting ready status", "lastHeartbeatTime": stamp}]}}


def _wall() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class NodeHeartbeats:
    """Renews the Leases and re-reports the status of the Nodes :meth:`add` ed, until
    :meth:`remove` d; :meth:`run` is the task doing it (until cancelled).

    Args:
        client: a :class:`bigfleet_trio.kube.KubeClient` (or the same interface).
        timeout: seconds one write may take before it counts as failed.
        wall: the wall clock the written timestamps come from.
        timing: the Lease duration and status interval (:class:`HeartbeatTiming`).

    Counters: ``renewals`` and ``reports`` (successful writes), ``errors`` (failed ones).
    """

    def __init__(self, client: Any, *, timeout: float = 10.0,
                 wall: Callable[[], dt.datetime] = _wall,
                 timing: HeartbeatTiming = DEFAULT_TIMING) -> None:
        self.client = client
        self.timing = timing
        self.timeout = timeout
        self.wall = wall
        self.beats: dict[str, Beat] = {}
        self.renewals = self.reports = self.errors = 0
        self._changed = trio.Event()
        self._limiter = trio.CapacityLimiter(WRITE_CONCURRENCY)

    def add(self, name: str, uid: str) -> None:
        """Start heartbeats for Node ``name`` (just registered: Lease and status written)."""
        self.beats[name] = registered_beat(uid, trio.current_time(), self.timing)
        self._changed.set()

    def remove(self, name: str) -> None:
        """Stop heartbeats for Node ``name`` (its machine was released); unknown names are
        ignored."""
        self.beats.pop(name, None)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Write each heartbeat when due, until cancelled."""
        task_status.started()
        while True:
            with trio.move_on_at(next_due(self.beats)):
                await self._changed.wait()
            self._changed = trio.Event()
            now = trio.current_time()
            async with trio.open_nursery() as nursery:
                for name, kind in due_beats(self.beats, now):
                    nursery.start_soon(self._beat, name, self.beats[name].uid, kind, now)

    async def _beat(self, name: str, uid: str, kind: BeatKind, now: float) -> None:
        ok = False
        async with self._limiter:
            try:
                with trio.fail_after(self.timeout):
                    await (self.renew_lease(name, uid) if kind == "lease" else self.report(name))
                ok = True
            except Exception as exc:  # noqa: BLE001 - retried on the backoff schedule
                self.errors += 1
                log.debug("node heartbeat (%s) failed node=%s: %r", kind, name, exc)
        beat = self.beats.get(name)
        if beat is not None:  # removed meanwhile: stays removed
            self.beats[name] = after_beat(beat, kind, now, ok, self.timing)

    async def renew_lease(self, name: str, uid: str) -> None:
        """Merge-patch the Lease's ``renewTime`` alone (a holder that took it keeps it); create
        it (owned by the Node ``uid``) if it is gone, as kubelet's ensureLease does. Raises
        what the client raises."""
        from bigfleet_trio.kube.client import rfc3339_micro
        from bigfleet_trio.kube.errors import NotFound
        from bigfleet_trio.kube.resources import LEASES

        lease = lease_manifest(name, uid, rfc3339_micro(self.wall()), self.timing)
        try:
            renew = {"spec": {"renewTime": lease["spec"]["renewTime"]}}
            await self.client.patch(LEASES, name, renew, NODE_LEASE_NAMESPACE)
        except NotFound:
            await self.client.create(LEASES, lease, NODE_LEASE_NAMESPACE)
        self.renewals += 1

    async def report(self, name: str) -> None:
        """Strategic-merge-patch the Node's Ready condition with a fresh heartbeat time."""
        from bigfleet_trio.kube.resources import NODES

        stamp = self.wall().strftime("%Y-%m-%dT%H:%M:%SZ")
        await self.client.patch(NODES, name, ready_heartbeat(stamp), patch_type="strategic",
                                subresource="status")
        self.reports += 1
