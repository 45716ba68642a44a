"""Pure planning of the embedded apiserver's writes, and the options every write verb takes.

:func:`new_object` / :func:`stamp_created` build the object a create stores,
:func:`committed_object` the merge an update or patch stores, :func:`marked_deleted` the state a
finalizer holds back; :class:`~.state.ApiState` checks the store around them and writes.
:class:`CreateOptions` / :class:`WriteOptions` are the verbs' keyword options, declared once.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from typing import Any, TypedDict

from . import errors as E
from .metadata import metadata_type_error, validate_labels
from .objects import check_body_meta, merge_write, name_causes, now_rfc3339
from .resources import ResourceType

__all__ = [
    "CreateOptions",
    "WriteOptions",
    "committed_object",
    "create_options",
    "marked_deleted",
    "new_object",
    "allows_unconditional_update",
    "stamp_created",
    "tracks_generation",
]


class CreateOptions(TypedDict, total=False):
    """Keyword options of a create.

    Attributes:
        field_validation: ``Strict``, ``Warn`` (default) or ``Ignore`` for unknown fields.
        dry_run: check and return the result without storing it (default False).
        warnings: a list to extend with the request's warnings (default None: dropped).
    """

    field_validation: str
    dry_run: bool
    warnings: list[str] | None


class WriteOptions(CreateOptions, total=False):
    """Keyword options of an update or patch: a create's, plus the subresource written.

    Attributes:
        subresource: ``status`` / ``scale`` / None (the main resource, the default).
    """

    subresource: str | None


def create_options(opts: WriteOptions) -> CreateOptions:
    """``opts`` without the subresource (an apply patch of a missing object creates it)."""
    return CreateOptions(
        field_validation=opts.get("field_validation", "Warn"),
        dry_run=opts.get("dry_run", False),
        warnings=opts.get("warnings"),
    )


def new_object(
    res: ResourceType, namespace: str | None, body: Any, taken: Callable[[str], bool]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The object and metadata a create of ``body`` starts from (``generateName`` resolved
    against ``taken``); :func:`stamp_created` completes them once the namespace is known.

    Raises:
        ApiError: 400 bad body metadata; 422 invalid name or labels.
    """
    meta: dict[str, Any] = dict(check_body_meta(res, namespace, body))
    obj: dict[str, Any] = {"apiVersion": res.api_version, "kind": res.kind}
    obj.update((k, v) for k, v in body.items() if k not in ("apiVersion", "kind"))
    if not meta.get("name") and meta.get("generateName"):
        gen = str(meta["generateName"])
        for _ in range(100):
            cand = gen + "".join(secrets.choice(NAME_SUFFIX_ALPHABET) for _ in range(5))
            if not taken(cand):
                break
        meta["name"] = cand
    name = meta.get("name", "")
    causes = name_causes(res, name) + validate_labels(meta)
    if causes:
        raise E.invalid(res.kind, res.group, str(name), causes)
    return obj, meta


# kube-apiserver's generateName suffix: five of these (no vowels, no 0/1/3: no words, no
# look-alikes)
NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

# Built-in kinds whose kube-apiserver strategy keeps metadata.generation (custom resources
# always do); Namespaces, Nodes, ConfigMaps, Secrets, ServiceAccounts, RBAC objects, Events,
# Leases and the other built-ins have none.
GENERATION_KINDS = frozenset({
    "pods", "podtemplates", "replicationcontrollers", "deployments.apps", "replicasets.apps",
    "statefulsets.apps", "daemonsets.apps", "jobs.batch", "cronjobs.batch",
    "poddisruptionbudgets.policy", "priorityclasses.scheduling.k8s.io",
    "customresourcedefinitions.apiextensions.k8s.io", "horizontalpodautoscalers.autoscaling",
    "ingresses.networking.k8s.io", "ingressclasses.networking.k8s.io",
    "networkpolicies.networking.k8s.io", "endpointslices.discovery.k8s.io",
})


def tracks_generation(res: ResourceType) -> bool:
    """True when objects of ``res`` carry ``metadata.generation`` (:data:`GENERATION_KINDS`)."""
    return res.custom or res.key in GENERATION_KINDS


# Built-in kinds whose kube-apiserver strategy refuses a PUT without metadata.resourceVersion
# (custom resources and CRDs refuse it too); the others replace unconditionally.
CONDITIONAL_UPDATE_KINDS = frozenset({
    "leases.coordination.k8s.io", "poddisruptionbudgets.policy", "runtimeclasses.node.k8s.io",
    "customresourcedefinitions.apiextensions.k8s.io",
})


def allows_unconditional_update(res: ResourceType) -> bool:
    """False when a PUT must carry ``metadata.resourceVersion`` (422 Invalid without it)."""
    return not res.custom and res.key not in CONDITIONAL_UPDATE_KINDS


def stamp_created(
    obj: dict[str, Any], meta: dict[str, Any], namespace: str | None, *, generation: bool = True
) -> None:
    """Set the server-owned metadata of a new object (uid, creation time, generation 1 when
    its kind tracks generation, :func:`tracks_generation`)."""
    if namespace:
        meta["namespace"] = namespace
    else:
        meta.pop("namespace", None)
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = now_rfc3339()
    if generation:
        meta["generation"] = 1
    else:
        meta.pop("generation", None)
    for k in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
        meta.pop(k, None)
    obj["metadata"] = meta


def committed_object(
    res: ResourceType, old: dict[str, Any], new: dict[str, Any], subresource: str | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The object (and its metadata) an update or patch of ``old`` to ``new`` would store.

    Raises:
        ApiError: 400 malformed metadata; 422 invalid labels; 409 a stale resourceVersion.
    """
    ometa = old["metadata"]
    name = ometa["name"]
    nmeta_raw = new.get("metadata")
    nmeta_in: dict[str, Any] = nmeta_raw if isinstance(nmeta_raw, dict) else {}
    err = metadata_type_error(nmeta_in)
    if err:
        raise E.bad_request(err)
    causes = validate_labels(nmeta_in)
    if causes:
        raise E.invalid(res.kind, res.group, name, causes)
    want_rv = nmeta_in.get("resourceVersion")
    if want_rv not in (None, "") and str(want_rv) != ometa["resourceVersion"]:
        raise E.conflict(res.plural, res.group, name)
    obj, meta = merge_write(res, old, new, nmeta_in, subresource)
    meta["resourceVersion"] = ometa["resourceVersion"]
    obj["metadata"] = meta
    return obj, meta


def marked_deleted(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with deletionTimestamp set: what a delete stores while finalizers hold it."""
    meta = obj["metadata"]
    nmeta = dict(meta)
    nmeta["deletionTimestamp"] = now_rfc3339()
    nmeta["deletionGracePeriodSeconds"] = 0
    if "generation" in meta:
        nmeta["generation"] = int(meta["generation"]) + 1
    return {**obj, "metadata": nmeta}
