"""The simulated kube-controller-manager: Deployment, ReplicaSet, StatefulSet and Job controllers
as Kubernetes clients over HTTP (our :class:`~bigfleet_trio.kube.KubeClient` and informers), so
they run beside any apiserver. Decisions come from :mod:`.workloads` (pure); this module watches,
queues and writes.

Writes: Pods (POST/DELETE), ReplicaSets (POST, ``spec.replicas`` merge patches), and every
workload's ``status`` subresource (merge patch, only when it changed). Pods are admitted the way
the real apiserver's admission plugins would before they are created (request = limit defaulting,
PriorityClass -> ``spec.priority``, RuntimeClass overhead/scheduling, ExtendedResourceToleration
for ``nvidia.com/gpu``), because the embedded apiserver has no admission chain.
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.errors import AlreadyExists, ApiError, KubeTransportError, NotFound
from bigfleet_trio.kube.informer import IndexFunc, Informer, drop_managed_fields
from bigfleet_trio.kube.resources import (
    DEPLOYMENTS,
    JOBS,
    PODS,
    PRIORITY_CLASSES,
    REPLICASETS,
    RUNTIME_CLASSES,
    STATEFULSETS,
    Resource,
)

from .queue import WorkQueue
from .workloads import (
    COMPLETION_INDEX,
    controller_ref,
    deployment_replicasets,
    deployment_status,
    job_finished_at,
    job_plan,
    owner_ref,
    pod_from_template,
    random_suffix,
    replicaset_diff,
    replicaset_status,
    statefulset_plan,
    statefulset_status,
    template_hash,
)

log = logging.getLogger(__name__)

__all__ = ["WorkloadControllers", "admit", "status_patch", "rfc3339_now"]

Key = tuple[str, str, str]  # (kind, namespace, name)
GPU = "nvidia.com/gpu"
OWNER_INDEX = "owner"
#: Seconds before an unobserved create/delete stops counting (client-go uses 5 minutes).
EXPECTATION_TTL = 60.0


def rfc3339_now() -> str:
    """UTC now as ``YYYY-MM-DDTHH:MM:SSZ``."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: str) -> float | None:
    try:
        return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()
    except (TypeError, ValueError):
        return None


def _owner_index(obj: Any) -> list[str]:
    ref = controller_ref(obj)
    return [str(ref.get("uid"))] if ref is not None and ref.get("uid") else []


def status_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any] | None:
    """A merge patch turning status ``old`` into ``new`` (removed keys set to null), or None when
    nothing changed."""
    old = old or {}
    patch: dict[str, Any] = {k: v for k, v in new.items() if old.get(k) != v}
    for k in old:
        if k not in new:
            patch[k] = None
    return patch or None


def add_extended_resource_tolerations(pod: dict[str, Any],
                                      tainted: tuple[str, ...] = (GPU,)) -> None:
    """The ExtendedResourceToleration admission plugin: a Pod requesting an extended resource in
    ``tainted`` tolerates ``<resource>:NoSchedule`` (``operator: Exists``), as GKE enables it."""
    spec = pod.setdefault("spec", {})
    wanted: set[str] = set()
    for c in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
        res = (c or {}).get("resources") or {}
        for section in ("requests", "limits"):
            wanted.update(k for k in (res.get(section) or {}) if k in tainted)
    if not wanted:
        return
    tols = list(spec.get("tolerations") or [])
    for key in sorted(wanted):
        if not any(t.get("key") == key and t.get("operator") == "Exists" for t in tols):
            tols.append({"key": key, "operator": "Exists", "effect": "NoSchedule"})
    spec["tolerations"] = tols


def admit(
    pod: dict[str, Any],
    priority_classes: list[dict[str, Any]],
    runtime_classes: list[dict[str, Any]],
) -> dict[str, Any]:
    """Run defaulting and the admission steps the embedded apiserver lacks (see the module
    docstring). Mutates and returns ``pod``.

    Raises:
        bigfleet_trio.sim.expand.ExpandError: admission would reject the Pod (unknown
            PriorityClass or RuntimeClass, conflicting priority or overhead).
    """
    from bigfleet_trio.sim.expand import (
        _priority_classes,
        _runtime_classes,
        admit_pod,
        apply_pod_defaults,
    )

    apply_pod_defaults(pod)
    pcs, default = _priority_classes(priority_classes)
    admit_pod(pod, pcs, _runtime_classes(runtime_classes), default)
    add_extended_resource_tolerations(pod)
    return pod


@dataclass
class _Expect:
    creates: dict[str, float]
    deletes: dict[str, float]


class WorkloadControllers:
    """Deployment -> ReplicaSet -> Pod, StatefulSet and Job controllers over one client.

    Args:
        client: a :class:`KubeClient` (owned by the caller).
        pods: a running Pod :class:`Informer` to share (None: one is made here, with
            ``drop_managed_fields`` as transform and the owner index).
        workers: reconciles running at once.
        write_concurrency: Pod creates/deletes in flight per reconcile.
        rng: random source for Pod name suffixes.
        on_event: optional ``(kind, fields)`` callback for every write decision (benchmarks).

    Attributes:
        created, deleted, status_writes, errors: counters.
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        pods: Informer | None = None,
        workers: int = 8,
        write_concurrency: int = 32,
        rng: random.Random | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.client = client
        self.workers = workers
        self.write_concurrency = write_concurrency
        self.rng = rng or random.Random()
        self.on_event = on_event
        self.queue: WorkQueue[Key] = WorkQueue()
        idx: dict[str, IndexFunc] = {OWNER_INDEX: _owner_index}
        self.pods = pods or Informer(client, PODS, transform=drop_managed_fields, indexers=idx)
        self._own_pods = pods is None
        self.informers: dict[str, Informer] = {
            "Deployment": Informer(client, DEPLOYMENTS, transform=drop_managed_fields),
            "ReplicaSet": Informer(client, REPLICASETS, transform=drop_managed_fields,
                                   indexers=idx),
            "StatefulSet": Informer(client, STATEFULSETS, transform=drop_managed_fields),
            "Job": Informer(client, JOBS, transform=drop_managed_fields),
        }
        self.priority_classes = Informer(client, PRIORITY_CLASSES)
        self.runtime_classes = Informer(client, RUNTIME_CLASSES)
        self._expect: dict[str, _Expect] = {}
        self.created = 0
        self.deleted = 0
        self.status_writes = 0
        self.errors = 0
        for kind, inf in self.informers.items():
            enqueue = self._enqueuer(kind)
            inf.add_handler(on_add=enqueue, on_update=self._updater(enqueue),
                            on_delete=self._forget)
        self.informers["ReplicaSet"].add_handler(
            on_add=self._owner_changed,
            on_update=lambda _o, n: self._owner_changed(n),
            on_delete=self._owner_changed,
        )
        self.pods.add_handler(
            on_add=self._pod_added,
            on_update=lambda _o, n: self._owner_changed(n),
            on_delete=self._pod_deleted,
        )

    # -- informer handlers (must not block) ----------------------------------------------------

    def _enqueuer(self, kind: str) -> Callable[[Any], None]:
        def enqueue(obj: Mapping[str, Any]) -> None:
            meta = obj.get("metadata") or {}
            self.queue.add((kind, str(meta.get("namespace") or ""), str(meta.get("name") or "")))

        return enqueue

    @staticmethod
    def _updater(fn: Callable[[Any], None]) -> Callable[[Any, Any], None]:
        def on_update(_old: Any, new: Any) -> None:
            fn(new)

        return on_update

    def _forget(self, obj: Mapping[str, Any]) -> None:
        self._expect.pop(str((obj.get("metadata") or {}).get("uid") or ""), None)

    def _owner_changed(self, obj: Mapping[str, Any]) -> None:
        ref = controller_ref(obj)
        if ref is None or ref.get("kind") not in self.informers:
            return
        ns = str((obj.get("metadata") or {}).get("namespace") or "")
        self.queue.add((str(ref["kind"]), ns, str(ref.get("name") or "")))

    def _pod_added(self, pod: Mapping[str, Any]) -> None:
        ref = controller_ref(pod)
        if ref is not None:
            exp = self._expect.get(str(ref.get("uid")))
            if exp is not None:
                exp.creates.pop(str(pod["metadata"].get("name")), None)
        self._owner_changed(pod)

    def _pod_deleted(self, pod: Mapping[str, Any]) -> None:
        ref = controller_ref(pod)
        if ref is not None:
            exp = self._expect.get(str(ref.get("uid")))
            if exp is not None:
                exp.deletes.pop(str(pod["metadata"].get("name")), None)
        self._owner_changed(pod)

    # -- running -------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run informers and workers until cancelled; ``started`` once every cache synced."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.queue.run)
            infs = [*self.informers.values(), self.priority_classes, self.runtime_classes]
            if self._own_pods:
                infs.append(self.pods)
            for inf in infs:
                await nursery.start(inf.run)
            for inf in [*infs, self.pods]:
                await inf.wait_synced()
            for _ in range(self.workers):
                nursery.start_soon(self._worker)
            log.info("workload controllers synced workers=%d", self.workers)
            task_status.started()

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self.reconcile(key)
            except (ApiError, KubeTransportError) as exc:
                self.errors += 1
                log.warning("reconcile failed %s %s/%s: %s (retrying in 1s)", *key, exc,
                            extra={"workload": f"{key[0]}/{key[1]}/{key[2]}"})
                self.queue.add_after(key, 1.0)
            except Exception:  # a bug must not stop every other workload: log, retry later
                self.errors += 1
                log.exception("reconcile crashed %s %s/%s (retrying in 5s)", *key,
                              extra={"workload": f"{key[0]}/{key[1]}/{key[2]}"})
                self.queue.add_after(key, 5.0)
            finally:
                self.queue.done(key)

    async def reconcile(self, key: Key) -> None:
        """Bring one workload one step closer to its spec and write its status."""
        kind, ns, name = key
        obj = self.informers[kind].store.get(f"{ns}/{name}")
        if obj is None:
            return
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            return
        if kind == "Deployment":
            await self._deployment(obj)
        elif kind == "ReplicaSet":
            await self._replicaset(obj)
        elif kind == "StatefulSet":
            await self._statefulset(obj)
        elif kind == "Job":
            await self._job(obj)

    # -- expectations --------------------------------------------------------------------------

    def _exp(self, uid: str) -> _Expect:
        exp = self._expect.get(uid)
        if exp is None:
            exp = self._expect[uid] = _Expect({}, {})
        now = trio.current_time()
        for d in (exp.creates, exp.deletes):
            for n in [n for n, t in d.items() if t < now]:
                del d[n]
        return exp

    def _owned_pods(self, uid: str) -> list[dict[str, Any]]:
        """Cached Pods of ``uid``, with in-flight deletes removed (a create in flight is counted
        by :meth:`_pending_creates`)."""
        exp = self._exp(uid)
        return [p for p in self.pods.store.by_index(OWNER_INDEX, uid)
                if p["metadata"].get("name") not in exp.deletes]

    def _pending_creates(self, uid: str) -> int:
        return len(self._exp(uid).creates)

    # -- writes --------------------------------------------------------------------------------

    def _emit(self, kind: str, **fields: Any) -> None:
        if self.on_event is not None:
            self.on_event(kind, fields)

    async def _create_pods(self, owner: Mapping[str, Any], bodies: list[dict[str, Any]]) -> None:
        uid = str(owner["metadata"].get("uid"))
        exp = self._exp(uid)
        # list items may come without ``kind``; admission matches on it
        pcs = [{**o, "kind": "PriorityClass"} for o in self.priority_classes.store.list()]
        rcs = [{**o, "kind": "RuntimeClass"} for o in self.runtime_classes.store.list()]
        limiter = trio.CapacityLimiter(self.write_concurrency)
        failures: list[BaseException] = []

        async def one(body: dict[str, Any]) -> None:
            from bigfleet_trio.sim.expand import ExpandError

            name = body["metadata"]["name"]
            try:
                admit(body, pcs, rcs)
            except ExpandError as exc:
                log.warning("pod create refused owner=%s/%s: %s", owner["metadata"].get(
                    "namespace"), owner["metadata"].get("name"), exc)
                await self.client.create_event(owner, reason="FailedCreate", type="Warning",
                                               message=f"Error creating: {exc}",
                                               component="sim-controller-manager")
                return
            exp.creates[name] = trio.current_time() + EXPECTATION_TTL
            async with limiter:
                try:
                    await self.client.create(PODS, body, body["metadata"]["namespace"])
                except AlreadyExists:
                    exp.creates.pop(name, None)
                except (ApiError, KubeTransportError) as exc:
                    exp.creates.pop(name, None)
                    failures.append(exc)
                    return
            self.created += 1
            self._emit("pod_created", namespace=body["metadata"]["namespace"], name=name)

        async with trio.open_nursery() as nursery:
            for body in bodies:
                nursery.start_soon(one, body)
        if failures:
            raise failures[0]

    async def _delete_pods(self, owner: Mapping[str, Any], names: list[str]) -> None:
        uid = str(owner["metadata"].get("uid"))
        ns = str(owner["metadata"].get("namespace"))
        exp = self._exp(uid)
        limiter = trio.CapacityLimiter(self.write_concurrency)
        failures: list[ApiError | KubeTransportError] = []

        async def one(name: str) -> None:
            exp.deletes[name] = trio.current_time() + EXPECTATION_TTL
            async with limiter:
                try:
                    await self.client.delete(PODS, name, ns)
                except NotFound:
                    pass
                except (ApiError, KubeTransportError) as exc:
                    exp.deletes.pop(name, None)
                    failures.append(exc)
                    return
            self.deleted += 1
            self._emit("pod_deleted", namespace=ns, name=name)

        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(one, name)
        if failures:
            raise failures[0]  # one error for the worker's retry, not a group

    async def _write_status(self, res: Resource, obj: Mapping[str, Any],
                            status: dict[str, Any]) -> None:
        patch = status_patch(obj.get("status"), status)
        if patch is None:
            return
        meta = obj["metadata"]
        try:
            await self.client.patch(res, meta["name"], {"status": patch}, meta.get("namespace"),
                                    subresource="status")
        except NotFound:
            return
        self.status_writes += 1

    # -- the controllers ----------------------------------------------------------------------

    async def _deployment(self, deploy: dict[str, Any]) -> None:
        uid = str(deploy["metadata"].get("uid"))
        owned = self.informers["ReplicaSet"].store.by_index(OWNER_INDEX, uid)
        new_rs, scales = deployment_replicasets(deploy, owned)
        exp = self._exp(uid)
        if new_rs is not None and new_rs["metadata"]["name"] not in exp.creates:
            exp.creates[new_rs["metadata"]["name"]] = trio.current_time() + EXPECTATION_TTL
            try:
                await self.client.create(REPLICASETS, new_rs, new_rs["metadata"]["namespace"])
                log.info("replicaset created deployment=%s/%s rs=%s replicas=%s",
                         deploy["metadata"].get("namespace"), deploy["metadata"]["name"],
                         new_rs["metadata"]["name"], new_rs["spec"]["replicas"])
            except AlreadyExists:
                pass
        for rs_name, replicas in scales.items():
            log.info("replicaset scaled deployment=%s/%s rs=%s replicas=%d",
                     deploy["metadata"].get("namespace"), deploy["metadata"]["name"], rs_name,
                     replicas)
            try:
                await self.client.patch(REPLICASETS, rs_name, {"spec": {"replicas": replicas}},
                                        deploy["metadata"].get("namespace"))
            except NotFound:
                pass
        owned = self.informers["ReplicaSet"].store.by_index(OWNER_INDEX, uid)
        await self._write_status(DEPLOYMENTS, deploy,
                                 deployment_status(deploy, owned, now=rfc3339_now()))

    async def _replicaset(self, rs: dict[str, Any]) -> None:
        uid = str(rs["metadata"].get("uid"))
        pods = self._owned_pods(uid)
        pending = self._pending_creates(uid)
        diff = replicaset_diff(rs, pods)
        meta = rs["metadata"]
        ns = str(meta.get("namespace") or "default")
        if diff.create > pending:
            template = (rs.get("spec") or {}).get("template") or {}
            owner = owner_ref(rs, "ReplicaSet", "apps/v1")
            bodies = [pod_from_template(template, name=f"{meta['name']}-{random_suffix(self.rng)}",
                                        namespace=ns, owner=owner)
                      for _ in range(diff.create - pending)]
            await self._create_pods(rs, bodies)
        elif diff.delete and not pending:
            await self._delete_pods(rs, diff.delete)
        await self._write_status(REPLICASETS, rs, replicaset_status(rs, self._owned_pods(uid)))

    async def _statefulset(self, sts: dict[str, Any]) -> None:
        uid = str(sts["metadata"].get("uid"))
        meta = sts["metadata"]
        name, ns = str(meta["name"]), str(meta.get("namespace") or "default")
        spec = sts.get("spec") or {}
        if not spec.get("updateStrategy") or not spec.get("podManagementPolicy"):
            # The defaults the real apiserver writes (kubectl rollout status needs updateStrategy);
            # the embedded apiserver does no defaulting. The update event requeues this set.
            await self.client.patch(STATEFULSETS, name, {"spec": {
                "updateStrategy": spec.get("updateStrategy")
                or {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
                "podManagementPolicy": spec.get("podManagementPolicy") or "OrderedReady",
            }}, ns)
            return
        pods = self._owned_pods(uid)
        template = spec.get("template") or {}
        revision = f"{name}-{template_hash(template)}"
        pending = self._pending_creates(uid)
        plan = statefulset_plan(sts, pods)
        if plan.delete:
            await self._delete_pods(sts, plan.delete)
        if plan.create and not pending:
            owner = owner_ref(sts, "StatefulSet", "apps/v1")
            bodies = []
            for n in plan.create:
                pod_name = f"{name}-{n}"
                body = pod_from_template(template, name=pod_name, namespace=ns, owner=owner,
                                         extra_labels={
                                             "apps.kubernetes.io/pod-index": str(n),
                                             "controller-revision-hash": revision,
                                             "statefulset.kubernetes.io/pod-name": pod_name,
                                         })
                body["spec"]["hostname"] = pod_name
                if spec.get("serviceName"):
                    body["spec"]["subdomain"] = spec["serviceName"]
                bodies.append(body)
            await self._create_pods(sts, bodies)
        await self._write_status(STATEFULSETS, sts,
                                 statefulset_status(sts, self._owned_pods(uid), revision))

    async def _job(self, job: dict[str, Any]) -> None:
        uid = str(job["metadata"].get("uid"))
        meta = job["metadata"]
        name, ns = str(meta["name"]), str(meta.get("namespace") or "default")
        spec = job.get("spec") or {}
        finished = job_finished_at(job)
        if finished is not None:
            ttl = spec.get("ttlSecondsAfterFinished")
            if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl >= 0:
                at = _parse_time(finished)
                left = 0.0 if at is None else at + ttl - dt.datetime.now(dt.UTC).timestamp()
                if left <= 0:
                    log.info("job deleted after ttl job=%s/%s", ns, name)
                    try:
                        await self.client.delete(JOBS, name, ns, propagation_policy="Background")
                    except NotFound:
                        pass
                    return
                self.queue.add_after(("Job", ns, name), left + 0.5)
            return
        pods = self._owned_pods(uid)
        pending = self._pending_creates(uid)
        plan = job_plan(job, pods, now=rfc3339_now())
        labels = {
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": name,
            "controller-uid": uid,
            "job-name": name,
        }
        owner = owner_ref(job, "Job", "batch/v1")
        template = spec.get("template") or {}
        if plan.delete:
            await self._delete_pods(job, plan.delete)
        if not pending and (plan.count or plan.indexes):
            bodies = []
            for _ in range(plan.count):
                bodies.append(pod_from_template(template, name=f"{name}-{random_suffix(self.rng)}",
                                                namespace=ns, owner=owner, extra_labels=labels))
            for i in plan.indexes:
                body = pod_from_template(
                    template, name=f"{name}-{i}-{random_suffix(self.rng)}", namespace=ns,
                    owner=owner, extra_labels={**labels, COMPLETION_INDEX: str(i)},
                    extra_annotations={COMPLETION_INDEX: str(i)})
                bodies.append(body)
            await self._create_pods(job, bodies)
            plan = job_plan(job, self._owned_pods(uid), now=rfc3339_now())
        await self._write_status(JOBS, job, copy.deepcopy(plan.status))
        if plan.status.get("completionTime") and "ttlSecondsAfterFinished" in spec:
            self.queue.add_after(("Job", ns, name), 0.5)
