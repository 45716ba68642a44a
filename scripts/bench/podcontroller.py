"""``bench podcontroller``: Pods -> CapacityRequests stamped Pending, our controller vs kopf.

Each contestant runs as a child process against a fresh embedded apiserver (a child process
too) that already holds ``--pods`` Pods; the bench watches CapacityRequests and stops the
contestant once every Pod's CR exists *and* is stamped ``status.phase: Pending`` (the full
job). Per round, alternating who goes first:

* ``ours``: the pod controller (``_podcontroller_probe ours``: :class:`PodController`,
  16 workers, no client-side rate limit);
* ``kopf``: a kopf operator (``_kopf_peer``: ``on.event`` on Pods calling our translation,
  kubernetes_asyncio writes) - the baseline;
* ``go``: the Go peer (``interop/gopodcontroller``: client-go informers, protobuf for Pods,
  16 workers, a crude translation), built by ``scripts/build-gopodcontroller`` - the anchor:
  what the Go stack spends on the same I/O (skipped, in one line, without a Go toolchain);
* ``raw``: the same CR bodies POSTed and stamped by 16 tasks with no controller
  (``_podcontroller_probe raw``): client CPU per write, the apiserver's own limit.

Figures: time to all CRs Pending (from process start), CPU per Pod and peak RSS of each
contestant (ours against kopf and against Go), client CPU per write. ``--cache-only``
measures the Pod cache's RSS per Pod instead (the controller's projection vs full
objects), e.g. with ``--pods 100000``.
Needs the ``bench`` extra (kopf, kubernetes_asyncio).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from scripts.bench import _apiserver_metrics, _profile_stages
from scripts.bench import _common as C
from scripts.bench import _podcontroller_probe as probe

log = logging.getLogger(__name__)


def _apiserver(tmp: str, engine: str) -> tuple[C.ApiServerProcess, str]:
    """A fresh embedded apiserver child process and a kubeconfig for it."""
    from bigfleet_trio.sim.apiserver import write_kubeconfig

    srv = C.ApiServerProcess(engine=engine).__enter__()
    kc = os.path.join(tmp, "kubeconfig")
    write_kubeconfig(srv.url, kc)
    return srv, kc


def _stop(proc: subprocess.Popen[Any]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def go_peer() -> tuple[str | None, str]:
    """The Go peer's binary (built or reused by ``scripts/build-gopodcontroller``) and ``""``,
    or None and the one-line reason it is skipped (no ``go`` on PATH, or the build failed)."""
    import shutil
    from pathlib import Path

    if shutil.which("go") is None:
        return None, "Go peer skipped: no Go toolchain (`go` not on PATH)"
    script = Path(__file__).resolve().parents[1] / "build-gopodcontroller"
    print(f"bench podcontroller: building the Go peer ({script.name}; minutes the first "
          "time)", file=sys.stderr, flush=True)
    out = subprocess.run([str(script)], capture_output=True, text=True)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"Go peer skipped: {script.name} failed: {last}"
    return out.stdout.strip(), ""


def rotate(contestants: list[str], r: int) -> list[str]:
    """Round ``r``'s order: ``contestants`` rotated by ``r`` (each goes first in turn, so no one
    always meets the machine's load of the previous contestant's clean-up)."""
    k = r % len(contestants) if contestants else 0
    return contestants[k:] + contestants[:k]


def _contestant(who: str, kc: str, workers: int, profile: str | None = None,
                go_bin: str | None = None, counts: str | None = None) -> list[str]:
    if who == "go":
        assert go_bin is not None
        return [go_bin, "-kubeconfig", kc, "-workers", str(workers)]
    if who == "kopf":
        return [sys.executable, "-m", "scripts.bench._kopf_peer", "--kubeconfig", kc]
    # ours-json: ours with Pods in JSON (--wire both), the protobuf lever's baseline
    mode = ["ours", "--json"] if who == "ours-json" else [who]
    return [sys.executable, "-m", "scripts.bench._podcontroller_probe", *mode, "--kubeconfig", kc,
            "--workers", str(workers)] + (["--profile", profile] if profile else []) + (
            ["--counts", counts] if counts and who in ("ours", "ours-json") else [])


async def _watch_until_pending(kc: str, n: int, child: subprocess.Popen[Any],
                               limit_s: float) -> dict[str, float]:
    """Seconds from now until the first CR, all CRs, all Pending; the child's CPU seconds and
    peak RSS at that moment."""
    import trio

    from bigfleet_trio.kube.client import KubeClient
    from bigfleet_trio.kube.config import load_kubeconfig
    from bigfleet_trio.kube.informer import Informer
    from bigfleet_trio.kube.resources import CAPACITY_REQUESTS

    t0 = time.perf_counter()
    out: dict[str, float] = {}
    done = trio.Event()
    counts = {"crs": 0, "pending": 0}

    def phase(obj: dict[str, Any]) -> bool:  # the cache keeps one bool per CR
        return (obj.get("status") or {}).get("phase") == "Pending"

    def check() -> None:
        now = time.perf_counter() - t0
        out.setdefault("first_cr_s", now)
        if counts["crs"] >= n:
            out.setdefault("all_created_s", now)
        if counts["pending"] >= n and not done.is_set():
            out["all_pending_s"] = now
            out["cpu_s"] = probe.cpu_seconds(child.pid)
            out["peak_rss_kb"] = probe.rss_kb(child.pid, "VmHWM")
            done.set()

    def on_add(pending: bool) -> None:
        counts["crs"] += 1
        counts["pending"] += pending
        check()

    def on_update(old: bool, new: bool) -> None:
        counts["pending"] += new - old
        check()

    def on_delete(old: bool) -> None:
        counts["crs"] -= 1
        counts["pending"] -= old

    async with KubeClient(load_kubeconfig(kc, env={}), **probe.UNLIMITED) as client:
        inf = Informer(client, CAPACITY_REQUESTS, transform=phase)
        inf.add_handler(on_add, on_update, on_delete)
        async with trio.open_nursery() as nursery:
            await nursery.start(inf.run)
            with trio.move_on_after(limit_s):
                await done.wait()
            nursery.cancel_scope.cancel()
    return out


class _RealServer:
    """``--kube real``: one control plane for the whole run (no scheduler or kwok: no Pod
    runs), emptied between rounds; the contestants use the pod controller's ServiceAccount
    token (so API Priority and Fairness applies to them as in a cluster), the bench the admin.
    ``cpu()``: kube-apiserver + etcd CPU seconds."""

    def __init__(self, tmp: str) -> None:
        from pathlib import Path

        from scripts.bench import _realkube

        self.cp = _realkube.start(Path(tmp) / "controlplane",
                                  without=("kube-scheduler", "kwok"))
        self.admin_kc = str(self.cp.kubeconfig)
        self.contestant_kc = _realkube.agent_kubeconfigs(self.cp, Path(tmp))[
            "bigfleet-pod-controller"]

    def scrape(self) -> dict[tuple[str, str], float]:
        """kube-apiserver's request and watch counters now (:func:`_apiserver_metrics.parse`)."""
        from scripts.bench import _apiserver_metrics

        return _apiserver_metrics.parse(self.cp.request("GET", "/metrics").text)

    def cpu(self) -> float:
        pids = self.cp.pids()
        return sum(probe.cpu_seconds(pids[n]) for n in ("kube-apiserver", "etcd"))

    def reset(self) -> None:
        """Delete every Pod and CapacityRequest in ``default`` and wait until they are gone."""
        crs = "/apis/bigfleet.lucy.sh/v1alpha1/namespaces/default/capacityrequests"
        pods = "/api/v1/namespaces/default/pods"
        import httpx

        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            try:
                left = sum(len(self.cp.request("GET", f"{path}?limit=1").json().get("items")
                               or []) for path in (crs, pods))
            except httpx.TimeoutException:
                left = 1
            if not left:
                return
            # a deletecollection cut short by the request timeout stops where it was: again
            for path in (crs, f"{pods}?gracePeriodSeconds=0"):
                try:
                    self.cp.request("DELETE", path)
                except httpx.TimeoutException:
                    pass
        raise RuntimeError("the previous round's Pods/CRs were not deleted within 900 s")

    def stop(self) -> None:
        self.cp.stop()


def _round_one(who: str, n: int, workers: int, engine: str, timeout: float,
               real: _RealServer | None = None, profile: str | None = None,
               go_bin: str | None = None) -> dict[str, Any]:
    import trio

    with tempfile.TemporaryDirectory() as tmp:
        server: Any
        if real is not None:
            real.reset()
            server, kc, contestant_kc = real, real.admin_kc, real.contestant_kc
        else:
            server, kc = _apiserver(tmp, engine)
            contestant_kc = kc
        try:
            trio.run(probe.create_pods, kc, n, 32, real is not None)
            m0 = real.scrape() if real is not None else None
            s0 = server.cpu()
            t0 = time.perf_counter()
            counts = os.path.join(tmp, "counts.json")
            child = subprocess.Popen(_contestant(who, contestant_kc, workers, profile, go_bin,
                                                 counts),
                                     stdout=subprocess.PIPE, text=True)
            try:
                if who == "raw":
                    assert child.stdout is not None
                    line = child.stdout.readline()
                    res = dict(json.loads(line)) if line else {}
                    res.pop("event", None)
                    res["wall_s"] = time.perf_counter() - t0
                else:
                    res = trio.run(_watch_until_pending, kc, n, child, timeout)
                    if who in ("ours", "ours-json"):
                        time.sleep(0.3)  # its event counts file is rewritten every 0.25 s
            finally:
                _stop(child)
            res["server_cpu_ms_per_pod"] = (server.cpu() - s0) / n * 1000
            if os.path.exists(counts):
                with open(counts) as fh:
                    res["events_per_pod"] = {k: v / n for k, v in json.load(fh).items()}
            if real is not None and m0 is not None:
                # the contestant's watches end with it: counted once the apiserver saw it go
                time.sleep(1.0)
                res["apiserver_per_pod"] = _apiserver_metrics.per_pod(m0, real.scrape(), n)
        finally:
            if real is None:
                server.__exit__()
    if "cpu_s" in res:
        res["cpu_ms_per_pod"] = res["cpu_s"] / n * 1000
        res["peak_rss_mb"] = res["peak_rss_kb"] / 1024
    if profile and os.path.exists(profile):
        with open(profile) as fh:
            res["stage_shares"] = _profile_stages.stage_shares(_profile_stages.read(fh))
    log.info("podcontroller round who=%s %s", who, {k: v for k, v in res.items()
                                                     if k != "apiserver_per_pod"})
    return res


def _cache_round(n: int, engine: str, full: bool) -> dict[str, float]:
    import trio

    with tempfile.TemporaryDirectory() as tmp:
        server, kc = _apiserver(tmp, engine)
        try:
            trio.run(probe.create_pods, kc, n)
            cmd = [sys.executable, "-m", "scripts.bench._podcontroller_probe", "cache",
                   "--kubeconfig", kc] + (["--full-objects"] if full else [])
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        finally:
            server.__exit__()
    res = json.loads(out.strip().splitlines()[-1])
    return {"kb_per_pod": (res["rss_after_kb"] - res["rss_before_kb"]) / n,
            "rss_after_mb": res["rss_after_kb"] / 1024}


def run(args: argparse.Namespace) -> dict[str, Any]:
    logging.basicConfig(level=logging.WARNING)
    n = 500 if args.quick else args.pods
    rounds = 1 if args.quick else args.rounds
    params = {"pods": n, "rounds": rounds, "workers": args.workers, "engine": args.engine,
              "wire": args.wire,
              "kube": args.kube}
    if args.cache_only:
        rows = [{"slim": _cache_round(n, args.engine, False),
                 "full": _cache_round(n, args.engine, True)} for _ in range(rounds)]
        figs = [C.figure(f"RSS per cached Pod at {n:,} Pods (controller's projection)", "KiB",
                         [r["slim"]["kb_per_pod"] for r in rows],
                         baseline=[r["full"]["kb_per_pod"] for r in rows],
                         baseline_label="the same informer keeping full Pod objects",
                         target="<= 2 KiB", met=lambda m, _r: m <= 2.0)]
        return C.result("podcontroller", {**params, "mode": "cache-only"}, figs, [],
                        {"rounds": rows})
    per: dict[str, list[dict[str, Any]]] = {"ours": [], "go": [], "kopf": [], "raw": []}
    if args.wire == "both":
        per["ours-json"] = []
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    notes: list[str] = []
    import importlib.util

    have_kopf = all(importlib.util.find_spec(m) for m in ("kopf", "kubernetes_asyncio"))
    if not have_kopf:
        notes.append("kopf peer skipped: install the bench extra (pip install -e '.[bench]')")
    # auto: only on kube-apiserver, where the Go stack's figures are the anchor; the sim run is
    # CI's smoke run (bench all --quick), and client-go's first build costs minutes there
    use_go = args.go_peer == "on" or (args.go_peer == "auto" and args.kube == "real")
    go_bin, go_skip = go_peer() if use_go else (None, "")
    if go_skip:
        print(f"bench podcontroller: {go_skip}", file=sys.stderr, flush=True)
        notes.append(go_skip)
    contestants = ["ours"] + (["go"] if go_bin else []) + (["kopf"] if have_kopf else [])
    real: _RealServer | None = None
    if args.kube == "real":
        import signal

        def _term(_sig: int, _frame: Any) -> None:
            raise KeyboardInterrupt  # stop the control plane on the way out

        signal.signal(signal.SIGTERM, _term)
    with tempfile.TemporaryDirectory(prefix="bench-podcontroller-") as tmp:
        if args.kube == "real":
            real = _RealServer(tmp)
        try:
            for r in range(rounds):
                order = rotate(contestants, r)
                if args.wire == "both":  # JSON next to protobuf, alternating which goes first
                    order.insert(order.index("ours") + r % 2, "ours-json")
                for who in [*order, "raw"]:
                    prof = (os.path.join(args.profile, f"{who}-round{r + 1}.txt")
                            if args.profile and who in ("ours", "ours-json", "raw") else None)
                    run_as = "ours-json" if who == "ours" and args.wire == "json" else who
                    per[who].append(_round_one(run_as, n, args.workers, args.engine,
                                               args.timeout, real, prof, go_bin))
        finally:
            if real is not None:
                real.stop()

    def col(who: str, key: str) -> list[float]:
        return [row[key] for row in per[who] if key in row]

    kopf_label = "kopf peer (on.event on Pods, our translation, kubernetes_asyncio), same run"
    go_label = "Go peer (client-go informers, protobuf Pods, 16 workers), same run"
    kopf_write = [c / 2 for c in col("kopf", "cpu_ms_per_pod")]
    is_real = args.kube == "real"
    time_target, rss_target = (0.35, 0.4) if is_real else (0.5, 0.5)
    cpu_target = 0.6 if is_real else 1.2
    ours_rate = [n / (row["all_created_s"] - row["first_cr_s"]) for row in per["ours"]
                 if row.get("all_created_s", 0) > row.get("first_cr_s", 0)]
    raw_rate = [n / row["create_seconds"] for row in per["raw"] if row.get("create_seconds")]
    figs = [
        C.figure(f"time to all {n:,} CRs Pending (process start -> last stamp)", "s",
                 col("ours", "all_pending_s"), baseline=col("kopf", "all_pending_s"),
                 baseline_label=kopf_label, target=f"<= {time_target}x kopf",
                 met=lambda _m, r: r is not None and r <= time_target),
        C.figure("CR create rate (first CR -> all created)", "CRs/s", ours_rate,
                 baseline=raw_rate, baseline_label="raw create loop, same client (16 tasks)",
                 target=">= 0.9x raw", met=lambda _m, r: r is not None and r >= 0.9),
        C.figure("time to all CRs created", "s", col("ours", "all_created_s"),
                 baseline=col("kopf", "all_created_s")),
        C.figure("controller CPU per Pod (create + stamp, incl. start-up and caches)", "ms",
                 col("ours", "cpu_ms_per_pod"), baseline=col("kopf", "cpu_ms_per_pod"),
                 target=f"<= {cpu_target} ms", met=lambda m, _r: m <= cpu_target),
        C.figure("peak RSS", "MiB", col("ours", "peak_rss_mb"),
                 baseline=col("kopf", "peak_rss_mb"), target=f"<= {rss_target}x kopf",
                 met=lambda _m, r: r is not None and r <= rss_target),
        C.figure("client CPU per write (raw: prebuilt bodies, POST + status PATCH)", "ms",
                 col("raw", "cpu_ms_per_write"), baseline=kopf_write,
                 baseline_label="kopf peer's CPU per Pod / 2 (two writes per Pod)",
                 target="<= 0.5 ms", met=lambda m, _r: m <= 0.5),
        C.figure("controller CPU per Pod, ours vs the Go peer", "ms",
                 col("ours", "cpu_ms_per_pod"), baseline=col("go", "cpu_ms_per_pod"),
                 baseline_label=go_label, target="<= 3x Go",
                 met=lambda _m, r: r is not None and r <= 3.0),
        C.figure("time to all CRs Pending, ours vs the Go peer", "s",
                 col("ours", "all_pending_s"), baseline=col("go", "all_pending_s"),
                 baseline_label=go_label),
        C.figure("peak RSS, ours vs the Go peer", "MiB", col("ours", "peak_rss_mb"),
                 baseline=col("go", "peak_rss_mb"), baseline_label=go_label),
        C.figure("apiserver CPU per Pod, ours" + (" (kube-apiserver + etcd)" if is_real else ""),
                 "ms", col("ours", "server_cpu_ms_per_pod"),
                 baseline=col("kopf", "server_cpu_ms_per_pod")),
        *([C.figure("controller CPU per Pod, Pods in protobuf (default)", "ms",
                    col("ours", "cpu_ms_per_pod"), baseline=col("ours-json", "cpu_ms_per_pod"),
                    baseline_label="ours with Pods in JSON, same run"),
           C.figure("peak RSS, Pods in protobuf", "MiB", col("ours", "peak_rss_mb"),
                    baseline=col("ours-json", "peak_rss_mb"),
                    baseline_label="ours with Pods in JSON, same run")]
          if args.wire == "both" else []),
        C.figure("raw writes: time for all creates + stamps", "s", col("raw", "seconds"),
                 baseline=col("ours", "all_pending_s"),
                 baseline_label="ours: time to all Pending (incl. start-up, LIST, watches)"),
    ]
    notes += [
        "every contestant: own child process; " + (
            "one real control plane (etcd, kube-apiserver, kube-controller-manager), emptied "
            "and refilled with the Pods before each contestant; contestants use a "
            "ServiceAccount token (APF applies)" if is_real else
            "fresh apiserver child process holding the Pods"),
        "time and CPU from the contestant's process start (imports, LIST, watches included)",
        "no client-side rate limit for ours (kopf has none)",
    ]
    tables: dict[str, list[str]] = {}
    events = {who: mean_rows([row["events_per_pod"] for row in rows if "events_per_pod" in row])
              for who, rows in per.items() if any("events_per_pod" in row for row in rows)}
    if events:
        tables["informer events per Pod (ours; handed to the handlers, a LIST's objects as "
               "ADDED; skipped: unchanged, docs/kube-api.md#unchanged-pod-events)"] = (
            _apiserver_metrics.table(events, digits=3))
    stages = {who: stage_ms(rows) for who, rows in per.items()
              if any("stage_shares" in row for row in rows)}
    if stages:
        tables["CPU per Pod by stage, ms (py-spy samples' shares x the process's CPU per Pod; "
               "--profile slows the process)"] = _apiserver_metrics.table(stages, digits=3)
    if is_real:
        server = {who: mean_per_pod([row["apiserver_per_pod"] for row in rows
                                     if "apiserver_per_pod" in row])
                  for who, rows in per.items() if rows}
        for section, title in (("requests", "kube-apiserver requests per Pod "
                                "(verb resource code; apiserver_request_total)"),
                               ("watch_events", "watch events sent per Pod (by resource)"),
                               ("watch_event_bytes", "watch event bytes sent per Pod"),
                               ("response_bytes", "response bytes per Pod (verb resource)")):
            # rows under 0.01 per Pod (or 10 bytes) everywhere: background, not the contestant
            tables[title] = _apiserver_metrics.table(
                {who: s.get(section, {}) for who, s in server.items()},
                digits=0 if "bytes" in section else 3,
                min_value=10.0 if "bytes" in section else 0.01)
        notes.append("apiserver counters: /metrics scraped before the contestant started and "
                     "1 s after it stopped; they include the bench's own CR watch (ours, kopf), "
                     "kube-controller-manager's CR watch (garbage collector: 2 events per Pod "
                     "for every contestant) and its background requests; a WATCH's response "
                     "bytes are counted when it ends (a long kube-controller-manager watch "
                     "ending in a window shows there); rows under 0.01 per Pod left out")
        per_extra: dict[str, Any] = {**per, "apiserver_per_pod": server}
    else:
        per_extra = dict(per)
    return C.result("podcontroller", params, figs, notes, per_extra, tables)


def mean_rows(rounds: list[dict[str, float]]) -> dict[str, float]:
    """The mean over rounds of flat ``{key: value}`` rows (a key missing in a round counts as
    0 there)."""
    out: dict[str, float] = {}
    for r in rounds:
        for k, v in r.items():
            out[k] = out.get(k, 0.0) + v / len(rounds)
    return out


def stage_ms(rows: list[dict[str, Any]]) -> dict[str, float]:
    """CPU ms per Pod by stage: each profiled round's stage shares times its CPU per Pod,
    averaged over those rounds; ``total`` is the mean CPU per Pod itself."""
    done = [r for r in rows if "stage_shares" in r and "cpu_ms_per_pod" in r]
    out = mean_rows([{k: share * r["cpu_ms_per_pod"] for k, share in r["stage_shares"].items()}
                     for r in done])
    if done:
        out["total"] = sum(r["cpu_ms_per_pod"] for r in done) / len(done)
    return out


def mean_per_pod(rounds: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """The mean over rounds of :func:`_apiserver_metrics.per_pod` results (a key missing in a
    round counts as 0 there)."""
    out: dict[str, dict[str, float]] = {}
    for r in rounds:
        for section, values in r.items():
            dst = out.setdefault(section, {})
            for k, v in values.items():
                dst[k] = dst.get(k, 0.0) + v / len(rounds)
    return out


def register(sub: Any) -> None:
    p = sub.add_parser("podcontroller", parents=[sub.common],
                       help="Pods -> CRs Pending: our pod controller vs kopf and Go peers")
    p.add_argument("--pods", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--engine", default="hypercorn", help="embedded apiserver engine")
    p.add_argument("--kube", choices=("sim", "real"), default="sim",
                   help="sim: a fresh embedded apiserver per contestant; real: one real control "
                   "plane (python -m scripts.realkube build), emptied between contestants")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per contestant")
    p.add_argument("--wire", choices=("protobuf", "json", "both"), default="protobuf",
                   help="how ours reads Pods: protobuf where offered (the default), JSON, or "
                   "both in one run (an ours-json contestant beside ours)")
    p.add_argument("--profile", metavar="DIR",
                   help="profile ours and raw with py-spy (pip install py-spy; slows them: not "
                   "for figures); collapsed on-CPU stacks in DIR/<who>-round<N>.txt")
    p.add_argument("--go-peer", choices=("auto", "on", "off"), default="auto",
                   help="the Go peer (interop/gopodcontroller, built by "
                   "scripts/build-gopodcontroller): auto runs it with --kube real when `go` is "
                   "on PATH")
    p.add_argument("--cache-only", action="store_true",
                   help="only the Pod cache's RSS per Pod (projection vs full objects)")
    p.set_defaults(func=run)
