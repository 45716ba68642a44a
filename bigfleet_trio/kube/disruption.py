"""The Pod annotations platform teams already use to keep a Pod from being disrupted, read the
way Karpenter and cluster-autoscaler read them (docs/rules.md#disruption-annotations).

- ``karpenter.sh/do-not-disrupt: "true"``, or a Go duration (``"30m"``): protected for that
  long from the Pod's ``status.startTime``, as Karpenter reads it;
- ``cluster-autoscaler.kubernetes.io/safe-to-evict: "false"``.

Pure; shared by the pod controller (the CR's reclamation penalty) and the operator (a drain
evicts such a Pod last, at its deadline).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from bigfleet_trio.durations import parse_go_duration
from bigfleet_trio.kube.client import parse_rfc3339

__all__ = ["DO_NOT_DISRUPT", "SAFE_TO_EVICT", "disruption_blocker", "invalid_do_not_disrupt"]

DO_NOT_DISRUPT: Final = "karpenter.sh/do-not-disrupt"
SAFE_TO_EVICT: Final = "cluster-autoscaler.kubernetes.io/safe-to-evict"


def disruption_blocker(
    annotations: object, *, started: object = None, now: datetime | None = None,
) -> str | None:
    """``"annotation KEY=VALUE"`` naming why the Pod must not be disrupted now, or None.

    ``karpenter.sh/do-not-disrupt`` is ``"true"`` (no end) or a positive Go duration: the Pod
    is protected while less than that has passed since ``started``, and the text ends with
    ``until <RFC 3339>``; a Pod with no (readable) start, or read with no clock, is protected
    (not started: the protection has not begun). Any other value is no protection (Karpenter
    ignores it too). ``cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`` has no end.

    Args:
        annotations: ``metadata.annotations`` as found (anything not a mapping: none).
        started: ``status.startTime`` as found (RFC 3339 with an offset; anything else: none).
        now: the wall clock (aware); None leaves a duration's protection unexpired.
    """
    if not isinstance(annotations, Mapping):
        return None
    value: Any = annotations.get(DO_NOT_DISRUPT)
    if value == "true":
        return f"annotation {DO_NOT_DISRUPT}=true"
    if isinstance(value, str):
        protected = _duration_protects(value, started, now)
        if protected is not None:
            return protected
    if annotations.get(SAFE_TO_EVICT) == "false":
        return f"annotation {SAFE_TO_EVICT}=false"
    return None


def invalid_do_not_disrupt(annotations: object) -> str | None:
    """The Warning for a ``karpenter.sh/do-not-disrupt`` value that protects nothing (neither
    ``"true"`` nor a positive Go duration: ``"600"``, ``"True"``, ``"false"``, ``"0s"``), as
    Karpenter's ``InvalidDoNotDisruptAnnotation`` warns of it; None when absent or valid.

    Args:
        annotations: ``metadata.annotations`` as found (anything not a mapping: none).
    """
    if not isinstance(annotations, Mapping) or DO_NOT_DISRUPT not in annotations:
        return None
    value = annotations[DO_NOT_DISRUPT]
    if value == "true" or (isinstance(value, str) and _positive(value)):
        return None
    return (f'annotation {DO_NOT_DISRUPT}="{value}" protects nothing and is ignored: use '
            '"true" or a Go duration such as "30m"')


def _positive(value: str) -> bool:
    try:
        return parse_go_duration(value) > 0
    except ValueError:
        return False


def _duration_protects(value: str, started: object, now: datetime | None) -> str | None:
    if not _positive(value):
        return None
    seconds = parse_go_duration(value)
    text = f"annotation {DO_NOT_DISRUPT}={value}"
    start = parse_rfc3339(started)
    if start is None:
        return text
    until = start + timedelta(seconds=seconds)
    if now is not None and now >= until:
        return None
    return f"{text} until {until.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"
