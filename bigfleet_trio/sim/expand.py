"""Workload manifests -> the Pods their controllers would create, as admission would admit them.

The pod controller translates Pods exactly as kube-scheduler sees them;
kube-scheduler sees a Pod *after* its workload controller stamped it out and after defaulting and
admission ran. This module reproduces the parts of that pipeline that change the translation,
for the golden tests over ``tests/fixtures/real-workloads`` and for the demo:

Workload controllers (names use the Kubernetes random-suffix alphabet, drawn from ``rng``):

- Pod: copied; ``metadata.name`` from ``generateName`` when needed.
- ReplicaSet: ``spec.replicas`` (default 1) Pods ``<rs>-<5 chars>``, owned by the ReplicaSet.
- Deployment: one ReplicaSet ``<deploy>-<pod-template-hash>``; its Pods carry the
  ``pod-template-hash`` label and are owned by that ReplicaSet (not by the Deployment).
- StatefulSet: ``spec.replicas`` (default 1) Pods ``<sts>-<ordinal>`` with the pod-name,
  pod-index and controller-revision-hash labels, ``hostname``/``subdomain`` set.
- Job: ``min(parallelism, completions)`` Pods (parallelism default 1); Indexed Jobs get
  ``<job>-<index>-<5 chars>`` names and the completion-index annotation and label. A suspended
  Job (``spec.suspend: true``) has no Pods unless ``include_suspended`` is set.
- DaemonSet: one Pod per name in ``daemonset_nodes``. Like the DaemonSet controller
  (``ReplaceDaemonSetPodNodeNameNodeAffinity``), the Pod's required nodeAffinity terms are
  REPLACED by a single term ``matchFields: metadata.name In [<node>]`` (``nodeSelector`` is
  kept). Nodes' labels are unknown here, so every listed node gets a Pod.

Defaulting (apiserver): a container or init container resource with a limit and no request gets
request = limit. Pod-level ``spec.resources`` are taken as written (no pod-level defaulting).

Admission:

- Priority: ``priorityClassName`` resolves against the PriorityClass objects given plus the
  built-in ``system-cluster-critical`` (2000000000) and ``system-node-critical`` (2000001000);
  no name -> the ``globalDefault: true`` class if any, else priority 0. ``spec.priority`` and
  ``spec.preemptionPolicy`` are set. Unknown class, or a conflicting ``spec.priority`` already in
  the Pod -> :class:`ExpandError` (admission rejects such a Pod).
- RuntimeClass: ``runtimeClassName`` resolves against the RuntimeClass objects given;
  ``overhead.podFixed`` -> ``spec.overhead``; ``scheduling.nodeSelector`` merged into
  ``spec.nodeSelector``; ``scheduling.tolerations`` appended. Unknown class, a nodeSelector
  conflict, or a differing pre-set overhead -> :class:`ExpandError`.

Other kinds in the input (PodDisruptionBudget, Service, PriorityClass, RuntimeClass, ...) produce
no Pods. Pure: no I/O apart from :func:`load_manifests`, which reads files.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import random
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypedDict, Unpack

import yaml

logger = logging.getLogger(__name__)

__all__ = [
    "BUILTIN_PRIORITY_CLASSES",
    "ExpandError",
    "ExpandOptions",
    "admit_pod",
    "apply_pod_defaults",
    "expand_manifests",
    "expand_object",
    "load_manifests",
]

#: The PriorityClasses every cluster has (name -> value).
BUILTIN_PRIORITY_CLASSES: Mapping[str, int] = {
    "system-cluster-critical": 2000000000,
    "system-node-critical": 2000001000,
}

_ALPHANUMS = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand
_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


class ExpandError(ValueError):
    """A manifest is malformed, or admission would reject the Pod it produces."""


def load_manifests(paths: Iterable[str | os.PathLike[str]]) -> list[dict[str, Any]]:
    """Read YAML files (multi-document, KYAML flow style too) into a list of objects.

    Empty documents are skipped.

    Raises:
        ExpandError: a file cannot be read or parsed, or a document is not an object.
    """
    out: list[dict[str, Any]] = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as fh:
                docs = list(yaml.safe_load_all(fh))
        except (OSError, yaml.YAMLError) as exc:
            raise ExpandError(f"{os.fspath(path)}: {exc}") from exc
        for doc in docs:
            if doc is None:
                continue
            if not isinstance(doc, dict):
                raise ExpandError(f"{os.fspath(path)}: document is not an object: {doc!r}")
            out.append(doc)
    return out


def _suffix(rng: random.Random, n: int = 5) -> str:
    return "".join(rng.choice(_ALPHANUMS) for _ in range(n))


def _template_hash(template: Mapping[str, Any]) -> str:
    digest = hashlib.sha256(yaml.safe_dump(template, sort_keys=True).encode()).digest()
    return "".join(_ALPHANUMS[b % len(_ALPHANUMS)] for b in digest[:10])


def _obj(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ExpandError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _count(value: Any, default: int, where: str) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ExpandError(f"{where}: expected a non-negative integer, got {value!r}")
    return value


def apply_pod_defaults(pod: dict[str, Any]) -> dict[str, Any]:
    """Apiserver defaulting that changes the translation: request = limit where unset.

    Applies to ``spec.containers`` and ``spec.initContainers``. Mutates and returns ``pod``.
    """
    spec = _obj(pod.get("spec"), "spec")
    for group in ("containers", "initContainers"):
        for c in spec.get(group) or []:
            if not isinstance(c, dict):
                continue
            resources = c.get("resources")
            if not isinstance(resources, dict):
                continue
            limits = resources.get("limits")
            if not isinstance(limits, dict) or not limits:
                continue
            requests = resources.get("requests")
            if not isinstance(requests, dict):
                requests = {}
            for name, value in limits.items():
                requests.setdefault(name, value)
            resources["requests"] = requests
    return pod


def _priority_classes(
    objects: Iterable[Mapping[str, Any]],
) -> tuple[dict[str, dict[str, Any]], str | None]:
    classes: dict[str, dict[str, Any]] = {
        name: {"value": value, "preemptionPolicy": "PreemptLowerPriority"}
        for name, value in BUILTIN_PRIORITY_CLASSES.items()
    }
    global_default: str | None = None
    for o in objects:
        if o.get("kind") != "PriorityClass":
            continue
        name = _obj(o.get("metadata"), "PriorityClass.metadata").get("name")
        value = o.get("value")
        if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, int):
            raise ExpandError(f"PriorityClass {name!r}: needs metadata.name and an integer value")
        classes[name] = {
            "value": value,
            "preemptionPolicy": o.get("preemptionPolicy") or "PreemptLowerPriority",
        }
        if o.get("globalDefault") is True:
            global_default = name
    return classes, global_default


def _runtime_classes(objects: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for o in objects:
        if o.get("kind") != "RuntimeClass":
            continue
        name = _obj(o.get("metadata"), "RuntimeClass.metadata").get("name")
        if not isinstance(name, str):
            raise ExpandError("RuntimeClass without metadata.name")
        out[name] = dict(o)
    return out


def admit_pod(
    pod: dict[str, Any],
    priority_classes: Mapping[str, Mapping[str, Any]],
    runtime_classes: Mapping[str, Mapping[str, Any]],
    global_default_priority_class: str | None = None,
) -> dict[str, Any]:
    """Run the Priority and RuntimeClass admission steps on ``pod`` (mutates and returns it).

    Args:
        pod: the Pod as JSON.
        priority_classes: name -> {"value": int, "preemptionPolicy": str}; include the
            built-ins (:data:`BUILTIN_PRIORITY_CLASSES`) yourself when calling directly.
        runtime_classes: name -> RuntimeClass object as JSON.
        global_default_priority_class: the class with ``globalDefault: true``, if any.

    Raises:
        ExpandError: admission would reject the Pod (see the module docstring).
    """
    meta = _obj(pod.get("metadata"), "metadata")
    who = f"pod {meta.get('namespace', '')}/{meta.get('name', '')}"
    spec = _obj(pod.get("spec"), f"{who} spec")
    pod["spec"] = spec

    class_name = spec.get("priorityClassName") or global_default_priority_class
    if class_name:
        pc = priority_classes.get(class_name)
        if pc is None:
            raise ExpandError(f"{who}: no PriorityClass with name {class_name} was found")
        value = pc["value"]
        if spec.get("priority") is not None and spec["priority"] != value:
            raise ExpandError(
                f"{who}: the integer value of priority ({spec['priority']}) must not be provided "
                f"in pod spec; priority admission controller computed {value} from the given "
                "PriorityClass name"
            )
        spec["priorityClassName"] = class_name
        spec["priority"] = value
        spec.setdefault("preemptionPolicy", pc.get("preemptionPolicy", "PreemptLowerPriority"))
    elif spec.get("priority") is None:
        spec["priority"] = 0

    rc_name = spec.get("runtimeClassName")
    if rc_name:
        rc = runtime_classes.get(rc_name)
        if rc is None:
            raise ExpandError(f'{who}: RuntimeClass "{rc_name}" not found')
        pod_fixed = _obj(rc.get("overhead"), "RuntimeClass.overhead").get("podFixed")
        if pod_fixed:
            if spec.get("overhead") and spec["overhead"] != pod_fixed:
                raise ExpandError(f"{who}: pod's overhead differs from RuntimeClass {rc_name}")
            spec["overhead"] = copy.deepcopy(pod_fixed)
        elif spec.get("overhead"):
            raise ExpandError(
                f"{who}: Pod Overhead set without corresponding RuntimeClass defined Overhead"
            )
        scheduling = _obj(rc.get("scheduling"), "RuntimeClass.scheduling")
        rc_selector = _obj(scheduling.get("nodeSelector"), "RuntimeClass.scheduling.nodeSelector")
        if rc_selector:
            selector = dict(_obj(spec.get("nodeSelector"), f"{who} nodeSelector"))
            for key, value in rc_selector.items():
                if key in selector and selector[key] != value:
                    raise ExpandError(
                        f"{who}: conflict: runtimeClass.scheduling.nodeSelector[{key}] = {value}; "
                        f"pod.spec.nodeSelector[{key}] = {selector[key]}"
                    )
                selector[key] = value
            spec["nodeSelector"] = selector
        rc_tolerations = scheduling.get("tolerations") or []
        if rc_tolerations:
            tolerations = list(spec.get("tolerations") or [])
            for t in rc_tolerations:
                if t not in tolerations:
                    tolerations.append(copy.deepcopy(t))
            spec["tolerations"] = tolerations
    return pod


def _owner(kind: str, api_version: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _pod_from_template(
    template: Any,
    *,
    name: str,
    namespace: str,
    uid: str,
    extra_labels: Mapping[str, str],
    owner: dict[str, Any] | None,
    where: str,
) -> dict[str, Any]:
    t = copy.deepcopy(_obj(template, f"{where}.spec.template"))
    meta = _obj(t.get("metadata"), f"{where}.spec.template.metadata")
    spec = _obj(t.get("spec"), f"{where}.spec.template.spec")
    labels = dict(_obj(meta.get("labels"), f"{where} template labels"))
    labels.update(extra_labels)
    pod_meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid, "labels": labels}
    if meta.get("annotations"):
        pod_meta["annotations"] = dict(meta["annotations"])
    if owner is not None:
        pod_meta["ownerReferences"] = [owner]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": pod_meta,
        "spec": spec,
        "status": {"phase": "Pending"},
    }


class ExpandOptions(TypedDict, total=False):
    """Keyword options of :func:`expand_manifests` and :func:`expand_object`.

    Attributes:
        namespace: the namespace for objects that name none (default ``"default"``).
        daemonset_nodes: node names; a DaemonSet gets one Pod per name (default ``("node-0",)``).
        include_suspended: expand suspended Jobs as if they were resumed (default False).
        rng: source of random name suffixes and UIDs; ``random.Random(0)`` when None, so the
            output is deterministic.
        uid_factory: makes object UIDs; defaults to version-4 UUIDs drawn from ``rng``.
    """

    namespace: str
    daemonset_nodes: Sequence[str]
    include_suspended: bool
    rng: random.Random | None
    uid_factory: Callable[[], str] | None


def _daemonset_affinity(spec: dict[str, Any], node: str) -> None:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    affinity = spec.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [term]}


def expand_object(
    obj: Mapping[str, Any], **opts: Unpack[ExpandOptions]
) -> list[dict[str, Any]]:
    """The Pods one workload object produces, BEFORE defaulting and admission.

    Use :func:`expand_manifests` for the full pipeline. Arguments as there.

    Raises:
        ExpandError: the object is malformed.
    """
    namespace = opts.get("namespace", "default")
    daemonset_nodes = opts.get("daemonset_nodes", ("node-0",))
    include_suspended = opts.get("include_suspended", False)
    uid_factory = opts.get("uid_factory")
    rng = opts.get("rng")
    rng = rng if rng is not None else random.Random(0)
    new_uid = (
        uid_factory
        if uid_factory is not None
        else (lambda: str(uuid.UUID(int=rng.getrandbits(128), version=4)))
    )
    kind = obj.get("kind")
    meta = _obj(obj.get("metadata"), f"{kind}.metadata")
    ns = meta.get("namespace") or namespace
    name = meta.get("name")
    if not name and meta.get("generateName"):
        name = f"{meta['generateName']}{_suffix(rng)}"
    where = f"{kind} {ns}/{name}"
    spec = _obj(obj.get("spec"), f"{where}.spec")
    owner_uid = meta.get("uid") or new_uid()

    if kind == "Pod":
        if not name:
            raise ExpandError("Pod without metadata.name or generateName")
        pod = copy.deepcopy(dict(obj))
        pod_meta = pod.setdefault("metadata", {})
        pod_meta.pop("generateName", None)
        pod_meta.update({"name": name, "namespace": ns})
        pod_meta.setdefault("uid", owner_uid)
        pod.setdefault("status", {})
        if not pod["status"].get("phase"):
            pod["status"]["phase"] = "Pending"
        return [pod]
    if not name:
        raise ExpandError(f"{kind} without metadata.name or generateName")

    template = spec.get("template")
    if kind in ("ReplicaSet", "Deployment"):
        replicas = _count(spec.get("replicas"), 1, f"{where}.spec.replicas")
        extra: dict[str, str] = {}
        rs_name, rs_uid = name, owner_uid
        if kind == "Deployment":
            h = _template_hash(_obj(template, f"{where}.spec.template"))
            rs_name, rs_uid = f"{name}-{h}", new_uid()
            extra = {"pod-template-hash": h}
        owner = _owner("ReplicaSet", "apps/v1", rs_name, rs_uid)
        return [
            _pod_from_template(
                template,
                name=f"{rs_name}-{_suffix(rng)}",
                namespace=ns,
                uid=new_uid(),
                extra_labels=extra,
                owner=owner,
                where=where,
            )
            for _ in range(replicas)
        ]
    if kind == "StatefulSet":
        replicas = _count(spec.get("replicas"), 1, f"{where}.spec.replicas")
        revision = f"{name}-{_template_hash(_obj(template, f'{where}.spec.template'))}"
        owner = _owner("StatefulSet", "apps/v1", name, owner_uid)
        pods = []
        for i in range(replicas):
            pod_name = f"{name}-{i}"
            pod = _pod_from_template(
                template,
                name=pod_name,
                namespace=ns,
                uid=new_uid(),
                extra_labels={
                    "apps.kubernetes.io/pod-index": str(i),
                    "controller-revision-hash": revision,
                    "statefulset.kubernetes.io/pod-name": pod_name,
                },
                owner=owner,
                where=where,
            )
            pod["spec"]["hostname"] = pod_name
            if spec.get("serviceName"):
                pod["spec"]["subdomain"] = spec["serviceName"]
            pods.append(pod)
        return pods
    if kind == "Job":
        if spec.get("suspend") is True and not include_suspended:
            logger.info("expand: suspended Job has no Pods job=%s", where)
            return []
        parallelism = _count(spec.get("parallelism"), 1, f"{where}.spec.parallelism")
        completions = spec.get("completions")
        count = parallelism
        if completions is not None:
            count = min(count, _count(completions, 1, f"{where}.spec.completions"))
        indexed = spec.get("completionMode") == "Indexed"
        owner = _owner("Job", "batch/v1", name, owner_uid)
        job_labels = {
            "batch.kubernetes.io/controller-uid": owner_uid,
            "batch.kubernetes.io/job-name": name,
            "controller-uid": owner_uid,
            "job-name": name,
        }
        pods = []
        for i in range(count):
            labels = dict(job_labels)
            pod_name = f"{name}-{_suffix(rng)}"
            if indexed:
                labels[_COMPLETION_INDEX] = str(i)
                pod_name = f"{name}-{i}-{_suffix(rng)}"
            pod = _pod_from_template(
                template,
                name=pod_name,
                namespace=ns,
                uid=new_uid(),
                extra_labels=labels,
                owner=owner,
                where=where,
            )
            if indexed:
                pod["metadata"].setdefault("annotations", {})[_COMPLETION_INDEX] = str(i)
            pods.append(pod)
        return pods
    if kind == "DaemonSet":
        owner = _owner("DaemonSet", "apps/v1", name, owner_uid)
        revision = _template_hash(_obj(template, f"{where}.spec.template"))
        pods = []
        for node in daemonset_nodes:
            pod = _pod_from_template(
                template,
                name=f"{name}-{_suffix(rng)}",
                namespace=ns,
                uid=new_uid(),
                extra_labels={"controller-revision-hash": revision, "pod-template-generation": "1"},
                owner=owner,
                where=where,
            )
            _daemonset_affinity(pod["spec"], node)
            pods.append(pod)
        return pods
    return []


def expand_manifests(
    objects: Iterable[Mapping[str, Any]], **opts: Unpack[ExpandOptions]
) -> list[dict[str, Any]]:
    """Every Pod the given manifests produce, defaulted and admitted.

    PriorityClass and RuntimeClass objects found among ``objects`` are used for admission
    (plus the built-in PriorityClasses). See the module docstring for each kind.

    Args:
        objects: parsed manifests (e.g. from :func:`load_manifests`), any kinds, any order.
        opts: :class:`ExpandOptions` (namespace, daemonset_nodes, include_suspended, rng,
            uid_factory).

    Returns:
        Pods as JSON dicts with ``metadata.{name,namespace,uid,labels,ownerReferences}``,
        ``spec`` (with ``priority``, and ``overhead`` where a RuntimeClass sets one) and
        ``status.phase`` Pending.

    Raises:
        ExpandError: a manifest is malformed, or admission would reject a Pod.
    """
    objs = list(objects)
    if opts.get("rng") is None:  # one generator across all objects: deterministic output
        opts["rng"] = random.Random(0)
    priority_classes, global_default = _priority_classes(objs)
    runtime_classes = _runtime_classes(objs)
    pods: list[dict[str, Any]] = []
    for obj in objs:
        for pod in expand_object(obj, **opts):
            apply_pod_defaults(pod)
            admit_pod(pod, priority_classes, runtime_classes, global_default)
            pods.append(pod)
    return pods
