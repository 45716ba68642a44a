"""``--metrics-auth``: /metrics and /events answer only a caller whose bearer token passes
TokenReview and a SubjectAccessReview for the path, checked by the RBAC-enforcing simulated
apiserver with the shipped ClusterRoles (config/rbac/metrics.yaml); probes stay open
(docs/crds.md#diagnostics-access). Real sockets: the apiserver over HTTPS, the listener over
HTTPS as the binaries serve it with --metrics-auth (a trustme certificate in a cert directory,
docs/crds.md#diagnostics-tls), ``bigfleet-trio events`` over WSS with a kubeconfig."""

from __future__ import annotations

import copy
import io
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trustme
import yaml

from bigfleet_trio import cli
from bigfleet_trio.kube.authz import KubeAuthorizer
from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import load_kubeconfig
from bigfleet_trio.observability.events import EventFeed, follow_events
from bigfleet_trio.observability.http import serve_observability
from bigfleet_trio.observability.tls import ServingCertificate, client_context, plan_tls
from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig

REPO = Path(__file__).resolve().parents[2]
NS = "bigfleet-system"


def _install(server: ApiServer, docs: list[dict[str, Any]]) -> None:
    for d in docs:
        group, _, version = d["apiVersion"].rpartition("/")
        res = next(r for r in server.resources.values()
                   if (r.group, r.version, r.kind) == (group, version, d["kind"]))
        server.create(res, d["metadata"].get("namespace"), copy.deepcopy(d))


def _sa(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": NS}}


class World:
    def __init__(self, server: ApiServer, addr: str, tmp: Path, url: str) -> None:
        self.server, self.addr, self.tmp, self.url = server, addr, tmp, url
        self.ca = trustme.CA()
        certs = tmp / "metrics-certs"  # a mounted kubernetes.io/tls Secret
        certs.mkdir()
        leaf = self.ca.issue_cert("127.0.0.1", "localhost")
        (certs / "tls.crt").write_bytes(leaf.cert_chain_pems[0].bytes())
        (certs / "tls.key").write_bytes(leaf.private_key_pem.bytes())
        self.tls = ServingCertificate(plan_tls(auth=True, plain_http=False,
                                               cert_dir=str(certs)))
        self.ca_file = str(tmp / "metrics-ca.pem")
        self.ca.cert_pem.write_to_path(self.ca_file)

    def https(self) -> httpx.AsyncClient:
        """A scraper that trusts the listener's CA."""
        return httpx.AsyncClient(verify=client_context(self.ca_file))

    def token(self, sa: str) -> str:
        return str(self.server.issue_token(NS, sa)["status"]["token"])

    def kubeconfig(self, sa: str) -> str:
        path = self.tmp / f"{sa}.kubeconfig"
        write_kubeconfig(self.url, str(path), token=self.token(sa),
                         ca_pem=self.server.tls_ca_pem)
        return str(path)


@asynccontextmanager
async def world(tmp_path: Path, feed: EventFeed) -> AsyncIterator[World]:
    server = ApiServer(authorization_mode="RBAC", crd_paths=[])
    shipped = [d for d in yaml.safe_load_all((REPO / "config/rbac/metrics.yaml").read_text())
               if d]
    _install(server, [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        _sa("bigfleet-operator"), _sa("bigfleet-pod-controller"), _sa("prometheus"),
        _sa("stranger"), *shipped,
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "prometheus-metrics"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "bigfleet-metrics-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": NS}]},
    ])
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve, server)
        w = World(server, "", tmp_path, url)
        kcfg = load_kubeconfig(w.kubeconfig("bigfleet-operator"))
        async with KubeClient(kcfg) as client:
            w.addr = await nursery.start(partial(
                serve_observability, "127.0.0.1:0", feed=feed, auth=KubeAuthorizer(client),
                tls=w.tls))
            yield w
        nursery.cancel_scope.cancel()


async def test_metrics_only_for_an_authorized_caller(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with world(tmp_path, EventFeed()) as w, w.https() as http:
            base = f"https://{w.addr}"
            r = await http.get(f"{base}/metrics")
            assert r.status_code == 401 and "bearer token is required" in r.text
            r = await http.get(f"{base}/metrics", headers={"Authorization": "Bearer forged"})
            assert r.status_code == 401
            stranger = {"Authorization": f"Bearer {w.token('stranger')}"}
            r = await http.get(f"{base}/metrics", headers=stranger)
            assert r.status_code == 403
            assert 'system:serviceaccount:bigfleet-system:stranger" cannot get path "/metrics"' \
                in r.text
            reader = {"Authorization": f"Bearer {w.token('prometheus')}"}
            r = await http.get(f"{base}/metrics", headers=reader)
            assert r.status_code == 200 and "bigfleet_diagnostics_auth_decisions_total" in r.text
            for probe in ("/healthz", "/readyz"):  # the kubelet sends no token
                assert (await http.get(base + probe)).status_code == 200
        async with httpx.AsyncClient() as plain:  # the token never travels in clear text
            with pytest.raises(httpx.TransportError):
                await plain.get(f"http://{w.addr}/metrics", headers=reader)


async def test_events_follower_sends_the_kubeconfig_token(tmp_path: Path) -> None:
    feed = EventFeed()
    with trio.fail_after(30):
        async with world(tmp_path, feed) as w:
            tls = cli.events_tls(w.ca_file, False, None)
            with pytest.raises(OSError, match=r"HTTP 401.*kubectl create token"):
                await follow_events(w.addr, io.StringIO(), tls=tls)
            with pytest.raises(OSError, match=r"HTTP 403.*bigfleet-metrics-reader"):
                await follow_events(w.addr, io.StringIO(), tls=tls,
                                    token=cli.events_token(w.kubeconfig("stranger")))
            out = io.StringIO()
            token = cli.events_token(w.kubeconfig("prometheus"))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(follow_events, f"https://{w.addr}", out,
                                           max_events=1, token=token, tls=tls))
                while feed.statistics().subscribers == 0:  # noqa: ASYNC110
                    await trio.sleep(0.01)
                feed.publish("rollup", needs=1)
            assert '"kind":"rollup"' in out.getvalue()


async def test_a_binary_without_the_review_grant_says_what_to_bind(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with trio.fail_after(30):
        async with world(tmp_path, EventFeed()) as w, w.https() as http:
            w.server.delete(next(r for r in w.server.resources.values()
                                 if r.plural == "clusterrolebindings"),
                            None, "bigfleet-metrics-auth")
            r = await http.get(f"https://{w.addr}/metrics",
                               headers={"Authorization": f"Bearer {w.token('prometheus')}"})
            assert r.status_code == 500
    assert any("bigfleet-metrics-auth" in rec.getMessage() and rec.levelno == logging.ERROR
               for rec in caplog.records)
