"""The Kubernetes test seam: a real ``KubeClient`` over the in-process sim apiserver.

Production code talks to Kubernetes through :class:`bigfleet_trio.kube.api.KubeAPI`. Tests hand
it either a plain client from :func:`sim_kube`, or a :class:`RecordingKube`, which implements
``KubeAPI`` by delegating to that client and records every call, so a test can assert on the
sequence of writes::

    kube = RecordingKube.over_sim(nursery)          # kube.server: the ApiServer, kube.client
    kube.seed(UPCOMING_NODES, {"metadata": {"name": "un-m-1"}, "status": {...}})  # no HTTP
    await handler(kube).on_node_state_update(...)
    kube.writes()        # [(op, name, body)] since the last call: op is create, patch,
                         # patch/status (patch of a subresource), update, delete or evict
    kube.objects(UPCOMING_NODES)                   # {name: stored object} read from the sim

Errors: HTTP status codes come from the sim's fault rules (``kube.server.faults.fail_next(code=
409, verb="patch", resource="upcomingnodes/status")``); exceptions the sim cannot produce over
HTTP (``KubeTransportError``), or a fault for one object name, through ``kube.fail``:
``{"patch": [exc, ...], ("patch", "name"): [...]}``, raised in order after the call is
recorded, before it reaches the server. ``kube.gate`` (a ``trio.Event``) holds every call until
set; ``kube.active`` / ``kube.max_active`` count calls in flight.

The client is built with ``max_attempts=1`` (no client-side retries, so the handler's own retry
policy is what a test observes) and no effective rate limit; pass ``**client_kw`` to change that.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, NamedTuple

import trio

from bigfleet_trio.kube.client import KubeClient, ObjectList, PatchType
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.resources import Resource
from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.testing import InProcessTransport

__all__ = ["Record", "RecordingKube", "sim_kube"]

MERGE = "application/merge-patch+json"


def sim_kube(
    nursery: trio.Nursery, server: ApiServer | None = None, **client_kw: Any
) -> tuple[ApiServer, KubeClient]:
    """An ``ApiServer`` (project CRDs installed; ``server`` if given) and a real ``KubeClient``
    talking to it in-process (no sockets; works with ``autojump_clock``)."""
    server = server if server is not None else ApiServer()
    kw: dict[str, Any] = {"qps": 1e6, "burst": 1_000_000, "max_attempts": 1, **client_kw}
    client = KubeClient(
        KubeConfig(server="http://apiserver"),
        transport=InProcessTransport(server.app, nursery),
        **kw,
    )
    return server, client


class Record(NamedTuple):
    """One call as :class:`RecordingKube` saw it (reads too); ``at``: ``trio.current_time()``."""

    op: str
    plural: str
    namespace: str | None
    name: str
    body: Any
    at: float
    patch_type: str | None = None


class RecordingKube:
    """``KubeAPI`` over a real client; records calls, injects the faults the sim cannot.

    Attributes:
        calls: writes as ``(op, name, body)`` in call order (failed attempts included).
        history: every call, reads too, as :class:`Record`.
        fail: exceptions to raise, by ``op`` or ``(op, name)`` (``op`` without ``/status``).
        gate: when not None, each call waits for it before reaching the server.
    """

    def __init__(self, client: KubeClient, server: ApiServer) -> None:
        self.client = client
        self.server = server
        self.calls: list[tuple[str, str, Any]] = []
        self.history: list[Record] = []
        self.fail: dict[str | tuple[str, str], list[BaseException]] = {}
        self.gate: trio.Event | None = None
        self.active = 0
        self.max_active = 0

    @classmethod
    def over_sim(
        cls, nursery: trio.Nursery, server: ApiServer | None = None, **client_kw: Any
    ) -> RecordingKube:
        """A RecordingKube over :func:`sim_kube`'s client."""
        server, client = sim_kube(nursery, server, **client_kw)
        return cls(client, server)

    # ---- views -------------------------------------------------------------------------------

    def writes(self) -> list[tuple[str, str, Any]]:
        """The writes since the last call (and forget them)."""
        out = list(self.calls)
        self.calls.clear()
        return out

    def of(self, op: str, plural: str | None = None) -> list[Record]:
        """Recorded calls of ``op`` (optionally on ``plural``)."""
        return [r for r in self.history if r.op == op and plural in (None, r.plural)]

    def _res(self, res: Resource) -> Any:
        return self.server.find(f"{res.plural}.{res.group}" if res.group else res.plural)

    def objects(self, res: Resource, namespace: str | None = None) -> dict[str, dict[str, Any]]:
        """Stored objects of ``res`` by name (``namespace/name`` for a namespaced resource
        listed across namespaces), read from the sim store (copies)."""
        out = {}
        for o in self.server.store.items(self._res(res), namespace):
            meta = o["metadata"]
            key = meta["name"] if namespace or not res.namespaced else (
                f"{meta['namespace']}/{meta['name']}"
            )
            out[key] = copy.deepcopy(o)
        return out

    def seed(
        self, res: Resource, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """Store ``body`` in-process (no HTTP, no faults, no counters, not recorded): apiVersion
        and kind filled in from ``res``, the namespace created if missing, ``status`` written
        through the status subresource. Returns the stored object."""
        rt = self._res(res)
        body = copy.deepcopy(body)
        body.setdefault("apiVersion", f"{res.group}/{res.version}" if res.group else res.version)
        body.setdefault("kind", res.kind)
        ns = namespace or body["metadata"].get("namespace") if res.namespaced else None
        if ns:
            self.ensure_namespace(ns)
        status = body.get("status")
        self.server.create(rt, ns, body)
        name = body["metadata"]["name"]
        if status is not None and self.server.get(rt, ns, name).get("status") != status:
            self.server.patch(rt, ns, name, {"status": status}, MERGE, subresource="status")
        return copy.deepcopy(self.server.get(rt, ns, name))

    def ensure_namespace(self, ns: str) -> None:
        """Create namespace ``ns`` in-process unless it exists."""
        rt = self.server.find("namespaces")
        if self.server.store.get(rt, None, ns) is None:
            self.server.create(rt, None, {"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": ns}})

    # ---- recording and injection -------------------------------------------------------------

    async def _enter(
        self, op: str, res: Resource, namespace: str | None, name: str, body: Any,
        patch_type: str | None,
    ) -> None:
        await trio.lowlevel.checkpoint()
        rec = Record(
            op, res.plural, namespace, name, copy.deepcopy(body), trio.current_time(), patch_type
        )
        self.history.append(rec)
        if op not in ("get", "list"):
            self.calls.append((op, name, rec.body))
        verb = op.split("/", 1)[0]
        for key in ((verb, name), verb):
            errs = self.fail.get(key)
            if errs:
                raise errs.pop(0)
        if self.gate is not None:
            await self.gate.wait()

    async def _call(
        self, op: str, res: Resource, namespace: str | None, name: str, body: Any, fn: Any,
        patch_type: str | None = None,
    ) -> Any:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await self._enter(op, res, namespace, name, body, patch_type)
            return await fn()
        finally:
            self.active -= 1

    # ---- KubeAPI -----------------------------------------------------------------------------

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        return await self._call(  # type: ignore[no-any-return]
            "get", res, namespace, name, None, lambda: self.client.get(res, name, namespace)
        )

    async def list(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
        resource_version: str | None = None,
    ) -> ObjectList:
        sel = {"label_selector": label_selector, "field_selector": field_selector}
        return await self._call(  # type: ignore[no-any-return]
            "list", res, namespace, "", {k: v for k, v in sel.items() if v},
            lambda: self.client.list(
                res, namespace, label_selector=label_selector, field_selector=field_selector,
                limit=limit, resource_version=resource_version,
            ),
        )

    async def create(
        self, res: Resource, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        return await self._call(  # type: ignore[no-any-return]
            "create", res, namespace, body["metadata"]["name"], body,
            lambda: self.client.create(res, body, namespace),
        )

    async def update(
        self, res: Resource, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        return await self._call(  # type: ignore[no-any-return]
            "update", res, namespace, body["metadata"]["name"], body,
            lambda: self.client.update(res, body, namespace),
        )

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
    ) -> dict[str, Any]:
        op = f"patch/{subresource}" if subresource else "patch"
        return await self._call(  # type: ignore[no-any-return]
            op, res, namespace, name, patch,
            lambda: self.client.patch(
                res, name, patch, namespace, patch_type=patch_type, subresource=subresource
            ),
            patch_type,
        )

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        propagation_policy: str | None = None,
        preconditions: Mapping[str, str] | None = None,
        grace_period_seconds: int | None = None,
    ) -> dict[str, Any] | None:
        return await self._call(  # type: ignore[no-any-return]
            "delete", res, namespace, name, None,
            lambda: self.client.delete(
                res, name, namespace, propagation_policy=propagation_policy,
                preconditions=preconditions, grace_period_seconds=grace_period_seconds,
            ),
        )

    async def evict(
        self,
        name: str,
        namespace: str,
        *,
        grace_period_seconds: int | None = None,
        uid: str | None = None,
    ) -> None:
        from bigfleet_trio.kube.resources import PODS

        await self._call(
            "evict", PODS, namespace, name, {"gracePeriodSeconds": grace_period_seconds,
                                             "uid": uid},
            lambda: self.client.evict(
                name, namespace, grace_period_seconds=grace_period_seconds, uid=uid
            ),
        )

    def __getattr__(self, attr: str) -> Any:
        # anything beyond KubeAPI (create_event, watch, ...) goes to the client, unrecorded
        return getattr(self.client, attr)
