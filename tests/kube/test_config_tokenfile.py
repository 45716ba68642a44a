"""Kubeconfig ``users[].user.tokenFile`` (docs/kube-api.md, "Config").

What the code does (bigfleet_trio/kube/config.py): ``tokenFile`` is stored as ``token_file``
(``~`` expanded, relative paths joined to the kubeconfig's directory, not the working directory);
the file is read lazily by ``bearer_token()`` (stripped, re-read when it changes) and wins over a
static ``token``. A missing or unreadable file at load time is a KubeConfigError naming the user
and the file (as client-go's kubeconfig validation: "unable to read token-file"). A file that
disappears *after* load (a rotation in progress): ``bearer_token()`` logs a WARNING naming the
file and returns None (or the static ``token`` if one is set).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig, KubeConfigError, load_kubeconfig
from bigfleet_trio.kube.resources import NODES


def _kubeconfig(user: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "ctx1",
        "clusters": [{"name": "c1", "cluster": {"server": "https://k:6443"}}],
        "users": [{"name": "u1", "user": user}],
        "contexts": [{"name": "ctx1", "context": {"cluster": "c1", "user": "u1"}}],
    }


def _write(directory: Path, user: dict[str, Any]) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    p = directory / "config"
    p.write_text(yaml.safe_dump(_kubeconfig(user)))
    return str(p)


async def _auth_header_sent(cfg: KubeConfig) -> str | None:
    """Authorization header of one GET through KubeClient (None when absent)."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"metadata": {"name": "n1"}})

    async with KubeClient(cfg, transport=httpx.MockTransport(handler)) as c:
        await c.get(NODES, "n1")
    header: str | None = seen[0].headers.get("authorization")
    return header


async def test_relative_token_file_resolved_against_kubeconfig_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube_dir = tmp_path / "kube"
    (kube_dir / "secrets").mkdir(parents=True)
    (kube_dir / "secrets" / "token").write_text("s3cret-from-file\n")
    path = _write(kube_dir, {"tokenFile": "secrets/token"})
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    (elsewhere / "secrets").mkdir()
    (elsewhere / "secrets" / "token").write_text("wrong-cwd-token\n")
    monkeypatch.chdir(elsewhere)  # a cwd-relative resolution would pick this file instead

    cfg = load_kubeconfig(path, env={})
    assert cfg.token_file == str(kube_dir / "secrets" / "token")
    assert cfg.token is None
    assert cfg.bearer_token() == "s3cret-from-file"  # trailing newline stripped
    assert await _auth_header_sent(cfg) == "Bearer s3cret-from-file"


def test_absolute_and_home_token_file_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    abs_tok = tmp_path / "abs-token"
    abs_tok.write_text("abs")
    cfg = load_kubeconfig(_write(tmp_path / "a", {"tokenFile": str(abs_tok)}), env={})
    assert cfg.token_file == str(abs_tok)
    assert cfg.bearer_token() == "abs"

    home = tmp_path / "home"
    home.mkdir()
    (home / "tok").write_text("from-home")
    monkeypatch.setenv("HOME", str(home))
    cfg = load_kubeconfig(_write(tmp_path / "b", {"tokenFile": "~/tok"}), env={})
    assert cfg.token_file == str(home / "tok")
    assert cfg.bearer_token() == "from-home"


def test_token_file_wins_over_static_token_and_is_re_read(tmp_path: Path) -> None:
    tok = tmp_path / "token"
    tok.write_text("file-one")
    cfg = load_kubeconfig(_write(tmp_path, {"token": "static", "tokenFile": "token"}), env={})
    assert cfg.token == "static"
    assert cfg.bearer_token() == "file-one"
    tok.write_text("file-two-rotated")
    os.utime(tok, ns=(1, 2_000_000_000_000_000_000))  # a distinct mtime whatever the fs clock
    assert cfg.bearer_token() == "file-two-rotated"


def test_missing_token_file_at_load_is_a_clear_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope" / "token")
    with pytest.raises(KubeConfigError) as err:
        load_kubeconfig(_write(tmp_path, {"tokenFile": "nope/token"}), env={})
    msg = str(err.value)
    assert "user 'u1'" in msg and f"tokenFile {missing}" in msg
    assert "No such file or directory" in msg


def test_unreadable_token_file_at_load_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "tokdir").mkdir()  # a directory: read fails (IsADirectoryError), even as root
    with pytest.raises(KubeConfigError, match="Is a directory"):
        load_kubeconfig(_write(tmp_path, {"tokenFile": "tokdir"}), env={})


async def test_token_file_gone_after_load_warns_and_sends_no_credentials(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bigfleet_trio.kube.config")
    (tmp_path / "nope").mkdir()
    (tmp_path / "nope" / "token").write_text("t0\n")
    cfg = load_kubeconfig(_write(tmp_path, {"tokenFile": "nope/token"}), env={})
    missing = str(tmp_path / "nope" / "token")
    assert cfg.token_file == missing
    os.remove(missing)
    assert cfg.bearer_token() is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert msg.startswith(f"kube token file unreadable file={missing} err=")
    assert "No such file or directory" in msg
    assert await _auth_header_sent(cfg) is None


def test_token_file_turned_unreadable_after_load_warns_and_returns_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bigfleet_trio.kube.config")
    (tmp_path / "tokdir").write_text("t0")
    cfg = load_kubeconfig(_write(tmp_path, {"tokenFile": "tokdir"}), env={})
    os.remove(tmp_path / "tokdir")
    (tmp_path / "tokdir").mkdir()  # now a directory: read fails (IsADirectoryError), even as root
    assert cfg.bearer_token() is None
    [rec] = [r for r in caplog.records if "kube token file unreadable" in r.getMessage()]
    assert rec.levelno == logging.WARNING
    assert f"file={tmp_path / 'tokdir'}" in rec.getMessage()
    assert "Is a directory" in rec.getMessage()


def test_token_file_gone_after_load_falls_back_to_static_token(tmp_path: Path) -> None:
    (tmp_path / "gone").write_text("first")
    cfg = load_kubeconfig(_write(tmp_path, {"token": "static", "tokenFile": "gone"}), env={})
    os.remove(tmp_path / "gone")  # before the first read: nothing cached to keep
    assert cfg.bearer_token() == "static"
    (tmp_path / "gone").write_text("appeared")
    assert cfg.bearer_token() == "appeared"  # the file is looked at again on every call


def test_token_file_read_once_then_gone_keeps_the_last_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bigfleet_trio.kube.config")
    (tmp_path / "tok").write_text("first\n")
    cfg = load_kubeconfig(_write(tmp_path, {"token": "static", "tokenFile": "tok"}), env={})
    assert cfg.bearer_token() == "first"
    os.remove(tmp_path / "tok")  # a rotation in progress: the last token stays in use
    assert cfg.bearer_token() == "first"
    assert "keeping last token" in caplog.records[-1].getMessage()
