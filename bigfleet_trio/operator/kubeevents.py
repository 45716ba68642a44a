"""Kubernetes Events the operator records on Nodes and Pods, for ``kubectl get events`` and
``kubectl describe``: what a reclaim did to a Node and its Pods.

:class:`EventRecorder` is a small recorder in the client-go sense: :meth:`~EventRecorder.record`
never blocks and never raises (it queues); one writer task (:meth:`~EventRecorder.run`, owned
by the operator's nursery) writes the queue in order through ``KubeClient.create_event`` (core/v1
Event, ``source.component`` ``bigfleet-operator``). A failed or dropped write is logged at DEBUG
and counted in ``bigfleet_operator_kube_events_total{reason,outcome}`` (outcome ``written``,
``failed`` or ``dropped``: queue full or recorder stopped): an Event is worth less than the
drain it describes, which never waits on it or fails because of it.

Reasons (reclaim: :mod:`.reclaim`): ``Reclaim``, ``Cordoned``, ``Drained`` (Normal) and
``DrainFailed`` (Warning, the UpcomingNode's ``lastError``) on the Node; ``Evicted`` (Normal) and
``EvictionBlocked`` (Warning, the apiserver's refusal naming the PodDisruptionBudget; once per
Pod per drain) and ``DisruptionBlocked`` (Warning, the disruption annotation that holds the Pod
until the deadline; once per Pod per drain) and ``InvalidDoNotDisruptAnnotation`` (Warning, a
``karpenter.sh/do-not-disrupt`` value that protects nothing; once per Pod per drain) on the Pod.
Outcomes (:mod:`.outcomes`): ``CapacityRequested``, ``MachineComing`` (Normal),
``CapacityRequestExcluded``, ``NoCapacityOffered``, ``NoMachineCame`` (Warning) on the Pod.
Shard frames (:mod:`.upcoming`, :mod:`.available`): ``WriteRefused`` (Warning) on the
UpcomingNode or AvailableCapacity whose write the apiserver refused for good (422 Invalid and the
like; docs/rules.md#level-triggered-operator).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

import trio
from prometheus_client import Counter

__all__ = [
    "EVENT_COMPONENT",
    "EventRecorder",
    "KubeEventSink",
    "REASON_CORDONED",
    "REASON_DRAINED",
    "REASON_DISRUPTION_BLOCKED",
    "REASON_DRAIN_FAILED",
    "REASON_EVICTED",
    "REASON_INVALID_DO_NOT_DISRUPT",
    "REASON_EVICTION_BLOCKED",
    "REASON_RECLAIM",
    "REASON_WRITE_REFUSED",
    "node_object",
    "object_ref",
    "pod_object",
]

log = logging.getLogger(__name__)

EVENT_COMPONENT = "bigfleet-operator"
"""``source.component`` / ``reportingComponent`` of the operator's Events."""

REASON_RECLAIM = "Reclaim"
REASON_CORDONED = "Cordoned"
REASON_EVICTION_BLOCKED = "EvictionBlocked"
REASON_EVICTED = "Evicted"
REASON_DRAINED = "Drained"
REASON_DRAIN_FAILED = "DrainFailed"
REASON_WRITE_REFUSED = "WriteRefused"
REASON_DISRUPTION_BLOCKED = "DisruptionBlocked"
REASON_INVALID_DO_NOT_DISRUPT = "InvalidDoNotDisruptAnnotation"  # Karpenter's reason

#: Events waiting to be written before :meth:`EventRecorder.record` drops new ones.
DEFAULT_CAPACITY = 1024
#: Seconds the writer keeps writing what is queued after it is cancelled (shutdown).
FLUSH_TIMEOUT = 2.0
#: Node uids remembered (name -> uid) for Events raised by name only.
UID_CACHE = 4096

KUBE_EVENTS = Counter(
    "bigfleet_operator_kube_events",
    "Kubernetes Events the operator recorded, by reason and outcome (written|failed|dropped).",
    ["reason", "outcome"],
)


class KubeEventSink(Protocol):
    """``KubeClient.create_event`` (docs/kube-api.md): True when written, False when dropped."""

    async def create_event(
        self,
        involved: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        type: str = "Normal",  # noqa: A002 - mirrors KubeClient
        component: str = "bigfleet-trio",
    ) -> object: ...


def node_object(name: str, uid: str | None = None) -> dict[str, Any]:
    """A Node reference for ``involvedObject`` (the uid lets ``kubectl describe node`` find it)."""
    meta: dict[str, Any] = {"name": name}
    if uid:
        meta["uid"] = uid
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta}


def object_ref(api_version: str, kind: str, name: str) -> dict[str, Any]:
    """A reference to a cluster-scoped object by name (``apiVersion`` ``group/version``); its
    Events land in ``default``, as client-go's do for cluster-scoped objects."""
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}}


def pod_object(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A Pod reference (name, namespace, uid) from a Pod as listed (list items carry no kind)."""
    md = pod.get("metadata")
    md = md if isinstance(md, Mapping) else {}
    meta = {k: md[k] for k in ("name", "namespace", "uid") if isinstance(md.get(k), str)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta}


_Item = tuple[dict[str, Any], str, str, str]


class EventRecorder:
    """Queues Events and writes them in order from one task.

    Usage::

        recorder = EventRecorder(client)
        await operator_nursery.start(recorder.run)
        recorder.record(node_object("n-1"), reason="Cordoned", message="...")

    Args:
        sink: a KubeClient (its ``create_event``).
        component: ``source.component`` of every Event.
        capacity: queued Events before new ones are dropped (counted).
    """

    def __init__(
        self,
        sink: KubeEventSink,
        *,
        component: str = EVENT_COMPONENT,
        capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        self._sink = sink
        self.component = component
        self._send, self._recv = trio.open_memory_channel[_Item](capacity)
        self._pending = 0
        self._abandoned = False
        self._idle = trio.Event()
        self._idle.set()
        self._uids: OrderedDict[str, str] = OrderedDict()

    def note_node(self, node: Mapping[str, Any] | None) -> None:
        """Remember a Node's uid (from an object the apiserver returned) for later Events."""
        md = node.get("metadata") if isinstance(node, Mapping) else None
        if not isinstance(md, Mapping):
            return
        name, uid = md.get("name"), md.get("uid")
        if isinstance(name, str) and isinstance(uid, str) and name and uid:
            self._uids[name] = uid
            self._uids.move_to_end(name)
            while len(self._uids) > UID_CACHE:
                self._uids.popitem(last=False)

    def node(self, name: str) -> dict[str, Any]:
        """:func:`node_object` for ``name`` with its uid if :meth:`note_node` saw it."""
        return node_object(name, self._uids.get(name))

    def record(
        self,
        involved: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        type: str = "Normal",  # noqa: A002 - as create_event
    ) -> None:
        """Queue one Event about ``involved``. Never blocks, never raises."""
        try:
            self._send.send_nowait((dict(involved), reason, message, type))
        except (trio.WouldBlock, trio.BrokenResourceError) as exc:
            KUBE_EVENTS.labels(reason, "dropped").inc()
            why = "queue full" if isinstance(exc, trio.WouldBlock) else "recorder stopped"
            log.debug("kube event dropped (%s) reason=%s", why, reason, extra={"reason": reason})
            return
        self._pending += 1
        self._idle = trio.Event() if self._idle.is_set() else self._idle

    async def wait_written(self) -> None:
        """Return once every queued Event was written or given up on (tests, shutdown)."""
        while self._pending:
            await self._idle.wait()

    def abandon(self) -> None:
        """Leadership lost: when :meth:`run` is cancelled, write nothing more (no flush)
        (docs/rules.md#leadership-loss). Never blocks."""
        self._abandoned = True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write queued Events until cancelled; then what is queued, for up to FLUSH_TIMEOUT
        (none after :meth:`abandon`).

        Runs once: afterwards :meth:`record` drops (and counts) every Event.
        """
        task_status.started()
        try:
            async for item in self._recv:
                await self._write(item)
        finally:
            # no flush after a lost leadership: another replica may lead and write now
            flush = 0.0 if self._abandoned else FLUSH_TIMEOUT
            with trio.CancelScope(shield=True), trio.move_on_after(flush):
                while True:
                    try:
                        item = self._recv.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                    await self._write(item)
            self._recv.close()

    async def _write(self, item: _Item) -> None:
        involved, reason, message, type_ = item
        try:
            ok = await self._sink.create_event(
                involved, reason=reason, message=message, type=type_, component=self.component
            )
        except Exception as exc:  # an Event must never take the writer (or a drain) down
            ok = False
            log.debug("kube event not written reason=%s error=%s", reason, exc,
                      extra={"reason": reason})
        else:
            if ok is False:  # KubeClient logged why
                log.debug("kube event not written reason=%s", reason, extra={"reason": reason})
        KUBE_EVENTS.labels(reason, "failed" if ok is False else "written").inc()
        self._pending -= 1
        if not self._pending:
            self._idle.set()
