"""The Pod annotations platform teams already use to keep a Pod from being disrupted, read the
way Karpenter and cluster-autoscaler read them (docs/rules.md#disruption-annotations).

- ``karpenter.sh/do-not-disrupt: "true"`` (or a duration, Karpenter's protection that expires;
  read here as protected, the expiry is not applied);
- ``cluster-autoscaler.kubernetes.io/safe-to-evict: "false"``.

Pure; shared by the pod controller (the CR's reclamation penalty) and the operator (a drain
evicts such a Pod last, at its deadline).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from bigfleet_trio.durations import parse_duration

__all__ = ["DO_NOT_DISRUPT", "SAFE_TO_EVICT", "disruption_blocker"]

DO_NOT_DISRUPT: Final = "karpenter.sh/do-not-disrupt"
SAFE_TO_EVICT: Final = "cluster-autoscaler.kubernetes.io/safe-to-evict"


def disruption_blocker(annotations: object) -> str | None:
    """``"annotation KEY=VALUE"`` naming why the Pod must not be disrupted, or None.

    Args:
        annotations: ``metadata.annotations`` as found (anything not a mapping: none).
    """
    if not isinstance(annotations, Mapping):
        return None
    value: Any = annotations.get(DO_NOT_DISRUPT)
    if isinstance(value, str) and _protects(value):
        return f"annotation {DO_NOT_DISRUPT}={value}"
    if annotations.get(SAFE_TO_EVICT) == "false":
        return f"annotation {SAFE_TO_EVICT}=false"
    return None


def _protects(value: str) -> bool:
    if value == "true":
        return True
    try:
        return parse_duration(value) > 0
    except ValueError:
        return False
