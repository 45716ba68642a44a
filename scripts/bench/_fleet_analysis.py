"""Analysis of the ``fleet`` bench (pure): latency matching and percentiles.

:func:`rollup_latencies` matches CR-total states to the roll-ups carrying them;
:func:`nsu_latencies` matches NodeStateUpdates to the UpcomingNode events showing their phase
within the machine's life (:func:`match_in_life`); :func:`reclaim_latencies` matches reclaim
instructions to their acks and :func:`pod_cr_latencies` Pods to their CRs, by id;
:func:`pct` is the percentile the report uses; :func:`agent_own` splits the matched latencies
into the apiserver's share (the traced requests on the objects named, as the client saw them) and
the agent's own. Private to :mod:`scripts.bench.fleet` (the
leading underscore keeps it out of scenario discovery).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bigfleet_trio.operator.upcoming.plan import upcoming_node_name

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


# Phases an UpcomingNode moves through in one life, in order; a write of a later one (or of
# an END_OF_LIFE phase) means the phase an update asked for will not be written in this life.
LIFE_RANK = {"Provisioning": 0, "Launched": 1, "Registered": 2, "Ready": 3}
END_OF_LIFE = frozenset({"Draining", "Drained", "Deleted", "Failed"})
# The shard stamps a frame after its send returns, so the operator may write (and the bench's
# watch see) the phase a little before the stamp.
SEND_SLACK = 0.05


Window = tuple[tuple[str, ...], float, float]
"""One matched latency: the objects whose apiserver requests it waited on, its start and end."""


@dataclass
class Matched:
    """Per phase of the run: update -> write latencies, and updates whose wanted write never came.

    ``latency``: seconds from the update (or instruction) to the write that shows it.
    ``superseded``: seconds from an update to the write that replaced it (a later phase of the
    same life, or the end of the life) when the asked-for phase itself was never written -- the
    operator's per-machine coalescing skips intermediate phases by design.
    ``unmatched``: updates with neither before the next update asking for the same thing (or the
    end of the observation): a missed watch event or a write that never happened.
    ``windows``: each ``latency`` sample as a :data:`Window`, for :func:`agent_own`.
    """

    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    superseded: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    unmatched: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    windows: dict[str, list[Window]] = field(default_factory=lambda: defaultdict(list))


def match_in_life(t: float, want: str, events: list[tuple[float, str]],
                  until: float = float("inf")) -> tuple[str, float]:
    """Where an update sent at ``t`` asking for phase ``want`` landed, within its machine's life.

    ``events`` are the machine's UpcomingNode phase events ``(seen_at, phase)`` in time order
    (``Deleted`` for a deletion). The scan starts at ``t - SEND_SLACK`` and ends at the first of:

    * an event showing ``want``: ``("written", latency)`` (latency >= 0);
    * an event at or after ``t`` of a phase ranking after ``want`` in :data:`LIFE_RANK`, or in
      :data:`END_OF_LIFE`: ``("superseded", seconds to that write)``;
    * ``until`` (the next update asking for ``want``, which owns later events): ``("unmatched",
      nan)``, as when the events run out.

    A skipped phase is thus never matched to the same phase written in the machine's next life.
    """
    i = bisect.bisect_left(events, (t - SEND_SLACK,))
    rank = LIFE_RANK.get(want, len(LIFE_RANK))
    for te, phase in events[i:]:
        if te >= until:
            break
        if phase == want:
            return "written", max(0.0, te - t)
        if te >= t and (phase in END_OF_LIFE or LIFE_RANK.get(phase, -1) > rank):
            return "superseded", te - t
    return "unmatched", float("nan")


def nsu_latencies(nsu: list[list[Any]], un_events: dict[str, list[tuple[float, str]]],
                  phase_of: Any) -> Matched:
    """NodeStateUpdate sent -> the UpcomingNode event showing its phase, bounded to the life.

    Timed: updates that change the phase (the first Provisioning, Launched after Creating,
    Registered, Ready); each is matched by :func:`match_in_life`, bounded also by the machine's
    next update asking for the same phase. Grouped by ``phase_of(sent_at)``.
    """
    out = Matched()
    by_machine: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for t, machine, state in sorted(nsu):
        by_machine[machine].append((t, state))
    for machine, updates in by_machine.items():
        timed: list[tuple[float, str]] = []
        before: str | None = None
        for t, state in updates:
            prev, before = before, state
            want = PHASE_OF_STATE.get(state)
            if want is None or PHASE_OF_STATE.get(prev or "") == want:
                continue
            if state == "IDLE" and prev not in ("CREATING", "SPECULATIVE"):
                continue  # a released machine: its UpcomingNode is deleted, not Launched
            timed.append((t, want))
        events = sorted(un_events.get(machine, ()))
        for k, (t, want) in enumerate(timed):
            until = next((t2 for t2, w2 in timed[k + 1:] if w2 == want), float("inf"))
            kind, secs = match_in_life(t, want, events, until)
            ph = phase_of(t)
            if kind == "written":
                out.latency[ph].append(secs)
                out.windows[ph].append((("un-" + machine,), t, t + secs))
            elif kind == "superseded":
                out.superseded[ph].append(secs)
            else:
                out.unmatched[ph] += 1
    return out


def reclaim_latencies(records: list[list[Any]], phase_of: Any,
                      machine_of_node: Mapping[str, str] | None = None) -> Matched:
    """ReclaimInstruction first sent -> its ReclaimAck received, per phase of the first send.

    ``records`` are the shard's ``[instruction_id, nodes, first_sent, acked | None, sends]``
    (``sends`` absent in older stats: 1). An instruction is its own lifecycle (one id, re-sent
    unchanged until acked), so the match is by id; acks that came only after the shard re-sent
    the instruction are timed from the first send in ``latency`` and counted apart in
    ``superseded`` (seconds from the first send, as there). Never acked: ``unmatched``.
    ``machine_of_node`` (the shard's Node -> machine id): the windows also name each Node's
    UpcomingNode, whose drain record the ack waits on.
    """
    out = Matched()
    for rec in records:
        issued, acked = rec[2], rec[3]
        sends = rec[4] if len(rec) > 4 else 1
        ph = phase_of(issued)
        if acked is None:
            out.unmatched[ph] += 1
            continue
        out.latency[ph].append(max(0.0, acked - issued))
        nodes = [n for n in str(rec[1]).split(",") if n]
        # the objects the ack waits on: each Node (cordoned) and its machine's UpcomingNode
        # (the drain record), when the shard said which machine the Node is
        uns = [upcoming_node_name(machine_of_node[n]) or "" for n in nodes
               if machine_of_node and n in machine_of_node]
        out.windows[ph].append((tuple(nodes + uns), issued, max(issued, acked)))
        if sends > 1:
            out.superseded[ph].append(max(0.0, acked - issued))
    return out


def pod_cr_latencies(pod_added: dict[str, tuple[float, str]], cr_added: dict[str, float],
                     pod_deleted: dict[str, float],
                     cr_name: Any = lambda uid: f"cr-{uid}") -> dict[str, dict[str, Any]]:
    """Pod first seen -> its (first) CR seen, per phase the Pod was seen in.

    A Pod's CR carries the Pod's UID, so the match is by UID, one life each. Per phase:
    ``latency`` (CR seen at or after the Pod, clipped at 0 when the CR's watch event came
    first: ``cr_first`` counts those), ``deleted_first`` (the Pod was deleted before any CR was
    seen: no latency), ``missing`` (live Pod never given a CR while observed), ``windows``
    (each latency as a :data:`Window` naming the CR, ``cr_name(uid)``).
    """
    out: dict[str, dict[str, Any]] = {}
    for uid, (t, ph) in pod_added.items():
        row = out.setdefault(ph, {"latency": [], "cr_first": 0, "deleted_first": 0,
                                  "missing": 0, "windows": []})
        tc = cr_added.get(uid)
        gone = pod_deleted.get(uid)
        if tc is None:
            row["deleted_first" if gone is not None else "missing"] += 1
            continue
        if gone is not None and gone < tc:
            row["deleted_first"] += 1
            continue
        if tc < t:
            row["cr_first"] += 1
        row["latency"].append(max(0.0, tc - t))
        row["windows"].append(((cr_name(uid),), t, max(t, tc)))
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


def trace_index(lines: list[list[Any]]) -> dict[str, list[tuple[float, float]]]:
    """Request-trace lines (``[start, end, method, path, name, status]``;
    docs/kube-api.md#request-trace) as object name -> its requests' ``(start, end)``, sorted;
    requests naming no object dropped."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for line in lines:
        if len(line) >= 5 and line[4]:
            out[str(line[4])].append((float(line[0]), float(line[1])))
    for spans in out.values():
        spans.sort()
    return dict(out)


def server_wait(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of ``[start, end]`` covered by the union of ``spans`` (sorted ``(start, end)``):
    concurrent requests count once."""
    covered = 0.0
    reach = start
    for s0, s1 in spans:
        if s0 >= end:
            break
        lo, hi = max(s0, reach), min(s1, end)
        if hi > lo:
            covered += hi - lo
            reach = hi
    return covered


def before_first_request(windows: list[Window],
                         index: dict[str, list[tuple[float, float]]]) -> list[float]:
    """Per window: seconds from its start to the agent's first request on its objects that
    starts inside it (the whole window when none does): the part of agent-own spent waiting
    for a worker, a dispatch slot or a turn in the work queue, before the agent touched the
    apiserver for this object."""
    out = []
    for names, start, end in windows:
        first = min((s0 for n in names for s0, _s1 in index.get(n, ()) if start <= s0 <= end),
                    default=end)
        out.append(first - start)
    return out


def saturated_spans(lines: list[list[Any]], workers: int,
                    kinds: tuple[str, ...]) -> list[tuple[float, float]]:
    """Sorted, disjoint ``(start, end)`` spans in which at least ``workers`` requests on one
    object whose path contains one of ``kinds`` were in flight (sent, not yet answered), from
    request-trace lines (``[start, end, method, path, name, ...]``;
    docs/kube-api.md#request-trace). Collection requests (no ``name``) are left out.

    With ``workers`` the binary's bound on the handlers making those requests, these are the
    spans in which every one of them was waiting on the apiserver. A request ending at the
    instant another starts is not in flight with it."""
    edges: list[tuple[float, int]] = []
    for line in lines:
        # a collection request (no object named: an informer's LIST) is no handler's
        if len(line) >= 5 and line[4] and any(k in str(line[3]) for k in kinds):
            edges.append((float(line[0]), 1))
            edges.append((float(line[1]), -1))
    edges.sort()  # at one instant the ends (-1) come first
    out: list[tuple[float, float]] = []
    busy = 0
    since: float | None = None
    for t, step in edges:
        busy += step
        if busy >= workers and since is None:
            since = t
        elif busy < workers and since is not None:
            if out and out[-1][1] == since:
                out[-1] = (out[-1][0], t)  # the same saturation, one request handed over
            elif t > since:
                out.append((since, t))
            since = None
    return out


def queued_behind_server(windows: list[Window], index: dict[str, list[tuple[float, float]]],
                         saturated: list[tuple[float, float]]) -> list[float]:
    """Per window: the seconds of its wait before the first request on its objects
    (:func:`before_first_request`) that fall in ``saturated`` (:func:`saturated_spans`): the
    wait for a worker while every worker held a request the apiserver had not answered yet.
    Seconds in which a request on the window's own objects was in flight are left out: those
    are already the server's share (:func:`agent_own`)."""
    ends = [s1 for _s0, s1 in saturated]

    def overlap(lo: float, hi: float) -> float:
        covered = 0.0
        i = bisect.bisect_right(ends, lo)  # the first span still open after lo
        while i < len(saturated) and saturated[i][0] < hi:
            covered += min(saturated[i][1], hi) - max(saturated[i][0], lo)
            i += 1
        return covered

    out = []
    for (names, start, _end), wait in zip(windows, before_first_request(windows, index),
                                          strict=True):
        covered = 0.0
        reach = start  # the gaps between the objects' own requests, inside the wait
        for s0, s1 in sorted(sp for n in names for sp in index.get(n, ())):
            if s0 >= start + wait:
                break
            if s0 > reach:
                covered += overlap(reach, s0)
            reach = max(reach, min(s1, start + wait))
        if reach < start + wait:
            covered += overlap(reach, start + wait)
        out.append(covered)
    return out


def frame_reads(lines: list[list[Any]]) -> dict[str, list[float]]:
    """NodeStateUpdate lines of the operator's frame trace (``[read, kind, key]``;
    docs/kube-api.md#request-trace) as machine ID -> the times its frames were read, sorted."""
    out: dict[str, list[float]] = defaultdict(list)
    for line in lines:
        if len(line) >= 3 and line[1] == "node_state_update":
            out[str(line[2])].append(float(line[0]))
    for times in out.values():
        times.sort()
    return dict(out)


def before_read(windows: list[Window], reads: dict[str, list[float]],
                index: dict[str, list[tuple[float, float]]]) -> list[float]:
    """Per NodeStateUpdate window (its object ``un-<machine>``): seconds from its start to the
    operator's first read of a frame for that machine inside it (:func:`frame_reads`), less the
    time requests on its objects were in flight then (already the server's share). That is the
    shard's send path and the connection, up to the operator's receive pump (and the pump's own
    pauses for backpressure). 0 when no read is traced inside the window, or the frame's read
    came up to ``SEND_SLACK`` before the shard's send timestamp."""
    out = []
    for names, start, end in windows:
        machine = names[0][len("un-"):] if names and names[0].startswith("un-") else ""
        times = reads.get(machine, [])
        # the shard stamps a frame after its send returned, so the operator may have read it a
        # moment before: such a read is this frame's (no wait), not the machine's next frame's
        i = bisect.bisect_left(times, start - SEND_SLACK)
        if i == len(times) or times[i] > end or times[i] < start:
            out.append(0.0)
            continue
        spans = sorted(sp for n in names for sp in index.get(n, ()))
        out.append((times[i] - start) - server_wait(spans, start, times[i]))
    return out


def agent_own(windows: list[Window], index: dict[str, list[tuple[float, float]]], *,
              watched_end: bool = False) -> list[float]:
    """Per window: its length minus the time the apiserver requests on its objects covered
    (merged over the objects, so overlapping requests count once), clipped at 0.

    ``watched_end``: the window ends when the bench's own watch saw the write (Pod -> CR,
    NodeStateUpdate -> UpcomingNode), so it ends at the last answer to a request on its objects
    inside it, where there is one: what follows is the apiserver delivering the event to the
    bench, with no work of the agent's left in it (docs/kube-api.md#request-trace). A later
    request's answer only moves that end later, so the agent's share is never understated."""
    out = []
    for names, start, end in windows:
        spans = sorted(sp for n in names for sp in index.get(n, ()))
        if watched_end:
            end = max((s1 for _s0, s1 in spans if start <= s1 <= end), default=end)
        out.append(max(0.0, (end - start) - server_wait(spans, start, end)))
    return out
