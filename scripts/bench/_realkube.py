"""The real control plane for benchmarks (``--kube real``): start it, give the agent identities.

Wraps :class:`scripts.realkube.ControlPlane` (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok as child processes; built by ``python -m scripts.realkube build``).
:func:`start` brings it up with the project's CRDs; :func:`agent_kubeconfigs` writes a
ServiceAccount-token kubeconfig per binary, so the binaries' requests go through API Priority
and Fairness as on a real cluster (the admin identity is in ``system:masters``, which APF
exempts). Private to the benches (the leading underscore keeps it out of scenario discovery).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

NAMESPACE = "bigfleet-system"
IDENTITIES = ("bigfleet-operator", "bigfleet-pod-controller")


def binaries() -> Any:
    """The built binaries, or raise SystemExit naming the build command."""
    try:
        from scripts.realkube import BUILD_HINT, find_binaries
    except ImportError as exc:
        raise SystemExit(f"--kube real needs scripts/realkube (the control-plane launcher): "
                         f"{exc}") from None

    found = find_binaries()
    if found is None:
        raise SystemExit(f"--kube real: control-plane binaries not built; run `{BUILD_HINT}`")
    return found


# The fleet soak's control-plane settings: what a scale test of a large cluster sets, so the
# figures are the agent's and the server's, not the defaults of clients the bench drives.
# - kube-controller-manager and kube-scheduler: client QPS 200 / burst 400 (defaults 20/30 and
#   50/100). At the defaults the ReplicaSet controller alone needs 2,500 s of its own limiter to
#   create 50,000 Pods, and at 400 machines it already waited up to 10.8 s per request
#   ("client-side throttling" in its log); kube-apiserver's API Priority and Fairness still
#   paces them.
# - kwok: 200 s node Leases, renewed every 50 s, with the node lifecycle controller's grace
#   period to match (240 s). A kubelet's 40 s Lease is renewed every 10 s: 500 writes/s for
#   5,000 simulated kubelets, on the same 2 cores as the server they write to. The agent
#   watches neither Leases nor heartbeats.
# - etcd: 8 GiB backend quota (default 2 GiB) for 50,000 Pods and 50,000 CapacityRequests
#   with their revisions between compactions.
# Written down in docs/benchmarks/fleet-real.md with the soak's figures.
SCALE_ARGS: dict[str, tuple[str, ...]] = {
    "kube-controller-manager": ("--kube-api-qps", "200", "--kube-api-burst", "400",
                                "--node-monitor-grace-period", "240s"),
    "kube-scheduler": ("--kube-api-qps", "200", "--kube-api-burst", "400"),
    "kwok": ("--node-lease-duration-seconds", "200"),
    "etcd": ("--quota-backend-bytes", str(8 << 30)),
}


def start(workdir: Path, *, without: tuple[str, ...] = (),
          extra_args: dict[str, tuple[str, ...]] | None = None, nice: int = 0) -> Any:
    """A started :class:`~scripts.realkube.ControlPlane` in ``workdir`` with the project's CRDs
    installed; the components named in ``without`` are stopped again (e.g. the scheduler and
    kwok for a bench that never runs a Pod); ``extra_args`` as the ControlPlane's (e.g.
    :data:`SCALE_ARGS`) and ``nice``. The caller stops it (``cp.stop()``)."""
    from scripts.realkube import ControlPlane

    cp = ControlPlane(binaries(), workdir, nodes=0, ready_timeout=300.0, extra_args=extra_args,
                      nice=nice)
    try:
        cp.start()
        cp.install_crds()
        for name in without:
            cp.stop_component(name)
    except BaseException:
        cp.stop()
        raise
    return cp


def agent_kubeconfigs(cp: Any, workdir: Path) -> dict[str, str]:
    """Per identity in :data:`IDENTITIES`: a kubeconfig with a TokenRequest token of that
    ServiceAccount (in :data:`NAMESPACE`), bound to ``cluster-admin`` (the bench measures
    speed, not RBAC; the shipped RBAC is exercised by the realkube test tier). Keys: the
    identity names."""
    def ok(r: Any, what: str) -> None:
        if r.status_code not in (200, 201, 409):
            raise RuntimeError(f"{what}: {r.status_code} {r.text}")

    ok(cp.request("POST", "/api/v1/namespaces", {
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}), NAMESPACE)
    out: dict[str, str] = {}
    for sa in IDENTITIES:
        ok(cp.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", {
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": sa, "namespace": NAMESPACE}}), sa)
        ok(cp.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": f"bench-{sa}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]}),
            f"binding {sa}")
        path = cp.write_kubeconfig(workdir / f"{sa}.kubeconfig",
                                   token=cp.token(NAMESPACE, sa), user=sa)
        out[sa] = str(path)
    return out


def pids(cp: Any) -> dict[str, int]:
    """The running components' pids by name."""
    return dict(cp.pids())
