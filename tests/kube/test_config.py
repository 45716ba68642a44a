"""Kubeconfig / in-cluster resolution (docs/kube-api.md, "Config")."""

import base64
import os
import ssl
import tempfile
from pathlib import Path

import pytest
import trustme
import yaml

from bigfleet_trio.kube.config import KubeConfig, load_incluster_config, load_kubeconfig
from bigfleet_trio.kube.errors import KubeConfigError


def _kubeconfig(cluster: dict, user: dict, *, ctx_ns: str | None = None) -> dict:
    ctx: dict = {"cluster": "c1", "user": "u1"}
    if ctx_ns:
        ctx["namespace"] = ctx_ns
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "ctx1",
        "clusters": [{"name": "c1", "cluster": cluster}],
        "users": [{"name": "u1", "user": user}],
        "contexts": [
            {"name": "ctx1", "context": ctx},
            {"name": "other", "context": {"cluster": "c1", "user": "u1", "namespace": "o"}},
        ],
    }


def _write(tmp_path: Path, doc: dict, name: str = "config") -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return str(p)


def test_token_and_namespace(tmp_path: Path) -> None:
    path = _write(
        tmp_path, _kubeconfig({"server": "https://k:6443/"}, {"token": "abc"}, ctx_ns="team")
    )
    cfg = load_kubeconfig(path, env={})
    assert cfg.server == "https://k:6443"
    assert cfg.namespace == "team"
    assert cfg.bearer_token() == "abc"
    assert cfg.is_https


def test_other_context(tmp_path: Path) -> None:
    path = _write(tmp_path, _kubeconfig({"server": "http://k"}, {}))
    assert load_kubeconfig(path, context="other", env={}).namespace == "o"
    with pytest.raises(KubeConfigError, match="context 'nope' not found"):
        load_kubeconfig(path, context="nope", env={})


def test_ca_data_and_client_cert_data(tmp_path: Path) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("kube-admin")
    cluster = {
        "server": "https://k:6443",
        "certificate-authority-data": base64.b64encode(ca.cert_pem.bytes()).decode(),
    }
    user = {
        "client-certificate-data": base64.b64encode(leaf.cert_chain_pems[0].bytes()).decode(),
        "client-key-data": base64.b64encode(leaf.private_key_pem.bytes()).decode(),
    }
    cfg = load_kubeconfig(_write(tmp_path, _kubeconfig(cluster, user)), env={})
    assert cfg.ca_data == ca.cert_pem.bytes()
    ctx = cfg.ssl_context()
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert len(ctx.get_ca_certs()) == 1
    assert cfg.ssl_context() is ctx  # cached
    # No key material left behind in the temp dir.
    assert not [
        p for p in os.listdir(os.environ.get("TMPDIR", "/tmp")) if p.startswith("bigfleet-kube-")
    ]


def _no_temp_files(*_a: object, **_k: object) -> object:
    raise OSError(30, "Read-only file system")


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs memfd_create (Linux)")
def test_inline_client_cert_loads_without_a_writable_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A container run with --read-only has no writable /tmp: the inline client pair must load
    # without creating any file (scripts/image-smoke checks the same inside the image).
    ca = trustme.CA()
    leaf = ca.issue_cert("kube-admin")
    cluster = {"server": "https://k:6443", "insecure-skip-tls-verify": True}
    user = {
        "client-certificate-data": base64.b64encode(leaf.cert_chain_pems[0].bytes()).decode(),
        "client-key-data": base64.b64encode(leaf.private_key_pem.bytes()).decode(),
    }
    cfg = load_kubeconfig(_write(tmp_path, _kubeconfig(cluster, user)), env={})
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-dir"))
    for name in ("mkstemp", "mkdtemp", "NamedTemporaryFile", "TemporaryFile"):
        monkeypatch.setattr(tempfile, name, _no_temp_files)
    before = len(os.listdir("/proc/self/fd"))
    ctx = cfg.ssl_context()
    assert isinstance(ctx, ssl.SSLContext)
    assert len(os.listdir("/proc/self/fd")) == before  # the in-memory files are closed again


def test_inline_client_cert_falls_back_to_a_deleted_temp_file_without_memfd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("kube-admin")
    user = {
        "client-certificate-data": base64.b64encode(leaf.cert_chain_pems[0].bytes()).decode(),
        "client-key-data": base64.b64encode(leaf.private_key_pem.bytes()).decode(),
    }
    cfg = load_kubeconfig(_write(tmp_path, _kubeconfig({"server": "https://k"}, user)), env={})
    monkeypatch.delattr(os, "memfd_create", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cfg.ssl_context()
    assert sorted(os.listdir(tmp_path)) == ["config"]


def test_client_cert_files_relative_to_kubeconfig(tmp_path: Path) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("kube-admin")
    (tmp_path / "pki").mkdir()
    ca.cert_pem.write_to_path(str(tmp_path / "pki" / "ca.crt"))
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "pki" / "admin.crt"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "pki" / "admin.key"))
    cluster = {"server": "https://k", "certificate-authority": "pki/ca.crt"}
    user = {"client-certificate": "pki/admin.crt", "client-key": "pki/admin.key"}
    cfg = load_kubeconfig(_write(tmp_path, _kubeconfig(cluster, user)), env={})
    assert cfg.ca_file == str(tmp_path / "pki" / "ca.crt")
    assert cfg.client_key_file == str(tmp_path / "pki" / "admin.key")
    cfg.ssl_context()


def test_insecure_skip_verify(tmp_path: Path) -> None:
    cfg = load_kubeconfig(
        _write(
            tmp_path,
            _kubeconfig({"server": "https://k", "insecure-skip-tls-verify": True}, {"token": "t"}),
        ),
        env={},
    )
    ctx = cfg.ssl_context()
    assert ctx.verify_mode == ssl.CERT_NONE and not ctx.check_hostname


def test_kubeconfig_env_first_existing(tmp_path: Path) -> None:
    b = _write(tmp_path, _kubeconfig({"server": "http://b"}, {}), "b")
    env = {"KUBECONFIG": os.pathsep.join([str(tmp_path / "missing"), b])}
    assert load_kubeconfig(env=env).server == "http://b"
    with pytest.raises(KubeConfigError, match="none of the listed files exists"):
        load_kubeconfig(env={"KUBECONFIG": str(tmp_path / "missing")})


def test_home_default(tmp_path: Path) -> None:
    (tmp_path / ".kube").mkdir()
    _write(tmp_path / ".kube", _kubeconfig({"server": "http://home"}, {}))
    assert load_kubeconfig(env={"HOME": str(tmp_path)}).server == "http://home"


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ("a: [unclosed\n", "not valid YAML"),
        ("", "is empty"),
        ("- a\n- b\n", "not a kubeconfig"),
        (yaml.safe_dump({"clusters": []}), "no current-context"),
        (yaml.safe_dump(_kubeconfig({}, {})), "has no server"),
        (yaml.safe_dump(_kubeconfig({"server": "k:6443"}, {})), "must start with http"),
        (
            yaml.safe_dump(
                _kubeconfig({"server": "https://k", "certificate-authority-data": "@@@"}, {})
            ),
            "not valid base64",
        ),
        (
            yaml.safe_dump(_kubeconfig({"server": "https://k"}, {"exec": {"command": "aws"}})),
            "exec",
        ),
        (
            yaml.safe_dump(_kubeconfig({"server": "https://k"}, {"client-certificate": "x.crt"})),
            "both client certificate and key",
        ),
    ],
)
def test_broken_kubeconfig(tmp_path: Path, doc: str, match: str) -> None:
    p = tmp_path / "config"
    p.write_text(doc)
    with pytest.raises(KubeConfigError, match=match):
        load_kubeconfig(str(p), env={})


def test_missing_explicit_path(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="does not exist"):
        load_kubeconfig(str(tmp_path / "nope"), env={})


def test_bad_ca_material_raises_config_error() -> None:
    cfg = KubeConfig(
        server="https://k", ca_data=b"-----BEGIN CERTIFICATE-----\nxx\n-----END CERTIFICATE-----\n"
    )
    with pytest.raises(KubeConfigError, match="bad TLS material"):
        cfg.ssl_context()


def test_incluster_and_token_rotation(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("one\n")
    (tmp_path / "namespace").write_text("bigfleet-system")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    cfg = load_kubeconfig(env=env | {"HOME": str(tmp_path)}, sa_dir=str(tmp_path))
    assert cfg.server == "https://10.0.0.1:443"
    assert cfg.namespace == "bigfleet-system"
    assert cfg.bearer_token() == "one"
    tok = tmp_path / "token"
    tok.write_text("two-rotated\n")
    os.utime(tok, ns=(1, 2_000_000_000_000_000_000))
    assert cfg.bearer_token() == "two-rotated"
    tok.unlink()
    assert cfg.bearer_token() == "two-rotated"  # transient absence keeps the last token


def test_incluster_ipv6_and_errors(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    cfg = load_incluster_config(
        str(tmp_path), {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    )
    assert cfg.server == "https://[fd00::1]:6443"
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
        load_incluster_config(str(tmp_path), {})
    with pytest.raises(KubeConfigError, match="no kubeconfig found"):
        load_kubeconfig(env={"HOME": str(tmp_path)}, sa_dir=str(tmp_path / "none"))
