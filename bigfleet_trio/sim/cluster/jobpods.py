"""The simulated kubelet's part for Jobs: a Job's Pod that has been Running for its run time
succeeds (phase Succeeded, containers terminated with exit code 0), so the Job controller can
count it. Shared by :class:`~bigfleet_trio.sim.cluster.scheduler.PodScheduler` and by the
demo's ``--keep-running`` cluster, whose Pods another binder places.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.errors import ApiError, KubeTransportError
from bigfleet_trio.kube.informer import Informer
from bigfleet_trio.kube.resources import PODS
from bigfleet_trio.sim.binder import is_bound, is_terminal

from .controllers import rfc3339_now
from .workloads import controller_ref

log = logging.getLogger(__name__)

__all__ = ["JobPodFinisher", "RUN_SECONDS_ANNOTATION", "succeeded_status"]

#: Per-Job (template) annotation: seconds a Job Pod runs before it succeeds (overrides the default).
RUN_SECONDS_ANNOTATION = "sim.bigfleet.lucy.sh/run-seconds"


def _key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name')}"


def succeeded_status(pod: Mapping[str, Any], stamp: str) -> dict[str, Any]:
    """The status a kubelet reports for a Pod whose containers all exited 0 at ``stamp``
    (RFC 3339): phase Succeeded, Ready and ContainersReady False with reason PodCompleted."""
    return {
        "phase": "Succeeded",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp},
            {"type": "Ready", "status": "False", "reason": "PodCompleted",
             "lastTransitionTime": stamp},
            {"type": "ContainersReady", "status": "False", "reason": "PodCompleted",
             "lastTransitionTime": stamp},
        ],
        "containerStatuses": [
            {"name": c.get("name", ""), "image": c.get("image", ""), "ready": False,
             "started": False, "restartCount": 0,
             "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": stamp}}}
            for c in (pod.get("spec") or {}).get("containers") or [] if isinstance(c, Mapping)
        ],
    }


class JobPodFinisher:
    """Finishes the Running Pods a Job controls after their run time (see the module docstring).

    Args:
        client: a :class:`KubeClient` (owned by the caller).
        pods: the Pod :class:`Informer` to follow (run by the caller); a handler is added to it.
        job_run_seconds: seconds a Job's Pod runs once Running before it succeeds; a Pod
            (template) annotation ``sim.bigfleet.lucy.sh/run-seconds`` overrides it; ``None``:
            Job Pods never finish.
        limiter: bounds the status writes in flight (shared with the caller's other writes).
        on_succeeded: optional ``(namespace, name)`` callback after each Pod's status write.

    Attributes:
        succeeded: Pods marked Succeeded.
    """

    def __init__(self, client: KubeClient, pods: Informer, *,
                 job_run_seconds: float | None = 30.0,
                 limiter: trio.CapacityLimiter | None = None,
                 on_succeeded: Callable[[str, str], None] | None = None) -> None:
        self.client = client
        self.pods = pods
        self.job_run_seconds = job_run_seconds
        self.on_succeeded = on_succeeded
        self.succeeded = 0
        self._limiter = limiter or trio.CapacityLimiter(32)
        self._due: list[tuple[float, str, str]] = []  # (deadline, key, uid), a heap
        self._scheduled: set[str] = set()
        self._wake: trio.Event | None = None
        pods.add_handler(on_add=self._observe, on_update=lambda _o, n: self._observe(n))

    def run_seconds(self, pod: Mapping[str, Any]) -> float | None:
        """Seconds ``pod`` runs before it succeeds, or None when it is no Job's or never ends."""
        ref = controller_ref(pod)
        if ref is None or ref.get("kind") != "Job":
            return None
        text = ((pod.get("metadata") or {}).get("annotations") or {}).get(RUN_SECONDS_ANNOTATION)
        if text is not None:
            try:
                return max(0.0, float(text))
            except ValueError:
                log.warning("ignoring %s=%r on pod=%s", RUN_SECONDS_ANNOTATION, text, _key(pod))
        return self.job_run_seconds

    def _observe(self, pod: Mapping[str, Any]) -> None:
        if not is_bound(pod) or (pod.get("status") or {}).get("phase") != "Running":
            return
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if not uid or uid in self._scheduled:
            return
        seconds = self.run_seconds(pod)
        if seconds is None or not math.isfinite(seconds):
            return
        self._scheduled.add(uid)
        heapq.heappush(self._due, (trio.current_time() + seconds, _key(pod), uid))
        if self._wake is not None:
            self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Finish Pods as they come due, until cancelled; ``started`` at once."""
        task_status.started()
        while True:
            self._wake = trio.Event()
            with trio.move_on_at(self._due[0][0] if self._due else math.inf):
                await self._wake.wait()
            now = trio.current_time()
            batch: list[tuple[str, str]] = []
            while self._due and self._due[0][0] <= now:
                _, key, uid = heapq.heappop(self._due)
                self._scheduled.discard(uid)
                batch.append((key, uid))
            if batch:
                async with trio.open_nursery() as nursery:
                    for key, uid in batch:
                        nursery.start_soon(self._succeed, key, uid)

    async def _succeed(self, key: str, uid: str) -> None:
        pod = self.pods.store.get(key)
        if pod is None or pod["metadata"].get("uid") != uid or is_terminal(pod):
            return
        ns, name = key.split("/", 1)
        status = succeeded_status(pod, rfc3339_now())
        try:
            async with self._limiter:
                await self.client.patch(PODS, name, {"status": status}, ns, subresource="status")
        except (ApiError, KubeTransportError) as exc:
            log.info("pod finish failed pod=%s: %s", key, exc)
            return
        self.succeeded += 1
        if self.on_succeeded is not None:
            self.on_succeeded(ns, name)
