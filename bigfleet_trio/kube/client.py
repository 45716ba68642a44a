"""Typed-enough Kubernetes REST client on httpx under Trio: the verbs of :class:`KubeClient`.

Objects are plain ``dict``\\ s exactly as the apiserver returns them. Each verb names which
failures its request may repeat (reads: every transient one; writes: only where a repetition gives
the same result, :func:`.retry.write_retry_on`); sending, rate limit, deadline and retries are
:class:`~.request.RequestCore`'s. Contract: docs/kube-api.md.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import trio

from . import protowire
from .errors import ApiError, Expired, KubeTransportError
from .request import ProtobufBody, RequestCore, clean_params
from .resources import EVENTS, Resource
from .retry import TRANSIENT, write_retry_on
from .transport import release_response
from .watchstream import WatchStream

__all__ = ["KubeClient", "ObjectList", "PatchType", "parse_rfc3339", "rfc3339", "rfc3339_micro"]

log = logging.getLogger(__name__)

PatchType = Literal["merge", "json", "strategic", "apply"]
_PATCH_CONTENT_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}

_READ_RETRY = TRANSIENT
_SAFE_WRITE_RETRY = write_retry_on(idempotent=True)
_WRITE_RETRY = write_retry_on(idempotent=False)
_IDEMPOTENT_PATCHES = frozenset(("merge", "apply"))


_last_event_ns = 0


def _event_suffix() -> str:
    """client-go's Event name suffix: the creation time in Unix nanoseconds, hex, strictly
    increasing here, so a LIST (name order) returns one object's Events in the order they were
    written and ``kubectl describe`` keeps that order for Events of the same second."""
    global _last_event_ns
    _last_event_ns = max(_last_event_ns + 1, time.time_ns())
    return f"{_last_event_ns:x}"


@dataclass
class ObjectList:
    """Result of :meth:`KubeClient.list`.

    Attributes:
        items: all objects across pages (``kind``/``apiVersion`` filled in from the resource).
        resource_version: collection resourceVersion of the (first page of the) list, the
            point a subsequent watch resumes from.
    """

    items: list[dict[str, Any]] = field(default_factory=list)
    resource_version: str = ""


def rfc3339_micro(when: dt.datetime | None = None) -> str:
    """``2026-11-21T13:03:09.123456Z`` (Kubernetes MicroTime) for ``when`` (default: now, UTC)."""
    when = when or dt.datetime.now(dt.UTC)
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339(when: dt.datetime | None = None) -> str:
    """``2026-11-21T13:03:09Z`` (Kubernetes Time) for ``when`` (default: now, UTC)."""
    when = when or dt.datetime.now(dt.UTC)
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: object) -> dt.datetime | None:
    """A Kubernetes Time or MicroTime read back: RFC 3339 with a date, a ``T`` and an offset
    (``Z`` or ``+hh:mm``) -> an aware datetime; None for anything else (not a string, no
    offset, not a timestamp)."""
    if not isinstance(text, str) or "T" not in text:
        return None
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


class KubeClient(RequestCore):
    """Async Kubernetes client (see docs/kube-api.md for the contract).

    Args:
        config: cluster settings from :func:`load_kubeconfig`.
        qps, burst: client-side token bucket (``qps <= 0`` disables it).
        transport: injected httpx transport (``httpx.MockTransport`` in tests).
        request_timeout: deadline in seconds for one non-watch request (Trio clock).
        max_attempts: attempts per retryable call (1 = no retries).
        max_retry_after: cap on a server-requested Retry-After wait (seconds).
        user_agent: User-Agent header.

    Use as ``async with KubeClient(cfg) as client:`` or call :meth:`aclose`.
    """

    # -- reads -------------------------------------------------------------------------------

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        """GET one object. Raises NotFound if absent."""
        path = res.object_path(name, namespace)
        return await self._request_obj("GET", path, retry_on=_READ_RETRY)

    async def list_paged(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        on_items: Callable[[list[dict[str, Any]]], None],
        on_restart: Callable[[], None] | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
        resource_version: str | None = None,
        protobuf: bool = False,
    ) -> str:
        """LIST following ``continue`` tokens, handing each page to ``on_items`` as it arrives.

        If a continue token has expired (410) the list restarts from the first page after
        calling ``on_restart`` (the consumer must drop what it collected), like client-go's pager
        with FullListIfExpired.

        ``protobuf``: the caller reads only the fields of the protobuf schema (an informer's
        transform); for Pods and Nodes, with the client's :attr:`protobuf` on, the LIST asks for
        Kubernetes protobuf and its items hold only those fields (docs/kube-api.md#protobuf).

        Returns:
            The collection resourceVersion of the first page of the (last) complete pass.

        Raises:
            ApiError subclasses / KubeTransportError after retries are exhausted.
        """
        path = res.collection_path(namespace if res.namespaced else None)
        base = {
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
            "limit": limit if limit and limit > 0 else None,
            "resourceVersion": resource_version,
        }
        accept = self._accept(res, protobuf)
        restarts = 0
        while True:
            token: str | None = None
            list_rv = ""
            first = True
            try:
                while True:
                    params = dict(base)
                    if token:
                        params["continue"] = token
                        params["resourceVersion"] = None
                    try:
                        page = await self.request("GET", path, params=params,
                                                  retry_on=_READ_RETRY, accept=accept)
                    except ApiError as exc:
                        if not self._refused(exc, accept, path):
                            raise
                        accept = "application/json"
                        page = await self.request("GET", path, params=params,
                                                  retry_on=_READ_RETRY, accept=accept)
                    if isinstance(page, ProtobufBody):
                        items, rv, token = _protobuf_page(res, path, page)
                        if first:
                            list_rv, first = rv, False
                        on_items(items)
                        if not token:
                            return list_rv
                        continue
                    if not isinstance(page, dict):
                        raise KubeTransportError(f"LIST {path}: answer is not an object")
                    meta = page.get("metadata") or {}
                    if first:
                        list_rv = str(meta.get("resourceVersion") or "")
                        first = False
                    items = page.get("items") or []
                    for item in items:
                        item.setdefault("kind", res.kind)
                        item.setdefault("apiVersion", res.api_version)
                    on_items(items)
                    token = meta.get("continue") or None
                    if not token:
                        return list_rv
            except Expired:
                if token is None or restarts >= 3:
                    raise
                restarts += 1
                log.info("kube list continue token expired, restarting full list path=%s", path)
                if on_restart is not None:
                    on_restart()

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
        """LIST all objects (all pages). See :meth:`list_paged` for semantics."""
        out = ObjectList()
        out.resource_version = await self.list_paged(
            res,
            namespace,
            on_items=out.items.extend,
            on_restart=out.items.clear,
            label_selector=label_selector,
            field_selector=field_selector,
            limit=limit,
            resource_version=resource_version,
        )
        return out

    @asynccontextmanager
    async def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        resource_version: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int | None = None,
        allow_bookmarks: bool = True,
        inactivity_timeout: float | None = None,
        retry: bool = True,
        send_initial_events: bool = False,
        protobuf: bool = False,
    ) -> AsyncIterator[WatchStream]:
        """Open a watch; yields a :class:`WatchStream` of events.

        Opening is retried like a read. ERROR events are yielded as-is (check
        :func:`bigfleet_trio.kube.watch.is_expired`); an HTTP 410 on open raises Expired.

        Args:
            inactivity_timeout: seconds without any line after which the stream raises
                WatchInactivityTimeout (None = wait forever).
            retry: retry opening like a read (False: one attempt; the informer runs its own
                backoff).
            send_initial_events: a streaming list (docs/kube-api.md#streaming-lists): adds
                ``sendInitialEvents=true`` and ``resourceVersionMatch=NotOlderThan`` (needs
                ``allow_bookmarks``).
            protobuf: as :meth:`list_paged`'s: the events' objects may come from Kubernetes
                protobuf, holding only the schema's fields.
        """
        path = res.collection_path(namespace if res.namespaced else None)
        params = clean_params(
            {  # never None: "watch" is always set
                "watch": "1",
                "resourceVersion": resource_version or None,
                "allowWatchBookmarks": "true" if allow_bookmarks else None,
                "sendInitialEvents": "true" if send_initial_events else None,
                "resourceVersionMatch": "NotOlderThan" if send_initial_events else None,
                "timeoutSeconds": timeout_seconds,
                "labelSelector": label_selector,
                "fieldSelector": field_selector,
            }
        )
        assert params is not None
        accept = self._accept(res, protobuf)

        async def open_stream() -> httpx.Response:
            if not retry or self.max_attempts == 1:
                return await self._open_stream(path, params, accept)
            return await self.retry.call(
                lambda: self._open_stream(path, params, accept), _READ_RETRY, f"WATCH {path}"
            )

        try:
            response = await open_stream()
        except ApiError as exc:
            if not self._refused(exc, accept, path):
                raise
            accept = "application/json"
            response = await open_stream()
        framed = protowire.is_protobuf(response.headers.get("content-type"))
        try:
            yield WatchStream(response, inactivity_timeout, protobuf=framed)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await response.aclose()
            release_response(response)

    def _accept(self, res: Resource, protobuf: bool) -> str:
        """The Accept header of a read: protobuf first for the kinds the schema carries, when
        both the client and the call take it; JSON otherwise (CRs have no protobuf)."""
        if protobuf and self.protobuf and protowire.supports(res):
            return protowire.ACCEPT
        return "application/json"

    def _refused(self, exc: ApiError, accept: str, path: str) -> bool:
        """True when an error answer to a read that took protobuf was 406 Not Acceptable
        (something between us and the apiserver knows only JSON): the caller asks again in
        JSON, and so does this client from then on (one WARNING)."""
        if exc.status != 406 or accept == "application/json":
            return False
        if self.protobuf:
            self.protobuf = False
            log.warning("kube protobuf refused (406 Not Acceptable), JSON from now on path=%s",
                        path, extra={"path": path})
        return True

    # -- writes ------------------------------------------------------------------------------

    async def create(
        self, res: Resource, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """POST a new object. ``namespace`` defaults to ``body.metadata.namespace``.

        Raises:
            AlreadyExists, Invalid, NotFound (namespace missing), ...
        """
        ns = namespace or _meta(body).get("namespace")
        body = _with_type(res, body)
        return await self._request_obj(
            "POST",
            res.collection_path(ns if res.namespaced else None),
            body=body,
            retry_on=_WRITE_RETRY,
        )

    async def update(
        self,
        res: Resource,
        body: dict[str, Any],
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """PUT a full object (or its ``status`` subresource).

        Raises:
            Conflict: ``metadata.resourceVersion`` is stale. NotFound: object absent.
        """
        meta = _meta(body)
        ns = namespace or meta.get("namespace")
        name = meta.get("name")
        if not name:
            raise ValueError("update: body has no metadata.name")
        retry = _SAFE_WRITE_RETRY if meta.get("resourceVersion") else _WRITE_RETRY
        return await self._request_obj(
            "PUT",
            res.object_path(name, ns, subresource),
            body=_with_type(res, body),
            retry_on=retry,
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
        """PATCH an object: ``merge`` (RFC 7386), ``json`` (RFC 6902 list), ``strategic``
        (built-in kinds only), ``apply`` (server-side apply; body is the YAML/JSON text)."""
        try:
            ctype = _PATCH_CONTENT_TYPES[patch_type]
        except KeyError:
            raise ValueError(f"unknown patch_type {patch_type!r}") from None
        params = {"fieldManager": "bigfleet-trio"} if patch_type == "apply" else None
        return await self._request_obj(
            "PATCH",
            res.object_path(name, namespace, subresource),
            params=params,
            body=patch,
            content_type=ctype,
            retry_on=_SAFE_WRITE_RETRY if patch_type in _IDEMPOTENT_PATCHES else _WRITE_RETRY,
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
        """DELETE one object.

        Args:
            propagation_policy: "Foreground" | "Background" | "Orphan".
            preconditions: ``{"uid": ..., "resourceVersion": ...}``; mismatch → Conflict.

        Returns:
            The server's answer (last state or Status), None if empty.
        """
        opts: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation_policy:
            opts["propagationPolicy"] = propagation_policy
        if preconditions:
            opts["preconditions"] = dict(preconditions)
        if grace_period_seconds is not None:
            opts["gracePeriodSeconds"] = grace_period_seconds
        retry = _SAFE_WRITE_RETRY if preconditions else _WRITE_RETRY
        out = await self.request(
            "DELETE", res.object_path(name, namespace), body=opts, retry_on=retry
        )
        return out if isinstance(out, dict) else None

    async def delete_collection(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> None:
        """DELETE a collection (deletecollection verb) matching the selectors."""
        await self.request(
            "DELETE",
            res.collection_path(namespace if res.namespaced else None),
            params={"labelSelector": label_selector, "fieldSelector": field_selector},
            retry_on=_WRITE_RETRY,
        )

    async def evict(
        self,
        name: str,
        namespace: str,
        *,
        grace_period_seconds: int | None = None,
        uid: str | None = None,
    ) -> None:
        """POST a policy/v1 Eviction for a pod (never retried).

        Args:
            uid: when given, evict only the Pod with this UID
                (``deleteOptions.preconditions.uid``), not another one of the same name.

        Raises:
            TooManyRequests: a PodDisruptionBudget blocks it (retry later).
            NotFound: the pod is gone.
            Conflict: ``uid`` given and the Pod of that name has another UID.
        """
        from .resources import PODS

        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        options: dict[str, Any] = {}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if uid:
            options["preconditions"] = {"uid": uid}
        if options:
            body["deleteOptions"] = options
        await self.request("POST", PODS.object_path(name, namespace, "eviction"), body=body)

    async def create_event(
        self,
        involved: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        type: str = "Normal",
        component: str = "bigfleet-trio",
    ) -> bool:
        """Record a core/v1 Event about ``involved`` (best effort: errors logged, not raised).

        Returns:
            True when the apiserver stored it, False when it was dropped (logged).
        """
        meta = _meta(involved)
        ns = meta.get("namespace") or "default"
        now = rfc3339()
        name = f"{meta.get('name', 'unknown')}.{_event_suffix()}"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {
                k: v
                for k, v in {
                    "apiVersion": involved.get("apiVersion"),
                    "kind": involved.get("kind"),
                    "name": meta.get("name"),
                    "namespace": meta.get("namespace"),
                    "uid": meta.get("uid"),
                    "resourceVersion": meta.get("resourceVersion"),
                }.items()
                if v
            },
            "reason": reason,
            "message": message[:1024],
            "type": type,
            "source": {"component": component},
            "reportingComponent": component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.request("POST", EVENTS.collection_path(ns), body=body)
        except (ApiError, KubeTransportError) as exc:
            log.warning(
                "kube event dropped reason=%s object=%s/%s err=%s",
                reason,
                ns,
                meta.get("name"),
                exc,
            )
            return False
        return True


def _protobuf_page(
    res: Resource, path: str, page: bytes
) -> tuple[list[dict[str, Any]], str, str | None]:
    """Items, resourceVersion and continue token of a protobuf LIST page.

    Raises:
        KubeTransportError: the page does not decode (a broken answer, like invalid JSON).
    """
    try:
        items, rv, token = protowire.decode_list(res, page)
    except protowire.ProtobufDecodeError as exc:
        raise KubeTransportError(f"LIST {path}: {exc}") from exc
    return items, rv, token or None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _with_type(res: Resource, body: dict[str, Any]) -> dict[str, Any]:
    if "kind" in body and "apiVersion" in body:
        return body
    return {"apiVersion": res.api_version, "kind": res.kind, **body}


