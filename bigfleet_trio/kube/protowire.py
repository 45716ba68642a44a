"""Kubernetes protobuf (``application/vnd.kubernetes.protobuf``) for Pods and Nodes, sans I/O.

Bytes in, plain dicts out: the same JSON-shaped objects an informer's transform reads from a JSON
answer, holding only the fields of ``proto/kube/v1/objects.proto`` (what the transforms read),
decoded in C by protobuf's upb backend; every other field the server sends is skipped by the
parser and never becomes a Python object. Wire format and fallback: docs/kube-api.md#protobuf.
Nothing here does I/O.
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Callable
from typing import Any, Final

from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from ..proto.kube.v1 import objects_pb2 as pb
from .resources import NODES, PODS, Resource

__all__ = [
    "ACCEPT",
    "CONTENT_TYPE",
    "MAGIC",
    "ProtobufDecodeError",
    "decode_list",
    "decode_status",
    "decode_watch_frame",
    "decode_watch_frame_unless",
    "is_protobuf",
    "pod_head",
    "split_frames",
    "supports",
]

CONTENT_TYPE: Final = "application/vnd.kubernetes.protobuf"
ACCEPT: Final = f"{CONTENT_TYPE}, application/json"
"""The Accept header of a read that takes protobuf: protobuf first, JSON as the second choice
(client-go's), so a server or a resource without protobuf (CRs) answers JSON instead of 406."""

MAGIC: Final = b"k8s\x00"
"""First 4 bytes of every protobuf body (and of every object embedded in a watch event)."""

_FRAME_HEADER: Final = struct.Struct(">I")
MAX_FRAME: Final = 256 << 20
"""The largest watch frame taken (bytes); a longer length prefix means a broken stream."""


class ProtobufDecodeError(ValueError):
    """Bytes that are not the protobuf answer expected (no ``k8s\\x00`` prefix, a truncated or
    corrupt message, another kind than asked for, a frame above :data:`MAX_FRAME`)."""


def is_protobuf(content_type: str | None) -> bool:
    """True for a Content-Type of Kubernetes protobuf (``;stream=watch`` included)."""
    return bool(content_type) and content_type.split(";", 1)[0].strip() == CONTENT_TYPE  # type: ignore[union-attr]


def supports(res: Resource) -> bool:
    """True for the kinds the schema carries (core/v1 Pods and Nodes)."""
    return res in _KINDS


# ---- the envelope ----------------------------------------------------------------------------


def _unwrap(data: bytes) -> tuple[str, bytes]:
    """``kind`` and ``raw`` of a ``k8s\\x00`` + ``runtime.Unknown`` body."""
    if data[:4] != MAGIC:
        raise ProtobufDecodeError(f"no k8s protobuf prefix: {data[:16]!r}")
    unknown = pb.Unknown()
    try:
        unknown.ParseFromString(memoryview(data)[4:])
    except DecodeError as exc:
        raise ProtobufDecodeError(f"corrupt runtime.Unknown ({len(data)} bytes): {exc}") from exc
    if unknown.contentEncoding:
        raise ProtobufDecodeError(f"unsupported contentEncoding {unknown.contentEncoding!r}")
    return unknown.typeMeta.kind, unknown.raw


def _parse(cls: Any, raw: bytes) -> Any:
    msg = cls()
    try:
        msg.ParseFromString(raw)
    except DecodeError as exc:
        raise ProtobufDecodeError(f"corrupt {cls.__name__} ({len(raw)} bytes): {exc}") from exc
    return msg


# ---- messages -> JSON-shaped dicts -----------------------------------------------------------
# Each converter emits what the apiserver's JSON carries for the schema's fields: a string,
# list or map only when non-empty (Go's omitempty), an optional scalar (a Go pointer:
# priority, restartPolicy) when the message has it.


def _time(t: Any) -> str:
    """metav1.Time as JSON writes it: RFC 3339, seconds, UTC."""
    when = dt.datetime.fromtimestamp(t.seconds, dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _quantities(m: Any) -> dict[str, str]:
    return {k: v.string for k, v in m.items()}


def _map(m: Any) -> dict[str, str]:
    """A protobuf map field as a dict: indexing key by key is about twice as fast as
    ``dict(m)`` on upb's map containers (``python -m scripts.bench kubewire``)."""
    return {k: m[k] for k in m}


def _generic(msg: Any) -> dict[str, Any]:
    """A small nested message (affinity terms, selectors, spread constraints) field by field:
    message fields recursively, maps as dicts, repeated fields as lists; empty strings left
    out."""
    out: dict[str, Any] = {}
    for field, value in msg.ListFields():
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                out[field.name] = _map(value)
            elif field.is_repeated:
                out[field.name] = [_generic(v) for v in value]
            else:
                out[field.name] = _generic(value)
        elif field.is_repeated:
            out[field.name] = list(value)
        elif value != "":
            out[field.name] = value
    return out


def _meta(m: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if m.name:
        out["name"] = m.name
    if m.namespace:
        out["namespace"] = m.namespace
    if m.uid:
        out["uid"] = m.uid
    if m.resourceVersion:
        out["resourceVersion"] = m.resourceVersion
    if m.HasField("generation"):
        out["generation"] = m.generation
    if m.HasField("deletionTimestamp"):
        out["deletionTimestamp"] = _time(m.deletionTimestamp)
    if m.labels:
        out["labels"] = _map(m.labels)
    if m.annotations:
        out["annotations"] = _map(m.annotations)
    return out


def _requirements(r: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if r.limits:
        out["limits"] = _quantities(r.limits)
    if r.requests:
        out["requests"] = _quantities(r.requests)
    return out


def _container(c: Any) -> dict[str, Any]:
    # JSON always writes a container's resources (a struct, {} when empty)
    out: dict[str, Any] = {"resources": _requirements(c.resources)}
    if c.HasField("restartPolicy"):
        out["restartPolicy"] = c.restartPolicy
    return out


def _pod_spec(s: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if s.initContainers:
        out["initContainers"] = [_container(c) for c in s.initContainers]
    out["containers"] = [_container(c) for c in s.containers]
    if s.nodeSelector:
        out["nodeSelector"] = _map(s.nodeSelector)
    if s.nodeName:
        out["nodeName"] = s.nodeName
    if s.HasField("affinity"):
        out["affinity"] = _generic(s.affinity)
    if s.priorityClassName:
        out["priorityClassName"] = s.priorityClassName
    if s.HasField("priority"):
        out["priority"] = s.priority
    if s.overhead:
        out["overhead"] = _quantities(s.overhead)
    if s.topologySpreadConstraints:
        out["topologySpreadConstraints"] = [_generic(c) for c in s.topologySpreadConstraints]
    if s.HasField("resources"):
        out["resources"] = _requirements(s.resources)
    return out


def pod_dict(p: Any) -> dict[str, Any]:
    """A decoded ``Pod`` as the JSON-shaped dict of its schema fields."""
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": _meta(p.metadata)}
    if p.HasField("spec"):
        out["spec"] = _pod_spec(p.spec)
    if p.HasField("status"):
        out["status"] = {"phase": p.status.phase} if p.status.phase else {}
    return out


def pod_head(p: Any) -> dict[str, Any]:
    """A decoded ``Pod`` without its spec but ``nodeName``: what deciding that a MODIFIED Pod
    changed nothing needs (docs/kube-api.md#unchanged-pod-events), at a fraction of
    :func:`pod_dict`'s cost (the containers, quantities and affinity terms are not converted)."""
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": _meta(p.metadata)}
    if p.spec.nodeName:
        out["spec"] = {"nodeName": p.spec.nodeName}
    if p.HasField("status"):
        out["status"] = {"phase": p.status.phase} if p.status.phase else {}
    return out


def node_dict(n: Any) -> dict[str, Any]:
    """A decoded ``Node`` as the JSON-shaped dict of its schema fields."""
    spec: dict[str, Any] = {}
    if n.spec.providerID:
        spec["providerID"] = n.spec.providerID
    if n.spec.unschedulable:
        spec["unschedulable"] = True
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": _meta(n.metadata),
                           "spec": spec}
    conds = [{"type": c.type, "status": c.status} for c in n.status.conditions]
    out["status"] = {"conditions": conds} if conds else {}
    return out


def _status_dict(s: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Status", "metadata": {}}
    for name in ("status", "message", "reason"):
        if getattr(s, name):
            out[name] = getattr(s, name)
    if s.HasField("details"):
        out["details"] = _generic(s.details)
    if s.HasField("code"):
        out["code"] = s.code
    return out


_Converter = Callable[[Any], dict[str, Any]]
_OBJECTS: Final[dict[str, tuple[Any, _Converter]]] = {
    "Pod": (pb.Pod, pod_dict),
    "Node": (pb.Node, node_dict),
    "Status": (pb.Status, _status_dict),
}
_KINDS: Final[dict[Resource, tuple[Any, _Converter]]] = {
    PODS: (pb.PodList, pod_dict),
    NODES: (pb.NodeList, node_dict),
}


# ---- bodies ------------------------------------------------------------------------------------


def decode_list(res: Resource, data: bytes) -> tuple[list[dict[str, Any]], str, str]:
    """A LIST answer (``PodList`` or ``NodeList``).

    Returns:
        ``(items, resourceVersion, continue)``: the objects as dicts (see the module
        docstring), the collection's resourceVersion and continue token ("" when absent).

    Raises:
        ProtobufDecodeError: not a protobuf list of ``res``'s kind.
        KeyError: ``res`` is not a kind the schema carries (:func:`supports`).
    """
    cls, conv = _KINDS[res]
    kind, raw = _unwrap(data)
    if kind != f"{res.kind}List":
        raise ProtobufDecodeError(f"expected a {res.kind}List, got {kind!r}")
    lst = _parse(cls, raw)
    # "continue" is a Python keyword: the field is read by name
    return ([conv(item) for item in lst.items], lst.metadata.resourceVersion,
            getattr(lst.metadata, "continue"))


def decode_status(data: bytes) -> dict[str, Any]:
    """A protobuf ``Status`` (an error answer) as the dict JSON would give.

    Raises:
        ProtobufDecodeError: not a protobuf Status.
    """
    kind, raw = _unwrap(data)
    if kind != "Status":
        raise ProtobufDecodeError(f"expected a Status, got {kind!r}")
    return _status_dict(_parse(pb.Status, raw))


def decode_watch_frame(frame: bytes) -> tuple[str, dict[str, Any]]:
    """One frame of a protobuf watch: a ``metav1.WatchEvent`` (no prefix of its own) whose
    object is a ``k8s\\x00``-prefixed ``runtime.Unknown`` of a Pod, a Node or, for ERROR, a
    Status.

    Returns:
        ``(type, object)``: the event type as sent and the object as a dict.

    Raises:
        ProtobufDecodeError: a corrupt frame or an object of a kind the schema lacks.
    """
    etype, obj, _ = decode_watch_frame_unless(frame, None)
    return etype, obj


def decode_watch_frame_unless(
    frame: bytes, unchanged: Callable[[dict[str, Any]], bool] | None,
) -> tuple[str, dict[str, Any], bool | None]:
    """:func:`decode_watch_frame`, asking ``unchanged`` first about a MODIFIED Pod's head
    (:func:`pod_head`): when it says True, the head is returned instead of the whole Pod, which
    is never converted (docs/kube-api.md#unchanged-pod-events).

    Returns:
        ``(type, object, verdict)``: verdict True (``object`` is the head: the event changes
        nothing), False (asked; the whole object), None (not asked: no ``unchanged``, not a
        MODIFIED Pod).

    Raises:
        ProtobufDecodeError: as :func:`decode_watch_frame`; whatever ``unchanged`` raises.
    """
    event = _parse(pb.WatchEvent, frame)
    kind, raw = _unwrap(event.object.raw)
    try:
        cls, conv = _OBJECTS[kind]
    except KeyError:
        raise ProtobufDecodeError(f"watch event {event.type} carries a {kind!r}") from None
    msg = _parse(cls, raw)
    if unchanged is None or kind != "Pod" or event.type != "MODIFIED":
        return event.type, conv(msg), None
    head = pod_head(msg)
    if unchanged(head):
        return event.type, head, True
    return event.type, conv(msg), False


def split_frames(buffer: bytearray) -> list[bytes]:
    """Take the complete length-prefixed frames (a 4-byte big-endian length, then the frame)
    off the front of ``buffer``; a partial frame stays in it.

    Raises:
        ProtobufDecodeError: a length above :data:`MAX_FRAME`.
    """
    frames: list[bytes] = []
    pos, end = 0, len(buffer)
    while end - pos >= 4:
        (size,) = _FRAME_HEADER.unpack_from(buffer, pos)
        if size > MAX_FRAME:
            raise ProtobufDecodeError(f"watch frame of {size} bytes (limit {MAX_FRAME})")
        if end - pos - 4 < size:
            break
        frames.append(bytes(buffer[pos + 4:pos + 4 + size]))
        pos += 4 + size
    if pos:
        del buffer[:pos]
    return frames
