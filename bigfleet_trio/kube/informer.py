"""Informer = reflector (LIST + resumable WATCH) feeding an indexed in-memory store.

Follows client-go's ``tools/cache`` reflector: a paged LIST (or, with ``watch_list``, a streaming
list: docs/kube-api.md#streaming-lists), then a WATCH resumed from the last resourceVersion
(bookmarks on, randomised server timeout, an inactivity deadline per line); HTTP 410 relists and
diffs the fresh list against the store; other failures back off with jitter.
Each method below says its part. Objects pass through the optional ``transform`` as their page
arrives, so only slim projections stay in memory. The contract: docs/kube-api.md.

Handlers run synchronously in event order inside the informer task; exceptions they raise are
logged and swallowed. Handlers must not block.
"""

from __future__ import annotations

import gc
import logging
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from ..observability import metrics
from .client import KubeClient
from .errors import (
    ApiError,
    Expired,
    KubeTransportError,
    NotFound,
    TooManyRequests,
    WatchInactivityTimeout,
    error_from_status,
)
from .resources import BIGFLEET_GROUP, Resource
from .retry import Backoff
from .watch import (
    INITIAL_EVENTS_END,
    InitialEvents,
    ResourceVersionTracker,
    WatchEvent,
    is_expired,
    object_key,
    object_rv,
)

__all__ = [
    "Store",
    "Informer",
    "Transform",
    "IndexFunc",
    "SyncTimeout",
    "refuses_watch_list",
    "wait_all_synced",
    "freeze_heap",
    "drop_managed_fields",
]

_List = list  # Store.list shadows the builtin inside the class body

log = logging.getLogger(__name__)

Transform = Callable[[dict[str, Any]], Any]
IndexFunc = Callable[[Any], list[str]]

_TOO_LARGE_RV = "Too large resource version"


def is_too_large_resource_version(exc: ApiError) -> bool:
    """True when the apiserver refused a watch or list from a resourceVersion it has not reached
    (it lost state, e.g. an etcd restore; docs/kube-api.md#relist-from-scratch).

    As client-go's ``isTooLargeResourceVersionError``: a ``ResourceVersionTooLarge`` cause in
    ``Status.details.causes``; or, from apiservers that predate the cause, a 504 whose cause
    message or Status message says "Too large resource version".
    """
    body = exc.body if isinstance(exc.body, dict) else {}
    details = body.get("details")
    raw = details.get("causes") if isinstance(details, dict) else None
    causes = [c for c in raw if isinstance(c, dict)] if isinstance(raw, list) else []
    if any(c.get("reason") == "ResourceVersionTooLarge" for c in causes):
        return True
    if exc.status != 504:
        return False
    return any(c.get("message") == _TOO_LARGE_RV for c in causes) or _TOO_LARGE_RV in exc.message


def rv_rolled_back(new: str, old: str) -> bool:
    """True when resourceVersion ``new`` (from the server) is older than ``old`` (ours).

    resourceVersions are opaque in Kubernetes: they are compared only when both are ASCII
    decimal integers (etcd revisions); anything else is never a rollback.
    """
    if not (new.isascii() and new.isdigit() and old.isascii() and old.isdigit()):
        return False
    return int(new) < int(old)


def freeze_heap() -> None:
    """Move what the process holds into the garbage collector's permanent generation, which its
    passes skip (``gc.freeze()``), after collecting what is garbage already: a reference cycle
    frozen while garbage is never collected, and a soak leaked every one (a failed request's
    exception and its traceback). The collection walks only what is not frozen yet, which
    between two freezes is little. docs/kube-api.md#garbage-collector."""
    gc.collect()
    gc.freeze()


def drop_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """Informer transform: the object without ``metadata.managedFields`` (a shallow copy; the
    same object when it has none).

    The server-side-apply bookkeeping is never read by a controller here, and on a real
    apiserver it is the larger part of a small object's metadata: every field each manager set,
    as nested dicts (client-go's informers drop it the same way).
    docs/kube-api.md#informer-memory.
    """
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = dict(obj)
        obj["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return obj


class _RolledBack(Exception):
    """A watch event carried a resourceVersion older than the informer's: the server lost state."""


class _WatchListRefused(Exception):
    """The apiserver will not serve a streaming list; the message says how it showed it."""


# 4xx answers that say nothing about the streaming-list parameters: credentials (401), the
# resource not served (404, the paged LIST would say the same), 408, 410, throttling (429).
_NOT_A_REFUSAL = frozenset((401, 404, 408, 410, 429))


def refuses_watch_list(exc: ApiError) -> bool:
    """True when the answer to a streaming-list watch means this apiserver will not serve one:
    a 4xx other than 401, 404, 408, 410 and 429 (an older apiserver answers 422 or 400 to
    ``sendInitialEvents``; docs/kube-api.md#streaming-lists). 5xx is retried, not a refusal."""
    return 400 <= exc.status < 500 and exc.status not in _NOT_A_REFUSAL


COMPACT_AFTER = 1024
"""Removals below which :meth:`Store.compact_if_churned` never rebuilds (small stores)."""


class Store:
    """Keyed cache with secondary indexes (client-go ``cache.Indexer`` analogue).

    Keys are ``"namespace/name"`` for namespaced objects and ``"name"`` for cluster-scoped ones.
    Values are whatever the informer's transform produced (the raw dict without one).

    Args:
        indexers: index name → function(stored object) → list of index values.
    """

    __slots__ = ("_items", "_indexers", "_indices", "observers", "_removed")

    def __init__(self, indexers: dict[str, IndexFunc] | None = None):
        self._items: dict[str, Any] = {}
        self._removed = 0  # keys removed since the dicts were last rebuilt
        self.observers: list[Callable[[Any | None, Any | None], object]] = []
        """Called as ``observer(old, new)`` after each change of the store, with the exact
        objects replaced and stored (None for an add's old or a removal's new): derived state
        that must see every change, whatever the handlers are told (a DELETED handler gets the
        watch event's object, not the cached one). An observer must not raise; one that does is
        logged and the store is unaffected."""
        self._indexers: dict[str, IndexFunc] = dict(indexers or {})
        # index value -> the one key (a str: most values name one object, and a set costs
        # ~200 bytes) or a set of keys
        self._indices: dict[str, dict[str, str | set[str]]] = {
            name: {} for name in self._indexers}

    def get(self, key: str) -> Any | None:
        """Object stored under ``key``, or None."""
        return self._items.get(key)

    def list(self) -> _List[Any]:
        """All stored objects (insertion order)."""
        return list(self._items.values())

    def keys(self) -> _List[str]:
        """All keys (insertion order)."""
        return list(self._items)

    def items(self) -> Iterator[tuple[str, Any]]:
        """Iterate ``(key, object)`` pairs (do not mutate the store while iterating)."""
        return iter(self._items.items())

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def index_keys(self, name: str, value: str) -> _List[str]:
        """Keys whose objects the indexer ``name`` maps to ``value`` (sorted).

        Raises:
            KeyError: no such indexer.
        """
        keys = self._indices[name].get(value)
        if keys is None:
            return []
        return [keys] if isinstance(keys, str) else sorted(keys)

    def by_index(self, name: str, value: str) -> _List[Any]:
        """Objects whose indexer ``name`` yields ``value`` (sorted by key).

        Raises:
            KeyError: no such indexer.
        """
        items = self._items
        return [items[k] for k in self.index_keys(name, value)]

    def index_values(self, name: str) -> _List[str]:
        """Distinct values currently present in index ``name``."""
        return list(self._indices[name])

    # -- mutation (the informer's) -------------------------------------------------------------

    def _values(self, name: str, fn: IndexFunc, obj: Any) -> _List[str]:
        try:
            return list(fn(obj) or ())
        except Exception:  # a broken indexer must not take the informer down
            log.exception("kube indexer failed index=%s", name)
            return []

    def _unindex(self, key: str, obj: Any) -> None:
        for name, fn in self._indexers.items():
            idx = self._indices[name]
            for value in self._values(name, fn, obj):
                keys = idx.get(value)
                if keys is None:
                    continue
                if isinstance(keys, str):
                    if keys == key:
                        del idx[value]
                    continue
                keys.discard(key)
                if len(keys) == 1:
                    idx[value] = next(iter(keys))

    def _index(self, key: str, obj: Any) -> None:
        for name, fn in self._indexers.items():
            idx = self._indices[name]
            for value in self._values(name, fn, obj):
                keys = idx.get(value)
                if keys is None or keys == key:
                    idx[value] = key
                elif isinstance(keys, str):
                    idx[value] = {keys, key}
                else:
                    keys.add(key)

    def _set(self, key: str, obj: Any) -> Any | None:
        old = self._items.get(key)
        if old is not None and self._indexers:
            self._unindex(key, old)
        self._items[key] = obj
        if self._indexers:
            self._index(key, obj)
        if self.observers:
            self._observe(old, obj)
        return old

    def compact_if_churned(self) -> bool:
        """Rebuild the dicts once as many keys were removed as the store holds (at least
        :data:`COMPACT_AFTER`), the index ones too; O(objects), so O(1) per removal.

        A dict never shrinks as keys are deleted, so after a churn that replaced every object
        its table stayed sized for the burst (docs/kube-api.md#relist-memory). Returns True if
        it rebuilt them.
        """
        if self._removed < max(COMPACT_AFTER, len(self._items)):
            return False
        self._removed = 0
        self._items = dict(self._items)
        for name, index in self._indices.items():
            self._indices[name] = dict(index)
        return True

    def _pop(self, key: str) -> Any | None:
        old = self._items.pop(key, None)
        if old is not None:
            self._removed += 1
            if self._indexers:
                self._unindex(key, old)
            if self.observers:
                self._observe(old, None)
        return old

    def _observe(self, old: Any | None, new: Any | None) -> None:
        for observer in self.observers:
            try:
                observer(old, new)
            except Exception:  # derived state must not take the informer down
                log.exception("kube store observer failed observer=%r", observer)



@dataclass(frozen=True, slots=True)
class _Handler:
    on_add: Callable[[Any], None] | None
    on_update: Callable[[Any, Any], None] | None
    on_delete: Callable[[Any], None] | None


NOT_SERVED_RETRY = 2.0
"""Seconds between LISTs while the resource itself answers 404 (a CRD not installed)."""


class Informer:
    """List+watch one resource into a :class:`Store` and fan events out to handlers.

    Args:
        client: the :class:`KubeClient`.
        res: resource to mirror.
        namespace: restrict to one namespace (None = all / cluster-scoped).
        label_selector, field_selector: server-side filters.
        transform: ``obj -> stored value`` applied to every object before storing
            (slim projections); handlers receive transformed values.
        indexers: index name → function(stored value) → list[str].
        page_size: LIST ``limit``.
        inactivity_timeout: seconds without a watch line before re-watching (90).
        watch_timeout_range: bounds (s) of the random server ``timeoutSeconds`` (300, 600).
        backoff: error backoff policy (client-go defaults).
        rng: random source (tests pass a seeded ``random.Random``).
        apply_chunk: streaming-list events applied, or objects removed at the end of a list,
            between two yields to the event loop (500); a paged LIST yields per page.
        watch_list: fill the cache from a streaming list (a watch with ``sendInitialEvents``)
            instead of a paged LIST; a refusal falls back to the paged LIST for good
            (docs/kube-api.md#streaming-lists). Off by default here; the binaries' knob
            ``--watch-list`` is on by default.
        initial_events_timeout: seconds (120) a streaming list may take to reach its
            ``k8s.io/initial-events-end`` BOOKMARK before it counts as refused.
        freeze_heap: move what the process holds into the garbage collector's permanent
            generation (``gc.freeze()``) after each LIST page, each applied chunk and every
            ``apply_chunk`` watch events, so the collector's full passes never walk the cache
            (docs/kube-api.md#garbage-collector).
        protobuf: ``transform`` reads only fields of the protobuf schema
            (``proto/kube/v1/objects.proto``), so for Pods and Nodes the LISTs and WATCHes may
            take Kubernetes protobuf (when the client's ``protobuf`` is on, the default) and hand
            it objects holding only those fields (docs/kube-api.md#protobuf). Off: whole objects
            in JSON.
        unchanged: ``(stored value, incoming object) -> bool``, asked for every watch
            MODIFIED event of a cached key before ``transform``: True skips the event (no
            projection, no store write, no handler), counted in
            ``bigfleet_informer_unchanged_events_total``. On a protobuf watch of Pods the
            incoming object is only the head the decoder builds (kube/protowire.py
            ``pod_head``), so the whole Pod is never converted
            (docs/kube-api.md#unchanged-pod-events).

    Usage::

        inf = Informer(client, CAPACITY_REQUESTS, transform=slim)
        inf.add_handler(on_add=..., on_update=..., on_delete=...)
        await nursery.start(inf.run)
        await inf.wait_synced()
    """

    def __init__(
        self,
        client: KubeClient,
        res: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Transform | None = None,
        indexers: dict[str, IndexFunc] | None = None,
        page_size: int = 500,
        inactivity_timeout: float = 90.0,
        watch_timeout_range: tuple[int, int] = (300, 600),
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        apply_chunk: int = 500,
        watch_list: bool = False,
        initial_events_timeout: float = 120.0,
        freeze_heap: bool = False,
        protobuf: bool = False,
        unchanged: Callable[[Any, dict[str, Any]], bool] | None = None,
    ):
        self.client = client
        self._unchanged = _UnchangedFilter(self, unchanged) if unchanged is not None else None
        self.protobuf = protobuf
        self.res = res
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.transform = transform
        self.store = Store(indexers)
        self.page_size = page_size
        self.inactivity_timeout = inactivity_timeout
        self.watch_timeout_range = watch_timeout_range
        if apply_chunk < 1:
            raise ValueError(f"apply_chunk must be >= 1 (got {apply_chunk})")
        self.apply_chunk = apply_chunk
        self.watch_list = watch_list
        self.initial_events_timeout = initial_events_timeout
        self.freeze_heap = freeze_heap
        self.watch_list_refused: str | None = None
        """Why the apiserver would not serve this informer a streaming list (it uses the paged
        LIST from then on), None while it does or ``watch_list`` is off."""
        self._need_list = True
        self._backoff = backoff or Backoff()
        self._rng = rng or random.Random()
        self._rv = ResourceVersionTracker()
        self._handlers: list[_Handler] = []
        self.served_again: list[Callable[[], None]] = []
        """Called (synchronously, from the informer's task) each time the resource is served
        again after a 404 for the resource itself (a CRD reinstalled)."""
        self._synced = trio.Event()
        metrics.INFORMER_SYNCED.labels(res.plural).set(0)
        self.last_error: Exception | None = None
        """The last list/watch failure, None once a list or watch succeeds again."""
        self.not_served = False
        """True while the apiserver answers 404 for the resource itself (a CRD not installed,
        or deleted while we run): /readyz says so (:meth:`problem`)."""
        self._relist_reason = "initial"  # why the next LIST runs (a metric label)
        self.relists = 0
        self.watches = 0

    @property
    def unchanged_events(self) -> int:
        """Watch events skipped as changing nothing (``unchanged``)."""
        return self._unchanged.skipped if self._unchanged is not None else 0

    @property
    def synced(self) -> bool:
        """True once the first LIST has been applied to the store."""
        return self._synced.is_set()

    @property
    def resource_version(self) -> str:
        """resourceVersion the next watch resumes from."""
        return self._rv.resource_version

    def problem(self) -> str | None:
        """Why this cache cannot be trusted now, for /readyz; None when it can.

        A resource that is not served is named with the fix (docs/crds.md#missing-crds); an
        unsynced cache carries its last error.
        """
        if self.not_served:
            return f"{_served_name(self.res)} is not served: {_not_served_fix(self.res)}"
        if not self.synced:
            why = f": {self.last_error}" if self.last_error is not None else ""
            return f"informer {self.res.plural} not synced{why}"
        return None

    async def wait_synced(self) -> None:
        """Block until the first LIST has been applied (handlers have seen every ADD)."""
        await self._synced.wait()

    def add_handler(
        self,
        on_add: Callable[[Any], None] | None = None,
        on_update: Callable[[Any, Any], None] | None = None,
        on_delete: Callable[[Any], None] | None = None,
    ) -> None:
        """Register callbacks ``on_add(obj)``, ``on_update(old, new)``, ``on_delete(obj)``.

        Handlers added after sync do not get a replay; call ``store.list()`` for the current state.
        """
        self._handlers.append(_Handler(on_add, on_update, on_delete))

    # -- the task ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run list+watch forever (until cancelled). Signals started at once, not at sync.

        A clean watch end re-watches at once from the last resourceVersion; an idle watch
        (``inactivity_timeout``) is re-opened from there too; 410 relists. A server that lost
        state (a watch refused as too new, or a resourceVersion older than ours) gets a LIST
        from scratch after one backoff step (docs/kube-api.md#relist-from-scratch). Other
        failures wait out the exponential backoff with jitter (0.8 s doubling to 30 s, reset
        after 2 min healthy; at least ``Retry-After`` on 429), then re-watch, or re-list if the
        list failed. With ``watch_list`` every list is a streaming list until the apiserver
        refuses one (:func:`refuses_watch_list`, a plain BOOKMARK or the watch ending before
        the initial events do): then the paged LIST at once, and for good.
        """
        task_status.started()
        name = self._name()
        self._need_list = True
        while True:
            streaming = self._need_list and self.watch_list and self.watch_list_refused is None
            try:
                if self._need_list and not streaming:
                    await self._relist()
                await self._watch_once(initial=streaming)
            except _WatchListRefused as exc:
                self._refuse(str(exc))
            except WatchInactivityTimeout as exc:
                log.warning(
                    "kube watch idle, re-watching informer=%s rv=%s err=%s",
                    name,
                    self._rv.resource_version,
                    exc,
                )
            except Expired as exc:
                if not self._need_list:
                    log.info(
                        "kube watch expired, relisting informer=%s rv=%s",
                        name,
                        self._rv.resource_version,
                    )
                    self._need_list = True
                    self._relist_reason = "expired"
                    continue
                await self._sleep_backoff(exc, "list")
            except _RolledBack as exc:
                self._need_list = True
                self._relist_reason = "rv_rollback"
                await self._sleep_backoff(exc, "watch", logging.INFO)  # the relist logs WARNING
            except (ApiError, KubeTransportError) as exc:
                stage = "list" if self._need_list else "watch"
                if isinstance(exc, NotFound):
                    # The resource itself is gone (a CRD deleted, and its objects with it):
                    # when it is back, its state is new, so list it, not watch on from an rv
                    # of the old one.
                    self._need_list = True
                    self._relist_reason = "not_served"
                elif isinstance(exc, ApiError):
                    if streaming and self._need_list and refuses_watch_list(exc):
                        self._refuse(f"HTTP {exc}")
                        continue
                    if stage == "watch" and is_too_large_resource_version(exc):
                        self._need_list = True
                        self._relist_reason = "too_large_rv"
                        await self._sleep_backoff(exc, stage, logging.INFO)
                        continue
                await self._sleep_backoff(exc, stage)

    def _refuse(self, why: str) -> None:
        self.watch_list_refused = why
        log.info(
            "kube streaming list refused, using paged LIST informer=%s why=%s",
            self._name(),
            why,
            extra={"informer": self._name(), "why": why},
        )

    async def _sleep_backoff(
        self, exc: Exception, stage: str, level: int = logging.WARNING
    ) -> None:
        # One backoff step before a relist from scratch too: apiservers behind one address
        # that disagree (HA, one lagging) must not make us relist in a hot loop.
        delay = self._backoff.next_delay(trio.current_time())
        if isinstance(exc, TooManyRequests) and exc.retry_after is not None:
            delay = max(delay, min(exc.retry_after, 60.0))
        self.last_error = exc
        if isinstance(exc, NotFound):
            # The resource type itself is gone (a LIST/WATCH of a collection is never 404
            # otherwise): one ERROR naming the fix, then quiet retries until it is back.
            # Poll for its return every few seconds, not on the growing backoff: a CRD
            # reinstalled is back at work within seconds (docs/crds.md#missing-crds).
            delay = min(delay, NOT_SERVED_RETRY)
            if not self.not_served:
                self.not_served = True
                log.error(
                    "%s is not served by the apiserver (404 on %s): %s",
                    _served_name(self.res), stage, _not_served_fix(self.res),
                    extra={"informer": self._name(), "resource": _served_name(self.res)},
                )
            level = logging.DEBUG
        log.log(
            level,
            "kube %s failed informer=%s rv=%s retry_in=%.2fs err=%s",
            stage,
            self._name(),
            self._rv.resource_version,
            delay,
            exc,
        )
        await trio.sleep(delay)

    def _served_again(self) -> None:
        self.last_error = None
        if self.not_served:
            self.not_served = False
            log.info("%s is served again", _served_name(self.res),
                     extra={"informer": self._name()})
            for listener in self.served_again:
                listener()

    def _name(self) -> str:
        return f"{self.res.plural}{'@' + self.namespace if self.namespace else ''}"

    def _keyed(self, raw: dict[str, Any]) -> tuple[str, Any] | None:
        try:
            key = object_key(raw)
        except ValueError:
            log.warning("kube object without name skipped informer=%s", self._name())
            return None
        if self.transform is None:
            return key, raw
        try:
            return key, self.transform(raw)
        except Exception:
            log.exception(
                "kube transform failed, object skipped informer=%s key=%s", self._name(), key
            )
            return None

    async def _relist(self) -> None:
        """LIST in ``limit``/``continue`` pages (a 410 on a continue token restarts the list).

        Each item is keyed (``"ns/name"`` or ``"name"``), transformed and applied to the store
        as its page arrives (:class:`_ListApply`); :meth:`_listed` finishes the list. The LIST
        never carries our resourceVersion: it is a consistent read of the server's current
        state, so after a server rollback it is the truth.
        """
        apply = _ListApply(self)

        def on_items(items: list[dict[str, Any]]) -> None:
            for raw in items:
                kv = self._keyed(raw)
                if kv is not None:
                    apply.upsert(*kv)
            items.clear()  # let the raw page go as soon as it is applied
            if self.freeze_heap:
                freeze_heap()

        rv = await self.client.list_paged(
            self.res,
            self.namespace,
            on_items=on_items,
            on_restart=apply.restart,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            limit=self.page_size,
            protobuf=self.protobuf,
        )
        await self._listed(rv, apply, "list")

    async def _listed(self, rv: str, apply: _ListApply, how: str) -> None:
        """Finish a complete list at resourceVersion ``rv``, got by ``how`` ("list" or
        "watch-list") and applied object by object as it arrived (``apply``), the same
        whichever way it came: the cached objects it did not name are removed.

        Against a non-empty store the handlers see the difference: changed objects as
        MODIFIED and new ones as ADDED as they arrive, vanished ones as DELETED at the end. A
        list that follows a server rollback (or whose resourceVersion is older than ours) is
        logged once at WARNING with the old and new resourceVersions and the objects dropped
        (docs/kube-api.md#relist-from-scratch). The first one marks the informer synced.
        """
        self.relists += 1
        old_rv = self._rv.resource_version
        reason = self._relist_reason
        if reason in ("initial", "expired") and rv_rolled_back(rv, old_rv):
            reason = "rv_rollback"
        counts = await apply.finish()
        self._rv.listed(rv)
        self._need_list = False
        self._served_again()
        metrics.INFORMER_RELISTS.labels(self.res.plural, reason).inc()
        log.info(
            "kube listed informer=%s rv=%s objects=%d diff=%s by=%s",
            self._name(),
            rv,
            len(self.store),
            counts,
            how,
        )
        if reason in ("too_large_rv", "rv_rollback"):
            dropped = counts.get("DELETED", 0)
            log.warning(
                "kube relisted from scratch after a server rollback informer=%s reason=%s "
                "old_rv=%s new_rv=%s dropped=%d",
                self._name(),
                reason,
                old_rv,
                rv,
                dropped,
                extra={
                    "resource": self.res.plural,
                    "reason": reason,
                    "old_rv": old_rv,
                    "new_rv": rv,
                    "dropped": dropped,
                },
            )
        if not self._synced.is_set():
            self._synced.set()
            metrics.INFORMER_SYNCED.labels(self.res.plural).set(1)

    async def _watch_once(self, initial: bool = False) -> None:
        """WATCH from the last resourceVersion with ``allowWatchBookmarks=true`` and a random
        ``timeoutSeconds`` in ``watch_timeout_range``; the resourceVersion advances on every
        event, BOOKMARKs included. Every line read runs under ``inactivity_timeout``.

        ``initial``: a streaming list instead (from no resourceVersion, with
        ``sendInitialEvents``): its initial events are gathered and applied as a list at the
        end BOOKMARK, then the same stream goes on as a watch.

        Raises:
            _WatchListRefused: (``initial``) the server showed it ignores ``sendInitialEvents``.
        """
        lo, hi = self.watch_timeout_range
        timeout = self._rng.randint(lo, hi)
        start = trio.current_time()
        events = 0
        self.watches += 1
        listing = _ListApply(self) if initial else None
        phase = InitialEvents(listing.upsert, listing.remove) if listing is not None else None
        deadline = start + self.initial_events_timeout if initial else math.inf
        with trio.CancelScope(deadline=deadline) as scope:
            async with self.client.watch(
                self.res,
                self.namespace,
                resource_version="" if initial else self._rv.resource_version,
                label_selector=self.label_selector,
                field_selector=self.field_selector,
                timeout_seconds=timeout,
                allow_bookmarks=True,
                inactivity_timeout=self.inactivity_timeout,
                retry=False,
                send_initial_events=initial,
                protobuf=self.protobuf,
            ) as stream:
                self._served_again()
                if self._unchanged is not None:
                    stream.unchanged = partial(self._unchanged.ask_head, phase)
                async for event in stream:
                    events += 1
                    if phase is not None and listing is not None and not phase.done:
                        await self._initial_event(phase, listing, event, scope)
                        if events % self.apply_chunk == 0:
                            await trio.lowlevel.checkpoint()  # docs/kube-api.md#relist-apply
                    else:
                        self._watch_event(event)
                    if events % self.apply_chunk == 0:
                        self.store.compact_if_churned()  # docs/kube-api.md#relist-memory
                        if self.freeze_heap:
                            freeze_heap()  # churn grows the cache too
        if phase is not None and not phase.done:
            if scope.cancelled_caught:
                raise _WatchListRefused(
                    f"no {INITIAL_EVENTS_END} BOOKMARK within {self.initial_events_timeout:g}s"
                )
            raise _WatchListRefused(f"the watch ended before the {INITIAL_EVENTS_END} BOOKMARK")
        if events == 0 and trio.current_time() - start < 1.0:
            # An instantly-closed empty watch is a failure, not a healthy end (client-go
            # "very short watch"); without this a broken proxy would make us spin.
            raise KubeTransportError("watch closed immediately without events")
        log.debug(
            "kube watch ended cleanly informer=%s rv=%s events=%d",
            self._name(),
            self._rv.resource_version,
            events,
        )

    async def _initial_event(
        self, phase: InitialEvents, listing: _ListApply, event: WatchEvent,
        scope: trio.CancelScope,
    ) -> None:
        """One event of a streaming list's initial phase, applied as it arrives (``phase``
        hands it to ``listing``); at the end the list is finished like a LIST's
        (:meth:`_listed`) and ``scope`` loses its deadline."""
        step = phase.feed(event, self._keyed)
        if step == "error":
            _raise_error_event(event)
        elif step == "unsupported":
            raise _WatchListRefused(
                f"a BOOKMARK without {INITIAL_EVENTS_END} came first: the apiserver ignored "
                "sendInitialEvents"
            )
        elif step == "end":
            scope.deadline = math.inf
            await self._listed(phase.resource_version, listing, "watch-list")

    def _watch_event(self, event: WatchEvent) -> None:
        if event.type == "ERROR":
            _raise_error_event(event)
        if rv_rolled_back(object_rv(event.object), self._rv.resource_version):
            raise _RolledBack(
                f"{event.type} at resourceVersion {object_rv(event.object)}, older than "
                f"ours ({self._rv.resource_version}): the server lost state"
            )
        self._rv.observe(event)
        if event.type != "BOOKMARK":
            self._apply(event)

    def _apply(self, event: WatchEvent) -> None:
        if self._unchanged is not None and self._unchanged.skip(event):
            return
        kv = self._keyed(event.object)
        if kv is None:
            return
        key, obj = kv
        if event.type == "DELETED":
            old = self.store._pop(key)
            if old is not None:
                self._dispatch("DELETED", old, obj)
            return
        old = self.store._set(key, obj)
        self._dispatch("ADDED" if old is None else "MODIFIED", old, obj)

    def _dispatch(self, etype: str, old: Any, new: Any) -> None:
        for h in self._handlers:
            try:
                if etype == "ADDED":
                    if h.on_add is not None:
                        h.on_add(new)
                elif etype == "MODIFIED":
                    if h.on_update is not None:
                        h.on_update(old, new)
                elif h.on_delete is not None:
                    h.on_delete(new if new is not None else old)
            except Exception:
                log.exception(
                    "kube informer handler failed informer=%s event=%s", self._name(), etype
                )


class _UnchangedFilter:
    """An informer's ``unchanged`` check (docs/kube-api.md#unchanged-pod-events): asked by a
    protobuf watch stream about a MODIFIED object's head, or here about a JSON object."""

    __slots__ = ("_inf", "_check", "skipped")

    def __init__(self, inf: Informer, check: Callable[[Any, dict[str, Any]], bool]) -> None:
        self._inf = inf
        self._check = check
        self.skipped = 0

    def ask_head(self, phase: InitialEvents | None, head: dict[str, Any]) -> bool:
        """The stream's question; never during a streaming list's initial phase (its events
        are the list)."""
        return (phase is None or phase.done) and self._ask(head)

    def _ask(self, obj: dict[str, Any]) -> bool:
        try:
            old = self._inf.store.get(object_key(obj))
            return old is not None and bool(self._check(old, obj))
        except Exception:  # a malformed object: not skipped, the projection reports it
            log.debug("kube unchanged check failed informer=%s", self._inf._name(),
                      exc_info=True)
            return False

    def skip(self, event: WatchEvent) -> bool:
        """True (counted) when a MODIFIED event changes nothing the store keeps: the stream's
        verdict, or the check asked here when the stream did not."""
        if event.type != "MODIFIED":
            return False
        verdict = event.unchanged
        if verdict is None:
            verdict = self._ask(event.object)
        if verdict:
            self.skipped += 1
            metrics.INFORMER_UNCHANGED.labels(self._inf.res.plural).inc()
        return verdict


class _ListApply:
    """A list (paged, or a streaming list's initial events) applied to the store as it
    arrives, so a relist never holds a second cache (docs/kube-api.md#relist-memory).

    Each listed object replaces the cached one at once (MODIFIED, or ADDED for a new key; an
    equal one keeps the cached copy and dispatches nothing); :meth:`finish` removes the cached
    objects the list did not name (DELETED) and returns the count per event type. Every
    object in the store is at one of its versions at all times, as between watch events
    (docs/kube-api.md#relist-apply).
    """

    __slots__ = ("_inf", "seen", "counts")

    def __init__(self, inf: Informer) -> None:
        self._inf = inf
        self.seen: set[str] = set()
        self.counts = {"ADDED": 0, "MODIFIED": 0, "DELETED": 0}

    def upsert(self, key: str, new: Any) -> None:
        """A listed object."""
        self.seen.add(key)
        inf = self._inf
        old = inf.store.get(key)
        if old is not None and (old is new or old == new):
            return
        etype = "ADDED" if old is None else "MODIFIED"
        self.counts[etype] += 1
        inf.store._set(key, new)
        inf._dispatch(etype, old, new)

    def remove(self, key: str, obj: Any) -> None:
        """A DELETED among a streaming list's initial events."""
        self.seen.discard(key)
        old = self._inf.store._pop(key)
        if old is not None:
            self.counts["DELETED"] += 1
            self._inf._dispatch("DELETED", old, obj)

    def restart(self) -> None:
        """The list starts over (a 410 on a continue token): what it names is counted anew."""
        self.seen.clear()

    async def finish(self) -> dict[str, int]:
        """Remove the cached objects the list did not name, yielding to the event loop every
        ``apply_chunk`` of them."""
        inf = self._inf
        seen = self.seen
        gone = [key for key in inf.store._items if key not in seen]
        self.seen = set()
        for n, key in enumerate(gone, 1):
            old = inf.store._pop(key)
            if old is not None:
                self.counts["DELETED"] += 1
                inf._dispatch("DELETED", old, None)
            if n % inf.apply_chunk == 0:
                await trio.lowlevel.checkpoint()
        inf.store.compact_if_churned()
        if inf.freeze_heap:
            freeze_heap()
        return self.counts


def _raise_error_event(event: WatchEvent) -> None:
    """Raise a watch ERROR event as its error (:class:`Expired` for 410)."""
    if is_expired(event):
        raise Expired(410, "Expired", str(event.object.get("message", "")), event.object)
    code = event.object.get("code")
    raise error_from_status(code if isinstance(code, int) else 500, event.object)


def _served_name(res: Resource) -> str:
    return f"{res.plural}.{res.group}" if res.group else res.plural


def _not_served_fix(res: Resource) -> str:
    if res.group == BIGFLEET_GROUP:
        return (f"the CustomResourceDefinition {res.plural}.{res.group} is not installed; "
                "install the CRDs with `bigfleet-trio install-crds` (or `kubectl apply -k "
                "config/crd`)")
    return f"this apiserver does not serve {res.group or 'core'}/{res.version} {res.plural}"


class SyncTimeout(Exception):
    """Informer caches did not sync within the start-up deadline (``--sync-timeout``).

    The message names the deadline in seconds and the plural of every informer still unsynced,
    e.g. ``timed out after 30s waiting for informer caches to sync (capacityrequests)``.
    """


async def wait_all_synced(informers: Sequence[Informer], seconds: float) -> None:
    """Wait until every informer in ``informers`` has synced, for at most ``seconds``.

    The Go agent's equivalent is controller-runtime's ``cache.WaitForCacheSync`` under a
    deadline (30 s in the Go operator, 10 min in its pod controller): an
    agent that cannot list its resources (RBAC missing, CRD not installed) must fail visibly
    and crash-loop, not sit unready forever.

    Raises:
        SyncTimeout: ``seconds`` passed with at least one informer unsynced.
    """
    with trio.move_on_after(seconds):
        for inf in informers:
            await inf.wait_synced()
        return
    unsynced = [inf for inf in informers if not inf.synced]
    missing = [inf.res.plural for inf in unsynced]
    # The last error says what to fix (a refused connection, a 403, a missing CRD); without
    # it the line only says that something did not work.
    last = next(((inf.res.plural, inf.last_error) for inf in unsynced
                 if inf.last_error is not None), None)
    why = f"; last error ({last[0]}): {' '.join(str(last[1]).split())}" if last else ""
    raise SyncTimeout(
        f"timed out after {seconds:g}s waiting for informer caches to sync "
        f"({', '.join(missing)}){why}"
    )
