"""Why a demo stalled, in the words of what it saw: the Warning Events the pod controller wrote
on the Pods that have no CapacityRequest, the Pods the binder cannot place, and the shard's
shortfalls for needs still short. :func:`stall_causes` is pure (over a :class:`~.demo_world.World`
snapshot, the Events, the binder's skips and the shard's shortfall log); the scenario appends
its answer to the final reason of a demo that ran out of time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .demo_world import World

__all__ = ["stall_causes"]

#: Causes named in the final line at most (the rest counted), so it stays one readable line.
MAX_CAUSES = 3


def _latest_warnings(events: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """``{"namespace/name": "Reason: message"}`` of the newest Warning Event on each Pod."""
    best: dict[str, tuple[str, str]] = {}
    for e in events:
        obj = e.get("involvedObject") or {}
        if e.get("type") != "Warning" or obj.get("kind") != "Pod":
            continue
        key = f"{obj.get('namespace') or 'default'}/{obj.get('name')}"
        stamp = str(e.get("lastTimestamp") or e.get("eventTime") or "")
        line = f"{e.get('reason')}: {' '.join(str(e.get('message') or '').split())}"
        if key not in best or stamp >= best[key][0]:
            best[key] = (stamp, line)
    return {k: v[1] for k, v in best.items()}


def stall_causes(world: World, events: Iterable[Mapping[str, Any]],
                 unplaceable: Mapping[str, str],
                 shortfalls: Iterable[Any], short_needs: Iterable[str]) -> list[str]:
    """What the demo saw holding it back, one short clause each, the first
    :data:`MAX_CAUSES` and then ``"N more"``; [] when it saw nothing beyond the waiting.

    Args:
        world: the last snapshot (its Pods without a CapacityRequest are looked up).
        events: core/v1 Events (the pod controller's Warnings on Pods).
        unplaceable: the binder's ``{"namespace/name": why}``.
        shortfalls: the shard engine's shortfall log (``EngineEvent`` with ``need``,
            ``missing``, ``reason`` fields), oldest first.
        short_needs: keys of the needs short in the last roll-up.
    """
    causes: list[str] = []
    warnings = _latest_warnings(events)
    for key in world.pods_without_cr():
        if key in warnings:
            causes.append(f"Pod {key}: {warnings[key]}")
    for key, why in sorted(unplaceable.items()):
        causes.append(f"Pod {key}: the binder cannot place it: {why}")
    short = set(short_needs)
    seen: dict[str, str] = {}
    for ev in shortfalls:
        need = str(ev.fields.get("need"))
        if need in short:
            seen[need] = (f"need {need}: {ev.fields.get('reason')} "
                          f"(short of {ev.fields.get('missing')})")
    causes += [seen[k] for k in sorted(seen)]
    if len(causes) > MAX_CAUSES:
        causes = [*causes[:MAX_CAUSES], f"{len(causes) - MAX_CAUSES} more"]
    return causes


async def observed_causes(client: Any, world: World | None, shard: Any, binder: Any) -> list[str]:
    """:func:`stall_causes` over what the demo's parts hold now (the Events listed once);
    [] without a snapshot. An apiserver that does not answer leaves the Events out."""
    from bigfleet_trio.kube.errors import KubeError
    from bigfleet_trio.kube.resources import EVENTS

    if world is None:
        return []
    try:
        events = (await client.list(EVENTS)).items
    except KubeError:
        events = []
    short = [n.key for n in shard.engine.needs if n.short]
    return stall_causes(world, events, binder.unplaceable, shard.engine.shortfalls, short)
