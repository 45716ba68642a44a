"""Machine catalog of the simulated shard: which shapes exist, where, how many, at what price.

Issue 7 "Simulated shard"; peer facts from reference-behavior §6 (the shard labels machines with
``node.kubernetes.io/instance-type`` and ``topology.kubernetes.io/zone`` and reports their
*allocatable* as resources) and §8 item 5 (AvailableCapacity per shape, cost = cheapest Idle price).

A :class:`MachineShape` is one instance type offered in one zone, with a machine count (the
inventory) of which ``warm`` start out already created (Idle, so they skip Speculative/Creating).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType

from ._quantity import parse_resources

LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_REGION = "topology.kubernetes.io/region"
LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_OS = "kubernetes.io/os"
LABEL_ARCH = "kubernetes.io/arch"


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
