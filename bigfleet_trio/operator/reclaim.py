"""Reclaim: cordon-then-ack, drain on its own clock (seed 000 "Handling reclaim"; ref §7;
peers.md N1-N5, P1-P5; issue 5 "Reclaim").

:class:`ReclaimHandler` (the session's ``on_reclaim_instruction``), inline and bounded:

1. Resolve each entry of ``nodes`` to a Node: a Node of that name; else the UpcomingNode
   ``un-<entry>`` (the shard sends machine IDs) and its ``status.nodeRef``; else that
   UpcomingNode's ``status.providerID`` matched against ``Node.spec.providerID`` through the
   injected ``node_lookup`` (the operator's Node informer indexed by providerID), else by listing
   Nodes. For an entry that names a Node, its UpcomingNode is found by ``status.nodeRef.name``
   through the injected ``upcoming_lookup`` (the operator's informer index), else by listing
   UpcomingNodes.
2. Cordon it (merge-patch ``{"spec":{"unschedulable":true}}``), walk its UpcomingNode to Draining
   and remember in the :class:`~bigfleet_trio.operator.upcoming.DrainMemory` that a drain began,
   then hand the drain to the :class:`DrainManager` (non-blocking).
3. Ack ``ReclaimAck{instruction_id, nodes_started}`` through ``reply`` (the outbox), where
   ``nodes_started`` counts the nodes actually cordoned now or already draining (an entry with no
   Node -- already gone, N1 -- is acked but not counted).

Idempotent (N4): a repeated instruction id is re-acked with the first answer and does nothing
else; a node already draining is cordoned again (a no-op), counted, and gets no second drain.

:class:`DrainManager` owns the drains in a nursery of its own, started by the operator
(``await operator_nursery.start(drains.run)``), never by the session: a reconnect does not cancel
a drain. One task per node, each under its own cancel scope whose deadline is the instruction's
grace period (0 or negative -> 30 s). A drain lists the Pods on the node (field selector
``spec.nodeName``), skips DaemonSet-owned, mirror (``kubernetes.io/config.mirror``) and terminal
(Succeeded/Failed) Pods, and evicts the rest through policy/v1 with
``deleteOptions.gracePeriodSeconds = min(Pod's terminationGracePeriodSeconds (30 if unset), time
left)``, at least 1 (0 would mean "delete now"). Outcomes by HTTP status (P1, never by reason):

* 2xx -> evicted (the Pod terminates; the drain waits for it to disappear);
* 404 -> gone;
* 429 (PodDisruptionBudget, or a disruption webhook like Podseidon's) and 409 -> retry;
* 5xx and transport errors -> retry;
* 403 and any other 4xx -> recorded, that Pod is not evicted again (it still blocks completion).

Rounds repeat every ~2 s (uniform jitter) while an eviction is blocked; while only Terminating
Pods remain (just evicted, or already being deleted) the drain re-lists quickly instead (0.25 s,
doubling up to the ~2 s interval) so a short grace is not lost waiting. Rounds go on until no
evictable Pod remains -> the UpcomingNode goes to Drained and is deleted (the rule of
:mod:`.upcoming`; the memory keeps a tombstone so a later IDLE does not recreate it), or until the
deadline -> one last listing right at the deadline (bounded by ``FINAL_CHECK_TIMEOUT``), then
Drained if the Pods are gone by now, else Failed with ``lastError`` naming the Pods left and why.
On shutdown (the operator cancels :meth:`DrainManager.run`) running drains may finish for up to
``shutdown_timeout`` seconds, then they are cancelled.

Metrics (ours): ``bigfleet_operator_drains_total{outcome=drained|failed|abandoned}``,
``bigfleet_operator_drains_active`` and ``bigfleet_operator_evictions_total{result=evicted|gone|
blocked|refused}`` (one per eviction call); :class:`DrainManager` also keeps cumulative
``completed_total``/``failed_total``/``abandoned_total`` (not bounded by its results ring).

Deviations from the Go reference (ref §7, §18.2-4): machine IDs are resolved through the
UpcomingNode; nodes_started counts cordoned nodes; a per-node deadline instead of one shared
deadline over a sequential loop; the drain is owned by the operator's nursery, bounded at
shutdown; mirror and terminal Pods are skipped; errors are classified (403/4xx stop, 404 gone);
the grace period is passed to the eviction; duplicates start no second drain.
"""

from __future__ import annotations

import logging
import math
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final, Literal, Protocol

import trio

from bigfleet_trio.kube.errors import ApiError, KubeError, KubeTransportError, NotFound
from bigfleet_trio.kube.resources import NODES, PODS, UPCOMING_NODES, Resource
from bigfleet_trio.observability import metrics
from bigfleet_trio.operator.upcoming import (
    PHASE_DRAINED,
    PHASE_DRAINING,
    PHASE_FAILED,
    DrainMemory,
    KubeLike,
    delete_upcoming,
    kube_retrying,
    patch_upcoming_status,
    upcoming_node_name,
)
from bigfleet_trio.proto import pb

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_SHUTDOWN_TIMEOUT",
    "RETRY_INTERVAL_SECONDS",
    "DrainManager",
    "DrainResult",
    "EvictionOutcome",
    "ReclaimHandler",
    "ReclaimKube",
    "classify_eviction_error",
    "drain_failure_message",
    "effective_grace",
    "eviction_grace_seconds",
    "pod_key",
    "skip_reason",
]

log = logging.getLogger(__name__)

DEFAULT_GRACE_SECONDS: Final = 30.0
"""Drain deadline when the instruction's grace_period_seconds is 0 or negative."""
RETRY_INTERVAL_SECONDS: Final = 2.0
"""Nominal pause between eviction rounds (jittered by +-25 %)."""
FAST_POLL_SECONDS: Final = 0.25
"""First re-check after an admitted eviction while only Terminating Pods remain (doubles up to
the retry interval)."""
FINAL_CHECK_TIMEOUT: Final = 5.0
"""Upper bound on the last Pod listing made at the drain deadline before declaring Failed."""
DEFAULT_SHUTDOWN_TIMEOUT: Final = 20.0
"""How long running drains may continue after the operator is asked to stop."""
STATUS_WRITE_TIMEOUT: Final = 10.0
"""Upper bound on the final Drained/Failed write of a drain (it runs after its deadline)."""
MAX_LAST_ERROR: Final = 2000
MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"
DEFAULT_POD_GRACE: Final = 30

Reply = Callable[[pb.OperatorMessage], bool]
UpcomingLookup = Callable[[str], Iterable[Mapping[str, Any]]]
"""Node name -> UpcomingNodes whose ``status.nodeRef.name`` is that node (e.g. an informer
index: ``Operator.upcoming_for_node``)."""


NodeLookup = Callable[[str], Iterable[Mapping[str, Any]]]
"""``spec.providerID`` -> Nodes with that providerID (e.g. an informer index:
``Operator.nodes_for_provider_id``). Each returned Node is re-checked, so a stale index entry is
harmless."""


class ReclaimKube(KubeLike, Protocol):
    """KubeClient methods used by reclaim (docs/kube-api.md): get/create/patch/delete + these."""

    async def list(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
        resource_version: str | None = None,
    ) -> Any: ...

    async def evict(
        self, name: str, namespace: str, *, grace_period_seconds: int | None = None
    ) -> None: ...


# --------------------------------------------------------------------------- pure helpers


class EvictionOutcome(Enum):
    """What an eviction answer means for the drain (P1)."""

    GONE = "gone"
    RETRY = "retry"
    STOP = "stop"


_EVICTION_RESULT: Final = {
    EvictionOutcome.GONE: "gone",
    EvictionOutcome.RETRY: "blocked",
    EvictionOutcome.STOP: "refused",
}
"""``result`` label of ``bigfleet_operator_evictions_total`` for a failed eviction."""


def classify_eviction_error(exc: BaseException) -> EvictionOutcome:
    """Classify a failed eviction by HTTP status (never by ``Status.reason``, P1).

    404 -> GONE; 429, 409, 5xx, transport errors -> RETRY; 403 and other 4xx (and anything
    unexpected) -> STOP.
    """
    if isinstance(exc, ApiError):
        if exc.status == 404:
            return EvictionOutcome.GONE
        if exc.status in (429, 409) or exc.status >= 500:
            return EvictionOutcome.RETRY
        return EvictionOutcome.STOP
    if isinstance(exc, KubeTransportError):
        return EvictionOutcome.RETRY
    return EvictionOutcome.STOP


def pod_key(pod: Mapping[str, Any]) -> str:
    """``namespace/name`` of a Pod."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def skip_reason(pod: Mapping[str, Any]) -> str | None:
    """Why a Pod is not evicted: "daemonset", "mirror", "terminal", or None (evict it)."""
    meta = pod.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("kind") == "DaemonSet":
            return "daemonset"
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return "mirror"
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return "terminal"
    return None


def effective_grace(grace_period_seconds: int) -> float:
    """Instruction grace -> drain deadline in seconds (<= 0 -> 30 s)."""
    return float(grace_period_seconds) if grace_period_seconds > 0 else DEFAULT_GRACE_SECONDS


def eviction_grace_seconds(pod: Mapping[str, Any], remaining: float) -> int:
    """``deleteOptions.gracePeriodSeconds`` for an eviction: the Pod's own grace (30 s if unset)
    bounded by the whole seconds left before the drain deadline, and at least 1."""
    own = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    own_s = int(own) if isinstance(own, int) and own >= 0 else DEFAULT_POD_GRACE
    return max(1, min(own_s, math.floor(remaining)))


def drain_failure_message(node: str, grace: float, pods_left: Mapping[str, str]) -> str:
    """``lastError`` of a drain that hit its deadline; names every Pod left and why."""
    parts = [f"{key} ({why})" for key, why in sorted(pods_left.items())]
    msg = f"drain of node {node} did not finish within {grace:g}s; pods left: " + (
        ", ".join(parts) if parts else "none listed"
    )
    if len(msg) > MAX_LAST_ERROR:
        msg = msg[: MAX_LAST_ERROR - 3] + "..."
    return msg


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, ApiError):
        return f"{exc.status}: {exc.message or exc.reason}"
    return f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------- drains


DrainOutcome = Literal["drained", "failed", "abandoned"]


@dataclass
class DrainResult:
    """How one node's drain ended.

    Attributes:
        node: Node name.
        outcome: "drained", "failed" (deadline) or "abandoned" (operator shut down).
        pods_left: ``namespace/name`` -> why it is still there (empty when drained).
        message: the ``lastError`` written for a failed drain.
    """

    node: str
    outcome: DrainOutcome
    pods_left: dict[str, str] = field(default_factory=dict)
    message: str = ""


@dataclass
class _Job:
    node: str
    un_name: str | None
    grace: float
    instruction_id: str
    pods_left: dict[str, str] = field(default_factory=dict)


class DrainManager:
    """Runs node drains in a nursery owned by the operator (not by any session).

    Usage::

        drains = DrainManager(client, memory)
        await operator_nursery.start(drains.run)   # long-lived; cancel it to shut down
        drains.start("node-1", un_name="un-m-1", grace_seconds=30, instruction_id="r-1")

    Args:
        client: a KubeClient.
        memory: the DrainMemory shared with the UpcomingNode handler.
        retry_interval: nominal seconds between eviction rounds (~2 s).
        fast_poll: first re-check delay (seconds) while only Terminating Pods remain; doubles
            each round up to ``retry_interval``.
        jitter: fraction of ``retry_interval`` added or removed at random (0.25 -> 1.5..2.5 s).
        shutdown_timeout: seconds running drains may continue after :meth:`run` is cancelled.
        rng: random source for the jitter (injectable for tests).
        results_capacity: how many finished :class:`DrainResult` to keep in :attr:`results`.
    """

    def __init__(
        self,
        client: ReclaimKube,
        memory: DrainMemory,
        *,
        retry_interval: float = RETRY_INTERVAL_SECONDS,
        fast_poll: float = FAST_POLL_SECONDS,
        jitter: float = 0.25,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
        rng: random.Random | None = None,
        results_capacity: int = 1024,
    ) -> None:
        self._client = client
        self.memory = memory
        self._interval = retry_interval
        self._fast_poll = fast_poll
        self._jitter = jitter
        self.shutdown_timeout = shutdown_timeout
        self._rng = rng or random.Random()
        self._active: dict[str, _Job] = {}
        self._nursery: trio.Nursery | None = None
        self._scope: trio.CancelScope | None = None
        self._stop = trio.Event()
        self._closing = False
        self._idle = trio.Event()
        self._idle.set()
        self.results: OrderedDict[str, DrainResult] = OrderedDict()
        self._results_capacity = results_capacity
        self.completed_total = 0
        """Drains that ended Drained since construction (cumulative)."""
        self.failed_total = 0
        """Drains that ended Failed (deadline) since construction (cumulative)."""
        self.abandoned_total = 0
        """Drains abandoned at shutdown since construction (cumulative)."""

    # ------------------------------------------------------------------ lifecycle
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the drains until cancelled; then let them run up to ``shutdown_timeout``."""
        async with trio.open_nursery() as top:
            await top.start(self._host)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._closing = True
                if self._scope is not None:
                    self._scope.deadline = trio.current_time() + self.shutdown_timeout
                if self._active:
                    log.info(
                        "drain: shutting down, waiting up to %gs for nodes=%s",
                        self.shutdown_timeout,
                        sorted(self._active),
                    )
                self._stop.set()

    async def _host(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # Shielded: cancelling run() does not reach the drains; only our own deadline does.
        with trio.CancelScope(shield=True) as scope:
            self._scope = scope
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await self._stop.wait()
            self._nursery = None
        if scope.cancelled_caught:
            log.warning("drain: shutdown timeout reached, remaining drains abandoned")

    @property
    def active(self) -> frozenset[str]:
        """Nodes with a drain running."""
        return frozenset(self._active)

    def is_draining(self, node: str) -> bool:
        """True while a drain of ``node`` runs."""
        return node in self._active

    async def wait_idle(self) -> None:
        """Return once no drain is running (for tests and orderly shutdown)."""
        while self._active:
            await self._idle.wait()

    def start(
        self, node: str, *, un_name: str | None, grace_seconds: float, instruction_id: str
    ) -> bool:
        """Start draining ``node`` in the background (non-blocking).

        Args:
            node: Node name (already cordoned).
            un_name: its UpcomingNode, or None if there is none.
            grace_seconds: the drain deadline, seconds from now (> 0).
            instruction_id: for log lines.

        Returns:
            True if a drain started; False if one is already running for ``node`` or the
            manager is shutting down.

        Raises:
            RuntimeError: :meth:`run` is not running.
        """
        if node in self._active:
            log.info(
                "drain: already draining, not starting another node=%s instruction_id=%s",
                node,
                instruction_id,
            )
            return False
        if self._closing:
            log.warning("drain: shutting down, not starting node=%s", node)
            return False
        if self._nursery is None:
            raise RuntimeError("DrainManager.run is not running")
        job = _Job(node, un_name, grace_seconds, instruction_id)
        self._active[node] = job
        metrics.DRAINS_ACTIVE.inc()
        self._idle = trio.Event()
        self._nursery.start_soon(self._drain, job, name=f"drain {node}")
        log.info(
            "drain: started node=%s upcoming=%s grace=%gs instruction_id=%s",
            node,
            un_name,
            grace_seconds,
            instruction_id,
        )
        return True

    def _finish(self, job: _Job, result: DrainResult) -> None:
        if result.outcome == "drained":
            self.completed_total += 1
        elif result.outcome == "failed":
            self.failed_total += 1
        else:
            self.abandoned_total += 1
        metrics.DRAINS.labels(result.outcome).inc()
        self.results[job.node] = result
        self.results.move_to_end(job.node)
        while len(self.results) > self._results_capacity:
            self.results.popitem(last=False)

    # ------------------------------------------------------------------ one drain
    async def _drain(self, job: _Job) -> None:
        deadline = trio.current_time() + job.grace
        finished = False
        recorded = False  # outcome recorded (a cancelled final status write is not abandonment)
        try:
            with trio.CancelScope(deadline=deadline):
                await self._evict_until_empty(job, deadline)
                finished = True
            if not finished:
                finished = await self._final_check(job)
            recorded = True
            if finished:
                self._finish(job, DrainResult(job.node, "drained"))
                log.info(
                    "drain: node drained node=%s instruction_id=%s", job.node, job.instruction_id
                )
                with trio.move_on_after(STATUS_WRITE_TIMEOUT):
                    await self._write_drained(job)
            else:
                message = drain_failure_message(job.node, job.grace, job.pods_left)
                self._finish(job, DrainResult(job.node, "failed", dict(job.pods_left), message))
                log.warning(
                    "drain: deadline passed node=%s instruction_id=%s error=%s",
                    job.node,
                    job.instruction_id,
                    message,
                )
                with trio.move_on_after(STATUS_WRITE_TIMEOUT):
                    await self._write_failed(job, message)
        except trio.Cancelled:
            if not recorded:
                self._finish(job, DrainResult(job.node, "abandoned", dict(job.pods_left)))
                log.warning("drain: abandoned at shutdown node=%s", job.node)
            raise
        finally:
            metrics.DRAINS_ACTIVE.dec()
            del self._active[job.node]
            if not self._active:
                self._idle.set()

    async def _write_drained(self, job: _Job) -> None:
        if job.un_name is None:
            return
        try:
            if await patch_upcoming_status(self._client, job.un_name, {"phase": PHASE_DRAINED}):
                await delete_upcoming(self._client, job.un_name)
            self.memory.mark_drained(job.un_name)
            log.info("drain: upcoming node drained and deleted name=%s", job.un_name)
        except KubeError as exc:
            log.error("drain: could not record Drained name=%s error=%s", job.un_name, exc)

    async def _write_failed(self, job: _Job, message: str) -> None:
        if job.un_name is None:
            return
        try:
            await patch_upcoming_status(
                self._client, job.un_name, {"phase": PHASE_FAILED, "lastError": message}
            )
        except KubeError as exc:
            log.error("drain: could not record Failed name=%s error=%s", job.un_name, exc)

    async def _pause(self) -> None:
        spread = self._interval * self._jitter
        await trio.sleep(max(0.0, self._interval + self._rng.uniform(-spread, spread)))

    async def _final_check(self, job: _Job) -> bool:
        """One listing at the deadline: True if no evictable Pod is left (the drain succeeded
        just in time); otherwise ``job.pods_left`` is refreshed from it and False returned."""
        listing = None
        with trio.move_on_after(FINAL_CHECK_TIMEOUT):
            try:
                listing = await self._client.list(PODS, field_selector=f"spec.nodeName={job.node}")
            except KubeError as exc:
                log.warning("drain: final pod listing failed node=%s error=%s", job.node, exc)
        if listing is None:
            return False
        left: dict[str, str] = {}
        for pod in listing.items:
            if skip_reason(pod) is not None:
                continue
            key = pod_key(pod)
            terminating = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
            left[key] = job.pods_left.get(key) or ("terminating" if terminating else "not evicted")
        job.pods_left.clear()
        job.pods_left.update(left)
        log.info(
            "drain: final check at deadline node=%s pods_left=%d", job.node, len(job.pods_left)
        )
        return not left

    async def _evict_until_empty(self, job: _Job, deadline: float) -> None:
        stopped: dict[str, str] = {}
        fast = self._fast_poll
        while True:
            try:
                listing = await self._client.list(PODS, field_selector=f"spec.nodeName={job.node}")
            except KubeError as exc:
                log.warning("drain: listing pods failed node=%s error=%s", job.node, exc)
                job.pods_left["<pod list>"] = _error_text(exc)
                await self._pause()
                continue
            job.pods_left.pop("<pod list>", None)
            pending: dict[str, str] = {}
            blocked = evicted_now = terminating = False
            for pod in listing.items:
                if skip_reason(pod) is not None:
                    continue
                key = pod_key(pod)
                if key in stopped:
                    pending[key] = stopped[key]
                    continue
                meta = pod.get("metadata") or {}
                if meta.get("deletionTimestamp"):
                    pending[key] = "terminating"
                    terminating = True
                    continue
                remaining = deadline - trio.current_time()
                # P3: no timeout of our own here. A disruption webhook (Podseidon) may take up to
                # 10 s; KubeClient.request_timeout (30 s default) bounds the call, and so does
                # the drain deadline (test_eviction_waits_for_a_slow_disruption_webhook).
                try:
                    await self._client.evict(
                        meta.get("name", ""),
                        meta.get("namespace", ""),
                        grace_period_seconds=eviction_grace_seconds(pod, remaining),
                    )
                except KubeError as exc:
                    outcome = classify_eviction_error(exc)
                    metrics.EVICTIONS.labels(_EVICTION_RESULT[outcome]).inc()
                    text = _error_text(exc)
                    if outcome is EvictionOutcome.GONE:
                        log.info("drain: pod already gone node=%s pod=%s", job.node, key)
                        continue
                    if outcome is EvictionOutcome.STOP:
                        stopped[key] = f"eviction refused, not retried: {text}"
                        pending[key] = stopped[key]
                        log.warning(
                            "drain: eviction refused, giving up on pod node=%s pod=%s error=%s",
                            job.node,
                            key,
                            text,
                        )
                        continue
                    pending[key] = f"eviction blocked: {text}"
                    blocked = True
                    log.info(
                        "drain: eviction blocked, will retry node=%s pod=%s error=%s",
                        job.node,
                        key,
                        text,
                    )
                    continue
                metrics.EVICTIONS.labels("evicted").inc()
                pending[key] = "evicted, terminating"
                evicted_now = terminating = True
                log.info("drain: evicted node=%s pod=%s", job.node, key)
            job.pods_left.clear()
            job.pods_left.update(pending)
            if not pending:
                return
            if blocked or not terminating:
                # an eviction to retry, or only refused Pods: the normal jittered interval
                fast = self._fast_poll
                await self._pause()
                continue
            # only Terminating (and refused) Pods: re-list soon, backing off to the interval
            if evicted_now:
                fast = self._fast_poll
            if fast >= self._interval:
                await self._pause()
            else:
                await trio.sleep(fast)
                fast *= 2


# --------------------------------------------------------------------------- handler


@dataclass
class _Instruction:
    done: trio.Event = field(default_factory=trio.Event)
    nodes_started: int = 0


@dataclass(frozen=True)
class _Resolved:
    entry: str
    node: str | None
    un_name: str | None
    how: str


class ReclaimHandler:
    """Handles ReclaimInstruction frames: resolve, cordon, mark Draining, start drain, ack.

    Args:
        client: a KubeClient.
        drains: the operator's :class:`DrainManager` (already running).
        memory: the DrainMemory shared with the UpcomingNode handler.
        seen_capacity: how many instruction ids to remember for duplicate detection.
        upcoming_lookup: Node name -> UpcomingNodes pointing at it (an informer index); None
            lists every UpcomingNode from the apiserver instead (one list per such entry).
        node_lookup: providerID -> Nodes with it (an informer index); None lists every Node
            from the apiserver instead (one list per entry resolved by providerID).
        cordon_concurrency: entries resolved and cordoned at once (16): an instruction naming
            100 nodes is acked after ~7 cordon round trips, not 100.
    """

    def __init__(
        self,
        client: ReclaimKube,
        drains: DrainManager,
        memory: DrainMemory,
        *,
        seen_capacity: int = 4096,
        upcoming_lookup: UpcomingLookup | None = None,
        node_lookup: NodeLookup | None = None,
        cordon_concurrency: int = 16,
    ) -> None:
        if cordon_concurrency < 1:
            raise ValueError("cordon_concurrency must be >= 1")
        self._cordon_concurrency = cordon_concurrency
        self._client = client
        self._upcoming_lookup = upcoming_lookup
        self._node_lookup = node_lookup
        self._drains = drains
        self.memory = memory
        self._seen: OrderedDict[str, _Instruction] = OrderedDict()
        self._seen_capacity = seen_capacity

    async def on_reclaim_instruction(self, instr: pb.ReclaimInstruction, reply: Reply) -> None:
        """Cordon inline, hand drains to the DrainManager, ack ``nodes_started`` via ``reply``."""
        iid = instr.instruction_id
        log.info(
            "reclaim: instruction instruction_id=%s nodes=%s grace=%ss preemptor_priority=%s",
            iid,
            list(instr.nodes),
            instr.grace_period_seconds,
            instr.preemptor_priority,
        )
        prior = self._seen.get(iid) if iid else None
        if prior is not None:
            await prior.done.wait()
            log.info(
                "reclaim: duplicate instruction, re-acking instruction_id=%s nodes_started=%d",
                iid,
                prior.nodes_started,
            )
            self._ack(iid, prior.nodes_started, reply)
            return
        record = _Instruction()
        if iid:
            self._seen[iid] = record
            while len(self._seen) > self._seen_capacity:
                self._seen.popitem(last=False)
        try:
            cordoned = await self._cordon_all(instr)
        except BaseException:
            if iid and self._seen.get(iid) is record:
                del self._seen[iid]  # never completed: a re-issue must do the work again
            record.done.set()
            raise
        record.nodes_started = len(cordoned)
        record.done.set()
        # Seed 000 order: cordon every node, ack, then drain. The ack and the drain starts are
        # all synchronous (no checkpoint between them), so a session cancelled after the ack
        # cannot lose a drain, and no eviction starts before every node is cordoned.
        self._ack(iid, len(cordoned), reply)
        grace = effective_grace(instr.grace_period_seconds)
        for node, un_name in cordoned:
            if self._drains.is_draining(node):
                log.info("reclaim: node already draining node=%s", node)
                continue
            self._drains.start(node, un_name=un_name, grace_seconds=grace, instruction_id=iid)

    def _ack(self, iid: str, nodes_started: int, reply: Reply) -> None:
        msg = pb.OperatorMessage(
            reclaim_ack=pb.ReclaimAck(instruction_id=iid, nodes_started=nodes_started)
        )
        if reply(msg):
            log.info("reclaim: acked instruction_id=%s nodes_started=%d", iid, nodes_started)
        else:
            log.warning(
                "reclaim: ack not queued (outbox full or session ended), shard will re-issue "
                "instruction_id=%s",
                iid,
            )

    async def _cordon_all(self, instr: pb.ReclaimInstruction) -> list[tuple[str, str | None]]:
        """Cordon every resolvable node of ``instr`` (walking its UpcomingNode to Draining).

        Entries are resolved and cordoned concurrently, at most ``cordon_concurrency`` at once.

        Returns:
            ``[(node name, UpcomingNode name or None)]`` for the nodes actually cordoned, in
            instruction order (duplicates removed): the ack's ``nodes_started`` and the drains.
        """
        entries = [e for e in dict.fromkeys(instr.nodes) if e]  # de-duplicated, order kept
        results: list[tuple[str, str | None] | None] = [None] * len(entries)
        limiter = trio.CapacityLimiter(self._cordon_concurrency)

        async def one(i: int, entry: str) -> None:
            async with limiter:
                results[i] = await self._cordon_entry(entry)

        async with trio.open_nursery() as nursery:
            for i, entry in enumerate(entries):
                nursery.start_soon(one, i, entry)
        cordoned: list[tuple[str, str | None]] = []
        for item in results:
            if item is not None and all(node != item[0] for node, _ in cordoned):
                cordoned.append(item)
        return cordoned

    async def _cordon_entry(self, entry: str) -> tuple[str, str | None] | None:
        """Resolve one entry, cordon its Node and mark its UpcomingNode Draining."""
        r = await self._resolve(entry)
        if r.node is None:
            log.info(
                "reclaim: no Node for entry, nothing to cordon entry=%s upcoming=%s",
                entry,
                r.un_name,
            )
            if r.un_name is not None:
                await self._mark_draining(r.un_name)
            return None
        if not await self._cordon(r.node):
            return None
        if r.un_name is not None:
            await self._mark_draining(r.un_name)
        log.info("reclaim: cordoned node=%s entry=%s via=%s", r.node, entry, r.how)
        return (r.node, r.un_name)

    async def _call(self, fn: Callable[[], Any]) -> Any:
        async for attempt in kube_retrying():
            with attempt:
                return await fn()
        raise AssertionError("unreachable")

    async def _get(self, res: Resource, name: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._call(lambda: self._client.get(res, name))
        except NotFound:
            return None
        return result

    async def _resolve(self, entry: str) -> _Resolved:
        try:
            return await self._resolve_inner(entry)
        except KubeError as exc:
            log.error("reclaim: resolving entry failed entry=%s error=%s", entry, exc)
            return _Resolved(entry, None, None, "error")

    async def _resolve_inner(self, entry: str) -> _Resolved:
        un_name = upcoming_node_name(entry)
        un = await self._get(UPCOMING_NODES, un_name) if un_name else None
        node = await self._get(NODES, entry)
        if node is not None:
            if un is None:
                un = await self._upcoming_by_node_ref(entry)
            return _Resolved(entry, entry, _name(un), "node name")
        if un is None:
            return _Resolved(entry, None, None, "unresolved")
        status = un.get("status") or {}
        ref = (status.get("nodeRef") or {}).get("name")
        if ref and await self._get(NODES, ref) is not None:
            return _Resolved(entry, ref, _name(un), "upcoming nodeRef")
        provider_id = status.get("providerID")
        if provider_id and isinstance(provider_id, str):
            for n in await self._nodes_by_provider_id(provider_id):
                spec = n.get("spec")
                if (
                    isinstance(spec, Mapping)
                    and spec.get("providerID") == provider_id
                    and _name(n) is not None
                ):
                    return _Resolved(entry, _name(n), _name(un), "upcoming providerID")
        return _Resolved(entry, None, _name(un), "upcoming without node")

    async def _nodes_by_provider_id(self, provider_id: str) -> list[Mapping[str, Any]]:
        if self._node_lookup is not None:
            return sorted(self._node_lookup(provider_id), key=lambda n: _name(n) or "")
        listing = await self._call(lambda: self._client.list(NODES))
        return list(listing.items)

    async def _upcoming_by_node_ref(self, node: str) -> dict[str, Any] | None:
        if self._upcoming_lookup is not None:
            candidates = list(self._upcoming_lookup(node))
        else:
            listing = await self._call(lambda: self._client.list(UPCOMING_NODES))
            candidates = list(listing.items)
        found = sorted(
            (
                un
                for un in candidates
                if ((un.get("status") or {}).get("nodeRef") or {}).get("name") == node
                and _name(un) is not None
            ),
            key=lambda un: _name(un) or "",
        )
        if len(found) > 1:
            log.warning(
                "reclaim: several upcoming nodes point at node=%s names=%s, using the first",
                node,
                [_name(un) for un in found],
            )
        return dict(found[0]) if found else None

    async def _cordon(self, node: str) -> bool:
        try:
            await self._call(
                lambda: self._client.patch(NODES, node, {"spec": {"unschedulable": True}})
            )
        except NotFound:
            log.info("reclaim: node gone before cordon node=%s", node)
            return False
        except KubeError as exc:
            log.error("reclaim: cordon failed node=%s error=%s", node, exc)
            return False
        return True

    async def _mark_draining(self, un_name: str) -> None:
        self.memory.mark_draining(un_name)
        try:
            if not await patch_upcoming_status(self._client, un_name, {"phase": PHASE_DRAINING}):
                log.info("reclaim: upcoming node gone name=%s", un_name)
        except KubeError as exc:
            log.error("reclaim: marking Draining failed name=%s error=%s", un_name, exc)


def _name(obj: Mapping[str, Any] | None) -> str | None:
    if obj is None:
        return None
    name = (obj.get("metadata") or {}).get("name")
    return name if isinstance(name, str) and name else None
