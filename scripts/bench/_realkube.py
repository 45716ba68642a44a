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


def start(workdir: Path, *, without: tuple[str, ...] = ()) -> Any:
    """A started :class:`~scripts.realkube.ControlPlane` in ``workdir`` with the project's CRDs
    installed; the components named in ``without`` are stopped again (e.g. the scheduler and
    kwok for a bench that never runs a Pod). The caller stops it (``cp.stop()``)."""
    from scripts.realkube import ControlPlane

    cp = ControlPlane(binaries(), workdir, nodes=0, ready_timeout=300.0)
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
