"""Pod Events per Pod at the end of a fleet run: what the operator's outcome pass and drains
wrote on Pods (docs/rules.md#outcomes-conditions-and-pod-events: the bound), from a LIST of
Events."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["pod_event_figures"]


def pod_event_figures(events: Iterable[Mapping[str, Any]], pods_seen: int,
                      component: str = "bigfleet-operator") -> dict[str, Any]:
    """``{"pods", "events", "per_pod", "max_per_pod", "by_reason"}`` over the Events
    ``component`` wrote on Pods; ``per_pod`` divides by every Pod the run created
    (``pods_seen``), ``max_per_pod`` is the most any one Pod got."""
    per_pod: Counter[str] = Counter()
    by_reason: Counter[str] = Counter()
    for e in events:
        obj = e.get("involvedObject") or {}
        if obj.get("kind") != "Pod" or (e.get("source") or {}).get("component") != component:
            continue
        n = int(e.get("count") or 1)
        per_pod[str(obj.get("uid") or obj.get("name"))] += n
        by_reason[str(e.get("reason"))] += n
    total = sum(per_pod.values())
    return {"pods": pods_seen, "events": total,
            "per_pod": round(total / pods_seen, 3) if pods_seen else 0.0,
            "max_per_pod": max(per_pod.values(), default=0),
            "by_reason": dict(sorted(by_reason.items()))}
