"""Sans-IO pieces of the watch protocol (the client-go reflector's, without I/O).

* :func:`decode_watch_line` turns one line of a ``?watch=1`` response into a :class:`WatchEvent`.
* :class:`ResourceVersionTracker` keeps the resourceVersion to resume from (advanced by every
  ADDED/MODIFIED/DELETED/BOOKMARK event, never by ERROR).
* :func:`is_expired` recognises the "too old resource version" ERROR event (code 410).
* :class:`InitialEvents` follows the initial phase of a streaming list (a watch with
  ``sendInitialEvents=true``) up to its ``k8s.io/initial-events-end`` BOOKMARK.

Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

__all__ = [
    "EventType",
    "WatchEvent",
    "WatchDecodeError",
    "decode_watch_line",
    "ResourceVersionTracker",
    "object_rv",
    "object_key",
    "is_expired",
    "INITIAL_EVENTS_END",
    "InitialStep",
    "InitialEvents",
    "is_initial_events_end",
]

EventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]
TYPES = frozenset(("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"))
"""The event types a watch sends."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One watch event. ``object`` is the object dict (a ``Status`` dict for ERROR).

    ``unchanged``: True when the decoder already found that the event changes nothing the
    informer keeps (``object`` may then be a head of the object only: kube/protowire.py
    ``pod_head``), False when it asked and it does, None when nobody asked."""

    type: EventType
    object: dict[str, Any]
    unchanged: bool | None = None


class WatchDecodeError(ValueError):
    """A watch line was not a ``{"type": ..., "object": {...}}`` JSON document."""


def decode_watch_line(line: str | bytes) -> WatchEvent | None:
    """Decode one line of a watch stream.

    Args:
        line: the line, with or without its trailing newline.

    Returns:
        The event, or None for a blank line (keep-alive).

    Raises:
        WatchDecodeError: invalid JSON, unknown ``type`` or non-object ``object``.
    """
    text = line.strip()  # bytes stay bytes: orjson reads (and checks) UTF-8 itself
    if not text:
        return None
    try:
        doc = orjson.loads(text)
    except ValueError as exc:
        raise WatchDecodeError(f"watch line is not JSON (or not UTF-8): {text[:200]!r}") from exc
    if not isinstance(doc, dict):
        raise WatchDecodeError(f"watch line is not an object: {text[:200]!r}")
    etype = doc.get("type")
    obj = doc.get("object")
    if etype not in TYPES:
        raise WatchDecodeError(f"unknown watch event type {etype!r}")
    if not isinstance(obj, dict):
        raise WatchDecodeError(f"watch event {etype} has no object")
    return WatchEvent(etype, obj)


def object_rv(obj: Mapping[str, Any]) -> str:
    """``metadata.resourceVersion`` of an object ("" if absent)."""
    meta = obj.get("metadata")
    if isinstance(meta, Mapping):
        rv = meta.get("resourceVersion")
        if isinstance(rv, str):
            return rv
    return ""


def object_key(obj: Mapping[str, Any]) -> str:
    """Cache key: ``"namespace/name"`` for namespaced objects, ``"name"`` otherwise.

    Raises:
        ValueError: the object has no ``metadata.name``.
    """
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("name"):
        raise ValueError("object has no metadata.name")
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


class ResourceVersionTracker:
    """The resourceVersion a watch resumes from.

    Set by :meth:`listed` from a LIST's ``metadata.resourceVersion``; advanced by
    :meth:`observe` on every non-ERROR event that carries one (BOOKMARKs included).
    """

    def __init__(self, resource_version: str = ""):
        self.resource_version = resource_version

    def listed(self, resource_version: str) -> None:
        """Reset to the collection resourceVersion of a completed LIST."""
        self.resource_version = resource_version

    def observe(self, event: WatchEvent) -> bool:
        """Advance from an event.

        Returns:
            True if the resourceVersion changed.
        """
        if event.type == "ERROR":
            return False
        rv = object_rv(event.object)
        if rv and rv != self.resource_version:
            self.resource_version = rv
            return True
        return False


def is_expired(event: WatchEvent) -> bool:
    """True for an ERROR event meaning "resourceVersion too old" (code 410, Expired/Gone)."""
    if event.type != "ERROR":
        return False
    obj = event.object
    return obj.get("code") == 410 or obj.get("reason") in ("Expired", "Gone")


INITIAL_EVENTS_END = "k8s.io/initial-events-end"
"""Annotation of the BOOKMARK that ends a streaming list's initial events (value ``"true"``)."""

InitialStep = Literal["more", "end", "unsupported", "error"]


def is_initial_events_end(event: WatchEvent) -> bool:
    """True for the BOOKMARK annotated ``k8s.io/initial-events-end: "true"``."""
    if event.type != "BOOKMARK":
        return False
    meta = event.object.get("metadata")
    ann = meta.get("annotations") if isinstance(meta, Mapping) else None
    return isinstance(ann, Mapping) and ann.get(INITIAL_EVENTS_END) == "true"


class InitialEvents:
    """The initial phase of a streaming list (docs/kube-api.md#streaming-lists).

    Feed it each event of a watch opened with ``sendInitialEvents=true``: each object (keyed
    and transformed by ``keyed``) goes to ``on_set`` or ``on_delete`` as ``(key, object)`` as
    it arrives, so the caller applies the list as it comes (an informer: its store).
    :meth:`feed` answers:

    * ``"more"``: an object event, handed on (ADDED/MODIFIED to ``on_set``, DELETED to
      ``on_delete``; a server may send more than ADDED before the end);
    * ``"end"``: the ``k8s.io/initial-events-end`` BOOKMARK; :attr:`resource_version` is its
      resourceVersion, the state the objects handed on are consistent at;
    * ``"unsupported"``: a BOOKMARK without the annotation before the end: the server ignored
      ``sendInitialEvents`` (one that honours it sends no other BOOKMARK first);
    * ``"error"``: an ERROR event (the caller raises it).

    Events after ``"end"`` are not for this class (the caller applies them as a watch).
    """

    __slots__ = ("resource_version", "done", "skipped", "_on_set", "_on_delete")

    def __init__(
        self,
        on_set: Callable[[str, Any], None],
        on_delete: Callable[[str, Any], None],
    ) -> None:
        self._on_set = on_set
        self._on_delete = on_delete
        self.resource_version = ""
        self.done = False
        self.skipped = 0
        """Objects ``keyed`` refused (no name, a failing transform)."""

    def feed(
        self, event: WatchEvent, keyed: Callable[[dict[str, Any]], tuple[str, Any] | None]
    ) -> InitialStep:
        """One event of the initial phase; see the class docstring for the answers.

        Raises:
            RuntimeError: fed after ``"end"``.
        """
        if self.done:
            raise RuntimeError("initial events already ended")
        if event.type == "ERROR":
            return "error"
        if event.type == "BOOKMARK":
            if not is_initial_events_end(event):
                return "unsupported"
            self.done = True
            self.resource_version = object_rv(event.object)
            return "end"
        kv = keyed(event.object)
        if kv is None:
            self.skipped += 1
        elif event.type == "DELETED":
            self._on_delete(*kv)
        else:
            self._on_set(*kv)
        return "more"


def iter_keys(objs: Iterable[Mapping[str, Any]]) -> list[str]:
    """Keys of objects (convenience for tests and logs)."""
    return [object_key(o) for o in objs]
