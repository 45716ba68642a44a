"""Process orchestration of the ``fleet`` bench: the five CLI processes, their logs and samples.

:class:`Fleet` spawns the embedded apiserver, ``sim cluster``, ``sim shard``, ``pod-controller``
and ``operator`` on loopback ports, waits for readiness, samples RSS and CPU from ``/proc``
(:class:`Proc`) and stops them. Private to :mod:`scripts.bench.fleet` (the leading underscore
keeps it out of scenario discovery).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bigfleet_trio.kube import reqtrace
from scripts.bench import _common as C
from scripts.bench._fleet_workload import fleet_catalog
from scripts.realkube.controlplane import free_port

PROCS = ("apiserver", "cluster", "shard", "pod-controller", "operator")
"""The processes of ``--kube sim``; ``--kube real`` has the control plane's components (etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, kwok) instead of the first two."""
TRACED = ("pod-controller", "operator")
"""The processes whose apiserver requests are traced (:meth:`Fleet.trace_path`)."""


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    samples: list[tuple[float, float, float]] = field(default_factory=list)  # t, rss MB, cpu s

    def sample(self, t: float) -> None:
        try:
            with open(f"/proc/{self.popen.pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            with open(f"/proc/{self.popen.pid}/status") as fh:
                rss = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError):
            return
        self.samples.append((t, rss / 1024, cpu))


class Fleet:
    """The five processes (see the module docstring)."""

    def __init__(self, tmp: Path, machines: int, rollup_interval: str, job_run_seconds: float,
                 qps: float = 50.0, kube: str = "sim", client_args: tuple[str, ...] = (),
                 control_plane_nice: int = 0):
        self.tmp = tmp
        self.control_plane_nice = control_plane_nice
        self.kube = kube
        self.cp: Any = None  # the real control plane (--kube real)
        self.kubeconfig = str(tmp / "kubeconfig")
        self.api_port = free_port()
        self.shard_port = free_port()
        self.stats_port = free_port()
        self.metrics_port = free_port()
        self.pc_metrics_port = free_port()
        self.probe_ports = {"pod-controller": free_port(), "operator": free_port()}
        self.procs: dict[str, Proc] = {}
        self.machines = machines
        self.rollup_interval = rollup_interval
        self.job_run_seconds = job_run_seconds
        # qps 0: the binaries' own defaults (config/ and the flags), not the bench's
        self.qps = ["--qps", f"{qps:g}", "--burst", f"{2 * qps:g}"] if qps > 0 else []
        self.qps += list(client_args)

    def _spawn(self, name: str, *args: str) -> None:
        out = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - lives with the process
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if name in TRACED:
            # every apiserver request as the binary saw it: the agent-own latency split
            # (docs/kube-api.md#request-trace)
            env[reqtrace.ENV] = str(self.trace_path(name))
        if name == "operator":  # and the shard frames it read: the split at the operator
            env[reqtrace.FRAME_ENV] = str(self.frame_trace_path())
        self.procs[name] = Proc(name, subprocess.Popen([sys.executable, *args], stdout=out,
                                                       stderr=subprocess.STDOUT, env=env,
                                                       cwd=C.ROOT))

    def start(self) -> None:
        cat = self.tmp / "catalog.yaml"
        cat.write_text(yaml.safe_dump(fleet_catalog(self.machines)))
        quiet = ["--log-level", "warning"]
        op_kc = pc_kc = self.kubeconfig
        if self.kube == "real":
            from scripts.bench import _realkube

            self.cp = _realkube.start(self.tmp / "controlplane",
                                      extra_args=_realkube.SCALE_ARGS,
                                      nice=self.control_plane_nice)
            self.kubeconfig = str(self.cp.kubeconfig)
            kcs = _realkube.agent_kubeconfigs(self.cp, self.tmp)
            op_kc, pc_kc = kcs["bigfleet-operator"], kcs["bigfleet-pod-controller"]
            for name, popen in self.cp.procs.items():  # sampled here, stopped by the cp
                self.procs[name] = Proc(name, popen)
        else:
            self._spawn("apiserver", "-m", "bigfleet_trio.sim.apiserver", str(self.api_port),
                        self.kubeconfig, "fast")
            deadline = time.monotonic() + 60
            while not os.path.exists(self.kubeconfig):
                if (time.monotonic() > deadline
                        or self.procs["apiserver"].popen.poll() is not None):
                    raise RuntimeError(f"apiserver did not start:\n{self.log('apiserver')}")
                time.sleep(0.1)
            op_kc = pc_kc = self.kubeconfig
            self._spawn("cluster", "-m", "bigfleet_trio", "sim", "cluster", "--kubeconfig",
                        self.kubeconfig, "--job-run-seconds", str(self.job_run_seconds),
                        *quiet)
        # on the real control plane the shard's simulated kubelets beat as kwok's do at this
        # scale (SCALE_ARGS: 200 s Leases, a 240 s grace): renewing 5,000 Leases every 10 s
        # was 40 % of kube-apiserver's writes in the full-size soak
        lease = ("--node-lease-duration", "200") if self.kube == "real" else ()
        self._spawn("shard", "-m", "bigfleet_trio", "sim", "shard", "--port",
                    str(self.shard_port), "--kubeconfig", self.kubeconfig, "--catalog", str(cat),
                    "--stats-addr", f"127.0.0.1:{self.stats_port}", *lease, *quiet)
        self._spawn("pod-controller", "-m", "bigfleet_trio", "pod-controller", "--kubeconfig",
                    pc_kc, "--metrics-addr", f"127.0.0.1:{self.pc_metrics_port}",
                    "--health-probe-addr", f"127.0.0.1:{self.probe_ports['pod-controller']}",
                    *self.qps, *quiet)
        self._spawn("operator", "-m", "bigfleet_trio", "operator", "--kubeconfig",
                    op_kc, "--cluster-id", "fleet", "--shard-addr",
                    f"127.0.0.1:{self.shard_port}", "--metrics-addr",
                    f"127.0.0.1:{self.metrics_port}", "--health-probe-addr",
                    f"127.0.0.1:{self.probe_ports['operator']}", "--rollup-interval",
                    self.rollup_interval, *self.qps, *quiet)

    def wait_ready(self, limit: float = 120.0) -> None:
        """Until the pod controller and the operator answer /readyz with 200."""
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + limit
        for name, port in self.probe_ports.items():
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5):
                        break
                except (OSError, urllib.error.URLError):
                    pass
                if time.monotonic() > deadline or self.dead():
                    raise RuntimeError(f"{name} not ready:\n{self.log(name)}")
                time.sleep(0.2)

    def trace_path(self, name: str) -> Path:
        """Where process ``name`` (one of :data:`TRACED`) writes its request trace."""
        return self.tmp / f"{name}.requests.jsonl"

    def frame_trace_path(self) -> Path:
        """Where the operator writes its shard-frame trace (docs/kube-api.md#request-trace)."""
        return self.tmp / "operator.frames.jsonl"

    def log(self, name: str, tail: int = 3000) -> str:
        if self.cp is not None and name in self.cp.procs:
            return str(self.cp.log_tail(name))[-tail:]
        try:
            return (self.tmp / f"{name}.log").read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def dead(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.popen.poll() is not None]

    def sample(self) -> None:
        t = time.time()
        for p in self.procs.values():
            p.sample(t)

    def stop(self) -> None:
        own = [p for n, p in self.procs.items() if self.cp is None or n not in self.cp.procs]
        for p in own:
            if p.popen.poll() is None:
                p.popen.terminate()
        for p in own:
            try:
                p.popen.wait(15)
            except subprocess.TimeoutExpired:
                p.popen.kill()
        if self.cp is not None:
            self.cp.stop()
