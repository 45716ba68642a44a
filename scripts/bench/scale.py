"""``bench scale``: event-loop lag and resident memory of an agent binary holding N Pods.

A sim apiserver child process holds ``--pods`` realistic Pods and, for each, its CR stamped
Pending (filled in-process, :mod:`._scale_probe`). The agent child (``--binary podcontroller``:
the whole :class:`PodController`; ``operator``: the operator's CR cache with its transform and
a roll-up from scratch every 10 s) then goes through three phases:

* ``startup``: LIST everything, sync, reconcile every Pod (no writes: every CR is in line);
* ``relist``: the server drops every watch and forgets its history, so each re-watch gets
  410 Expired and the informers relist every object;
* ``churn``: the server deletes every Pod (its CR goes with it) and creates as many new ones;
  the pod controller writes a CR per new Pod and stamps it.

Figures per phase: the worst event-loop lag (a task sleeping 50 ms in a loop: how late it
woke, as ``bigfleet_event_loop_lag_seconds`` measures), peak RSS; and the steady RSS after the
start-up per cached Pod (the pod controller caches the Pod and its CR) or per cached CR, against
the process's own RSS before its informers started (same run). ``--spy`` takes a ``py-spy dump``
of the agent whenever it has printed nothing for 1 s (a stall in progress) into the result.

``--watch-list on|off|both`` fills the agent's caches from streaming lists or paged LISTs
(docs/kube-api.md#streaming-lists); ``both`` runs off then on and reports on/off ratios, with
the sim apiserver's peak RSS during the start-up too (its ``VmHWM``, reset after the fill).

Usage: ``python -m scripts.bench scale --binary podcontroller --pods 150000 [--phases
startup,relist,churn] [--watch-list on|off|both] [--spy]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from scripts.bench import _common as C


class _Child:
    """A child process whose stdout JSON lines are collected by a thread."""

    def __init__(self, cmd: list[str], stdin: bool = False) -> None:
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                                     stdin=subprocess.PIPE if stdin else None)
        self.lines: list[dict[str, Any]] = []
        self.last_seen = time.monotonic()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                continue
            self.last_seen = time.monotonic()

    def wait_line(self, pred: Any, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for line in self.lines[seen:]:
                if pred(line):
                    return line
            seen = len(self.lines)
            if self.proc.poll() is not None:
                raise RuntimeError(f"child exited rc={self.proc.returncode}")
            time.sleep(0.1)
        raise TimeoutError("no such line")

    def send(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def _spy(agent: _Child, dumps: list[str], stop: threading.Event) -> None:
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        dumps.append("py-spy not installed (pip install py-spy)")
        return
    armed = True
    while not stop.wait(0.2):
        quiet = time.monotonic() - agent.last_seen
        if quiet > 1.0 and armed and agent.proc.poll() is None:
            out = subprocess.run([spy, "dump", "--pid", str(agent.proc.pid)],
                                 capture_output=True, text=True).stdout
            dumps.append(f"quiet {quiet:.1f}s:\n{out}")
            armed = False
        elif quiet < 0.6:
            armed = True


def _settled(agent: _Child, since: int, cond: Any, timeout: float, stable: int = 4) -> float:
    """Seconds until ``stable`` consecutive samples after index ``since`` satisfy ``cond``."""
    t0 = time.monotonic()
    run = 0
    seen = since
    while time.monotonic() - t0 < timeout:
        for line in agent.lines[seen:]:
            run = run + 1 if cond(line) else 0
            if run >= stable:
                return time.monotonic() - t0
        seen = len(agent.lines)
        if agent.proc.poll() is not None:
            raise RuntimeError(f"agent exited rc={agent.proc.returncode}")
        time.sleep(0.2)
    raise TimeoutError(f"phase did not settle within {timeout:.0f}s")


def _window(lines: list[dict[str, Any]], a: int, b: int) -> dict[str, float]:
    part = lines[a:b] or lines[-1:]
    return {"worst_lag_s": max(x["lag"] for x in part),
            "worst_gc_pass_s": max(x.get("gc", 0.0) for x in part),
            "peak_rss_mb": max(x["rss_kb"] for x in part) / 1024,
            "end_rss_mb": part[-1]["rss_kb"] / 1024,
            "end_blocks": part[-1].get("blocks", 0)}


def _phase_cond(binary: str, n: int, relists: int, done: int) -> Any:
    if binary == "podcontroller":
        return lambda x: (x["synced"] and x["queue"] == 0 and x["relists"] >= relists
                          and x["pods"] == n and x["crs"] == n and x["done"] >= done)
    return lambda x: x["synced"] and x["relists"] >= relists and x["crs"] == n and x["done"] >= 1


def _proc_kb(pid: int, field: str) -> float:
    """``field`` (``VmHWM``, ``VmRSS``) of /proc/<pid>/status in KiB (0 where not Linux)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def _reset_peak(pid: int) -> None:
    """Reset the process's ``VmHWM`` to its current RSS (Linux ``clear_refs`` 5)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def run_once(binary: str, n: int, phases: list[str], spy: bool, timeout: float,
             watch_list: bool = False) -> dict[str, Any]:
    """One server + one agent through ``phases``; per-phase lag and RSS, steady RSS/object."""
    probe = [sys.executable, "-m", "scripts.bench._scale_probe"]
    out: dict[str, Any] = {"binary": binary, "pods": n, "watch_list": watch_list}
    with tempfile.TemporaryDirectory() as tmp:
        from bigfleet_trio.sim.apiserver import write_kubeconfig

        server = _Child([*probe, "server", "--pods", str(n), "--crs"], stdin=True)
        agent: _Child | None = None
        stop = threading.Event()
        dumps: list[str] = []
        try:
            first = server.wait_line(lambda x: "url" in x, 3600)
            out["server_fill_s"] = first["filled_s"]
            kc = os.path.join(tmp, "kubeconfig")
            write_kubeconfig(first["url"], kc)
            _reset_peak(server.proc.pid)
            out["server_base_rss_mb"] = _proc_kb(server.proc.pid, "VmRSS") / 1024
            agent = _Child([*probe, binary, "--kubeconfig", kc,
                            *(["--watch-list"] if watch_list else [])])
            if spy:
                threading.Thread(target=_spy, args=(agent, dumps, stop), daemon=True).start()
            per_inf = 2 if binary == "podcontroller" else 1
            relists = per_inf
            mark = 0
            for phase in phases:
                if phase == "relist":
                    relists += per_inf
                if phase != "startup":
                    server.send(phase)
                    server.wait_line(lambda x, p=phase: x.get("done") == p, timeout)
                # the churn reconciles every new Pod (its events may not have arrived yet)
                done = agent.lines[-1]["done"] + n if phase == "churn" and agent.lines else 0
                secs = _settled(agent, mark, _phase_cond(binary, n, relists, done), timeout)
                end = len(agent.lines)
                out[phase] = {"settled_s": round(secs, 1), **_window(agent.lines, mark, end)}
                if phase == "churn" and mark > 0:  # the agent's whole-process CPU for n Pods
                    used = agent.lines[end - 1]["cpu_s"] - agent.lines[mark - 1]["cpu_s"]
                    out[phase]["cpu_ms_per_pod"] = round(1000 * used / n, 3)
                if phase == "startup":
                    out["server_startup_peak_mb"] = _proc_kb(server.proc.pid, "VmHWM") / 1024
                    last = agent.lines[-1]
                    out["base_rss_mb"] = last["base_kb"] / 1024
                    out["steady_rss_mb"] = last["rss_kb"] / 1024
                    out["kb_per_object"] = (last["rss_kb"] - last["base_kb"]) / n
                mark = end
                print(f"phase {phase}: {out[phase]}", file=sys.stderr, flush=True)
        finally:
            stop.set()
            if agent is not None:
                agent.stop()
            server.stop()
    if "relist" in out and "steady_rss_mb" in out:
        out["relist_peak_over_steady"] = out["relist"]["peak_rss_mb"] / out["steady_rss_mb"]
    out["spy_dumps"] = dumps
    return out


def _watch_list_figures(binary: str, n: int, off: dict[str, Any], on: dict[str, Any]) -> list[Any]:
    """Streaming lists on / off, same size, back to back: client and server peak RSS."""
    figs = []
    for what, key in (("agent peak RSS, start-up", ("startup", "peak_rss_mb")),
                      ("agent peak RSS, relist", ("relist", "peak_rss_mb")),
                      ("sim apiserver peak RSS, start-up", ("server_startup_peak_mb",))):
        a, b = off, on
        for k in key:
            a, b = a.get(k, {}), b.get(k, {})
        if isinstance(a, float) and isinstance(b, float) and a > 0:
            figs.append(C.figure(f"{binary} {what}, watch-list on/off, {n:,}", "x", b / a,
                                 target="< 1", met=lambda m, _r: m < 1.0))
    return figs


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [2000] if args.quick else [int(s) for s in args.pods.split(",")]
    phases = args.phases.split(",")
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.watch_list]
    rows = [run_once(args.binary, n, phases, args.spy, args.timeout, wl)
            for n in sizes for wl in modes]
    figs = []
    unit = "Pod (Pod + its CR cached)" if args.binary == "podcontroller" else "CR"
    budget = 3.0 if args.binary == "podcontroller" else 1.0
    for r in rows:
        n = r["pods"]
        for phase in phases:
            if phase in r:
                figs.append(C.figure(f"{args.binary} worst loop lag, {phase}, {n:,}", "s",
                                     r[phase]["worst_lag_s"], target="<= 0.25 s",
                                     met=lambda m, _r: m <= 0.25))
        figs.append(C.figure(f"{args.binary} RSS per {unit} at {n:,}", "KiB",
                             r["kb_per_object"], target=f"<= {budget:g} KiB",
                             met=lambda m, _r, b=budget: m <= b))
        cpu = (r.get("churn") or {}).get("cpu_ms_per_pod")
        if cpu is not None and args.binary == "podcontroller":
            # every Pod replaced: a CR created and stamped per new Pod, one deleted per old one
            figs.append(C.figure(f"podcontroller CPU per replaced Pod, churn, {n:,}", "ms",
                                 cpu, target="<= 2 ms", met=lambda m, _r: m <= 2.0))
        if "relist_peak_over_steady" in r:
            figs.append(C.figure(f"{args.binary} peak RSS in relist / steady, {n:,}", "x",
                                 r["relist_peak_over_steady"], target="<= 1.25",
                                 met=lambda m, _r: m <= 1.25))
    if len(modes) == 2:
        for i in range(0, len(rows), 2):
            figs += _watch_list_figures(args.binary, rows[i]["pods"], rows[i], rows[i + 1])
    return C.result("scale", {"binary": args.binary, "pods": sizes, "phases": phases,
                              "watch_list": args.watch_list}, figs,
                    ["sim apiserver in its own process, filled in-process; agent in its own "
                     "process; lag sampled every 50 ms"], {"rounds": rows})


def register(sub: Any) -> None:
    p = sub.add_parser("scale", parents=[sub.common],
                       help="loop lag and RSS of a binary at N Pods: start-up, relist, churn")
    p.add_argument("--binary", choices=("podcontroller", "operator"), default="podcontroller")
    p.add_argument("--pods", default="10000", help="comma-separated sizes")
    p.add_argument("--phases", default="startup,relist,churn")
    p.add_argument("--spy", action="store_true", help="py-spy dump the agent during stalls")
    p.add_argument("--watch-list", choices=("on", "off", "both"), default="off",
                   help="agent caches from streaming lists; both: off then on, with ratios")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per phase")
    p.set_defaults(func=run)
