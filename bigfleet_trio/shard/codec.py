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
    "NodeStateFrame",
    "decode_deferred",
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
    """Build (once per class) a function turning a upb message into ``cls``.

    The function is generated source, one assignment per field, so a frame costs the field reads
    and nothing else: at tens of thousands of frames per second a generic per-field loop of
    closures was most of the downlink's decode time. Per field it does what betterproto's own
    parser would: scalars and bytes as is, enums to their member (an unknown value stays an int),
    messages converted (unset: betterproto's placeholder), repeated fields and maps as lists and
    dicts, and a oneof's unset members left as placeholders with ``_group_current`` naming the
    set one.
    """
    hit = _converters.get(cls)
    if hit is not None:
        return hit
    # Registered before the fields are generated: a message type may contain itself.
    def forward(m: Any, size: int = 0) -> betterproto.Message:
        return _converters[cls](m, size)

    _converters[cls] = forward
    meta: Any = getattr(cls, "_betterproto")  # noqa: B009 - class metadata (numbers, classes)
    desc: Descriptor = _POOL.FindMessageTypeByName(f"{_PACKAGE}.{cls.__name__}")
    env: dict[str, Any] = {"cls": cls, "new": object.__new__, "PH": _PLACEHOLDER,
                           "UFS": UnknownFieldSet, "check": _check_unknown,
                           "known": frozenset(f.number for f in desc.fields),
                           "qual": desc.full_name}
    groups = sorted({m.group for m in meta.meta_by_field_name.values() if m.group})
    lines = ["def convert(m, size=0):",
             "    if len(UFS(m)):",
             "        check(m, known, qual, size)"]
    for i, g in enumerate(groups):
        lines.append(f"    g{i} = m.WhichOneof({g!r})")
    items: list[str] = []
    for k, (name, fmeta) in enumerate(meta.meta_by_field_name.items()):
        fdesc: FieldDescriptor = desc.fields_by_number[fmeta.number]
        expr = _field_expr(cls, name, fmeta, fdesc, k, env)
        if fmeta.group:
            gi = groups.index(fmeta.group)
            lines.append(f"    v{k} = ({expr}) if g{gi} == {name!r} else PH")
        else:
            lines.append(f"    v{k} = {expr}")
        items.append(f"{name!r}: v{k}")
    current = ", ".join(f"{g!r}: g{i}" for i, g in enumerate(groups))
    lines += ["    obj = new(cls)",
              "    obj.__dict__.update({" + ", ".join(items) + ", '_serialized_on_wire': True, "
              "'_unknown_fields': b'', '_group_current': {" + current + "}})",
              "    return obj"]
    exec("\n".join(lines), env)  # noqa: S102 - generated from the schema, no outside input
    convert: Converter = env["convert"]
    _converters[cls] = convert
    return convert


def _is_repeated(fdesc: FieldDescriptor) -> bool:
    flag = getattr(fdesc, "is_repeated", None)  # protobuf >= 6; ``label`` before (removed in 7)
    if flag is None:
        return bool(fdesc.label == FieldDescriptor.LABEL_REPEATED)
    return bool(flag)


def _field_expr(
    cls: type[betterproto.Message], name: str, fmeta: Any, fdesc: FieldDescriptor, k: int,
    env: dict[str, Any],
) -> str:
    """One field's expression over the upb message ``m`` (helpers it needs go into ``env``)."""
    meta: Any = getattr(cls, "_betterproto")  # noqa: B009
    repeated = _is_repeated(fdesc)
    get = f"m.{name}"
    if fmeta.proto_type == betterproto.TYPE_MAP:
        value_cls = meta.cls_by_field.get(f"{name}.value")
        if fmeta.map_types[1] == betterproto.TYPE_MESSAGE:
            env[f"c{k}"] = _converter(value_cls)
            return f"{{key: c{k}(v, size) for key, v in {get}.items()}}"
        if fmeta.map_types[1] == betterproto.TYPE_ENUM:
            env[f"e{k}"] = _enum_converter(value_cls)
            return f"{{key: e{k}(v) for key, v in {get}.items()}}"
        return f"dict({get})"
    if fmeta.proto_type == betterproto.TYPE_MESSAGE:
        env[f"c{k}"] = _converter(meta.cls_by_field[name])
        if repeated:
            return f"[c{k}(v, size) for v in {get}]"
        return f"c{k}({get}, size) if m.HasField({name!r}) else PH"
    if fmeta.proto_type == betterproto.TYPE_ENUM:
        env[f"e{k}"] = _enum_converter(meta.cls_by_field[name])
        if repeated:
            return f"[e{k}(v) for v in {get}]"
        return f"e{k}({get})"
    if repeated:
        return f"list({get})"
    return get


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


_NodeStateUpdateUpb: Final = upb_class("NodeStateUpdate")
_NSU_FIELD: Final = "node_state_update"


_validators: dict[type[betterproto.Message], Callable[[Any, int], None]] = {}


def _validator(cls: type[betterproto.Message]) -> Callable[[Any, int], None]:
    """Build (once per class) the schema check :func:`_converter`'s functions make, without the
    conversion: every message in a upb ``cls`` message, recursively, is checked for known
    fields that arrived with the wrong wire type (:class:`MalformedFrame`)."""
    hit = _validators.get(cls)
    if hit is not None:
        return hit
    _validators[cls] = lambda m, size: _validators[cls](m, size)  # a type may contain itself
    desc: Descriptor = _POOL.FindMessageTypeByName(f"{_PACKAGE}.{cls.__name__}")
    known = frozenset(f.number for f in desc.fields)
    meta: Any = getattr(cls, "_betterproto")  # noqa: B009
    single: list[tuple[str, Callable[[Any, int], None]]] = []
    many: list[tuple[str, Callable[[Any, int], None]]] = []
    maps: list[tuple[str, Callable[[Any, int], None]]] = []
    for name, fmeta in meta.meta_by_field_name.items():
        if fmeta.proto_type == betterproto.TYPE_MESSAGE:
            sub = _validator(meta.cls_by_field[name])
            repeated = _is_repeated(desc.fields_by_number[fmeta.number])
            (many if repeated else single).append((name, sub))
        elif (fmeta.proto_type == betterproto.TYPE_MAP
              and fmeta.map_types[1] == betterproto.TYPE_MESSAGE):
            maps.append((name, _validator(meta.cls_by_field[f"{name}.value"])))
    qual = desc.full_name

    def validate(m: Any, size: int) -> None:
        if len(UnknownFieldSet(m)):
            _check_unknown(m, known, qual, size)
        for name, sub in single:
            if m.HasField(name):
                sub(getattr(m, name), size)
        for name, sub in many:
            for v in getattr(m, name):
                sub(v, size)
        for name, sub in maps:
            for v in getattr(m, name).values():
                sub(v, size)

    _validators[cls] = validate
    return validate


class NodeStateFrame:
    """A NodeStateUpdate frame parsed and checked, not yet converted to ``pb.NodeStateUpdate``.

    The session coalesces node-state frames per machine (docs/wire.md#downlink-decoding);
    under a burst most are superseded before a worker takes them, so the conversion to the
    betterproto model (most of a frame's decode cost: its maps and sub-messages) is done only
    for the frame a worker takes (:meth:`to_message`). ``machine_id`` and ``state`` (an int; an
    unknown value stays one) are read at once for coalescing and the unknown-enum check.
    """

    __slots__ = ("machine_id", "state", "_upb", "_size")

    def __init__(self, upb_msg: Any, size: int) -> None:
        self._upb = upb_msg
        self._size = size
        self.machine_id: str = upb_msg.machine_id
        self.state: int = upb_msg.state

    def to_message(self) -> pb.NodeStateUpdate:
        """The betterproto message, as :func:`decode_shard_message` would have produced it."""
        return _converter(pb.NodeStateUpdate)(self._upb, self._size)  # type: ignore[return-value]


def decode_deferred(data: bytes) -> pb.ShardMessage | NodeStateFrame:
    """Like :func:`decode_shard_message`, but a NodeStateUpdate frame comes back as a
    :class:`NodeStateFrame` (checked now, converted when taken).

    Raises:
        MalformedFrame: as :func:`decode_shard_message`, for every kind of frame.
    """
    try:
        m = _ShardMessageUpb.FromString(data)
    except DecodeError as exc:
        _CORRUPT.inc()
        raise MalformedFrame("corrupt", str(exc) or "wire format was corrupt", len(data)) from None
    if m.WhichOneof("payload") == _NSU_FIELD:
        if len(UnknownFieldSet(m)):
            _check_unknown(m, _SHARD_MESSAGE_FIELDS, _SHARD_MESSAGE_NAME, len(data))
        nsu = m.node_state_update
        _validator(pb.NodeStateUpdate)(nsu, len(data))
        return NodeStateFrame(nsu, len(data))
    return _converter(pb.ShardMessage)(m, len(data))  # type: ignore[return-value]


_SHARD_MESSAGE_FIELDS: Final = frozenset(
    f.number for f in _POOL.FindMessageTypeByName(f"{_PACKAGE}.ShardMessage").fields)
_SHARD_MESSAGE_NAME: Final = f"{_PACKAGE}.ShardMessage"
