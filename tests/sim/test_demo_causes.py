"""The final reason of a stalled demo names what it saw (README.md, the demo section):
the pod controller's Warning on a Pod without a CapacityRequest, the binder's skips and the
shard's shortfalls, at most three and then a count."""

from __future__ import annotations

from typing import Any

from bigfleet_trio.sim.demo_causes import stall_causes
from bigfleet_trio.sim.demo_world import World
from bigfleet_trio.sim.shard.model import EngineEvent


def pod(name: str, uid: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "uid": uid}, "spec": {},
            "status": {"phase": "Pending"}}


def warning(name: str, reason: str, message: str, at: str) -> dict[str, Any]:
    return {"type": "Warning", "reason": reason, "message": message, "lastTimestamp": at,
            "involvedObject": {"kind": "Pod", "namespace": "default", "name": name}}


def test_the_causes_seen_are_named() -> None:
    cr = {"metadata": {"labels": {"bigfleet.lucy.sh/owned-by-pod": "u-ok"}}}
    world = World([pod("hog", "u-hog"), pod("ok", "u-ok")], [cr], [], [], {})
    events = [warning("hog", "CapacityRequestFailed", "old", "2026-12-01T10:00:00Z"),
              warning("hog", "CapacityRequestFailed", "spec.overhead[cpu]:  not a\nquantity",
                      "2026-12-01T10:00:05Z"),
              warning("ok", "CapacityRequestFailed", "has a CR now", "2026-12-01T10:00:05Z"),
              {**warning("hog", "X", "normal", "2026-12-01T11:00:00Z"), "type": "Normal"}]
    shortfalls = [EngineEvent(1.0, "shortfall", {"need": "n1", "reason": "no machine fits",
                                                 "missing": "cpu"}),
                  EngineEvent(2.0, "shortfall", {"need": "gone", "reason": "no machine fits",
                                                 "missing": "memory"})]
    assert stall_causes(world, events, {}, shortfalls, ["n1"]) == [
        "Pod default/hog: CapacityRequestFailed: spec.overhead[cpu]: not a quantity",
        "need n1: no machine fits (short of cpu)",
    ]
    many = {f"default/p{i}": "bad" for i in range(4)}
    causes = stall_causes(world, [], many, [], [])
    assert causes == ["Pod default/p0: the binder cannot place it: bad",
                      "Pod default/p1: the binder cannot place it: bad",
                      "Pod default/p2: the binder cannot place it: bad", "1 more"]
    assert stall_causes(World([], [], [], [], {}), [], {}, [], []) == []
