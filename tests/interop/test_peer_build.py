"""A plain ``pytest`` that has to build the Go peer says so with one line first; a cached or
prebuilt peer is used without a word (tests/interop/_peer.py). The build script is a stand-in
here, so no Go toolchain is needed."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.interop import _peer

STUB = """#!/bin/sh
bin="{bin}"
if [ "$1" = "--path" ]; then echo "$bin"; exit 0; fi
printf '#!/bin/sh\\n' > "$bin"; chmod +x "$bin"; echo "$bin"
"""


@pytest.fixture
def fake_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "repo" / "scripts" / "build-goshard"
    script.parent.mkdir(parents=True)
    binary = tmp_path / "goshard-0123"
    script.write_text(STUB.format(bin=binary))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(_peer, "REPO", tmp_path / "repo")
    monkeypatch.delenv("BIGFLEET_GOSHARD_BIN", raising=False)
    return binary


def test_a_build_is_announced_with_one_line_then_a_cached_peer_is_not(fake_repo: Path) -> None:
    lines: list[str] = []
    assert _peer.build_goshard(lines.append) == str(fake_repo)
    assert lines == [f"{_peer.BUILDING} {fake_repo} (set BIGFLEET_GOSHARD_BIN to use a built "
                     "one)"]
    assert _peer.build_goshard(lines.append) == str(fake_repo)
    assert len(lines) == 1


def test_a_prebuilt_peer_is_used_as_is(fake_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BIGFLEET_GOSHARD_BIN", "/opt/goshard")
    lines: list[str] = []
    assert _peer.build_goshard(lines.append) == "/opt/goshard"
    assert not lines and not fake_repo.exists()
