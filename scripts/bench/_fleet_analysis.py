"""Analysis of the ``fleet`` bench (pure): latency matching and percentiles.

:func:`rollup_latencies` matches CR-total states to the roll-ups carrying them;
:func:`nsu_latencies` matches NodeStateUpdates to the UpcomingNode events showing their phase;
:func:`pct` is the percentile the report uses. Private to :mod:`scripts.bench.fleet` (the
leading underscore keeps it out of scenario discovery).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

PHASE_OF_STATE = {"SPECULATIVE": "Provisioning", "CREATING": "Provisioning", "IDLE": "Launched",
                  "CONFIGURING": "Registered", "CONFIGURED": "Ready"}


def pct(samples: list[float], q: float) -> float:
    """The ``q`` quantile of ``samples`` (nearest rank, 0..1); NaN for none."""
    if not samples:
        return float("nan")
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def rollup_latencies(states: list[tuple[float, int, int, str]],
                     rollups: list[list[Any]]) -> dict[str, list[float]]:
    """Per phase: for each CR-total state (t, cpu, mem), the time to the first roll-up received
    at or after t whose totals equal this state or any later one current by then (a later change
    superseding it is carried by the same roll-up). States never carried are left out.

    O(states + roll-ups x log states): a roll-up with totals T carries every state up to the
    last one with totals T current when it arrived; a pointer walks the (sampled) states once.
    """
    import bisect

    out: dict[str, list[float]] = defaultdict(list)
    if not states or not rollups:
        return out
    by_total: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, (_t, cpu, mem, _ph) in enumerate(states):
        by_total[(cpu, mem)].append(i)
    times = [st[0] for st in states]
    sampled: list[int] = []
    last = -1.0
    for i, t in enumerate(times):  # at most one state per 0.2 s
        if t - last >= 0.2:
            sampled.append(i)
            last = t
    p = 0
    for r in sorted(rollups, key=lambda r: r[0]):
        at, total = r[0], (r[2], r[3])
        idx = by_total.get(total)
        if not idx:
            continue
        # the last state with these totals that was current when the roll-up arrived
        k = bisect.bisect_right(idx, bisect.bisect_right(times, at) - 1) - 1
        if k < 0:
            continue
        j = idx[k]
        while p < len(sampled) and sampled[p] <= j:
            i = sampled[p]
            out[states[i][3]].append(at - states[i][0])
            p += 1
    return out


def nsu_latencies(nsu: list[list[Any]], un_events: dict[str, list[tuple[float, str]]],
                  phase_of: Any) -> dict[str, list[float]]:
    """Per phase: NodeStateUpdate sent -> the UpcomingNode event showing its phase, for updates
    that change the phase (the first Provisioning, Launched after Creating, Registered, Ready)."""
    out: dict[str, list[float]] = defaultdict(list)
    prev: dict[str, str] = {}
    for t, machine, state in sorted(nsu):
        before = prev.get(machine)
        prev[machine] = state
        want = PHASE_OF_STATE.get(state)
        if want is None or PHASE_OF_STATE.get(before or "") == want:
            continue
        if state == "IDLE" and before not in ("CREATING", "SPECULATIVE"):
            continue  # a released machine: its UpcomingNode is deleted, not Launched
        for te, phase in un_events.get(machine, ()):
            if te >= t - 0.05 and phase == want:
                out[phase_of(t)].append(max(0.0, te - t))
                break
    return out


def cr_readds(readds: list[tuple[float, str, str, float | None]], pod_deleted: dict[str, float],
              cr_deleted: dict[str, float], grace: float = 30.0) -> dict[str, dict[str, Any]]:
    """Per phase (when seen): a Pod's CR created again after the first one, split by the Pod.

    ``live``: the Pod was not deleted by ``grace`` seconds after the re-add (the bench's Pod and
    CR watches are separate streams, so a deletion can show up late). ``pod_deleted``: the Pod
    was deleted before, or within ``grace`` after, the re-add (a create for a Pod on its way
    out, which the garbage collector removes). ``pod_delete_to_readd``: re-add minus the Pod's
    deletion (negative: the deletion was seen after); ``cr_delete_to_readd``: since the earlier
    CR was deleted; ``readd_lifetime``: until the re-added CR was deleted (NaN: it stayed).
    """
    out: dict[str, dict[str, Any]] = {}
    for t, uid, phase, prev_delete in readds:
        row = out.setdefault(phase, {"live": 0, "pod_deleted": 0, "pod_delete_to_readd": [],
                                     "cr_delete_to_readd": [], "readd_lifetime": []})
        gone = pod_deleted.get(uid)
        if gone is not None and gone <= t + grace:
            row["pod_deleted"] += 1
            row["pod_delete_to_readd"].append(t - gone)
        else:
            row["live"] += 1
        if prev_delete is not None:
            row["cr_delete_to_readd"].append(t - prev_delete)
        later = cr_deleted.get(uid)
        row["readd_lifetime"].append(later - t if later is not None and later >= t
                                     else float("nan"))
    return out
