"""Reporting of the ``fleet`` bench: the result's figures from the observations and shard stats.

:func:`report` turns per-phase latencies (:mod:`._fleet_analysis`), end-of-phase object counts
and per-process RSS/CPU samples into ``scripts.bench._common`` figures. Private to
:mod:`scripts.bench.fleet` (the leading underscore keeps it out of scenario discovery).
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from typing import Any

from bigfleet_trio.podcontroller.translate import cr_name_for_pod
from scripts.bench import _common as C
from scripts.bench._fleet_analysis import (
    Matched,
    Window,
    agent_own,
    before_first_request,
    before_read,
    cr_readds,
    frame_reads,
    nsu_latencies,
    pct,
    pod_cr_latencies,
    queued_behind_server,
    reclaim_latencies,
    rollup_latencies,
    saturated_spans,
    trace_index,
)
from scripts.bench._fleet_observe import Observed
from scripts.bench._fleet_procs import TRACED, Fleet

BOOTSTRAP_DEADLINE = 10.0
AGENT_OWN_P99 = 0.1  # seconds: the agent's own share of a matched latency, p99


def _jsonl(path: Any) -> list[Any] | None:
    """The JSON lines of ``path`` (a line cut short by the process's end skipped); None when
    the file cannot be read."""
    import orjson

    try:
        raw = path.read_bytes()
    except OSError:
        return None
    out = []
    for line in raw.splitlines():
        try:
            out.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    return out


def load_traces(fleet: Fleet) -> dict[str, list[list[Any]]]:
    """The traced binaries' request-trace lines (docs/kube-api.md#request-trace), per binary
    name in :data:`TRACED`; a binary without a trace is left out."""
    out: dict[str, list[list[Any]]] = {}
    for name in TRACED:
        lines = _jsonl(fleet.trace_path(name))
        if lines is not None:
            out[name] = lines
    return out


def load_frame_reads(fleet: Fleet) -> dict[str, list[float]]:
    """The operator's shard-frame trace as :func:`frame_reads`; {} without one."""
    return frame_reads(_jsonl(fleet.frame_trace_path()) or [])


def worker_bounds() -> dict[str, tuple[int, tuple[str, ...]]]:
    """Per traced binary: how many handlers may be waiting on the apiserver at once, and the
    paths their requests name (the bench runs both binaries at their defaults). The pod
    controller's reconcile workers write CapacityRequests; the operator's dispatch slots
    (shard instructions) write UpcomingNodes, AvailableCapacities and Node cordons. The
    operator's drains hold no slot, so its Pod requests are left out."""
    from bigfleet_trio.config import PodControllerConfig
    from bigfleet_trio.operator.session.types import SessionConfig

    return {
        "pod-controller": (PodControllerConfig().workers, ("/capacityrequests",)),
        "operator": (SessionConfig().dispatch_concurrency,
                     ("/upcomingnodes", "/availablecapacities", "/nodes/")),
    }


WRITE_METHODS = frozenset(("POST", "PUT", "PATCH", "DELETE"))


def count_writes(lines: list[list[Any]]) -> int:
    """Apiserver writes (POST, PUT, PATCH, DELETE) among request-trace lines."""
    return sum(1 for row in lines
               if isinstance(row, list) and len(row) > 2 and row[2] in WRITE_METHODS)


def _own_rows(ph: str, name: str, windows: list[Window],
              index: dict[str, list[tuple[float, float]]], *,
              watched_end: bool = False,
              saturated: list[tuple[float, float]] | None = None,
              reads: dict[str, list[float]] | None = None) -> list[dict[str, Any]]:
    """Agent-own rows of one matched latency: end-to-end minus the apiserver requests on its
    objects as the client saw them, up to the last answer when the bench's watch ends the
    latency (``watched_end``: :func:`agent_own`; docs/kube-api.md#request-trace); target p99
    <= 100 ms."""
    if not windows or not index:
        return []
    own = agent_own(windows, index, watched_end=watched_end)
    e2e = [end - start for _n, start, end in windows]
    # where agent-own goes: before the first request on the objects (a worker, a slot, the
    # work queue) or after it (building, retries' backoff, the next request of a sequence)
    before = [min(b, o) for b, o in zip(before_first_request(windows, index), own, strict=True)]
    rows = _rows(f"{ph}: {name}: agent-own", own, baseline=pct(e2e, 0.99),
                 label="end-to-end p99 (same samples)",
                 target=f"p99 <= {AGENT_OWN_P99 * 1000:g} ms",
                 met=pct(own, 0.99) <= AGENT_OWN_P99) + _rows(
        f"{ph}: {name}: agent-own before its first request", before, baseline=pct(own, 0.99),
        label="agent-own p99 (same samples)")
    if saturated is not None:
        # of that wait, the part in which every worker held an unanswered request: taken out,
        # what is left is the agent's work and its own scheduling (docs/kube-api.md#request-trace)
        queued = queued_behind_server(windows, index, saturated)
        rest = [max(0.0, o - min(q, b)) for o, q, b in zip(own, queued, before, strict=True)]
        rows += _rows(f"{ph}: {name}: agent-own less the wait while every worker was at the "
                      "server", rest, baseline=pct(own, 0.99),
                      label="agent-own p99 (same samples)")
    if reads:
        # NodeStateUpdates: from the moment the operator's receive pump had the frame on
        got = before_read(windows, reads, index)
        rows += _rows(f"{ph}: {name}: agent-own after the operator read the frame",
                      [max(0.0, o - g) for o, g in zip(own, got, strict=True)],
                      baseline=pct(own, 0.99), label="agent-own p99 (same samples)")
    return rows


def _rows(name: str, samples: list[float], unit: str = "s", *, baseline: float | None = None,
          label: str = "", target: str = "", met: Any = None) -> list[dict[str, Any]]:
    """Two table rows: the samples (median = p50, min, max, n) and their p99 on its own."""
    row = C.figure(f"{name} (p50)", unit, samples if samples else [float("nan")],
                   baseline=baseline, baseline_label=label, target=target, met=met)
    row["n"] = len(samples)
    p99 = C.figure(f"{name} (p99)", unit, pct(samples, 0.99), baseline=baseline,
                   baseline_label=label)
    return [row, p99]


def _matched_rows(ph: str, name: str, m: Matched, cycle: float, *, apart: str, apart_name: str,
                  apart_in_latency: bool = False, own: float | None = None
                  ) -> list[dict[str, Any]]:
    """Rows for one phase of a :class:`Matched`: the latency p50/p99 (target p99 <= 2 s), the
    count kept apart (``apart``: what ``superseded`` means here; ``apart_in_latency``: those are
    also in the latency rows) with the unmatched, and the kept-apart ones' own timing
    (``apart_name``). Baseline of the latency: ``own`` (the operator's own handling p99) when
    given, else the roll-up interval."""
    lat, sup, lost = m.latency.get(ph) or [], m.superseded.get(ph) or [], m.unmatched.get(ph, 0)
    if not (lat or sup or lost):
        return []
    if own is not None:
        base, label = own, "the operator's own handling p99 (histogram bucket bound, same phase)"
    else:
        base, label = cycle, "one roll-up interval"
    rows = _rows(f"{ph}: {name}", lat, baseline=base, label=label, target="p99 <= 2 s",
                 met=pct(lat, 0.99) <= 2.0 if lat else None)
    timed = len(lat) + lost + (0 if apart_in_latency else len(sup))
    rows.append(C.figure(f"{ph}: {name}: {apart}", "count", len(sup), baseline=timed,
                         baseline_label=f"timed; {lost} unmatched (no write seen before the "
                         "next such update or the run's end)"))
    if sup:
        rows += _rows(f"{ph}: {name}: {apart_name}", sup, baseline=cycle,
                      label="one roll-up interval")
    return rows


NSU_WAIT_HISTOGRAMS = (
    ("nsu_queue_buckets", "bigfleet_operator_node_state_queue_seconds", ""),
    ("nsu_gate_buckets", "bigfleet_operator_node_state_worker_wait_seconds",
     'waited_for="read_ahead"'),
    ("nsu_slot_buckets", "bigfleet_operator_node_state_worker_wait_seconds",
     'waited_for="slot"'),
)
"""The operator's node-state wait histograms the bench reads at each phase end: (key in the
phase-end counts, metric, series filter)."""
NSU_WAIT_ROWS = {
    "nsu_queue_buckets": "a machine ready -> a worker claims it",
    "nsu_gate_buckets": "the claiming worker's wait at the read-ahead gate",
    "nsu_slot_buckets": "the claiming worker's wait for a slot other handlers held",
}


def _phase_p99(counts: list[dict[str, Any]],
                 key: str = "nsu_duration_buckets") -> dict[str, float]:
    """Per phase: an upper bound of the p99 of an operator histogram read at each phase end
    (``key``; by default its own NodeStateUpdate handling time,
    ``..._node_state_update_duration_seconds``, all phase labels), from the buckets' growth
    between the previous phase end and this one. {} without the buckets."""
    out: dict[str, float] = {}
    prev: dict[str, float] = {}
    for c in counts:
        cur = c.get(key) or {}
        if not cur:
            continue
        delta = sorted((float(le), n - prev.get(le, 0.0)) for le, n in cur.items())
        prev = cur
        total = delta[-1][1] if delta else 0.0
        if total > 0:
            out[c["end_of"]] = next(le for le, n in delta if n >= 0.99 * total)
    return out


def report(args: argparse.Namespace, fleet: Fleet, obs: Observed,
           result: dict[str, Any]) -> None:
    """Fill ``result`` (figures and extras) from a finished run."""
    stats = result["extra"].pop("final_stats", None) or {}
    figures: list[dict[str, Any]] = []
    cycle = float(args.rollup_seconds)
    phases = ("ramp", "churn", "reclaim", "quiesce")
    roll = rollup_latencies(obs.states, stats.get("rollups") or [])
    nsu = nsu_latencies(stats.get("nsu") or [], obs.un_events, obs.phase_of)
    own_nsu = _phase_p99(result["extra"].get("counts") or [])
    nsu_waits = {key: _phase_p99(result["extra"].get("counts") or [], key)
                 for key in NSU_WAIT_ROWS}
    boot: dict[str, list[float]] = defaultdict(list)
    unanswered = 0
    for _rid, sent, answered, _err in stats.get("bootstrap") or []:
        if answered is None:
            unanswered += 1
            continue
        boot[obs.phase_of(sent)].append(answered - sent)
    readds = cr_readds(obs.cr_readds, obs.pod_deleted, obs.cr_deleted)
    rec = reclaim_latencies(stats.get("reclaim") or [], obs.phase_of,
                            stats.get("machine_of_node") or {})
    pod_cr = pod_cr_latencies(obs.pod_added, obs.cr_added, obs.pod_deleted, cr_name_for_pod)
    traces = load_traces(fleet)
    index = trace_index([line for lines in traces.values() for line in lines])
    result["extra"]["traced_requests"] = sum(len(v) for v in index.values())
    reads = load_frame_reads(fleet)
    full = {name: saturated_spans(traces.get(name, []), workers, kinds)
            for name, (workers, kinds) in worker_bounds().items()}
    result["extra"]["all_workers_at_server_s"] = {
        name: round(sum(b - a for a, b in spans), 3) for name, spans in full.items()}
    for ph in phases:
        pc = pod_cr.get(ph)
        if pc and pc["latency"]:
            figures += _rows(f"{ph}: Pod created -> CR exists", pc["latency"],
                             baseline=cycle, label="one roll-up interval",
                             target="p99 <= 2 s" if ph == "churn" else "",
                             met=(pct(pc["latency"], 0.99) <= 2.0) if ph == "churn" else None)
            figures += _own_rows(ph, "Pod created -> CR exists", pc["windows"], index,
                                 watched_end=True, saturated=full["pod-controller"])
            figures.append(C.figure(
                f"{ph}: Pods with no CR timed (deleted first / never seen with one)", "pods",
                pc["deleted_first"] + pc["missing"], baseline=len(pc["latency"]),
                baseline_label=f"Pods timed ({pc['deleted_first']} deleted before a CR was "
                f"seen, {pc['missing']} never seen with one; {pc['cr_first']} CRs seen before "
                "their Pod, timed as 0)"))
        if ph in readds:
            r = readds[ph]
            figures.append(C.figure(
                f"{ph}: CRs re-created for a live Pod", "CRs", r["live"],
                baseline=r["live"] + r["pod_deleted"],
                baseline_label="a Pod's CR created again (Pod live or being deleted)"))
            figures.append(C.figure(
                f"{ph}: CRs re-created for a deleted Pod", "CRs", r["pod_deleted"],
                baseline=len(obs.pod_deleted),
                baseline_label="Pods deleted in the run"))
        if roll.get(ph):
            figures += _rows(f"{ph}: CR change -> roll-up carrying it", roll[ph],
                             baseline=cycle, label="one roll-up interval",
                             target=f"p99 <= {cycle + 1:g} s (interval + 1 s)",
                             met=pct(roll[ph], 0.99) <= cycle + 1)
        figures += _matched_rows(ph, "NodeStateUpdate -> UpcomingNode written", nsu, cycle,
                                 apart="superseded (phase never written, a later one was)",
                                 apart_name="superseded update -> the write replacing it",
                                 own=own_nsu.get(ph))
        figures += _own_rows(ph, "NodeStateUpdate -> UpcomingNode written",
                             nsu.windows.get(ph) or [], index, watched_end=True,
                             saturated=full["operator"], reads=reads)
        for key, what in NSU_WAIT_ROWS.items():
            bound = nsu_waits[key].get(ph)
            if bound is not None:
                figures.append(C.figure(
                    f"{ph}: NodeStateUpdate: {what} (p99, bucket bound)", "s", bound,
                    baseline=own_nsu.get(ph), baseline_label="the operator's own handling p99 "
                    "(histogram bucket bound, same phase)"))
        if boot.get(ph):
            late = sum(1 for x in boot[ph] if x > BOOTSTRAP_DEADLINE)
            rows = _rows(f"{ph}: BootstrapRequest -> response", boot[ph],
                         baseline=BOOTSTRAP_DEADLINE,
                         label="the shard's one-cycle deadline (10 s)",
                         target=f"0 past 10 s (here {late})", met=late == 0)
            figures += rows
        figures += _matched_rows(ph, "reclaim instruction -> ack", rec, cycle,
                                 apart="acked only after the shard re-sent it",
                                 apart_name="acked after a re-send (from the first send)",
                                 apart_in_latency=True)
        figures += _own_rows(ph, "reclaim instruction -> ack", rec.windows.get(ph) or [], index,
                             saturated=full["operator"])
    for c in result["extra"].get("counts") or []:
        ph = c["end_of"]
        figures.append(C.figure(f"end of {ph}: UpcomingNodes", "objects", c["upcoming"],
                                baseline=c["machines_bound"] or 0,
                                baseline_label="machines bound at the shard (ratio 1 = live set)",
                                target="= bound machines, 0 stale",
                                met=c["upcoming"] == c["machines_bound"]
                                and c["upcoming_stale"] == 0 and c["upcoming_drained"] == 0))
        figures.append(C.figure(f"end of {ph}: CapacityRequests", "objects", c["crs"],
                                baseline=c["pods"],
                                baseline_label="live Pods (ratio 1 = one each)"))
        figures.append(C.figure(f"end of {ph}: Pods left pending", "pods",
                                c["pods"] - c["pods_bound"], baseline=c["pods"],
                                baseline_label="live Pods"))
        for who, cl in (c.get("client") or {}).items():
            figures.append(C.figure(
                f"end of {ph}: {who}: requests held by 429s (APF) / seconds waited on the "
                "client limiter, cumulative", "count", cl["throttled_429"],
                baseline=cl["requests"], baseline_label=f"requests sent; limiter waits "
                f"{cl['limiter_wait_s']:.1f} s in all"))
            if who == "pod-controller" and c["pods"]:
                figures.append(C.figure(
                    f"end of {ph}: Pod watch events skipped as unchanged (status heartbeats), "
                    "cumulative, per live Pod", "events", cl.get("unchanged_events", 0)
                    / c["pods"]))
        m = c.get("operator_metrics") or {}
        figures.append(C.figure(f"end of {ph}: outbox drops, reconnects", "count",
                                sum(v for k, v in m.items() if "outbox_dropped" in k)
                                + sum(v for k, v in m.items() if "reconnects" in k),
                                target="0", met=not any(m.values())))
    churn_t = [t for t, name in obs.phase_at if name in ("churn", "reclaim")]
    frames_down = (len(stats.get("nsu") or []) + len(stats.get("bootstrap") or [])
                   + sum(r[4] if len(r) > 4 else 1 for r in stats.get("reclaim") or []))
    for name, p in fleet.procs.items():
        if not p.samples:
            continue
        peak = max(s[1] for s in p.samples)
        cpu = p.samples[-1][2]
        window = [s for s in p.samples if len(churn_t) == 2 and churn_t[0] <= s[0] <= churn_t[1]]
        growth = float("nan")
        if len(window) >= 3:
            xs = [s[0] for s in window]
            ys = [s[1] for s in window]
            growth = statistics.linear_regression(xs, ys).slope * 3600
        ramp_rss = [s[1] for s in p.samples if obs.phase_of(s[0]) == "ramp"]
        row = C.figure(f"{name}: peak RSS", "MB", peak,
                       baseline=max(ramp_rss) if ramp_rss else None,
                       baseline_label="peak RSS during the ramp")
        figures.append(row)
        wall = p.samples[-1][0] - p.samples[0][0] if len(p.samples) > 1 else float("nan")
        figures.append(C.figure(f"{name}: CPU seconds", "s", cpu, baseline=wall,
                                baseline_label="wall seconds sampled (ratio = cores used)"))
        figures.append(C.figure(f"{name}: RSS growth over churn", "MB/h", growth,
                                baseline=peak, baseline_label="peak RSS (ratio = share per hour)"))
        half = [x for x in p.samples if x[0] >= (p.samples[0][0] + p.samples[-1][0]) / 2]
        if name in ("operator", "pod-controller") and len(half) >= 2:
            figures.append(C.figure(
                f"{name}: RSS change over the second half of the run", "MB",
                half[-1][1] - half[0][1], baseline=half[0][1],
                baseline_label="RSS at the run's midpoint (ratio ~0 = flat)",
                target="flat (no leak)"))
        if name == "operator" and frames_down:
            figures.append(C.figure(
                "operator: CPU per downlink frame", "ms", cpu / frames_down * 1000,
                baseline=frames_down, baseline_label="frames the shard sent (NodeStateUpdates, "
                "BootstrapRequests, ReclaimInstruction sends)"))
        writes = count_writes(traces.get(name, []))
        if writes:
            figures.append(C.figure(
                f"{name}: CPU per apiserver write", "ms", cpu / writes * 1000,
                baseline=writes, baseline_label="writes in its request trace (whole-process "
                "CPU: reads, watches and the shard stream included)",
                target="<= 1 ms (operator)" if name == "operator" else "reported",
                met=cpu / writes * 1000 <= 1.0 if name == "operator" else None))
        if name == "pod-controller" and obs.pod_added:
            figures.append(C.figure(
                "pod-controller: CPU per Pod", "ms", cpu / len(obs.pod_added) * 1000,
                baseline=len(obs.pod_added), baseline_label="Pods created in the run"))
    result["figures"] = figures
    if getattr(args, "plot", ""):
        from pathlib import Path

        from scripts.bench._fleet_plot import plot

        series: dict[str, list[Window]] = {
            "Pod created -> CR exists": [w for r in pod_cr.values() for w in r["windows"]],
            "NodeStateUpdate -> UpcomingNode written": [
                w for ws in nsu.windows.values() for w in ws],
            "reclaim instruction -> ack": [w for ws in rec.windows.values() for w in ws]}
        plot(Path(args.plot), series, {n: p.samples for n, p in fleet.procs.items()},
             obs.phase_at, f"bench fleet --kube {args.kube}: {args.machines} machines, "
             f"{args.pods} Pods, churn {args.duration:g} s")
        result["extra"]["plot"] = args.plot
    result["extra"]["cr_readds"] = {ph: {
        k: (v if isinstance(v, int) else
            {"n": len(v), "p50": pct(v, 0.5), "p99": pct(v, 0.99),
             "min": min(v, default=float("nan")), "max": max(v, default=float("nan"))})
        for k, v in r.items()} for ph, r in readds.items()}
    result["extra"]["bootstrap_unanswered"] = unanswered
    result["extra"]["bootstrap_past_deadline"] = sum(1 for v in boot.values() for x in v
                                                     if x > BOOTSTRAP_DEADLINE)
    result["extra"]["processes"] = {
        n: {"samples": [[round(t, 1), round(r, 1), round(c, 2)] for t, r, c in p.samples[::6]]}
        for n, p in fleet.procs.items()}
    result["extra"]["rollups_received"] = len(stats.get("rollups") or [])
    result["extra"]["machines_bound_end"] = len(stats.get("bound") or [])
