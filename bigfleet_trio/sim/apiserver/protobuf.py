"""Just enough Kubernetes protobuf decoding for the imperative kubectl commands that send
protobuf bodies for built-in kinds (``kubectl create namespace``, ``kubectl create configmap``,
``kubectl create token``, ``kubectl auth can-i``).

A body is ``k8s\\x00`` + runtime.Unknown{typeMeta{apiVersion=1, kind=2}=1, raw=2, ...}; raw is the
object whose field 1 is ObjectMeta (name=1, generateName=2, namespace=3, labels=11,
annotations=12). Only kinds listed in :data:`SUPPORTED` are decoded; others are refused (415).
"""

from __future__ import annotations

from typing import Any

MAGIC = b"k8s\x00"


class ProtobufError(ValueError):
    """Malformed or unsupported protobuf body."""


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = 0
    out = 0
    while True:
        if i >= len(buf):
            raise ProtobufError("truncated varint")
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, i
        shift += 7
        if shift > 63:
            raise ProtobufError("varint too long")


def fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """Decode one message level into ``(field_number, wire_type, value)`` triples."""
    out = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        val: Any
        if wt == 0:
            val, i = _varint(buf, i)
        elif wt == 2:
            ln, i = _varint(buf, i)
            if i + ln > len(buf):
                raise ProtobufError("truncated field")
            val = buf[i : i + ln]
            i += ln
        elif wt == 1:
            val = buf[i : i + 8]
            i += 8
        elif wt == 5:
            val = buf[i : i + 4]
            i += 4
        else:
            raise ProtobufError(f"unsupported wire type {wt}")
        out.append((num, wt, val))
    return out


def _str(v: Any) -> str:
    if not isinstance(v, bytes):
        raise ProtobufError("expected bytes")
    return v.decode("utf-8")


def _map(entries: list[bytes]) -> dict[str, str]:
    out = {}
    for e in entries:
        k = v = ""
        for num, _, val in fields(e):
            if num == 1:
                k = _str(val)
            elif num == 2:
                v = _str(val)
        out[k] = v
    return out


def _meta(buf: bytes) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    labels: list[bytes] = []
    annotations: list[bytes] = []
    for num, _, val in fields(buf):
        if num == 1:
            meta["name"] = _str(val)
        elif num == 2:
            meta["generateName"] = _str(val)
        elif num == 3:
            meta["namespace"] = _str(val)
        elif num == 11:
            labels.append(val)
        elif num == 12:
            annotations.append(val)
    if labels:
        meta["labels"] = _map(labels)
    if annotations:
        meta["annotations"] = _map(annotations)
    return {k: v for k, v in meta.items() if v != ""}


def _configmap(parts: list[tuple[int, int, Any]], obj: dict[str, Any]) -> None:
    data = [v for n, _, v in parts if n == 2]
    if data:
        obj["data"] = _map(data)


def _priorityclass(parts: list[tuple[int, int, Any]], obj: dict[str, Any]) -> None:
    for num, _, val in parts:
        if num == 2:
            v = int(val)
            obj["value"] = v - (1 << 64) if v >= 1 << 63 else v
        elif num == 3:
            obj["globalDefault"] = bool(val)
        elif num == 4:
            obj["description"] = _str(val)
        elif num == 5:
            obj["preemptionPolicy"] = _str(val)


def _tokenrequest(parts: list[tuple[int, int, Any]], obj: dict[str, Any]) -> None:
    # spec = 2: audiences = 1 (repeated), boundObjectRef = 3, expirationSeconds = 4
    spec: dict[str, Any] = {}
    for num, _, val in parts:
        if num != 2:
            continue
        for n2, _, v2 in fields(val):
            if n2 == 1:
                spec.setdefault("audiences", []).append(_str(v2))
            elif n2 == 4:
                spec["expirationSeconds"] = int(v2)
            elif n2 == 3:
                names = {1: "kind", 2: "apiVersion", 3: "name", 4: "uid"}
                spec["boundObjectRef"] = {
                    names[n3]: _str(v3) for n3, _, v3 in fields(v2) if n3 in names
                }
    obj["spec"] = spec


_RESOURCE_ATTRS = {1: "namespace", 2: "verb", 3: "group", 4: "version", 5: "resource",
                   6: "subresource", 7: "name"}
_NON_RESOURCE_ATTRS = {1: "path", 2: "verb"}


def _access_review(parts: list[tuple[int, int, Any]], obj: dict[str, Any]) -> None:
    # spec = 2: resourceAttributes = 1, nonResourceAttributes = 2, user = 3, groups = 4
    spec: dict[str, Any] = {}
    for num, _, val in parts:
        if num != 2:
            continue
        for n2, _, v2 in fields(val):
            if n2 in (1, 2):
                names = _RESOURCE_ATTRS if n2 == 1 else _NON_RESOURCE_ATTRS
                key = "resourceAttributes" if n2 == 1 else "nonResourceAttributes"
                spec[key] = {names[n3]: _str(v3) for n3, _, v3 in fields(v2) if n3 in names}
            elif n2 == 3:
                spec["user"] = _str(v2)
            elif n2 == 4:
                spec.setdefault("groups", []).append(_str(v2))
    obj["spec"] = spec


SUPPORTED = {
    "Namespace": None,
    "ConfigMap": _configmap,
    "PriorityClass": _priorityclass,
    "TokenRequest": _tokenrequest,
    "SelfSubjectAccessReview": _access_review,
    "SubjectAccessReview": _access_review,
}


def decode(body: bytes) -> dict[str, Any]:
    """Decode a Kubernetes protobuf body into a JSON-shaped dict.

    Raises:
        ProtobufError: malformed data or a kind outside :data:`SUPPORTED`.
    """
    if not body.startswith(MAGIC):
        raise ProtobufError("missing k8s protobuf magic")
    api_version = kind = ""
    raw = b""
    for num, _, val in fields(body[len(MAGIC) :]):
        if num == 1:
            for n2, _, v2 in fields(val):
                if n2 == 1:
                    api_version = _str(v2)
                elif n2 == 2:
                    kind = _str(v2)
        elif num == 2:
            raw = val
    if kind not in SUPPORTED:
        raise ProtobufError(f"protobuf bodies for kind {kind!r} are not supported")
    parts = fields(raw)
    obj: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "metadata": {}}
    for num, _, val in parts:
        if num == 1:
            obj["metadata"] = _meta(val)
    extra = SUPPORTED[kind]
    if extra is not None:
        extra(parts, obj)
    return obj
