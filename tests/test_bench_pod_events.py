"""The fleet bench's Pod Events figure (scripts/bench/_fleet_events.py): per Pod over every Pod
the run created, only the operator's Events on Pods, aggregated counts included."""

from __future__ import annotations

from scripts.bench._fleet_events import pod_event_figures


def ev(uid: str, reason: str, *, kind: str = "Pod", component: str = "bigfleet-operator",
       count: int | None = None) -> dict[str, object]:
    e: dict[str, object] = {"involvedObject": {"kind": kind, "uid": uid}, "reason": reason,
                            "source": {"component": component}}
    if count is not None:
        e["count"] = count
    return e


def test_events_per_pod_counts_the_operators_pod_events_only() -> None:
    got = pod_event_figures([
        ev("a", "CapacityRequested"), ev("a", "MachineComing"),
        ev("b", "CapacityRequested"), ev("b", "NoCapacityOffered", count=2),
        ev("n-1", "Cordoned", kind="Node"), ev("a", "Scheduled", component="default-scheduler"),
    ], pods_seen=4)
    assert got == {"pods": 4, "events": 5, "per_pod": 1.25, "max_per_pod": 3,
                   "by_reason": {"CapacityRequested": 2, "MachineComing": 1,
                                 "NoCapacityOffered": 2}}


def test_no_pods_is_zero_not_a_division_error() -> None:
    assert pod_event_figures([], pods_seen=0)["per_pod"] == 0.0
