"""In-memory object store: one global resourceVersion counter, per-resource buckets, a bounded
event history for watch replay and per-watcher Trio memory channels.

Stored objects are never mutated in place: every write stores a new dict (unchanged subtrees
may be shared), so readers, history entries and snapshots can hold references safely.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from typing import Any

import trio

from bigfleet_trio.kube.labelselector import Requirement, match_labels

from .resources import ResourceType
from .selectors import FieldRequirement

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace or "", name)

try:  # pragma: no cover - exercised implicitly
    import orjson

    def dumps(obj: Any) -> bytes:
        """Encode JSON (orjson when installed)."""
        return orjson.dumps(obj)

except ImportError:  # pragma: no cover
    import json

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


class Event:
    """One persisted change: ``type`` in ADDED/MODIFIED/DELETED, the new ``obj`` and ``old``."""

    __slots__ = ("rv", "type", "obj", "old", "_line")

    def __init__(
        self, rv: int, type_: str, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        self.rv = rv
        self.type = type_
        self.obj = obj
        self.old = old
        self._line: bytes | None = None

    def line(self) -> bytes:
        """The watch line for this event, encoded once."""
        if self._line is None:
            self._line = dumps({"type": self.type, "object": self.obj}) + b"\n"
        return self._line


class Watcher:
    """A registered watch: namespace + selectors and the channel events are pushed into.

    Items put on the channel are ``(type, obj, cached_line | None)``; a BOOKMARK item carries
    the resourceVersion string as ``obj``.
    """

    __slots__ = ("bucket", "namespace", "labels", "fields", "send", "receive", "closed", "reason")

    def __init__(
        self,
        bucket: Bucket,
        namespace: str | None,
        labels: list[Requirement],
        fields: list[FieldRequirement],
        buffer: int,
    ) -> None:
        self.bucket = bucket
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.send, self.receive = trio.open_memory_channel[tuple[str, Any, bytes | None]](buffer)
        self.closed = False
        self.reason = ""

    def matches(self, obj: dict[str, Any] | None) -> bool:
        """True when ``obj`` passes this watcher's namespace and selectors."""
        if obj is None:
            return False
        meta = obj["metadata"]
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        if self.labels and not match_labels(self.labels, meta.get("labels")):
            return False
        if self.fields:
            res = self.bucket.res
            for field, op, value in self.fields:
                if (op == "=") != (res.field_value(obj, field) == value):
                    return False
        return True

    def translate(self, ev: Event) -> tuple[str, dict[str, Any], bytes | None] | None:
        """Map a store event through this watcher's filter (enter → ADDED, leave → DELETED)."""
        if not self.namespace and not self.labels and not self.fields:
            return (ev.type, ev.obj, None)
        now = self.matches(ev.obj)
        if ev.type == "DELETED":
            return (ev.type, ev.obj, None) if now else None
        before = self.matches(ev.old) if ev.old is not None else False
        if now and before:
            return ("MODIFIED", ev.obj, None)
        if now:
            return ("ADDED", ev.obj, None) if ev.type == "MODIFIED" else (ev.type, ev.obj, None)
        if before:
            return ("DELETED", ev.obj, None)
        return None

    def push(self, item: tuple[str, Any, bytes | None]) -> None:
        """Queue an item; a full buffer closes the watch (the client re-watches)."""
        if self.closed:
            return
        try:
            self.send.send_nowait(item)
        except trio.WouldBlock:
            log.warning("watch on %s closed: client too slow (buffer full)", self.bucket.res.key)
            self.close("overflow")
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self.closed = True

    def close(self, reason: str = "closed") -> None:
        """Stop the watch; the streaming handler ends the response."""
        if not self.closed:
            self.closed = True
            self.reason = reason
            self.send.close()
            self.bucket.watchers.discard(self)


class Bucket:
    """All objects of one resource type plus its history and watchers."""

    __slots__ = ("res", "objects", "history", "dropped_rv", "watchers", "_sorted")

    def __init__(self, res: ResourceType, history: int) -> None:
        self.res = res
        self.objects: dict[Key, dict[str, Any]] = {}
        self.history: deque[Event] = deque(maxlen=history)
        self.dropped_rv = 0  # every event with rv <= dropped_rv may be missing from history
        self.watchers: set[Watcher] = set()
        self._sorted: list[Key] | None = None

    def sorted_keys(self) -> list[Key]:
        """Keys in (namespace, name) order, cached until the key set changes."""
        if self._sorted is None:
            self._sorted = sorted(self.objects)
        return self._sorted

    def record(self, ev: Event) -> None:
        """Append to history and fan out to watchers."""
        h = self.history
        if h.maxlen is not None and len(h) == h.maxlen:
            self.dropped_rv = h[0].rv
        h.append(ev)
        for w in list(self.watchers):
            item = w.translate(ev)
            if item is not None:
                if item[0] == ev.type and item[1] is ev.obj:
                    item = (item[0], item[1], ev.line())
                w.push(item)


class Store:
    """Objects of every resource, the global resourceVersion counter and GC indexes.

    Args:
        history: events retained per resource for watch replay (older → 410 Expired).
        watch_buffer: queued events per watcher before a slow watcher is closed.
    """

    def __init__(self, history: int = 50_000, watch_buffer: int = 20_000) -> None:
        self.rv = 1
        self.history = history
        self.watch_buffer = watch_buffer
        self.buckets: dict[str, Bucket] = {}
        self.uids: dict[str, tuple[str, Key]] = {}
        self.dependents: dict[str, set[tuple[str, Key]]] = {}
        self.listeners: list[Any] = []  # callables (resource key, Event) run after each change

    # ---- buckets -----------------------------------------------------------------------------

    def add_resource(self, res: ResourceType) -> Bucket:
        """Register (or re-register with a new definition) a resource type."""
        b = self.buckets.get(res.key)
        if b is None:
            b = Bucket(res, self.history)
            self.buckets[res.key] = b
        else:
            b.res = res
        return b

    def remove_resource(self, key: str) -> None:
        """Drop a resource type with all its objects and watchers."""
        b = self.buckets.pop(key, None)
        if b is None:
            return
        for w in list(b.watchers):
            w.close("resource removed")
        for k, obj in b.objects.items():
            self._unindex(key, k, obj)

    def bucket(self, res: ResourceType) -> Bucket:
        return self.buckets[res.key]

    # ---- reads -------------------------------------------------------------------------------

    def get(self, res: ResourceType, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The stored object (do not mutate it) or None."""
        return self.buckets[res.key].objects.get((namespace or "", name))

    def by_uid(self, uid: str) -> dict[str, Any] | None:
        """The live object with this uid, or None."""
        loc = self.uids.get(uid)
        if loc is None:
            return None
        b = self.buckets.get(loc[0])
        return b.objects.get(loc[1]) if b else None

    def items(self, res: ResourceType, namespace: str | None = None) -> Iterable[dict[str, Any]]:
        """Objects in (namespace, name) order, optionally in one namespace."""
        b = self.buckets[res.key]
        objs = b.objects
        if namespace:
            return (objs[k] for k in b.sorted_keys() if k[0] == namespace)
        return (objs[k] for k in b.sorted_keys())

    # ---- writes ------------------------------------------------------------------------------

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def put(
        self, res: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> dict[str, Any]:
        """Persist ``obj`` (its metadata dict must be fresh): assigns a new resourceVersion,
        records ADDED/MODIFIED and updates the uid/owner indexes."""
        b = self.buckets[res.key]
        rv = self.next_rv()
        meta = obj["metadata"]
        meta["resourceVersion"] = str(rv)
        key = (meta.get("namespace") or "", meta["name"])
        if key not in b.objects:
            b._sorted = None
        b.objects[key] = obj
        if old is None or old["metadata"].get("ownerReferences") != meta.get("ownerReferences"):
            if old is not None:
                self._unindex(res.key, key, old)
            self._index(res.key, key, obj)
        elif old is None:
            self._index(res.key, key, obj)
        ev = Event(rv, "ADDED" if old is None else "MODIFIED", obj, old)
        b.record(ev)
        for listener in self.listeners:
            listener(res.key, ev)
        return obj

    def remove(self, res: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """Delete ``obj``; the DELETED event carries its last state with the deletion RV."""
        b = self.buckets[res.key]
        meta = obj["metadata"]
        key = (meta.get("namespace") or "", meta["name"])
        b.objects.pop(key, None)
        b._sorted = None
        self._unindex(res.key, key, obj)
        rv = self.next_rv()
        final = dict(obj)
        final["metadata"] = dict(meta, resourceVersion=str(rv))
        ev = Event(rv, "DELETED", final, obj)
        b.record(ev)
        for listener in self.listeners:
            listener(res.key, ev)
        return final

    def _index(self, rkey: str, key: Key, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        uid = meta.get("uid")
        if uid:
            self.uids[uid] = (rkey, key)
        for ref in meta.get("ownerReferences") or ():
            ouid = ref.get("uid")
            if ouid:
                self.dependents.setdefault(ouid, set()).add((rkey, key))

    def _unindex(self, rkey: str, key: Key, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        uid = meta.get("uid")
        if uid and self.uids.get(uid) == (rkey, key):
            del self.uids[uid]
        for ref in meta.get("ownerReferences") or ():
            deps = self.dependents.get(ref.get("uid", ""))
            if deps is not None:
                deps.discard((rkey, key))
                if not deps:
                    del self.dependents[ref["uid"]]

    # ---- watch -------------------------------------------------------------------------------

    def compact(self) -> None:
        """Forget all history: a watch from any RV older than now gets 410."""
        for b in self.buckets.values():
            b.history.clear()
            b.dropped_rv = self.rv

    def drop_watches(self) -> int:
        """Close every open watch; returns how many were closed."""
        n = 0
        for b in self.buckets.values():
            for w in list(b.watchers):
                w.close("dropped")
                n += 1
        return n
