"""The embedded apiserver's state and verbs: the resource registry and create / get / list /
update / patch / delete / deletecollection / watch over the :class:`~.store.Store`, with the
status-subresource split, generation, finalizers and resourceVersion preconditions.

Write planning (:mod:`.writes`), garbage collection (:mod:`.gc`), eviction (:mod:`.eviction`) and
CRD acceptance (:mod:`.crds`) are separate modules this one applies; the HTTP side is
:mod:`.app`, joined in :mod:`.server`. Everything here is synchronous (no awaits), so every verb
is atomic under Trio.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from typing import Any, Unpack

from . import errors as E
from .access import AccessControl, bootstrap_policy
from .crds import accept_crd, default_crd_text, parse_yaml_docs
from .errors import ApiError
from .eviction import check_eviction_body, matching_pdbs, plan_eviction
from .faults import Counters, Faults
from .gc import GarbageCollector
from .objects import (
    INITIAL_NAMESPACES,
    PROTECTED_NAMESPACES,
    ListResult,
    check_body_meta,
    check_delete,
    content,
    create_defaults,
    filter_objects,
    now_rfc3339,
    requested_rv,
    same,
    validate_schema,
)
from .paging import Pager
from .patching import apply_patch
from .resources import ResourceType, builtin_resources
from .scale import scale_of, scaled
from .selectors import parse_field_selector, parse_label_selector
from .store import Store, Watcher
from .writes import (
    CreateOptions,
    WriteOptions,
    allows_unconditional_update,
    committed_object,
    create_options,
    marked_deleted,
    new_object,
    stamp_created,
    tracks_generation,
)

log = logging.getLogger(__name__)

_List = list  # the ApiState.list method shadows the builtin inside the class body

__all__ = ["ApiState", "CreateOptions", "ListResult", "WriteOptions", "now_rfc3339"]


class ApiState:
    """State of one embedded Kubernetes API server (no HTTP; see :class:`.server.ApiServer`).

    Args:
        crd_paths: YAML files of CRDs to install at start; None installs the project's
            packaged CRD manifest; ``[]`` installs none.
        history: watch events retained per resource (older resourceVersions → 410).
        bookmark_interval: seconds between BOOKMARKs on watches that allow them.
        gc_dangling: delete objects created with ownerReferences whose owners are all gone
            (as the garbage collector would).
        pdb_controller: keep PodDisruptionBudget status computed from pods
            (:class:`~.controllers.PdbController`); off = tests set PDB status via /status.
        authorization_mode: ``AlwaysAllow`` (default; credentials ignored) or ``RBAC``
            (bearer tokens authenticated, every request authorized; see :mod:`.access`).

    Attributes:
        store: the :class:`~.store.Store` (read-only use by in-process helpers).
        faults: :class:`~.faults.Faults` injection hooks.
        counters: :class:`~.faults.Counters` of requests by (verb, resource).
        access: :class:`~.access.AccessControl` (``admin_token``, ``denials``).
    """

    def __init__(
        self,
        crd_paths: _List[str] | None = None,
        *,
        history: int = 50_000,
        bookmark_interval: float = 5.0,
        gc_dangling: bool = True,
        pdb_controller: bool = False,
        authorization_mode: str = "AlwaysAllow",
    ) -> None:
        self.store = Store(history=history)
        self.bookmark_interval = bookmark_interval
        self.gc_dangling = gc_dangling
        self.faults = Faults(self.store)
        self.counters = Counters()
        self.gc = GarbageCollector(self.store, self._delete_obj)
        self.resources: dict[tuple[str, str, str], ResourceType] = {}
        self.crd_resources: dict[str, ResourceType] = {}  # CRD name -> resource
        self.discovery_epoch = 0
        self.pager = Pager()
        for res in builtin_resources():
            self._register(res)
        self.pods = self.resource("", "v1", "pods")
        self.namespaces = self.resource("", "v1", "namespaces")
        self.pdbs = self.resource("policy", "v1", "poddisruptionbudgets")
        self.crds = self.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        self.service_accounts = self.resource("", "v1", "serviceaccounts")
        self.access = AccessControl(authorization_mode, self._rbac_objects, self._sa_uid)
        if pdb_controller:
            from .controllers import PdbController

            self.store.listeners.append(PdbController(self).on_event)
        for ns in INITIAL_NAMESPACES:
            self.create(self.namespaces, None, {"metadata": {"name": ns}})
        if self.access.enforcing:
            self._install_bootstrap_policy()
        if crd_paths is None:
            self.install_crd_text(default_crd_text())
        else:
            for path in crd_paths:
                with open(path, encoding="utf-8") as fh:
                    self.install_crd_text(fh.read())

    # ---- registry ----------------------------------------------------------------------------

    def _register(self, res: ResourceType) -> None:
        self.resources[(res.group, res.version, res.plural)] = res
        self.store.add_resource(res)
        self.discovery_epoch += 1

    def _unregister_crd(self, crd_name: str) -> None:
        r = self.crd_resources.pop(crd_name, None)
        if r is not None:
            self.resources.pop((r.group, r.version, r.plural), None)
            self.store.remove_resource(r.key)
            self.discovery_epoch += 1

    def resource(self, group: str, version: str, plural: str) -> ResourceType:
        """Look a resource up by group/version/plural.

        Raises:
            ApiError: 404 when not served.
        """
        res = self.resources.get((group, version, plural))
        if res is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        return res

    def find(self, name: str) -> ResourceType:
        """Resolve a plural, singular, kind or short name (helper for in-process callers)."""
        low = name.lower()
        for res in self.resources.values():
            if (
                low in (res.plural, res.singular, res.kind.lower(), *res.short_names)
                or low == res.key
            ):
                return res
        raise KeyError(name)

    def install_crd_text(self, text: str) -> _List[dict[str, Any]]:
        """Create (or replace) every CRD in a multi-document YAML string."""
        out = []
        for doc in copy.deepcopy(parse_yaml_docs(text)):
            if not doc:
                continue
            name = doc.get("metadata", {}).get("name", "")
            old = self.store.get(self.crds, None, name)
            if old is not None:
                doc["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                out.append(self.update(self.crds, None, name, doc))
            else:
                out.append(self.create(self.crds, None, doc))
        return out

    # ---- access ------------------------------------------------------------------------------

    def _rbac_objects(self, plural: str) -> Iterable[dict[str, Any]]:
        return self.store.items(self.resource("rbac.authorization.k8s.io", "v1", plural))

    def _sa_uid(self, namespace: str, name: str) -> str | None:
        sa = self.store.get(self.service_accounts, namespace, name)
        return None if sa is None else sa["metadata"].get("uid")

    def _install_bootstrap_policy(self) -> None:
        for plural, obj in bootstrap_policy():
            self.create(self.resource("rbac.authorization.k8s.io", "v1", plural), None, obj)

    def issue_token(
        self, namespace: str, name: str, body: Any = None
    ) -> dict[str, Any]:
        """Answer a TokenRequest for an existing ServiceAccount (``status.token`` is the
        bearer token).

        Raises:
            ApiError: 404 no such ServiceAccount; 400/422 a bad TokenRequest.
        """
        sa = self.get(self.service_accounts, namespace, name)
        return self.access.token_request(namespace, name, sa["metadata"]["uid"], body)

    # ---- helpers -----------------------------------------------------------------------------

    def _check_scope(self, res: ResourceType, namespace: str | None) -> str | None:
        if res.namespaced:
            if not namespace:
                raise E.bad_request("the server could not find the requested resource")
            return namespace
        return None

    def _require_namespace(self, namespace: str) -> None:
        if self.store.get(self.namespaces, None, namespace) is None:
            raise E.not_found("namespaces", "", namespace)

    # ---- create ------------------------------------------------------------------------------

    def create(
        self,
        res: ResourceType,
        namespace: str | None,
        body: Any,
        **opts: Unpack[CreateOptions],
    ) -> dict[str, Any]:
        """Create an object (POST). Returns the stored object. ``opts``: :class:`CreateOptions`.

        Raises:
            ApiError: 404 missing namespace, 409 AlreadyExists, 422 Invalid, 400 BadRequest.
        """
        namespace = self._check_scope(res, namespace)
        obj, meta = new_object(
            res, namespace, body, lambda cand: self.store.get(res, namespace, cand) is not None
        )
        name = meta.get("name", "")
        if namespace:
            self._require_namespace(namespace)
        stamp_created(obj, meta, namespace, generation=tracks_generation(res))
        create_defaults(res, obj)
        obj, warns = validate_schema(res, obj, opts.get("field_validation", "Warn"))
        warnings = opts.get("warnings")
        if warnings is not None:
            warnings.extend(warns)
        new_res: ResourceType | None = None
        if res is self.crds:
            obj, new_res = accept_crd(obj)
        if self.store.get(res, namespace, name) is not None:
            raise E.already_exists(res.plural, res.group, name)
        if opts.get("dry_run", False):
            return obj
        if new_res is not None:
            self._register(new_res)
            self.crd_resources[name] = new_res
        stored = self.store.put(res, obj, None)
        log.debug("created %s %s/%s rv=%s", res.key, namespace, name, meta["resourceVersion"])
        if self.gc_dangling and meta.get("ownerReferences"):
            self.gc.collect_if_orphaned(res.key, (namespace or "", name))
        return stored

    # ---- get / list --------------------------------------------------------------------------

    def get(self, res: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        """Return the stored object or raise 404."""
        obj = self.store.get(res, namespace, name)
        if obj is None:
            raise E.not_found(res.plural, res.group, name)
        return obj

    def selectors(
        self, res: ResourceType, label_selector: str | None, field_selector: str | None
    ) -> tuple[_List[Any], _List[Any]]:
        """Parse ``labelSelector``/``fieldSelector`` for ``res`` (400 on error)."""
        labels = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector, lambda f: f in res.selectable)
        return labels, fields

    def list(
        self,
        res: ResourceType,
        namespace: str | None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_: str | None = None,
        resource_version: str | None = None,
    ) -> ListResult:
        """List objects sorted by namespace/name with limit/continue pagination.

        ``resource_version`` (any non-zero value, with or without
        ``resourceVersionMatch=NotOlderThan``) asks for state at least that new: the latest
        state is served when the server has reached it.

        Raises:
            ApiError: 400 bad selector, continue token or resourceVersion; 410 expired continue
                token; 504 a resourceVersion newer than the server's.
        """
        labels, fields = self.selectors(res, label_selector, field_selector)
        if continue_:
            rv, matched, start, snap_id = self.pager.resume(continue_)
            return self.pager.page(rv, matched, limit, start, snap_id)
        requested_rv(resource_version, self.store.rv)
        matched = filter_objects(res, self.store.items(res, namespace), labels, fields)
        return self.pager.page(self.store.rv, matched, limit)

    # ---- update / patch ----------------------------------------------------------------------

    def update(
        self,
        res: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        **opts: Unpack[WriteOptions],
    ) -> dict[str, Any]:
        """Replace an object (PUT), honouring the status split and RV preconditions.

        ``opts``: :class:`WriteOptions` (``subresource="status"`` writes only the status).

        Raises:
            ApiError: 404, 409 Conflict (stale metadata.resourceVersion), 422, 400.
        """
        namespace = self._check_scope(res, namespace)
        meta = check_body_meta(res, namespace, body)
        if meta.get("name") not in (None, name):
            raise E.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                f"({name})"
            )
        old = self.get(res, namespace, name)
        if not meta.get("resourceVersion") and not allows_unconditional_update(res):
            raise E.invalid(res.plural, res.group, name, [E.field_cause(
                "FieldValueInvalid", "metadata.resourceVersion",
                "Invalid value: 0: must be specified for an update")])
        return self._commit(res, old, dict(body), opts)

    def patch(
        self,
        res: ResourceType,
        namespace: str | None,
        name: str,
        patch: Any,
        content_type: str,
        **opts: Unpack[WriteOptions],
    ) -> dict[str, Any]:
        """Apply a merge / JSON / strategic / apply patch. ``opts``: :class:`WriteOptions`.

        Raises:
            ApiError: 415 strategic patch on a custom resource or unknown type; 422 failed JSON
                patch; 409 stale resourceVersion in the patch; 404.
        """
        namespace = self._check_scope(res, namespace)
        ct = content_type.split(";")[0].strip().lower()
        if ct == "application/apply-patch+yaml":
            old_or_none = self.store.get(res, namespace, name)
            if old_or_none is None:
                if not isinstance(patch, dict):
                    raise E.bad_request("apply patch must be an object")
                patch = dict(patch)
                patch.setdefault("metadata", {})
                patch["metadata"] = dict(patch["metadata"], name=name)
                return self.create(res, namespace, patch, **create_options(opts))
        if ct == "application/strategic-merge-patch+json" and res.custom:
            raise E.unsupported_media_type(ct)
        old = self.get(res, namespace, name)
        return self._commit(res, old, apply_patch(res, old, patch, ct), opts)

    def _commit(
        self, res: ResourceType, old: dict[str, Any], new: dict[str, Any], opts: WriteOptions
    ) -> dict[str, Any]:
        ometa = old["metadata"]
        name = ometa["name"]
        subresource = opts.get("subresource")
        obj, meta = committed_object(res, old, new, subresource)
        if res is self.crds and subresource is None:
            obj, new_res = accept_crd(obj)
        else:
            new_res = None
        obj, warns = validate_schema(res, obj, opts.get("field_validation", "Warn"))
        warnings = opts.get("warnings")
        if warnings is not None:
            warnings.extend(warns)
        if same(obj, old):
            return old
        if not tracks_generation(res):
            meta.pop("generation", None)
        elif subresource != "status" and content(obj) != content(old):
            meta["generation"] = int(ometa.get("generation", 1)) + 1
        if opts.get("dry_run", False):
            return obj
        if new_res is not None:
            self._register(new_res)
            self.crd_resources[name] = new_res
        if ometa.get("deletionTimestamp") and not meta.get("finalizers"):
            final = self.store.remove(res, obj)
            self._after_delete(res, final, "Background")
            return final
        return self.store.put(res, obj, old)

    def write_scale(
        self, res: ResourceType, namespace: str | None, name: str, scale: Any, *, dry_run: bool
    ) -> dict[str, Any]:
        """Set a workload's ``spec.replicas`` from an ``autoscaling/v1`` Scale; returns the
        Scale of the stored object.

        Raises:
            ApiError: 404; 409 stale Scale resourceVersion; 422 bad replicas; 400.
        """
        old = self.get(res, self._check_scope(res, namespace), name)
        new = scaled(res, old, scale)
        stored = self._commit(res, old, new, {"field_validation": "Ignore", "dry_run": dry_run})
        return scale_of(stored)

    # ---- delete ------------------------------------------------------------------------------

    def delete(
        self,
        res: ResourceType,
        namespace: str | None,
        name: str,
        options: dict[str, Any] | None = None,
        *,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Delete an object: finalizers → deletionTimestamp set; else removed (+ GC).

        Returns:
            The last state (with deletionTimestamp when finalizers hold it).

        Raises:
            ApiError: 404; 409 failed preconditions; 403 protected namespace.
        """
        namespace = self._check_scope(res, namespace)
        obj = self.get(res, namespace, name)
        options = options or {}
        check_delete(res, obj, options)
        if dry_run:
            return obj
        policy = options.get("propagationPolicy") or "Background"
        if options.get("orphanDependents") is True:
            policy = "Orphan"
        return self._delete_obj(res, obj, policy)

    def _delete_obj(self, res: ResourceType, obj: dict[str, Any], policy: str) -> dict[str, Any]:
        meta = obj["metadata"]
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return obj
            return self.store.put(res, marked_deleted(obj), obj)
        final = self.store.remove(res, obj)
        log.debug("deleted %s %s/%s", res.key, meta.get("namespace", ""), meta["name"])
        self._after_delete(res, final, policy)
        return final

    def _after_delete(self, res: ResourceType, final: dict[str, Any], policy: str) -> None:
        meta = final["metadata"]
        if res is self.crds:
            self._unregister_crd(meta["name"])
        elif res is self.namespaces:
            self.gc.empty_namespace(meta["name"], self.resources.values())
        uid = meta.get("uid")
        if uid:
            self.gc.owner_deleted(uid, policy)

    def delete_collection(
        self,
        res: ResourceType,
        namespace: str | None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> _List[dict[str, Any]]:
        """Delete every match; returns the affected objects' last states."""
        lst = self.list(
            res, namespace, label_selector=label_selector, field_selector=field_selector
        )
        out = []
        policy = (options or {}).get("propagationPolicy") or "Background"
        for obj in lst.items:
            m = obj["metadata"]
            cur = self.store.get(res, m.get("namespace"), m["name"])
            if cur is None:
                continue
            if res is self.namespaces and m["name"] in PROTECTED_NAMESPACES:
                continue
            out.append(self._delete_obj(res, cur, policy))
        return out

    # ---- eviction ----------------------------------------------------------------------------

    def evict(self, namespace: str, name: str, body: Any) -> None:
        """pods/eviction with PodDisruptionBudget evaluation (:func:`.eviction.plan_eviction`).

        Raises:
            ApiError: 404 pod missing; 429 PDB blocks (DisruptionBudget cause); 500 more than
                one PDB; 400 body/name mismatch.
        """
        check_eviction_body(name, body)
        pod = self.get(self.pods, namespace, name)
        options = body.get("deleteOptions") if isinstance(body, dict) else None
        # the Eviction's deleteOptions preconditions (uid, resourceVersion) hold as for a DELETE
        check_delete(self.pods, pod, options if isinstance(options, dict) else {})
        pdbs = matching_pdbs(pod, _List(self.store.items(self.pdbs, namespace)))
        new_pdb = plan_eviction(pod, pdbs, now_rfc3339())
        if new_pdb is not None:
            self.store.put(self.pdbs, new_pdb, pdbs[0])
        self._delete_obj(self.pods, pod, "Background")

    # ---- watch -------------------------------------------------------------------------------

    def open_watch(
        self,
        res: ResourceType,
        namespace: str | None,
        *,
        resource_version: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        send_initial_events: bool = False,
    ) -> tuple[_List[tuple[str, Any, bytes | None]], Watcher]:
        """Register a watcher; returns (initial items to send, watcher).

        Raises:
            ApiError: 410 Expired when ``resource_version`` is older than retained history;
                504 when it is newer than the server's; 400 bad selectors or resourceVersion.
        """
        labels, fields = self.selectors(res, label_selector, field_selector)
        b = self.store.bucket(res)
        w = Watcher(b, namespace, labels, fields, self.store.watch_buffer)
        initial: _List[tuple[str, Any, bytes | None]] = []
        requested = requested_rv(resource_version, self.store.rv)
        if send_initial_events or requested is None:
            for o in filter_objects(res, self.store.items(res, namespace), labels, fields):
                initial.append(("ADDED", o, None))
            if send_initial_events:
                initial.append(("BOOKMARK", str(self.store.rv), b"initial-events-end"))
        else:
            rv = requested
            if rv < b.dropped_rv:
                oldest = b.history[0].rv if b.history else self.store.rv
                raise E.expired(f"too old resource version: {rv} ({oldest})")
            for ev in b.history:
                if ev.rv > rv:
                    item = w.translate(ev)
                    if item is not None:
                        initial.append(item)
        b.watchers.add(w)
        return initial, w
