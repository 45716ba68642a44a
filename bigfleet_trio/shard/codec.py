"""Downlink decoding with protobuf's upb classes, converted at the edge to the betterproto model.

Where it sits: the gRPC transport (:mod:`bigfleet_trio.shard.grpc`) hands raw ``ShardMessage``
bytes to :func:`decode_shard_message`; everything above the transport keeps the betterproto
classes of :mod:`bigfleet_trio.proto`. The upb classes are built from ``descriptor.binpb``, the
FileDescriptorSet ``scripts/gen-proto`` compiles from the same ``.proto`` files, so both models
describe one wire. Uplink frames can be sent pre-encoded (:class:`EncodedFrame`). Rules and the
malformed-frame policy: ``docs/wire.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

import betterproto
from google.protobuf import (  # type: ignore[import-untyped]
    descriptor_pb2,
    descriptor_pool,
    message_factory,
)
from google.protobuf.descriptor import (  # type: ignore[import-untyped]
    Descriptor,
    FieldDescriptor,
)
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from google.protobuf.unknown_fields import UnknownFieldSet  # type: ignore[import-untyped]
from prometheus_client import Counter

from bigfleet_trio.proto import pb

__all__ = [
    "BOOTSTRAP_TAG",
    "MALFORMED_FRAMES",
    "EncodedFrame",
    "MalformedFrame",
    "decode_shard_message",
    "is_bootstrap_frame",
    "upb_class",
]

log = logging.getLogger(__name__)

_PACKAGE: Final = "bigfleet.v1alpha1"

#: First byte of a serialized ``ShardMessage`` carrying a BootstrapRequest: oneof field 2,
#: wire type 2 (length-delimited). A ShardMessage has exactly one field set and encoders write
#: fields in number order, so the payload's tag is the frame's first byte.
BOOTSTRAP_TAG: Final = 0x12

MALFORMED_FRAMES = Counter(
    "bigfleet_operator_malformed_frames",
    "Downlink frames that are not a valid ShardMessage, skipped before any handler saw them.",
    ["problem"],
)
_CORRUPT = MALFORMED_FRAMES.labels("corrupt")
_WRONG_WIRE_TYPE = MALFORMED_FRAMES.labels("wrong_wire_type")


class MalformedFrame(ValueError):
    """A downlink frame that is not a valid ``ShardMessage``.

    Attributes:
        problem: ``"corrupt"`` (truncated, bad varint, invalid UTF-8, ...) or
            ``"wrong_wire_type"`` (a known field number encoded with another wire type).
        size: frame length in bytes.
    """

    def __init__(self, problem: str, detail: str, size: int) -> None:
        super().__init__(f"malformed ShardMessage ({size} bytes): {problem}: {detail}")
        self.problem = problem
        self.size = size


@dataclass(frozen=True, slots=True)
class EncodedFrame:
    """An uplink ``OperatorMessage`` already serialized (e.g. a roll-up from cached encodings).

    The gRPC codec writes ``data`` as is. ``kind`` is the oneof field name (``"rollup"``) for
    metrics and logs.
    """

    kind: str
    data: bytes

    def __bytes__(self) -> bytes:
        return self.data


def is_bootstrap_frame(data: bytes) -> bool:
    """True when raw ShardMessage bytes carry a BootstrapRequest (looks at the first byte only)."""
    return bool(data) and data[0] == BOOTSTRAP_TAG


# ---- upb classes from the committed descriptor set ---------------------------------------------


def _load_pool() -> descriptor_pool.DescriptorPool:
    raw = (resources.files("bigfleet_trio.proto") / "descriptor.binpb").read_bytes()
    fds = descriptor_pb2.FileDescriptorSet.FromString(raw)
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    return pool


_POOL: Final = _load_pool()


def upb_class(name: str) -> Any:
    """The protobuf (upb) message class for ``bigfleet.v1alpha1.<name>``."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.{name}"))


# ---- conversion upb -> betterproto ------------------------------------------------------------

Converter = Callable[[Any, int], betterproto.Message]
_converters: dict[type[betterproto.Message], Converter] = {}
_PLACEHOLDER: Final = betterproto.PLACEHOLDER


def _enum_converter(enum_cls: Any) -> Callable[[int], Any]:
    # Known values map to the member; an unknown value (a newer shard's) stays a plain int, as
    # betterproto's own decoders leave it, so the handler can see and report it.
    members = {int(m): m for m in enum_cls}

    def conv(v: int) -> Any:
        return members.get(v, v)

    return conv


def _check_unknown(msg: Any, known: frozenset[int], name: str, size: int) -> None:
    """A field number the schema knows, stored as unknown, arrived with the wrong wire type."""
    for f in UnknownFieldSet(msg):
        if f.field_number in known:
            _WRONG_WIRE_TYPE.inc()
            raise MalformedFrame(
                "wrong_wire_type",
                f"{name} field {f.field_number} has wire type {f.wire_type}",
                size,
            )


def _converter(cls: type[betterproto.Message]) -> Converter:
    """Build (once per class) a function turning a upb message into ``cls``."""
    hit = _converters.get(cls)
    if hit is not None:
        return hit
    meta: Any = getattr(cls, "_betterproto")  # noqa: B009 - class metadata (numbers, classes)
    desc: Descriptor = _POOL.FindMessageTypeByName(f"{_PACKAGE}.{cls.__name__}")
    known = frozenset(f.number for f in desc.fields)
    groups = sorted({m.group for m in meta.meta_by_field_name.values() if m.group})
    steps: list[tuple[str, Callable[[Any, int], Any]]] = []
    oneof_fields: set[str] = set()
    for name, fmeta in meta.meta_by_field_name.items():
        fdesc: FieldDescriptor = desc.fields_by_number[fmeta.number]
        if fmeta.group:
            oneof_fields.add(name)
        steps.append((name, _field_step(cls, name, fmeta, fdesc)))
    new = object.__new__
    qual = desc.full_name
    group_of = dict(meta.oneof_group_by_field)

    def convert(m: Any, size: int = 0) -> betterproto.Message:
        _check_unknown(m, known, qual, size)
        obj = new(cls)
        d = obj.__dict__
        current: dict[str, str | None] = {g: None for g in groups}
        if groups:
            for g in groups:
                current[g] = m.WhichOneof(g)
        for name, step in steps:
            if name in oneof_fields and current[group_of[name]] != name:
                d[name] = _PLACEHOLDER
            else:
                d[name] = step(m, size)
        d["_serialized_on_wire"] = True
        d["_unknown_fields"] = b""
        d["_group_current"] = current
        return obj

    _converters[cls] = convert
    return convert


def _is_repeated(fdesc: FieldDescriptor) -> bool:
    flag = getattr(fdesc, "is_repeated", None)  # protobuf >= 6; ``label`` before (removed in 7)
    if flag is None:
        return bool(fdesc.label == FieldDescriptor.LABEL_REPEATED)
    return bool(flag)


def _field_step(
    cls: type[betterproto.Message], name: str, fmeta: Any, fdesc: FieldDescriptor
) -> Callable[[Any, int], Any]:
    """One field's getter: upb value -> betterproto value."""
    meta: Any = getattr(cls, "_betterproto")  # noqa: B009
    repeated = _is_repeated(fdesc)
    if fmeta.proto_type == betterproto.TYPE_MAP:
        value_cls = meta.cls_by_field.get(f"{name}.value")
        if fmeta.map_types[1] == betterproto.TYPE_MESSAGE:
            sub = _converter(value_cls)
            return lambda m, size: {k: sub(v, size) for k, v in getattr(m, name).items()}
        if fmeta.map_types[1] == betterproto.TYPE_ENUM:
            econv = _enum_converter(value_cls)
            return lambda m, size: {k: econv(v) for k, v in getattr(m, name).items()}
        return lambda m, size: dict(getattr(m, name))
    if fmeta.proto_type == betterproto.TYPE_MESSAGE:
        sub_cls = meta.cls_by_field[name]
        if repeated:
            return lambda m, size: [_converter(sub_cls)(v, size) for v in getattr(m, name)]

        def message_step(m: Any, size: int) -> Any:
            if not m.HasField(name):
                return _PLACEHOLDER
            return _converter(sub_cls)(getattr(m, name), size)

        return message_step
    if fmeta.proto_type == betterproto.TYPE_ENUM:
        econv = _enum_converter(meta.cls_by_field[name])
        if repeated:
            return lambda m, size: [econv(v) for v in getattr(m, name)]
        return lambda m, size: econv(getattr(m, name))
    if repeated:
        return lambda m, size: list(getattr(m, name))
    return lambda m, size: getattr(m, name)


_ShardMessageUpb: Final = upb_class("ShardMessage")


def decode_shard_message(data: bytes) -> pb.ShardMessage:
    """Decode one downlink frame: upb parse, schema checks, conversion to ``pb.ShardMessage``.

    Unknown field numbers (a newer shard's additions) are ignored; a payload kind this build
    does not know leaves the oneof unset.

    Raises:
        MalformedFrame: the bytes are not a valid ShardMessage (counted in
            ``bigfleet_operator_malformed_frames_total``; the caller logs and skips it).
    """
    try:
        m = _ShardMessageUpb.FromString(data)
    except DecodeError as exc:
        _CORRUPT.inc()
        raise MalformedFrame("corrupt", str(exc) or "wire format was corrupt", len(data)) from None
    out = _converter(pb.ShardMessage)(m, len(data))
    return out  # type: ignore[return-value]
