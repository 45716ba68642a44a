"""The control plane itself (scripts/realkube): kwok runs bound Pods and finishes deletions, the
real scheduler binds, TokenRequest issues tokens the shipped RBAC governs, and ``up`` works as
a command (ready line, admin kubeconfig, every process stopped by pid on SIGTERM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bigfleet_trio.kube.errors import Forbidden, NotFound
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, NODES, PODS
from bigfleet_trio.sim.apiserver.testing import find_kubectl
from tests.realkube.agent import phase
from tests.support.realkube import RealKube, require_binaries, until

REPO = Path(__file__).resolve().parents[2]


def pod(name: str, **spec: object) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"t": name}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec}}


async def test_kwok_runs_bound_pods_and_finishes_deletions(realkube: RealKube) -> None:
    realkube.reset()
    ns = realkube.namespace("kwok")
    node = realkube.cp.create_nodes(1, prefix=f"{ns}-node-")[0]
    try:
        async with realkube.client() as kube:
            # the real scheduler binds it (no nodeName given), kwok reports it Running
            await kube.create(PODS, pod("scheduled"), ns)

            async def running() -> bool:
                return phase(await kube.get(PODS, "scheduled", ns)) == "Running"

            await until("the Pod Running", running, 60)
            assert (await kube.get(PODS, "scheduled", ns))["spec"]["nodeName"] == node
            await kube.delete(PODS, "scheduled", ns)

            async def gone() -> bool:
                try:
                    await kube.get(PODS, "scheduled", ns)
                except NotFound:
                    return True
                return False

            # a kubelet confirms the deletion (grace period) and the Pod is then gone
            await until("the Pod gone", gone, 60)
    finally:
        realkube.cp.request("DELETE", f"/api/v1/nodes/{node}")


async def test_a_pod_requesting_a_gpu_gets_the_extended_resource_toleration(
        realkube: RealKube) -> None:
    # kube-apiserver runs the admission plugins a managed cluster adds to the defaults
    # (docs/deviations.md#realkube-admission): ExtendedResourceToleration lets a GPU Pod onto
    # the shard's GPU machines, tainted nvidia.com/gpu:NoSchedule as on GKE
    realkube.reset()
    ns = realkube.namespace("gpu")
    gpu = {"limits": {"nvidia.com/gpu": "1"}}
    async with realkube.client() as kube:
        await kube.create(PODS, pod("gpu", containers=[
            {"name": "c", "image": "busybox", "resources": gpu}]), ns)
        await kube.create(PODS, pod("cpu"), ns)
        tolerations = (await kube.get(PODS, "gpu", ns))["spec"].get("tolerations") or []
        assert {"key": "nvidia.com/gpu", "operator": "Exists",
                "effect": "NoSchedule"} in tolerations
        cpu_tolerations = (await kube.get(PODS, "cpu", ns))["spec"].get("tolerations") or []
        assert all(t.get("key") != "nvidia.com/gpu" for t in cpu_tolerations)
    argv = realkube.cp.argv("kube-apiserver")
    plugins = argv[argv.index("--enable-admission-plugins") + 1].split(",")
    assert plugins == ["ExtendedResourceToleration", "NodeRestriction"]


async def test_service_account_tokens_are_bound_by_the_shipped_rbac(realkube: RealKube) -> None:
    async with realkube.client(realkube.pod_controller_kubeconfig) as pc, \
            realkube.client(realkube.operator_kubeconfig) as op:
        await pc.list(CAPACITY_REQUESTS)           # granted
        await op.list(NODES)                       # granted
        with pytest.raises(Forbidden):
            await op.create(PODS, pod("nope"), "default")
        with pytest.raises(Forbidden):
            await pc.delete(NODES, "anything")


def test_up_prints_ready_writes_a_kubeconfig_and_stops_every_process(tmp_path: Path) -> None:
    require_binaries()
    kubeconfig = tmp_path / "kc.yaml"
    agents = tmp_path / "agents"
    proc = subprocess.Popen(
        [sys.executable, "-m", "scripts.realkube", "up", "--kubeconfig-out", str(kubeconfig),
         "--nodes", "1", "--agent-kubeconfigs", str(agents)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ready "), (line, proc.stderr.read() if proc.poll() else "")
        fields = dict(w.split("=", 1) for w in line.split()[1:])
        assert fields["kubeconfig"] == str(kubeconfig) and kubeconfig.exists()
        pids = [int(fields[c]) for c in ("etcd", "kube-apiserver", "kube-controller-manager",
                                         "kube-scheduler", "kwok")]
        kubectl = find_kubectl()
        assert kubectl is not None
        nodes = subprocess.run([kubectl, "--kubeconfig", str(kubeconfig), "get", "nodes",
                                "-o", "name"], capture_output=True, text=True, check=True)
        assert nodes.stdout.split() == ["node/kwok-node-0"]
        # the binaries' own identities, under the shipped RBAC (docs: CONTRIBUTING.md)
        for name, allowed, refused in (("operator", "nodes", "pods"),
                                       ("pod-controller", "capacityrequests", "nodes")):
            kc = agents / f"{name}.kubeconfig"
            assert subprocess.run([kubectl, "--kubeconfig", str(kc), "get", allowed, "-A"],
                                  capture_output=True, check=False).returncode == 0, name
            can = subprocess.run([kubectl, "--kubeconfig", str(kc), "auth", "can-i", "delete",
                                  refused], capture_output=True, text=True, check=False)
            assert can.stdout.strip() == "no", (name, can.stdout, can.stderr)
        # the CRDs carry kubectl's last-applied annotation: a later apply -k does not warn
        applied = subprocess.run([kubectl, "--kubeconfig", str(kubeconfig), "apply", "-k",
                                  str(REPO / "config" / "crd")], capture_output=True,
                                 text=True, check=False)
        assert applied.returncode == 0 and "last-applied" not in applied.stderr, applied.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        for pid in pids:  # every component stopped (reaped by `up`)
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        assert not Path(fields["workdir"]).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_build_again_is_a_no_op_that_prints_each_version() -> None:
    require_binaries()
    out = subprocess.run([sys.executable, "-m", "scripts.realkube", "build"], cwd=REPO,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    assert "built " not in out.stderr  # nothing rebuilt
    lines = {line.split()[0]: line for line in out.stdout.splitlines()}
    assert set(lines) == {"kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd",
                          "kwok"}
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        assert "Kubernetes v1.37.2" in lines[name], lines[name]
    assert "3.6.16" in lines["etcd"]
    assert all(" built in " in line for line in lines.values()), lines
