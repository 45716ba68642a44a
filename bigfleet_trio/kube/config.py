"""Cluster connection settings: kubeconfig files and the in-cluster service account.

Resolution order of :func:`load_kubeconfig` (same as kubectl / client-go):

1. the explicit ``path`` argument (``--kubeconfig``),
2. ``$KUBECONFIG`` (a ``os.pathsep``-separated list; the first file that exists is used),
3. ``~/.kube/config``,
4. the in-cluster service account (``KUBERNETES_SERVICE_HOST``/``_PORT`` plus
   ``/var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt,namespace}``).

Supported kubeconfig user/cluster fields: ``server``, ``certificate-authority(-data)``,
``insecure-skip-tls-verify``, ``tls-server-name``, ``client-certificate(-data)``,
``client-key(-data)``, ``token``, ``tokenFile``, ``username``/``password``. Exec and
auth-provider plugins are rejected with a :class:`KubeConfigError`. Relative file paths are
resolved against the kubeconfig's directory. Token files are re-read whenever they change on
disk (projected service-account tokens rotate hourly).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import os
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped, unused-ignore]

from .errors import KubeConfigError

__all__ = ["KubeConfig", "load_kubeconfig", "load_incluster_config", "SERVICE_ACCOUNT_DIR"]

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass
class KubeConfig:
    """Everything needed to reach and authenticate to one apiserver.

    Attributes:
        server: base URL, e.g. "https://10.0.0.1:6443" (no trailing slash).
        namespace: default namespace of the context ("default" if unset).
        ca_file / ca_data: CA bundle path / PEM bytes used to verify the server.
        client_cert_file / client_cert_data, client_key_file / client_key_data: client TLS
            identity as paths or PEM bytes.
        token: static bearer token; token_file: bearer token file re-read on change
            (token_file wins when both are set).
        username / password: HTTP basic credentials (rare; static-password clusters).
        insecure_skip_tls_verify: do not verify the server certificate.
        tls_server_name: SNI / hostname to verify instead of the URL host.
        source: human-readable origin ("kubeconfig /x (context c)" / "in-cluster").
    """

    server: str
    namespace: str = "default"
    ca_file: str | None = None
    ca_data: bytes | None = None
    client_cert_file: str | None = None
    client_cert_data: bytes | None = None
    client_key_file: str | None = None
    # secrets never appear in repr() (a logged config must not leak them)
    client_key_data: bytes | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    insecure_skip_tls_verify: bool = False
    tls_server_name: str | None = None
    source: str = ""
    _token_cache: tuple[int, int, str] | None = field(default=None, repr=False, compare=False)
    _ssl: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    def bearer_token(self) -> str | None:
        """Current bearer token: re-reads ``token_file`` when its mtime/size changed.

        Returns:
            The token, or None if neither ``token`` nor a readable ``token_file`` is configured.
            When a previously read token file becomes unreadable, the last token is kept and a
            warning logged (the kubelet rewrites it atomically, so this is transient).
        """
        if self.token_file:
            try:
                st = os.stat(self.token_file)
                cache = self._token_cache
                if cache is not None and cache[0] == st.st_mtime_ns and cache[1] == st.st_size:
                    return cache[2]
                value = Path(self.token_file).read_text().strip()
                if cache is not None and cache[2] != value:
                    log.info("kube token rotated file=%s", self.token_file)
                self._token_cache = (st.st_mtime_ns, st.st_size, value)
                return value
            except OSError as exc:
                if self._token_cache is not None:
                    log.warning(
                        "kube token file unreadable, keeping last token file=%s err=%s",
                        self.token_file,
                        exc,
                    )
                    return self._token_cache[2]
                if not self.token:
                    log.warning("kube token file unreadable file=%s err=%s", self.token_file, exc)
                    return None
        return self.token

    @property
    def is_https(self) -> bool:
        """True when the server URL is https (TLS settings apply)."""
        return self.server.lower().startswith("https://")

    def ssl_context(self) -> ssl.SSLContext:
        """Build (once) the TLS context for this cluster.

        CA material given as data is loaded in memory; a client pair given as data is loaded
        through an anonymous in-memory file (Linux ``memfd_create``, so it works on a read-only
        filesystem) or, where that is missing, a 0600 temporary file deleted at once, since
        ``SSLContext.load_cert_chain`` only takes paths.

        Raises:
            KubeConfigError: unreadable or malformed certificate/key material.
        """
        if self._ssl is not None:
            return self._ssl
        try:
            if self.ca_file or self.ca_data:
                # Like client-go: an explicit CA replaces the system roots.
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            else:
                ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
            if self.insecure_skip_tls_verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            else:
                if self.ca_file:
                    ctx.load_verify_locations(cafile=self.ca_file)
                if self.ca_data:
                    ctx.load_verify_locations(cadata=self.ca_data.decode("ascii"))
            cert = self.client_cert_data
            key = self.client_key_data
            if self.client_cert_file or cert:
                self._load_client_pair(ctx, cert, key)
        except (ssl.SSLError, OSError, ValueError, UnicodeDecodeError) as exc:
            raise KubeConfigError(
                f"{self.source or 'kube config'}: bad TLS material: {exc}"
            ) from exc
        self._ssl = ctx
        return ctx

    def _load_client_pair(self, ctx: ssl.SSLContext, cert: bytes | None, key: bytes | None) -> None:
        with contextlib.ExitStack() as stack:
            cert_path = self.client_cert_file
            key_path = self.client_key_file
            if cert is not None:
                cert_path = stack.enter_context(_secret_path(cert))
            if key is not None:
                key_path = stack.enter_context(_secret_path(key))
            if cert_path is None:
                raise ValueError("client key given without client certificate")
            ctx.load_cert_chain(certfile=cert_path, keyfile=key_path)


@contextlib.contextmanager
def _secret_path(data: bytes) -> Iterator[str]:
    """A path holding ``data`` for as long as the context is open, then gone.

    ``SSLContext.load_cert_chain`` only takes paths, and a container run with a read-only root
    has no writable /tmp. On Linux the PEM goes into an anonymous in-memory file
    (``memfd_create``) opened again through ``/proc/self/fd/N``: nothing touches a filesystem
    and the memory is freed when the descriptor is closed. Elsewhere (no memfd, or no /proc) it
    falls back to a 0600 temporary file that is deleted on exit.
    """
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create("bigfleet-kube-pem", os.MFD_CLOEXEC)
        try:
            _write_all(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    fd, path = tempfile.mkstemp(prefix="bigfleet-kube-", suffix=".pem")
    try:
        try:
            os.fchmod(fd, 0o600)
            _write_all(fd, data)
        finally:
            os.close(fd)
        yield path
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _b64(value: Any, what: str, src: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KubeConfigError(f"{src}: {what} is not valid base64: {exc}") from exc


def _named(entries: Any, name: str, kind: str, src: str) -> dict[str, Any]:
    if not isinstance(entries, list):
        raise KubeConfigError(f"{src}: '{kind}s' must be a list")
    for entry in entries:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(kind)
            if body is None:
                return {}
            if not isinstance(body, dict):
                raise KubeConfigError(f"{src}: {kind} {name!r} must be a mapping")
            return body
    raise KubeConfigError(f"{src}: {kind} {name!r} not found")


def _path(base: Path, value: Any) -> str:
    p = Path(os.path.expanduser(str(value)))
    return str(p if p.is_absolute() else base / p)


def parse_kubeconfig(
    doc: Mapping[str, Any], *, base_dir: Path, source: str, context: str | None = None
) -> KubeConfig:
    """Build a :class:`KubeConfig` from a decoded kubeconfig document (pure; no network).

    Args:
        doc: the YAML document as a mapping.
        base_dir: directory relative file references are resolved against.
        source: label used in error messages (usually the file path).
        context: context name to use instead of ``current-context``.

    Raises:
        KubeConfigError: missing context/cluster/user/server, bad base64, unsupported auth.
    """
    if not isinstance(doc, Mapping):
        raise KubeConfigError(f"{source}: not a kubeconfig (top level is not a mapping)")
    ctx_name = context or doc.get("current-context")
    if not ctx_name:
        raise KubeConfigError(f"{source}: no current-context set and no context given")
    ctx = _named(doc.get("contexts") or [], str(ctx_name), "context", source)
    cluster_name = ctx.get("cluster")
    if not cluster_name:
        raise KubeConfigError(f"{source}: context {ctx_name!r} names no cluster")
    cluster = _named(doc.get("clusters") or [], str(cluster_name), "cluster", source)
    user_name = ctx.get("user")
    user = _named(doc.get("users") or [], str(user_name), "user", source) if user_name else {}
    server = cluster.get("server")
    if not server or not isinstance(server, str):
        raise KubeConfigError(f"{source}: cluster {cluster_name!r} has no server")
    if not server.startswith(("http://", "https://")):
        raise KubeConfigError(f"{source}: server {server!r} must start with http:// or https://")
    if user.get("exec") or user.get("auth-provider"):
        raise KubeConfigError(
            f"{source}: user {user_name!r} uses an exec/auth-provider plugin (unsupported);"
            " use a token, tokenFile or client certificate"
        )
    cfg = KubeConfig(
        server=server.rstrip("/"),
        namespace=str(ctx.get("namespace") or "default"),
        source=f"kubeconfig {source} (context {ctx_name})",
    )
    if cluster.get("certificate-authority-data"):
        cfg.ca_data = _b64(
            cluster["certificate-authority-data"], "certificate-authority-data", source
        )
    elif cluster.get("certificate-authority"):
        cfg.ca_file = _path(base_dir, cluster["certificate-authority"])
    cfg.insecure_skip_tls_verify = bool(cluster.get("insecure-skip-tls-verify", False))
    if cluster.get("tls-server-name"):
        cfg.tls_server_name = str(cluster["tls-server-name"])
    if user.get("client-certificate-data"):
        cfg.client_cert_data = _b64(
            user["client-certificate-data"], "client-certificate-data", source
        )
    elif user.get("client-certificate"):
        cfg.client_cert_file = _path(base_dir, user["client-certificate"])
    if user.get("client-key-data"):
        cfg.client_key_data = _b64(user["client-key-data"], "client-key-data", source)
    elif user.get("client-key"):
        cfg.client_key_file = _path(base_dir, user["client-key"])
    if bool(cfg.client_cert_data or cfg.client_cert_file) != bool(
        cfg.client_key_data or cfg.client_key_file
    ):
        raise KubeConfigError(f"{source}: user {user_name!r} needs both client certificate and key")
    if user.get("token"):
        cfg.token = str(user["token"])
    if user.get("tokenFile"):
        cfg.token_file = _path(base_dir, user["tokenFile"])
        # As client-go's kubeconfig validation ("unable to read token-file"): a token file that
        # cannot be read at start is a configuration error, not a stream of 401s later. Once
        # loaded, the file is re-read on change and a transient read failure only warns.
        try:
            Path(cfg.token_file).read_bytes()
        except OSError as exc:
            raise KubeConfigError(
                f"{source}: user {user_name!r}: cannot read tokenFile {cfg.token_file}: "
                f"{exc.strerror or exc}"
            ) from exc
    if user.get("username"):
        cfg.username = str(user["username"])
        cfg.password = str(user.get("password") or "")
    return cfg


def load_incluster_config(
    sa_dir: str = SERVICE_ACCOUNT_DIR, env: Mapping[str, str] | None = None
) -> KubeConfig:
    """Configuration of a pod's service account.

    Raises:
        KubeConfigError: not running in a cluster (env vars or token file missing).
    """
    env = os.environ if env is None else env
    host = env.get("KUBERNETES_SERVICE_HOST")
    port = env.get("KUBERNETES_SERVICE_PORT", "443")
    token_path = os.path.join(sa_dir, "token")
    if not host:
        raise KubeConfigError("in-cluster: KUBERNETES_SERVICE_HOST is not set")
    if not os.path.exists(token_path):
        raise KubeConfigError(f"in-cluster: service account token {token_path} does not exist")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    cfg = KubeConfig(server=f"https://{host}:{port}", token_file=token_path, source="in-cluster")
    ca = os.path.join(sa_dir, "ca.crt")
    if os.path.exists(ca):
        cfg.ca_file = ca
    ns = os.path.join(sa_dir, "namespace")
    try:
        cfg.namespace = Path(ns).read_text().strip() or "default"
    except OSError:
        pass
    return cfg


def _read_kubeconfig_file(path: str, context: str | None) -> KubeConfig:
    try:
        text = Path(path).read_text()
    except FileNotFoundError as exc:
        raise KubeConfigError(f"kubeconfig {path} does not exist") from exc
    except OSError as exc:
        raise KubeConfigError(f"kubeconfig {path} is unreadable: {exc}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KubeConfigError(f"kubeconfig {path} is not valid YAML: {exc}") from exc
    if doc is None:
        raise KubeConfigError(f"kubeconfig {path} is empty")
    return parse_kubeconfig(doc, base_dir=Path(path).resolve().parent, source=path, context=context)


def load_kubeconfig(
    path: str | None = None,
    *,
    context: str | None = None,
    env: Mapping[str, str] | None = None,
    sa_dir: str = SERVICE_ACCOUNT_DIR,
) -> KubeConfig:
    """Resolve cluster settings: explicit path, $KUBECONFIG, ~/.kube/config, in-cluster.

    Args:
        path: explicit kubeconfig (``--kubeconfig``); must exist.
        context: context to use instead of the file's ``current-context``.
        env: environment (defaults to ``os.environ``; tests pass their own).
        sa_dir: service-account directory for the in-cluster fallback.

    Raises:
        KubeConfigError: nothing usable found, or the chosen file is broken (message names the
            file and the problem).
    """
    env = os.environ if env is None else env
    if path:
        return _read_kubeconfig_file(path, context)
    listed = env.get("KUBECONFIG")
    if listed:
        candidates = [p for p in listed.split(os.pathsep) if p]
        for candidate in candidates:
            if os.path.exists(candidate):
                return _read_kubeconfig_file(candidate, context)
        raise KubeConfigError(f"KUBECONFIG={listed!r}: none of the listed files exists")
    home = env.get("HOME") or os.path.expanduser("~")
    default = os.path.join(home, ".kube", "config")
    if os.path.exists(default):
        return _read_kubeconfig_file(default, context)
    try:
        return load_incluster_config(sa_dir, env)
    except KubeConfigError as exc:
        raise KubeConfigError(
            f"no kubeconfig found (no --kubeconfig, KUBECONFIG unset, {default} missing) and not "
            f"in a cluster ({exc})"
        ) from exc
