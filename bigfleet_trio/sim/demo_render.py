"""What the demo prints: the live progress line, the summary table, the failure line, the banner.

Pure string building over :mod:`.demo_world`'s :class:`~.demo_world.World` and
:class:`~.demo_world.DemoSummary` (the banner and :func:`print_summary` write to a given
stream). Used by the scenario (:mod:`.demo_scenario`) and the CLI entry (:mod:`.demo`), which
re-exports it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from bigfleet_trio.sim.demo_options import DemoOptions
from bigfleet_trio.sim.shard.session import SimShard

from .demo_world import DemoSummary, World


def fleet_line(rigs: Sequence[Any], worlds: Mapping[str, World], shard: SimShard) -> str:
    """One live line for the fleet: per cluster Pods bound and machines, then the moves."""
    parts = []
    for rig in rigs:
        world = worlds.get(rig.name)
        bound = rig.view.engine.bound_machines()
        spot = sum(1 for m in bound if m.spot)
        pods = f"{world.bound()}/{len(world.live_pods)}" if world is not None else "-"
        parts.append(f"{rig.name} pods {pods} machines {len(bound)}"
                     + (f" ({spot} spot)" if spot else ""))
    moves = shard.fleet.moves
    return ("         fleet      " + " | ".join(parts)
            + f" | moved {len(moves)}"
            + (f" (preempted {sum(1 for m in moves if m.why == 'preempted')})" if moves else ""))


def fleet_story(s: DemoSummary) -> list[str]:
    """What moved where and why, one sentence each (the summary's ``story``)."""
    lines = []
    for m in s.moves:
        why = {"surplus": "no need there took it any more (surplus reclaim)",
               "preempted": "higher-priority demand needed it (preempted)",
               "failed": "its bootstrap failed there"}.get(m["why"], m["why"])
        lines.append(f"{m['instance_type']} {m['node']} moved {m['from']} -> {m['to']} at "
                     f"{m['t']:.1f}s: {why}")
    spot = [c for c in s.clusters if c["spot_machines"]]
    for c in spot:
        lines.append(f"{c['name']} runs {c['spot_machines']} spot machines: its batch work "
                     "tolerates interruption (penalty $0) and spot machines cost less; work "
                     "without a low interruption penalty stays on on-demand machines")
    for c in s.clusters:
        if c["pods_pending"]:
            lines.append(f"{c['name']}: {len(c['pods_pending'])} Pods Pending "
                         f"({', '.join(c['pods_pending'][:3])}): {c['pending_why']}")
    return lines


def progress_line(elapsed: float, world: World, shard: Any, stage: str) -> str:
    """One line of live progress."""
    snap = world.shard
    machines = {k: v for k, v in snap["machines"].items() if k != "FREE"}
    mtxt = " ".join(f"{k.lower()} {v}" for k, v in sorted(machines.items())) or "none"
    up = world.upcoming_phases()
    utxt = " ".join(f"{k} {v}" for k, v in sorted(up.items())) or "none"
    live = world.live_pods
    return (f"[{elapsed:5.1f}s] {stage:<10} pods {world.bound():>3}/{len(live):<3} bound | "
            f"CRs {len(world.crs):>3} | needs {snap['needs']:>2} | machines: {mtxt} | "
            f"upcoming: {utxt} | nodes ready {world.nodes_ready():>2} | "
            f"reclaims {snap['reclaims_acked']}/{snap['reclaims_issued']} acked, "
            f"{snap['released']} drained")


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def replaced_line(n: int) -> str:
    """The "evicted Pods recreated" row: what the count means, worded for zero too."""
    if n == 0:
        return ("0 (the drained machines held no Pods any more: the scale-down had removed "
                "them before the reclaim)")
    return (f"{n} (the drain evicted them; their controllers made new ones on the remaining "
            "Nodes)")


def render_summary(s: DemoSummary, *, live: bool = False) -> str:
    """The human summary table. ``live``: the diagnostics listener still serves (with
    ``--keep-running``), so its URLs are worth printing; otherwise it has stopped."""
    t = s.timings
    rows: list[tuple[str, str]] = [
        ("workloads applied", ", ".join(s.workloads) or "-"),
        ("Pods created", str(s.pods_created)),
        ("CapacityRequests", str(s.crs)),
        ("needs in the roll-up", f"{s.needs} ({s.rollup_bytes} bytes on the wire, "
                                 f"{s.rollups} roll-ups accepted)"),
        ("machines Configured", f"{s.machines_configured} (${s.hourly_cost:.2f}/h)"),
        ("UpcomingNodes Ready", str(s.upcoming_ready)),
        ("Nodes Ready", str(s.nodes_ready)),
        ("Pods bound", f"{s.pods_bound}/{s.pods_created}"),
        ("time to all Pods bound", _secs(t.get("all_bound"))),
        ("scaled down", f"{s.scaled_down or '-'} ({s.pods_deleted} Pods deleted)"),
        ("reclaims issued / acked", f"{s.reclaims_issued} / {s.reclaims_acked}"),
        ("machines drained and released", f"{s.machines_released} "
                                          f"({', '.join(s.reclaimed_nodes) or '-'})"),
        ("drains finished (operator)", str(s.drains_completed)),
        ("evicted Pods recreated", replaced_line(s.pods_replaced)),
        ("UpcomingNodes deleted", str(s.upcoming_deleted)),
        ("machines bound while reclaiming", f"{s.machines_bound_while_reclaiming} (demand that "
                                            "came back, e.g. evicted Pods; a just-released warm "
                                            "machine is the cheapest pick)"),
        ("time from scale-down to drained", _secs(t.get("reclaim"))),
        ("after: machines Configured", f"{s.final_machines_configured} "
                                       f"(${s.final_hourly_cost:.2f}/h)"),
        ("total wall time", f"{t.get('total', 0):.1f}s"),
    ]
    if len(s.clusters) > 1:
        rows.append(("clusters", str(len(s.clusters))))
        for c in s.clusters:
            rows.append((f"  {c['name']}",
                         f"{c['pods_bound']}/{c['pods']} Pods bound, {c['machines']} machines "
                         f"({c['spot_machines']} spot, ${c['hourly_cost']:.2f}/h), "
                         f"{c['reclaims']} reclaimed ({c['preempted']} preempted)"))
        rows.append(("machines moved between clusters",
                     f"{len(s.moves)} ({s.preemptions} preemptions, {s.spot_machines} spot "
                     "machines in use)"))
    if s.page and live:
        rows.append(("live page", s.page))
    width = max(len(k) for k, _ in rows)
    lines = ["", "BigFleet demo summary" + ("" if s.ok else " (FAILED)"),
             "-" * (width + 40)]
    lines += [f"{k:<{width}}  {v}" for k, v in rows]
    if s.diagnostics and live:
        lines.append(f"{'diagnostics':<{width}}  {diagnostics_urls(s.diagnostics)}")
    lines.append("")
    lines.append("machine states in the live lines: creating -> configuring -> configured (a "
                 "Node of this cluster); idle = warm in the shard's pool, bound to no cluster "
                 "(released machines return there)")
    if s.story:
        lines.append("")
        lines.append("what moved where, and why:")
        lines += [f"  {line}" for line in s.story]
    if s.failure:
        lines.append(f"{'did not converge':<{width}}  {s.failure}")
    return "\n".join(lines)


def diagnostics_urls(addr: str) -> str:
    """The URLs of the diagnostics endpoints served on ``addr`` (``HOST:PORT``)."""
    return (f"http://{addr}/metrics  http://{addr}/healthz  http://{addr}/readyz  "
            f"ws://{addr}/events")


_STAGE_WORDS = {
    "apply": "applying the workloads",
    "scale-up": "waiting for every Pod to get a machine and be bound",
    "reclaim": "waiting for the scaled-down workload's machines to be reclaimed and drained",
}


def failure_line(timeout: float, stage: str, why: str | None) -> str:
    """One plain line saying why the demo did not converge (stage, then what was missing)."""
    doing = _STAGE_WORDS.get(stage, f"in stage {stage}")
    return f"not done after {timeout:g}s while {doing}: {why or 'no progress observed'}"


def print_summary(summary: DemoSummary, opts: DemoOptions, out: TextIO) -> None:
    """The summary on ``out``: one JSON line with ``--json``, else the table."""
    if opts.json_summary:
        print(json.dumps(summary.to_dict(), sort_keys=True), file=out, flush=True)
    else:
        print(render_summary(summary, live=opts.keep_running), file=out, flush=True)


def print_keep_running_banner(summary: DemoSummary, out: TextIO) -> None:
    """What ``--keep-running`` prints after the summary: kubectl commands and the diagnostics
    addresses (both with the virtualenv's paths, so they work without an activated venv)."""
    bin_dir = os.path.dirname(sys.executable)
    kubectl = os.path.join(bin_dir, "kubectl")
    kubectl = kubectl if os.path.exists(kubectl) else "kubectl"
    print("", file=out)
    print("The simulated cluster keeps running. Explore it with kubectl (the Deployment, "
          "ReplicaSet, StatefulSet and Job controllers run: what you apply gets Pods, and "
          "machines from the shard):", file=out)
    print(f"  export KUBECONFIG={summary.kubeconfig}", file=out)
    for cmd in ("get nodes -L node.kubernetes.io/instance-type,topology.kubernetes.io/zone",
                "get pods -A -o wide",
                "get capacityrequests -A",
                "get upcomingnodes",
                "get availablecapacities"):
        print(f"  {kubectl} {cmd}", file=out)
    for c in summary.clusters[1:]:
        print(f"  {kubectl} --kubeconfig {c['kubeconfig']} get pods -A -o wide   "
              f"# {c['name']}", file=out)
    if summary.page:
        print(f"Live page (every cluster, machines moving between them): {summary.page}",
              file=out)
    if summary.diagnostics:
        addr = summary.diagnostics
        print("Diagnostics (operator and pod controller):", file=out)
        print(f"  metrics  http://{addr}/metrics", file=out)
        print(f"  health   http://{addr}/healthz  http://{addr}/readyz", file=out)
        cli = os.path.join(bin_dir, "bigfleet-trio")
        cli = cli if os.path.exists(cli) else "bigfleet-trio"
        print(f"  events   {cli} events --addr {addr}", file=out)
    print("Press Ctrl-C to stop.", file=out, flush=True)
