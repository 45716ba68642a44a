"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok (fake kubelets), each a child process started and stopped by pid.

:class:`ControlPlane` is the one implementation behind ``python -m scripts.realkube up``, the
``realkube`` pytest fixture (tests/support/realkube.py) and the benchmarks::

    with ControlPlane(find_binaries(), workdir, nodes=3) as cp:
        cp.kubeconfig            # admin (client certificate in system:masters)
        cp.token("bigfleet-system", "bigfleet-operator")   # a TokenRequest-issued token
        cp.restart("kube-apiserver"); cp.compact_etcd()

Synchronous on purpose (plain subprocess + httpx.Client): a session-scoped pytest fixture and
a command-line tool both call it outside any event loop.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from .build import Binaries
from .pki import Pki, write_pki

__all__ = ["ControlPlane", "ControlPlaneError", "free_port", "KWOK_NODE_PREFIX"]

KWOK_NODE_PREFIX = "kwok-node-"
UNMANAGED_LABEL = "bigfleet.lucy.sh/unmanaged"
"""On kwok's Nodes: BigFleet did not buy them, so the pod controller's default
``--unmanaged-node-selector`` gives the Pods bound to them no CapacityRequest
(docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out)."""
SERVICE_CIDR = "10.0.0.0/24"
SA_ISSUER = "https://kubernetes.default.svc"
# start order; stop is the reverse
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    verbs: [get, list, watch]
  - level: Metadata
"""
"""kube-apiserver's audit policy here: every write at Metadata level (who, what, when, the
answer's code), no reads."""


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def as_applied(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as ``kubectl apply`` creates it: with the last-applied annotation (the object's
    JSON, without that annotation), so a later ``kubectl apply -k config/default`` patches it
    without warning that the annotation is missing."""
    out = json.loads(json.dumps(obj))
    meta = out.setdefault("metadata", {})
    annotations = meta.setdefault("annotations", {})
    annotations.pop(LAST_APPLIED, None)
    annotations[LAST_APPLIED] = json.dumps(out, separators=(",", ":"), sort_keys=True)
    return out


EXTRA_ADMISSION_PLUGINS = ("ExtendedResourceToleration", "NodeRestriction")
"""Admission plugins kube-apiserver v1.37 leaves off by default that managed clusters (GKE, EKS,
AKS, kubeadm for NodeRestriction) turn on: ExtendedResourceToleration gives a Pod requesting
e.g. ``nvidia.com/gpu`` the toleration of the GPU machines' ``nvidia.com/gpu`` NoSchedule taint;
NodeRestriction confines a kubelet's credentials to its own Node and Pods. The defaults
(NamespaceLifecycle, ServiceAccount, PodSecurity, DefaultTolerationSeconds, ...) stay on by
themselves (docs/deviations.md#realkube-admission)."""


class ControlPlaneError(RuntimeError):
    """A component did not start or become ready; the message carries its log's tail."""


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Ports:
    etcd: int = field(default_factory=free_port)
    etcd_peer: int = field(default_factory=free_port)
    apiserver: int = field(default_factory=free_port)
    controller_manager: int = field(default_factory=free_port)
    scheduler: int = field(default_factory=free_port)
    kwok: int = field(default_factory=free_port)


class ControlPlane:
    """Start/stop the five components; helpers for tests (tokens, restarts, etcd compaction).

    Args:
        binaries: from :func:`scripts.realkube.build.find_binaries`.
        workdir: where data, certificates, kubeconfigs and logs go (``logs/<component>.log``).
        nodes: fake Nodes kwok runs (``kwok-node-0`` ...; 32 CPU, 256Gi, 110 Pods each),
            labelled ``bigfleet.lucy.sh/unmanaged: "true"`` (:data:`UNMANAGED_LABEL`).
        ready_timeout: seconds each component gets to become ready.
        extra_args: per component name, flags appended to its command line (e.g. a scale
            test's client QPS for kube-controller-manager); a name not in the components is
            a ``KeyError``.
        nice: the components' scheduling niceness (``nice -n``; 0: the caller's). A benchmark
            that runs the control plane on the same cores as the clients it measures sets it,
            so the clients are not starved by the server the way they would not be on a real
            cluster, where they run on worker nodes.

    kwok manages every Node (``--manage-all-nodes``), so Nodes registered by anyone else, e.g.
    the sim shard, also keep fresh heartbeats and run their Pods.
    """

    def __init__(self, binaries: Binaries, workdir: Path, *, nodes: int = 0,
                 ready_timeout: float = 120.0,
                 extra_args: Mapping[str, Sequence[str]] | None = None,
                 nice: int = 0) -> None:
        self.nice = nice
        unknown = set(extra_args or {}) - set(COMPONENTS)
        if unknown:
            raise KeyError(f"extra_args for unknown components: {sorted(unknown)}")
        self.extra_args = {name: list(args) for name, args in (extra_args or {}).items()}
        self.binaries = binaries
        self.workdir = Path(workdir)
        self.nodes = nodes
        self.ready_timeout = ready_timeout
        self.ports = Ports()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.pki: Pki | None = None
        self.server = f"https://127.0.0.1:{self.ports.apiserver}"
        self.etcd_url = f"http://127.0.0.1:{self.ports.etcd}"
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.logs_dir = self.workdir / "logs"

    # ---- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start every component in order, each ready before the next; then the fake Nodes.

        Raises ControlPlaneError (with the failing component's log tail) on a start failure."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        self.pki = write_pki(self.workdir / "pki")
        (self.workdir / "audit-policy.yaml").write_text(AUDIT_POLICY)
        self.write_kubeconfig(self.kubeconfig)
        for name in COMPONENTS:
            if name == "kwok" and self.binaries.kwok is None:
                continue
            self._start(name)
        self._wait("the default ServiceAccount (serviceaccount controller)", self._default_sa)
        self.create_nodes(self.nodes)

    def stop(self) -> None:
        """Stop every started component by pid, in reverse order: SIGTERM, then SIGKILL after
        10 s. Safe to call twice."""
        for name in reversed(COMPONENTS):
            self._stop(name)

    def restart(self, name: str) -> None:
        """Stop component ``name`` (SIGTERM) and start it again with the same flags and data;
        returns once it is ready."""
        self.stop_component(name)
        self.start_component(name)

    def stop_component(self, name: str) -> None:
        """Stop component ``name`` (SIGTERM, SIGKILL after 10 s); its data stays."""
        self._stop(name)

    def start_component(self, name: str) -> None:
        """Start a stopped component again with the same flags and data; returns once ready."""
        self._start(name)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to component ``name`` and reap it (it stays stopped)."""
        proc = self.procs.pop(name)
        os.kill(proc.pid, sig)
        proc.wait()

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.procs.items()}

    def check_alive(self) -> None:
        """Raise ControlPlaneError if a started component has exited."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise ControlPlaneError(
                    f"{name} exited with {proc.returncode}\n{self.log_tail(name)}")

    # ---- components ------------------------------------------------------------------------

    def argv(self, name: str) -> list[str]:
        """The command line of component ``name`` (each flag checked against its --help), with
        its ``extra_args`` last."""
        audit = self._audit_argv() if name == "kube-apiserver" else []
        return [*self._base_argv(name), *audit, *self.extra_args.get(name, ())]

    @property
    def audit_log(self) -> Path:
        """kube-apiserver's audit log: one JSON line per write (create, update, patch, delete,
        deletecollection), with its user, user agent, object and answer (:data:`AUDIT_POLICY`);
        reads are not logged. Fault tests read who wrote what, when, from it."""
        return self.workdir / "audit.log"

    def _audit_argv(self) -> list[str]:
        policy = self.workdir / "audit-policy.yaml"  # written by start()
        return ["--audit-policy-file", str(policy), "--audit-log-path", str(self.audit_log),
                "--audit-log-format", "json", "--audit-log-maxsize", "0"]

    def _base_argv(self, name: str) -> list[str]:
        assert self.pki is not None
        p, pki, kc, bins = self.ports, self.pki, str(self.kubeconfig), self.binaries
        secure = ["--bind-address", "127.0.0.1", "--authentication-kubeconfig", kc,
                  "--authorization-kubeconfig", kc, "--cert-dir", str(self.workdir / name)]
        if name == "etcd":
            return [bins["etcd"], "--name", "realkube", "--data-dir", str(self.workdir / "etcd"),
                    "--listen-client-urls", self.etcd_url,
                    "--advertise-client-urls", self.etcd_url,
                    "--listen-peer-urls", f"http://127.0.0.1:{p.etcd_peer}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{p.etcd_peer}",
                    "--initial-cluster", f"realkube=http://127.0.0.1:{p.etcd_peer}",
                    # a test cluster: durability across a machine crash is not needed
                    "--unsafe-no-fsync", "--log-level", "warn"]
        if name == "kube-apiserver":
            return [bins[name], "--etcd-servers", self.etcd_url,
                    "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
                    "--secure-port", str(p.apiserver), "--cert-dir", str(self.workdir / name),
                    "--tls-cert-file", str(pki.serving_crt),
                    "--tls-private-key-file", str(pki.serving_key),
                    "--client-ca-file", str(pki.ca_crt),
                    "--service-cluster-ip-range", SERVICE_CIDR,
                    "--service-account-issuer", SA_ISSUER,
                    "--service-account-key-file", str(pki.sa_pub),
                    "--service-account-signing-key-file", str(pki.sa_key),
                    "--authorization-mode", "Node,RBAC",
                    "--enable-admission-plugins", ",".join(EXTRA_ADMISSION_PLUGINS),
                    "--allow-privileged=true",
                    # the `kubernetes` Service's endpoints may not be a loopback address, and
                    # nothing here runs in a Pod that would need them
                    "--endpoint-reconciler-type", "none"]
        if name == "kube-controller-manager":
            return [bins[name], "--kubeconfig", kc, *secure,
                    "--secure-port", str(p.controller_manager),
                    # every controller enabled by default, as on a real cluster: garbage
                    # collector, namespace, deployment, replicaset, statefulset, job,
                    # disruption (PodDisruptionBudget status), serviceaccount(-token), podgc ...
                    "--controllers", "*",
                    "--service-account-private-key-file", str(pki.sa_key),
                    "--root-ca-file", str(pki.ca_crt),
                    "--cluster-signing-cert-file", str(pki.ca_crt),
                    "--cluster-signing-key-file", str(pki.ca_key),
                    "--use-service-account-credentials",
                    "--leader-elect=false"]
        if name == "kube-scheduler":
            return [bins[name], "--kubeconfig", kc, *secure, "--secure-port", str(p.scheduler),
                    "--leader-elect=false"]
        if name == "kwok":
            assert bins.kwok is not None
            return [bins.kwok, "--kubeconfig", kc, "--config", bins.kwok_config,
                    "--manage-all-nodes=true", "--server-address", f"127.0.0.1:{p.kwok}"]
        raise KeyError(name)

    def _ready_check(self, name: str) -> Callable[[], bool]:
        p = self.ports
        if name == "etcd":
            return lambda: self._http_ok(f"{self.etcd_url}/health", expect="true")
        if name == "kube-apiserver":
            return lambda: self._http_ok(f"{self.server}/readyz", admin=True)
        if name == "kube-controller-manager":
            return lambda: self._http_ok(f"https://127.0.0.1:{p.controller_manager}/healthz")
        if name == "kube-scheduler":
            return lambda: self._http_ok(f"https://127.0.0.1:{p.scheduler}/healthz")
        return lambda: self._http_ok(f"http://127.0.0.1:{p.kwok}/healthz")

    def _start(self, name: str) -> None:
        log = (self.logs_dir / f"{name}.log").open("ab")
        argv = self.argv(name)
        if self.nice:
            argv = ["nice", "-n", str(self.nice), *argv]  # nice execs it: the pid is the binary's
        try:
            self.procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                # own process group: Ctrl-C in the terminal of `up` reaches only `up`, which
                # stops the components in order
                start_new_session=True,
            )
        finally:
            log.close()
        self._wait(name, self._ready_check(name), component=name)

    def _stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _wait(self, what: str, check: Callable[[], bool], component: str | None = None) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if component is not None and self.procs[component].poll() is not None:
                raise ControlPlaneError(f"{component} exited with "
                                        f"{self.procs[component].returncode}\n"
                                        f"{self.log_tail(component)}")
            try:
                if check():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        tail = self.log_tail(component) if component else ""
        raise ControlPlaneError(f"{what} not ready after {self.ready_timeout:.0f} s\n{tail}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.logs_dir / f"{name}.log"
        if not path.exists():
            return ""
        return "".join(path.read_text(errors="replace").splitlines(True)[-lines:])

    # ---- HTTP --------------------------------------------------------------------------------

    def httpx_kwargs(self) -> dict[str, Any]:
        """``base_url`` and ``verify`` (an SSLContext: the CA plus the admin's client
        certificate, in system:masters) for an httpx client, sync or async."""
        assert self.pki is not None
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_crt))
        ctx.load_cert_chain(str(self.pki.admin_crt), str(self.pki.admin_key))
        return {"base_url": self.server, "verify": ctx}

    def admin_client(self, timeout: float = 30.0) -> httpx.Client:
        """A synchronous httpx client authenticated as the admin (system:masters)."""
        return httpx.Client(timeout=timeout, **self.httpx_kwargs())

    def _http_ok(self, url: str, *, admin: bool = False, expect: str = "ok") -> bool:
        if admin:
            with self.admin_client(timeout=5) as c:
                r = c.get(url)
        else:
            # kube-controller-manager/scheduler serve a self-signed certificate on healthz
            r = httpx.get(url, verify=False, timeout=5)  # noqa: S501
        return r.status_code == 200 and expect in r.text

    def _default_sa(self) -> bool:
        with self.admin_client(timeout=5) as c:
            return c.get("/api/v1/namespaces/default/serviceaccounts/default").status_code == 200

    def request(self, method: str, path: str, body: Any = None, *,
                content_type: str = "application/json") -> httpx.Response:
        """One admin request; ``body`` is JSON-encoded."""
        with self.admin_client() as c:
            data = None if body is None else json.dumps(body).encode()
            return c.request(method, path, content=data,
                             headers={"Content-Type": content_type} if data else {})

    # ---- identities ----------------------------------------------------------------------------

    def token(self, namespace: str, service_account: str, seconds: int = 86400) -> str:
        """A ServiceAccount token from the TokenRequest API (``serviceaccounts/<sa>/token``)."""
        r = self.request(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": seconds}})
        if r.status_code != 201:
            raise ControlPlaneError(f"TokenRequest for {namespace}/{service_account}: "
                                    f"{r.status_code} {r.text}")
        return str(r.json()["status"]["token"])

    def write_kubeconfig(self, path: Path, *, token: str | None = None,
                         user: str = "admin") -> Path:
        """Write a kubeconfig for the apiserver: the admin client certificate, or ``token``."""
        assert self.pki is not None
        if token is not None:
            creds: dict[str, str] = {"token": token}
        else:
            creds = {"client-certificate": str(self.pki.admin_crt),
                     "client-key": str(self.pki.admin_key)}
        doc = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "realkube", "cluster": {
                "server": self.server, "certificate-authority": str(self.pki.ca_crt)}}],
            "users": [{"name": user, "user": creds}],
            "contexts": [{"name": "realkube", "context": {"cluster": "realkube", "user": user}}],
            "current-context": "realkube",
        }
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        path.chmod(0o600)
        return path

    # ---- the project's CRDs ------------------------------------------------------------------

    def install_crds(self) -> None:
        """Create the project's CRDs (``bigfleet_trio/manifests/crds.yaml``) and wait until each
        is Established."""
        from bigfleet_trio.install import load_crds

        path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        names = []
        for crd in load_crds():
            r = self.request("POST", path, as_applied(crd))
            if r.status_code not in (201, 409):
                raise ControlPlaneError(f"creating CRD {crd['metadata']['name']}: "
                                        f"{r.status_code} {r.text}")
            names.append(crd["metadata"]["name"])

        def established(name: str) -> bool:
            conds = (self.request("GET", f"{path}/{name}").json().get("status") or {}).get(
                "conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

        for name in names:
            self._wait(f"CRD {name} Established", lambda n=name: established(n))  # type: ignore[misc]

    # ---- Nodes ---------------------------------------------------------------------------------

    def create_nodes(self, count: int, prefix: str = KWOK_NODE_PREFIX, *,
                     unmanaged: bool = True) -> list[str]:
        """Create ``count`` fake Nodes (kwok runs them) and wait until each is Ready.

        ``unmanaged``: label them ``bigfleet.lucy.sh/unmanaged: "true"`` (:data:`UNMANAGED_LABEL`),
        so Pods on them get no CapacityRequest with the pod controller's default flags.
        """
        names = [f"{prefix}{i}" for i in range(count)]
        extra = {UNMANAGED_LABEL: "true"} if unmanaged else {}
        for name in names:
            node = {"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": name,
                "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                "kwok.x-k8s.io/node": "fake"},
                "labels": {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
                           "kubernetes.io/hostname": name, "type": "kwok", **extra}},
                "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                           "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"}}}
            r = self.request("POST", "/api/v1/nodes", node)
            if r.status_code not in (201, 409):
                raise ControlPlaneError(f"creating Node {name}: {r.status_code} {r.text}")
        if self.binaries.kwok is not None:
            for name in names:
                self._wait(f"Node {name} Ready", lambda n=name: self._node_ready(n))  # type: ignore[misc]
        return names

    def _node_ready(self, name: str) -> bool:
        r = self.request("GET", f"/api/v1/nodes/{name}")
        conds = (r.json().get("status") or {}).get("conditions") or [] if r.is_success else []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)

    # ---- etcd ------------------------------------------------------------------------------------

    def _etcd(self, call: str, body: dict[str, Any]) -> dict[str, Any]:
        # etcd's gRPC gateway (JSON over HTTP on the client URL); keys/values are base64
        r = httpx.post(f"{self.etcd_url}/v3/{call}", json=body, timeout=30)
        r.raise_for_status()
        return dict(r.json())

    def etcd_revision(self) -> int:
        """etcd's current revision (what the apiserver serves as resourceVersion)."""
        hdr = self._etcd("kv/range", {"key": base64.b64encode(b"/").decode()})["header"]
        return int(hdr["revision"])

    def bump_etcd_revision(self, writes: int = 1) -> int:
        """Write ``writes`` keys outside the apiserver's prefix (/registry), so etcd's revision
        moves without any Kubernetes object changing; returns the new revision."""
        for i in range(writes):
            self._etcd("kv/put", {"key": base64.b64encode(f"/realkube-bump/{i}".encode()).decode(),
                                  "value": base64.b64encode(b"x").decode()})
        return self.etcd_revision()

    def compact_etcd(self, revision: int | None = None) -> int:
        """Compact etcd's history up to ``revision`` (default: the current one), physically;
        watches and lists from older resourceVersions then get 410 Gone. Returns it."""
        rev = revision if revision is not None else self.etcd_revision()
        self._etcd("kv/compaction", {"revision": str(rev), "physical": True})
        return rev

    # ---- housekeeping ----------------------------------------------------------------------------

    def remove(self) -> None:
        """Delete the work directory (after :meth:`stop`)."""
        shutil.rmtree(self.workdir, ignore_errors=True)
