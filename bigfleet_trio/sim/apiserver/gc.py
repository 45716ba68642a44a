"""Garbage collection in the embedded apiserver: dependents of a deleted owner (Background
deletes them, Orphan strips the ownerReference), objects created with only dangling owners,
and a deleted namespace's contents.

Synchronous, run by :mod:`.state` right after the delete that triggers it, so a test sees the
cascade as soon as the DELETE returns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from .resources import ResourceType
from .store import Key, Store

log = logging.getLogger(__name__)

DeleteFn = Callable[[ResourceType, dict[str, Any], str], dict[str, Any]]


class GarbageCollector:
    """Cascading deletes over ``store``; ``delete(res, obj, policy)`` deletes one object
    (honouring its finalizers) and triggers the next round itself."""

    def __init__(self, store: Store, delete: DeleteFn) -> None:
        self.store = store
        self.delete = delete

    def owner_deleted(self, owner_uid: str, policy: str) -> None:
        """Handle the dependents of a deleted owner per ``policy`` (Background / Orphan)."""
        deps = self.store.dependents.pop(owner_uid, None)
        if not deps:
            return
        for rkey, key in sorted(deps):
            b = self.store.buckets.get(rkey)
            obj = b.objects.get(key) if b is not None else None
            if b is None or obj is None:
                continue
            if policy == "Orphan":
                new = dict(obj)
                new["metadata"] = dict(obj["metadata"])
                refs = [
                    r
                    for r in obj["metadata"].get("ownerReferences") or ()
                    if r.get("uid") != owner_uid
                ]
                if refs:
                    new["metadata"]["ownerReferences"] = refs
                else:
                    new["metadata"].pop("ownerReferences", None)
                self.store.put(b.res, new, obj)
                continue
            self.collect_if_orphaned(rkey, key)

    def collect_if_orphaned(self, rkey: str, key: Key) -> None:
        """Delete the object at (rkey, key) when every one of its owners is gone; another
        live owner keeps it."""
        b = self.store.buckets.get(rkey)
        obj = b.objects.get(key) if b else None
        if b is None or obj is None:
            return
        refs = obj["metadata"].get("ownerReferences") or ()
        if refs and all(self.store.by_uid(r.get("uid", "")) is None for r in refs):
            log.info("gc: deleting %s %s/%s (owners gone)", rkey, key[0], key[1])
            self.delete(b.res, obj, "Background")

    def empty_namespace(self, namespace: str, resources: Iterable[ResourceType]) -> None:
        """Delete every namespaced object in a namespace that was just deleted."""
        for r in list(resources):
            if not r.namespaced:
                continue
            for o in list(self.store.items(r, namespace)):
                if self.store.get(r, namespace, o["metadata"]["name"]) is o:
                    self.delete(r, o, "Background")
