"""The pod controller's work-queue keys: which object a queued job is about, typed.

Four kinds of job share one de-duplicating queue; a key's type says which, its fields say
which object (``str(key)`` is ``"namespace/name"``, as in log lines).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import ClassVar, Self

__all__ = ["OrphanKey", "PodKey", "QueueKey", "RecreateKey", "StampKey", "split_key"]


def split_key(key: str) -> tuple[str, str]:
    """``"ns/name"`` -> ``("ns", "name")``; a key without "/" is ``("", key)``. The namespace
    is interned: a burst queues a key per Pod, and a cluster has few namespaces (at 150,000
    queued keys a string each was 8 MB)."""
    ns, sep, name = key.partition("/")
    return (sys.intern(ns), name) if sep else ("", key)


@dataclass(frozen=True, slots=True)
class _Key:
    kind: ClassVar[str] = ""
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def parse(cls, key: str) -> Self:
        """From ``"ns/name"``."""
        return cls(*split_key(key))


@dataclass(frozen=True, slots=True)
class PodKey(_Key):
    """Reconcile this Pod: make its CapacityRequest match it (or report why there is none)."""

    kind: ClassVar[str] = "pod"


@dataclass(frozen=True, slots=True)
class OrphanKey(_Key):
    """Check this CapacityRequest: delete it if its owner Pod is really gone."""

    kind: ClassVar[str] = "orphan"


@dataclass(frozen=True, slots=True)
class StampKey(_Key):
    """Stamp this CapacityRequest (just created by us) ``status.phase: Pending``."""

    kind: ClassVar[str] = "stamp"


@dataclass(frozen=True, slots=True)
class RecreateKey(_Key):
    """A CR of this Pod was deleted while the cache still shows the Pod: confirm the Pod is
    live (a GET) before re-creating it, since the deletion may be garbage collection after a
    Pod deletion the Pod watch has not delivered yet."""

    kind: ClassVar[str] = "recreate"


QueueKey = PodKey | OrphanKey | StampKey | RecreateKey
