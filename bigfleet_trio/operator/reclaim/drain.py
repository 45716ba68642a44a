"""The drains of reclaim: :class:`DrainManager`, one Trio task per node being drained.

Owned by the operator's nursery (not the session's), each drain evicts a cordoned Node's Pods
in rounds under its own deadline and records Drained or Failed on the node's UpcomingNode.
The rules it applies are the pure functions of :mod:`.plan`; :mod:`.handler` starts drains.
"""

from __future__ import annotations

import logging
import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import trio

from bigfleet_trio.kube.api import KubeAPI
from bigfleet_trio.kube.disruption import disruption_blocker, invalid_do_not_disrupt
from bigfleet_trio.kube.errors import KubeError
from bigfleet_trio.kube.resources import PODS
from bigfleet_trio.observability import events as kinds
from bigfleet_trio.observability import metrics
from bigfleet_trio.observability.events import EventFeed
from bigfleet_trio.operator.kubeevents import (
    REASON_DISRUPTION_BLOCKED,
    REASON_DRAIN_FAILED,
    REASON_DRAINED,
    REASON_EVICTED,
    REASON_EVICTION_BLOCKED,
    REASON_INVALID_DO_NOT_DISRUPT,
    EventRecorder,
    pod_object,
)
from bigfleet_trio.operator.upcoming.handler import delete_upcoming, patch_upcoming_status
from bigfleet_trio.operator.upcoming.plan import PHASE_DRAINED, PHASE_FAILED, DrainMemory

from .plan import (
    DEFAULT_SHUTDOWN_TIMEOUT,
    FAST_POLL_SECONDS,
    FINAL_CHECK_TIMEOUT,
    RETRY_INTERVAL_SECONDS,
    STATUS_WRITE_TIMEOUT,
    DrainResult,
    EvictionOutcome,
    budget_refusal,
    classify_eviction_error,
    drain_failure_message,
    error_text,
    eviction_grace_seconds,
    eviction_result_label,
    pod_key,
    protected_wait,
    refusal_text,
    skip_reason,
)
from .resume import (
    RESUMED_INSTRUCTION_ID,
    expired_drain_message,
    resumed_failure_message,
    utc_now,
)

__all__ = ["DrainManager"]

# The package's logger: log lines keep the logger name they had before the package was split.
log = logging.getLogger(__package__)


@dataclass
class _Job:
    node: str
    un_name: str | None
    grace: float
    instruction_id: str
    pods_left: dict[str, str] = field(default_factory=dict)
    blocked_reported: set[str] = field(default_factory=set)  # Pods with an EvictionBlocked Event
    held_reported: set[str] = field(default_factory=set)  # Pods with a DisruptionBlocked Event
    invalid_reported: set[str] = field(default_factory=set)  # Pods warned of a do-not-disrupt value
    resumed_deadline: str | None = None  # a drain resumed after a restart: its recorded deadline


class DrainManager:
    """Runs node drains in a nursery owned by the operator (not by any session).

    Started by the operator (``await operator_nursery.start(drains.run)``), never by the
    session, so a reconnect does not cancel a drain. One task per node, each under a cancel scope
    whose deadline is its own grace period (the reference drained nodes in sequence under one
    shared deadline: docs/reference.md#drain-deadline-shared-and-detached). A drain lists the
    node's Pods, skips those :func:`.plan.skip_reason` names and evicts the rest (outcomes by
    :func:`.plan.classify_eviction_error`) in rounds until none is left -> Drained (the
    UpcomingNode is deleted, the memory keeps a tombstone), or until the deadline -> one last
    listing, then Drained if the Pods are gone by now, else Failed with ``lastError`` naming the
    Pods left and why.

    Metrics: ``bigfleet_operator_drains_total{outcome=drained|failed|abandoned}``,
    ``bigfleet_operator_drains_active``, ``bigfleet_operator_evictions_total{result=evicted|gone|
    blocked|refused}`` (one per eviction call), and the cumulative ``completed_total``,
    ``failed_total``, ``abandoned_total`` attributes (not bounded by the :attr:`results` ring).

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
        events: optional :class:`EventRecorder` for Kubernetes Events: ``Evicted`` and
            ``EvictionBlocked`` (first refusal per Pod per drain, the apiserver's message) on
            the Pod, ``Drained`` / ``DrainFailed`` (the ``lastError``) on the Node.
        feed: optional :class:`EventFeed` for ``drain_started`` / ``drain_finished``.
        disruption_annotations: a Pod marked ``karpenter.sh/do-not-disrupt`` or
            ``cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`` is evicted last, only
            near the deadline (:func:`~.plan.protected_wait`), with a ``DisruptionBlocked``
            Event; False (``--disruption-annotations=false``) evicts it like any other.
        wall_clock: the wall clock (aware) a ``karpenter.sh/do-not-disrupt`` duration expires
            by (from the Pod's ``status.startTime``); tests inject one.
    """

    def __init__(
        self,
        client: KubeAPI,
        memory: DrainMemory,
        *,
        retry_interval: float = RETRY_INTERVAL_SECONDS,
        fast_poll: float = FAST_POLL_SECONDS,
        jitter: float = 0.25,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
        rng: random.Random | None = None,
        results_capacity: int = 1024,
        events: EventRecorder | None = None,
        feed: EventFeed | None = None,
        disruption_annotations: bool = True,
        wall_clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._client = client
        self._honour_annotations = disruption_annotations
        self._wall_clock = wall_clock
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
        self._events = events
        self._feed = feed
        self.completed_total = 0
        """Drains that ended Drained since construction (cumulative)."""
        self.failed_total = 0
        """Drains that ended Failed (deadline) since construction (cumulative)."""
        self.abandoned_total = 0
        """Drains abandoned at shutdown since construction (cumulative)."""

    # ------------------------------------------------------------------ lifecycle
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the drains until cancelled; then let them run up to ``shutdown_timeout``.

        Bounded so an operator shutdown neither waits forever on a PodDisruptionBudget nor
        drops a drain that is about to finish; what is still running then is abandoned and
        counted.
        """
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

    def abandon(self) -> None:
        """Stop every drain now, with no shutdown grace (this replica lost its leadership:
        another may already lead and drain; docs/rules.md#leadership-loss). The drains end
        abandoned and counted; :meth:`start` refuses new ones. Idempotent; never blocks."""
        self._closing = True
        if self._active:
            log.warning("drain: leadership lost, drains abandoned now nodes=%s",
                        sorted(self._active))
        if self._scope is not None:
            self._scope.cancel()
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
        self,
        node: str,
        *,
        un_name: str | None,
        grace_seconds: float,
        instruction_id: str,
        resumed_deadline: str | None = None,
    ) -> bool:
        """Start draining ``node`` in the background (non-blocking).

        Args:
            node: Node name (already cordoned).
            un_name: its UpcomingNode, or None if there is none.
            grace_seconds: the drain deadline, seconds from now (> 0).
            instruction_id: for log lines.
            resumed_deadline: set by :meth:`resume` only (the recorded deadline).

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
        job = _Job(node, un_name, grace_seconds, instruction_id, resumed_deadline=resumed_deadline)
        self._active[node] = job
        metrics.DRAINS_ACTIVE.inc()
        if self._idle.is_set():  # idle -> busy; a busy manager's waiters keep their event
            self._idle = trio.Event()
        self._nursery.start_soon(self._drain, job, name=f"drain {node}")
        log.info(
            "drain: started node=%s upcoming=%s grace=%gs instruction_id=%s",
            node,
            un_name,
            grace_seconds,
            instruction_id,
        )
        if self._feed is not None:
            self._feed.publish(
                kinds.DRAIN_STARTED, node=node, instruction_id=instruction_id,
                grace_seconds=grace_seconds,
            )
        return True

    def resume(self, node: str, *, un_name: str, remaining: float, deadline: str) -> bool:
        """Take up a drain an earlier operator process started.

        The rule: docs/rules.md#reclaim-resume-after-restart.

        Like :meth:`start` (one drain per node: a ReclaimInstruction naming ``node`` later gets
        no second drain), under the recorded ``deadline``: ``remaining`` seconds from now; if
        that is <= 0 the drain ends Failed at once, without evicting. ``un_name`` is marked
        draining in the memory, as the reclaim handler does.

        Returns:
            True if a drain started (see :meth:`start`).
        """
        self.memory.mark_draining(un_name)
        log.info(
            "drain: resuming after restart node=%s upcoming=%s deadline=%s remaining=%gs",
            node,
            un_name,
            deadline,
            remaining,
        )
        return self.start(
            node,
            un_name=un_name,
            grace_seconds=remaining,
            instruction_id=RESUMED_INSTRUCTION_ID,
            resumed_deadline=deadline,
        )

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
        if self._feed is not None:
            self._feed.publish(
                kinds.DRAIN_FINISHED, node=job.node, instruction_id=job.instruction_id,
                outcome=result.outcome, error=result.message, pods_left=len(result.pods_left),
            )
        if self._events is None:
            return
        if result.outcome == "drained":
            self._events.record(
                self._events.node(job.node), reason=REASON_DRAINED,
                message=f"Drained for reclaim {job.instruction_id}: no evictable Pod left",
            )
        elif result.outcome == "failed":
            self._events.record(
                self._events.node(job.node), reason=REASON_DRAIN_FAILED, message=result.message,
                type="Warning",
            )

    def _eviction_blocked(self, job: _Job, pod: dict[str, Any], key: str, why: str) -> None:
        """The first refused eviction of ``pod`` in this drain becomes a Warning Event
        (``why``: ``": <error>"`` or ``" by PodDisruptionBudget ns/name: ..."``)."""
        if self._events is None or key in job.blocked_reported:
            return
        job.blocked_reported.add(key)
        self._events.record(
            pod_object(pod), reason=REASON_EVICTION_BLOCKED, type="Warning",
            message=f"Eviction to drain node {job.node} refused{why}",
        )

    def _holds(self, job: _Job, pod: dict[str, Any], key: str, deadline: float) -> str | None:
        """Why this round leaves ``pod`` alone (its disruption annotation), or None."""
        if not self._honour_annotations:
            return None
        annotations = (pod.get("metadata") or {}).get("annotations")
        invalid = invalid_do_not_disrupt(annotations)
        if invalid is not None and self._events is not None and key not in job.invalid_reported:
            job.invalid_reported.add(key)  # once per drain, as DisruptionBlocked
            self._events.record(pod_object(pod), reason=REASON_INVALID_DO_NOT_DISRUPT,
                                type="Warning", message=invalid)
        blocker = disruption_blocker(
            annotations, started=(pod.get("status") or {}).get("startTime"),
            now=self._wall_clock(),
        )
        remaining = deadline - trio.current_time()
        if blocker is None or not protected_wait(pod, remaining, self._interval):
            return None
        if self._events is not None and key not in job.held_reported:  # once per drain
            job.held_reported.add(key)
            self._events.record(
                pod_object(pod), reason=REASON_DISRUPTION_BLOCKED, type="Warning",
                message=f"Drain of node {job.node} for reclaim {job.instruction_id} leaves "
                "this Pod for last while its annotation protects it, evicting it near the "
                f"deadline (in {int(remaining)} s) at the latest: {blocker}",
            )
        return f"held until the deadline: {blocker}"

    # ------------------------------------------------------------------ one drain
    async def _drain(self, job: _Job) -> None:
        deadline = trio.current_time() + job.grace
        finished = False
        recorded = False  # outcome recorded (a cancelled final status write is not abandonment)
        try:
            if job.grace > 0:  # a resumed drain whose deadline passed fails at once
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
                message = self._failure_message(job)
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

    @staticmethod
    def _failure_message(job: _Job) -> str:
        if job.resumed_deadline is None:
            return drain_failure_message(job.node, job.grace, job.pods_left)
        if job.grace <= 0:
            return expired_drain_message(job.node, job.resumed_deadline)
        return resumed_failure_message(job.node, job.resumed_deadline, job.pods_left)

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

    async def _evict_one(
        self, job: _Job, pod: dict[str, Any], key: str, deadline: float
    ) -> tuple[str, str] | None:
        """Evict one listed Pod: ``("evicted" | "blocked" | "stopped", why)`` for the drain's
        pods_left, or None when the Pod is already gone."""
        meta = pod.get("metadata") or {}
        remaining = deadline - trio.current_time()
        # No timeout of our own here. A disruption webhook (Podseidon) may take up to 10 s
        # to answer; KubeClient.request_timeout (30 s default) bounds the call, and so does
        # the drain deadline (test_eviction_waits_for_a_slow_disruption_webhook).
        try:
            # The UID precondition: this Pod, not one recreated under its name (a
            # StatefulSet's) on another node since the LIST; that one answers 409, and
            # the next LIST no longer shows it here (docs/rules.md#reclaim-drain).
            await self._client.evict(
                meta.get("name", ""),
                meta.get("namespace", ""),
                grace_period_seconds=eviction_grace_seconds(pod, remaining),
                uid=meta.get("uid") or None,
            )
        except KubeError as exc:
            outcome = classify_eviction_error(exc)
            metrics.EVICTIONS.labels(eviction_result_label(outcome)).inc()
            text = refusal_text(exc, meta.get("namespace", ""))
            if outcome is EvictionOutcome.GONE:
                log.info("drain: pod already gone node=%s pod=%s", job.node, key)
                return None
            # the budget leads the text: "refused by PodDisruptionBudget ns/name: ..."
            why = f" by {text}" if budget_refusal(exc) is not None else f": {text}"
            self._eviction_blocked(job, pod, key, why)
            if outcome is EvictionOutcome.STOP:
                log.warning(
                    "drain: eviction refused, giving up on pod node=%s pod=%s error=%s",
                    job.node,
                    key,
                    text,
                )
                return "stopped", f"eviction refused, not retried{why}"
            log.info(
                "drain: eviction blocked, will retry node=%s pod=%s error=%s",
                job.node,
                key,
                text,
            )
            return "blocked", f"eviction blocked{why}"
        metrics.EVICTIONS.labels("evicted").inc()
        log.info("drain: evicted node=%s pod=%s", job.node, key)
        if self._events is not None:
            self._events.record(
                pod_object(pod), reason=REASON_EVICTED,
                message=f"Evicted to drain node {job.node} "
                f"(reclaim {job.instruction_id})",
            )
        return "evicted", "evicted, terminating"

    async def _evict_until_empty(self, job: _Job, deadline: float) -> None:
        stopped: dict[str, str] = {}
        fast = self._fast_poll
        while True:
            try:
                listing = await self._client.list(PODS, field_selector=f"spec.nodeName={job.node}")
            except KubeError as exc:
                log.warning("drain: listing pods failed node=%s error=%s", job.node, exc)
                job.pods_left["<pod list>"] = error_text(exc)
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
                held = self._holds(job, pod, key, deadline)
                if held is not None:
                    pending[key] = held
                    continue
                result = await self._evict_one(job, pod, key, deadline)
                if result is None:
                    continue  # already gone
                state, pending[key] = result
                if state == "stopped":
                    stopped[key] = pending[key]
                elif state == "blocked":
                    blocked = True
                else:
                    evicted_now = terminating = True
            job.pods_left.clear()
            job.pods_left.update(pending)
            if not pending:
                return
            if blocked or not terminating:
                # an eviction to retry, or only refused Pods: the normal jittered interval
                fast = self._fast_poll
                await self._pause()
                continue
            # only Terminating (and refused) Pods: re-list soon, backing off to the interval, so
            # a Pod with a short grace that is gone in a moment does not cost a whole round
            if evicted_now:
                fast = self._fast_poll
            if fast >= self._interval:
                await self._pause()
            else:
                await trio.sleep(fast)
                fast *= 2
