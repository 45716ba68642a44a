"""Machine catalog of the simulated shard: which shapes exist, where, how many, at what price.

Like a real shard, it labels machines with ``node.kubernetes.io/instance-type`` and
``topology.kubernetes.io/zone``, reports their *allocatable* as resources, and offers
AvailableCapacity per shape (cost = the cheapest Idle machine's price).

A :class:`MachineShape` is one instance type offered in one zone, with a machine count (the
inventory) of which ``warm`` start out already created (Idle, so they skip Speculative/Creating).

The catalog is configurable: :func:`load_catalog` reads one from a YAML
file (format documented in the shipped :data:`EXAMPLE_CATALOG`, whose content equals
:func:`default_catalog`), validated with ``jsonschema`` plus checks of quantities (via
:mod:`bigfleet_trio.quantity`), label syntax and shape keys; every problem is one
:class:`CatalogError` line naming the file and the field.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import Any

from bigfleet_trio.kube.names import is_dns1123_subdomain, is_label_value, is_qualified_name_part

from ._quantity import parse_quantity, parse_resources

LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_REGION = "topology.kubernetes.io/region"
LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_OS = "kubernetes.io/os"
LABEL_ARCH = "kubernetes.io/arch"
#: A spot machine's label (value ``"true"``): cheaper, interruptible; it serves only demand that
#: tolerates interruption (docs/rules.md#simulated-fleet). A catalog sets it through ``labels``.
LABEL_SPOT = "bigfleet.io/spot"


@dataclass(frozen=True)
class ShapeTaint:
    """A taint every machine of a shape carries (effect: NoSchedule|PreferNoSchedule|NoExecute)."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class MachineShape:
    """One instance type offered in one zone.

    Attributes:
        instance_type: value of ``node.kubernetes.io/instance-type`` (DNS-label safe,
            e.g. ``sim-standard-4``).
        zone: value of ``topology.kubernetes.io/zone``.
        allocatable: Kubernetes quantity strings per resource (``{"cpu": "4", "memory": "16Gi"}``);
            sent verbatim as ``NodeStateUpdate.resources``.
        price_per_hour: USD per machine-hour.
        count: machines of this shape in the inventory (>= 0).
        warm: how many of them start already created (Idle); the rest start Speculative.
        region: value of ``topology.kubernetes.io/region``.
        extra_labels: more node labels (e.g. ``cloud.google.com/gke-accelerator``).
        taints: taints every machine of this shape carries.
    """

    instance_type: str
    zone: str
    allocatable: Mapping[str, str]
    price_per_hour: float
    count: int = 8
    warm: int = 0
    region: str = "sim-region-1"
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[ShapeTaint, ...] = ()

    def __post_init__(self) -> None:
        if not self.instance_type or not self.zone:
            raise ValueError("MachineShape needs an instance_type and a zone")
        if self.count < 0 or not 0 <= self.warm <= self.count:
            raise ValueError(
                f"MachineShape {self.key}: need 0 <= warm ({self.warm}) <= count ({self.count})"
            )
        if self.price_per_hour < 0:
            raise ValueError(f"MachineShape {self.key}: negative price")
        parse_resources(self.allocatable)  # raises ValueError on a bad quantity
        object.__setattr__(self, "allocatable", MappingProxyType(dict(self.allocatable)))
        object.__setattr__(self, "extra_labels", MappingProxyType(dict(self.extra_labels)))

    @property
    def key(self) -> str:
        """``"<instance_type>/<zone>"``: unique within a catalog."""
        return f"{self.instance_type}/{self.zone}"

    @property
    def allocatable_values(self) -> dict[str, Fraction]:
        """The allocatable as exact numbers (cpu in cores, memory in bytes, ...)."""
        return parse_resources(self.allocatable)

    def labels(self) -> dict[str, str]:
        """Node labels shared by every machine of this shape (hostname is added per machine)."""
        out = {
            LABEL_OS: "linux",
            LABEL_ARCH: "amd64",
            LABEL_INSTANCE_TYPE: self.instance_type,
            LABEL_ZONE: self.zone,
            LABEL_REGION: self.region,
        }
        out.update(self.extra_labels)
        return out


class Catalog:
    """An ordered, validated set of :class:`MachineShape` (keys unique).

    Raises:
        ValueError: on duplicate shape keys.
    """

    def __init__(self, shapes: Iterable[MachineShape]) -> None:
        self.shapes: tuple[MachineShape, ...] = tuple(shapes)
        seen: set[str] = set()
        for s in self.shapes:
            if s.key in seen:
                raise ValueError(f"duplicate machine shape {s.key}")
            seen.add(s.key)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Catalog):
            return NotImplemented
        return self.shapes == other.shapes

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Catalog({list(self.shapes)!r})"

    def get(self, key: str) -> MachineShape | None:
        """The shape with this ``"<instance_type>/<zone>"`` key, or None."""
        for s in self.shapes:
            if s.key == key:
                return s
        return None


def offer(
    instance_type: str,
    zones: Sequence[str],
    allocatable: Mapping[str, str],
    price_per_hour: float,
    *,
    count: int = 8,
    warm: int = 0,
    extra_labels: Mapping[str, str] | None = None,
    taints: Sequence[ShapeTaint] = (),
) -> list[MachineShape]:
    """The same instance type offered in several zones (``count`` machines per zone)."""
    return [
        MachineShape(
            instance_type=instance_type,
            zone=z,
            allocatable=allocatable,
            price_per_hour=price_per_hour,
            count=count,
            warm=warm,
            extra_labels=dict(extra_labels or {}),
            taints=tuple(taints),
        )
        for z in zones
    ]


DEFAULT_ZONES = ("sim-zone-a", "sim-zone-b", "sim-zone-c")


def default_catalog(zones: Sequence[str] = DEFAULT_ZONES) -> Catalog:
    """A small catalog that fits the bundled real workloads.

    General purpose 4- and 8-core machines, a high-memory 16-core, NVIDIA L4 machines (2 GPUs,
    ``cloud.google.com/gke-accelerator: nvidia-l4``) and H100 machines (8 GPUs), in every zone.
    Prices are illustrative list prices in USD/hour.
    """
    pods = {"pods": "110", "ephemeral-storage": "100Gi"}
    shapes: list[MachineShape] = []
    shapes += offer("sim-standard-4", zones, {"cpu": "4", "memory": "16Gi", **pods}, 0.19,
                    count=12, warm=2, extra_labels={"cloud.google.com/compute-class": "Balanced"})
    shapes += offer("sim-standard-8", zones, {"cpu": "8", "memory": "32Gi", **pods}, 0.38,
                    count=8, warm=1, extra_labels={"cloud.google.com/compute-class": "Balanced"})
    shapes += offer("sim-highmem-16", zones, {"cpu": "16", "memory": "128Gi", **pods}, 1.05,
                    count=4)
    shapes += offer("g2-standard-24", zones,
                    {"cpu": "24", "memory": "96Gi", "nvidia.com/gpu": "2", **pods}, 2.0,
                    count=4, extra_labels={"cloud.google.com/gke-accelerator": "nvidia-l4"})
    shapes += offer("a3-highgpu-8g", zones,
                    {"cpu": "208", "memory": "1872Gi", "nvidia.com/gpu": "8", **pods}, 88.49,
                    count=2, extra_labels={"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"})
    return Catalog(shapes)


# --------------------------------------------------------------------------------------------
# Catalog files
# --------------------------------------------------------------------------------------------

#: The commented example catalog shipped with the package; its content equals
#: :func:`default_catalog` (a test keeps the two in step).
EXAMPLE_CATALOG = Path(__file__).resolve().with_name("catalog.example.yaml")

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

#: Labels a file may not set through ``labels`` (they come from instanceType/zones/region, or are
#: per machine).
RESERVED_LABELS = (LABEL_INSTANCE_TYPE, LABEL_ZONE, LABEL_REGION, LABEL_HOSTNAME)


class CatalogError(ValueError):
    """A catalog file cannot be used. ``str()`` is one line: ``<file>: <field>: <what>``."""


_STR = {"type": "string", "minLength": 1}
_ZONES = {"type": "array", "minItems": 1, "items": _STR}

#: JSON Schema (2020-12) of a catalog file; semantic checks follow in :func:`parse_catalog`.
CATALOG_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    # Keyword order matters: jsonschema reports in this order and only the first error is shown,
    # so an unknown (misspelt) field is named before the required one it was meant to be.
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "zones": _ZONES,
        "shapes": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/shape"}},
    },
    "required": ["shapes"],
    "$defs": {
        "shape": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "instanceType": _STR,
                "zones": _ZONES,
                "allocatable": {
                    "type": "object",
                    "minProperties": 1,
                    "additionalProperties": {"type": ["string", "integer", "number"]},
                },
                "pricePerHour": {"type": "number", "minimum": 0},
                "count": {"type": "integer", "minimum": 0},
                "warm": {"type": "integer", "minimum": 0},
                "region": _STR,
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "taints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "key": _STR,
                            "value": {"type": "string"},
                            "effect": {"enum": list(TAINT_EFFECTS)},
                        },
                        "required": ["key"],
                    },
                },
            },
            "required": ["instanceType", "allocatable", "pricePerHour"],
        },
    },
}

# Kubernetes label syntax (apimachinery validation: qualified names and label values).
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _qualified_name_problem(key: str) -> str | None:
    prefix, slash, name = key.rpartition("/")
    if slash and not (prefix and is_dns1123_subdomain(prefix)):
        return f"{key!r} is not a valid name (bad prefix {prefix!r})"
    if not is_qualified_name_part(name):
        return (f"{key!r} is not a valid name (at most 63 alphanumerics, '-', '_' or '.', "
                "starting and ending alphanumeric, after an optional DNS prefix and '/')")
    return None


def _label_value_problem(value: str) -> str | None:
    if not is_label_value(value):
        return (f"{value!r} is not a valid label value (at most 63 alphanumerics, '-', '_' or "
                "'.', starting and ending alphanumeric)")
    return None


def _path(parts: Iterable[str | int]) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif _IDENT_RE.match(p):
            out += f".{p}" if out else p
        else:
            out += f'["{p}"]'
    return out


_JSON_TYPES = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
               int: "an integer", float: "a number", type(None): "null"}


def _schema_message(error: Any) -> str:
    """One line for a jsonschema ValidationError, without dumping big instances."""
    if error.validator == "type":
        want = error.validator_value
        want = " or ".join(want) if isinstance(want, list) else want
        got = _JSON_TYPES.get(type(error.instance), type(error.instance).__name__)
        scalar = isinstance(error.instance, bool | int | float)
        hint = " (quote it in YAML)" if want == "string" and scalar else ""
        return f"must be of type {want}, got {got}{hint}"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = error.schema.get("properties", {})
        extra = sorted(str(k) for k in error.instance if k not in known)
        return (f"unknown field{'s' if len(extra) > 1 else ''} {', '.join(extra)} "
                f"(known: {', '.join(known)})")
    if error.validator in ("minItems", "minProperties"):
        return "must not be empty"
    return " ".join(str(error.message).split())


class _Problem(Exception):
    def __init__(self, where: Sequence[str | int], what: str) -> None:
        super().__init__(what)
        self.where = tuple(where)
        self.what = what


def _quantity_text(value: str | int | float) -> str:
    """YAML ``cpu: 4`` / ``cpu: 0.5`` arrive as numbers; a quantity is their text."""
    return value if isinstance(value, str) else repr(value)


def _non_string_key(node: Any, where: list[str | int]) -> _Problem | None:
    """The first mapping key that is not a string (YAML ``1: x`` or ``yes: x``), if any."""
    if isinstance(node, dict):
        for k, v in node.items():
            if not isinstance(k, str):
                return _Problem(where, f"key {k!r} must be a string (quote it in YAML)")
            if (p := _non_string_key(v, [*where, k])) is not None:
                return p
    elif isinstance(node, list):
        for i, v in enumerate(node):
            if (p := _non_string_key(v, [*where, i])) is not None:
                return p
    return None


def _check_shape(i: int, spec: Mapping[str, Any], zones: Sequence[str]) -> list[MachineShape]:
    from bigfleet_trio.quantity import Quantity

    where: list[str | int] = ["shapes", i]
    itype = spec["instanceType"]
    if (p := _label_value_problem(itype)) is not None:
        raise _Problem([*where, "instanceType"], p)
    for j, z in enumerate(zones):
        if (p := _label_value_problem(z)) is not None:
            raise _Problem([*where, "zones", j] if "zones" in spec else ["zones", j], p)
    region = spec.get("region")
    if region is not None and (p := _label_value_problem(region)) is not None:
        raise _Problem([*where, "region"], p)
    allocatable: dict[str, str] = {}
    for name, raw in spec["allocatable"].items():
        at = [*where, "allocatable", name]
        if (p := _qualified_name_problem(name)) is not None:
            raise _Problem(at, f"resource {p}")
        text = _quantity_text(raw)
        try:
            q = Quantity.parse(text)
            parse_quantity(text)  # the engine's parser: rejects Go's lenient "+", "-", "."
        except ValueError as exc:
            raise _Problem(at, str(exc)) from None
        if q.sign() < 0:
            raise _Problem(at, f"quantity {text!r} must not be negative")
        allocatable[name] = text
    count = int(spec.get("count", 8))
    warm = int(spec.get("warm", 0))
    if warm > count:
        raise _Problem([*where, "warm"], f"{warm} is more than count ({count})")
    labels: dict[str, str] = dict(spec.get("labels", {}))
    for key, value in labels.items():
        at = [*where, "labels", key]
        if key == LABEL_HOSTNAME:
            raise _Problem(at, f"label {key} is set per machine by the shard")
        if key in RESERVED_LABELS:
            raise _Problem(at, f"label {key} comes from instanceType, zones or region")
        if (p := _qualified_name_problem(key)) is not None:
            raise _Problem(at, f"label key {p}")
        if (p := _label_value_problem(value)) is not None:
            raise _Problem(at, p)
    taints: list[ShapeTaint] = []
    for k, t in enumerate(spec.get("taints", [])):
        if (p := _qualified_name_problem(t["key"])) is not None:
            raise _Problem([*where, "taints", k, "key"], f"taint key {p}")
        value = t.get("value", "")
        if (p := _label_value_problem(value)) is not None:
            raise _Problem([*where, "taints", k, "value"], p)
        taints.append(ShapeTaint(t["key"], value, t.get("effect", "NoSchedule")))
    extra: dict[str, Any] = {} if region is None else {"region": region}
    try:
        return [
            MachineShape(
                instance_type=itype,
                zone=z,
                allocatable=allocatable,
                price_per_hour=float(spec["pricePerHour"]),
                count=count,
                warm=warm,
                extra_labels=labels,
                taints=tuple(taints),
                **extra,
            )
            for z in zones
        ]
    except ValueError as exc:
        raise _Problem(where, str(exc)) from None


def parse_catalog(doc: Any, source: str = "<catalog>") -> Catalog:
    """Build a :class:`Catalog` from a parsed catalog document (format: :data:`EXAMPLE_CATALOG`).

    Each entry of ``shapes`` becomes one :class:`MachineShape` per zone, like :func:`offer`
    (same order: entries in file order, zones in list order). Defaults: ``zones`` from the top
    level, ``count`` 8, ``warm`` 0, ``region`` ``sim-region-1``, no labels, no taints, taint
    ``effect`` ``NoSchedule``. Integer and float quantities (YAML ``cpu: 4``) are taken as text.

    Args:
        doc: the document (a mapping with ``shapes`` and optional ``zones``).
        source: names the document in errors (the file path).

    Raises:
        CatalogError: the first problem found, as one line ``<source>: <field>: <what>``
            (e.g. ``cat.yaml: shapes[1].allocatable.memory: invalid quantity '16GB': ...``).
    """
    import jsonschema

    if doc is None:
        raise CatalogError(f"{source}: empty file (expected a mapping with a 'shapes' list)")
    validator = jsonschema.Draft202012Validator(CATALOG_SCHEMA)
    shapes: list[MachineShape] = []
    seen: dict[str, tuple[str | int, ...]] = {}
    try:
        if (bad_key := _non_string_key(doc, [])) is not None:
            raise bad_key
        error = next(iter(validator.iter_errors(doc)), None)
        if error is not None:
            raise _Problem(list(error.absolute_path), _schema_message(error))
        default_zones: list[str] = doc.get("zones", [])
        for i, spec in enumerate(doc["shapes"]):
            zones = spec.get("zones", default_zones)
            if not zones:
                raise _Problem(["shapes", i], "'zones' is required (here or at the top level)")
            for j, shape in enumerate(_check_shape(i, spec, zones)):
                at = ("shapes", i, "zones", j) if "zones" in spec else ("shapes", i)
                if shape.key in seen:
                    raise _Problem(at, f"duplicate machine shape {shape.key} "
                                   f"(also {_path(seen[shape.key])})")
                seen[shape.key] = at
                shapes.append(shape)
    except _Problem as p:
        where = _path(p.where)
        raise CatalogError(f"{source}: {where + ': ' if where else ''}{' '.join(p.what.split())}") \
            from None
    return Catalog(shapes)


def load_catalog(path: str | os.PathLike[str]) -> Catalog:
    """Read a YAML catalog file (format: the commented :data:`EXAMPLE_CATALOG`).

    Args:
        path: the file.

    Returns:
        The :class:`Catalog` (see :func:`parse_catalog` for defaults and order).

    Raises:
        CatalogError: unreadable file, invalid YAML, or an invalid catalog; one line naming the
            file (and the line/column for YAML syntax, the field otherwise).
    """
    import yaml

    source = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        what = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CatalogError(f"{source}: cannot read: {what}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise CatalogError(f"{source}{at}: invalid YAML: {' '.join(str(problem).split())}") \
            from None
    return parse_catalog(doc, source)
