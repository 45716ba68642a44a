"""The shipped diagnostics access on the real control plane (docs/crds.md#diagnostics-access,
docs/crds.md#diagnostics-tls): the pod controller as a process with its ServiceAccount token under
the shipped RBAC, ``--metrics-auth`` over HTTPS with a certificate directory; the real
kube-apiserver answers the TokenReview and the SubjectAccessReview."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio
import trustme

from bigfleet_trio.observability.tls import client_context
from tests.realkube.agent import Agent
from tests.support.ports import free_port
from tests.support.realkube import RealKube, until


async def test_metrics_over_https_only_for_a_bound_caller(
    realkube: RealKube, tmp_path: Path
) -> None:
    cp = realkube.cp
    ns = realkube.namespace("metrics")
    for sa in ("scraper", "stranger"):
        r = cp.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts",
                       {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}})
        assert r.status_code == 201, r.text
    binding = f"{ns}-scraper-metrics"
    r = cp.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": binding},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "bigfleet-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": ns}]})
    assert r.status_code == 201, r.text

    # The apiserver's RBAC authorizer learns of a new binding from its own informer: wait
    # until it grants the scraper, so the 200 below is the pod controller's answer, not a race.
    async def granted() -> bool:
        r = cp.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": f"system:serviceaccount:{ns}:scraper",
                     "groups": ["system:serviceaccounts", f"system:serviceaccounts:{ns}"],
                     "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}})
        return r.status_code == 201 and bool(r.json()["status"].get("allowed"))

    await until("the apiserver's RBAC to grant the scraper /metrics", granted, 60)
    ca = trustme.CA()
    certs = tmp_path / "metrics-tls"
    certs.mkdir()
    leaf = ca.issue_cert("127.0.0.1")
    (certs / "tls.crt").write_bytes(leaf.cert_chain_pems[0].bytes())
    (certs / "tls.key").write_bytes(leaf.private_key_pem.bytes())
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    scraper = {"Authorization": f"Bearer {cp.token(ns, 'scraper')}"}
    stranger = {"Authorization": f"Bearer {cp.token(ns, 'stranger')}"}
    try:
        async with realkube.client() as admin, trio.open_nursery() as nursery:
            a = Agent(realkube, tmp_path, nursery, admin)
            metrics = f"127.0.0.1:{free_port()}"
            a.probes["pod-controller"] = f"127.0.0.1:{free_port()}"
            try:
                await a.start("pod-controller", "pod-controller",
                              "--kubeconfig", str(realkube.pod_controller_kubeconfig),
                              "--metrics-addr", metrics, "--metrics-auth",
                              "--metrics-cert-path", str(certs),
                              "--health-probe-addr", a.probes["pod-controller"])
                await a.ready("pod-controller")  # probes: plain HTTP, no token
                async with httpx.AsyncClient(
                        verify=client_context(str(tmp_path / "ca.pem")), timeout=10) as https:
                    url = f"https://{metrics}/metrics"
                    assert (await https.get(url)).status_code == 401
                    r = await https.get(url, headers=stranger)
                    assert r.status_code == 403, r.text
                    assert f"system:serviceaccount:{ns}:stranger" in r.text
                    r = await https.get(url, headers=scraper)
                    assert r.status_code == 200, a.logs()
                    assert "bigfleet_unschedulable_pod_controller" in r.text
                async with httpx.AsyncClient(timeout=10) as plain:
                    with pytest.raises(httpx.TransportError):
                        await plain.get(f"http://{metrics}/metrics", headers=scraper)
            finally:
                await a.stop()
                nursery.cancel_scope.cancel()
    finally:
        cp.request("DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}")
