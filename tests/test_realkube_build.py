"""``scripts.realkube build`` holds its pins: checked with a stand-in ``go`` on PATH (no build)."""

from __future__ import annotations

import importlib
import os
import stat
from pathlib import Path

import pytest

rk = importlib.import_module("scripts.realkube.build")


def test_pin_mismatches_names_each_module_off_its_pin() -> None:
    pins = {"go.etcd.io/etcd/server/v3": "v3.6.16", "go.etcd.io/etcd/api/v3": "v3.6.16"}
    assert rk.pin_mismatches(dict(pins), pins) == []
    assert rk.pin_mismatches({"go.etcd.io/etcd/server/v3": "v3.7.3"}, pins) == [
        "go.etcd.io/etcd/api/v3: pinned v3.6.16, resolved nothing",
        "go.etcd.io/etcd/server/v3: pinned v3.6.16, resolved v3.7.3",
    ]


def _fake_go(tmp_path: Path, resolved_version: str) -> Path:
    """A ``go`` that logs its argv and answers ``go list -m`` with ``resolved_version``."""
    calls = tmp_path / "calls"
    script = tmp_path / "bin" / "go"
    script.parent.mkdir()
    script.write_text(f"""#!/bin/sh
echo "$@" >> {calls}
if [ "$1" = list ]; then
  shift 4
  for m in "$@"; do echo "$m {resolved_version}"; done
fi
if [ "$1" = mod ] && [ "$2" = init ]; then echo "module x" > go.mod; fi
exit 0
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return calls


def test_etcd_build_states_every_pin_even_over_an_old_go_mod(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_go(tmp_path, rk.ETCD_VERSION)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    src = tmp_path / "cache" / f"etcd-{rk.ETCD_VERSION}"
    src.mkdir(parents=True)
    # a go.mod left by an earlier run that resolved etcd by itself
    (src / "go.mod").write_text("module x\nrequire go.etcd.io/etcd/server/v3 v3.7.3\n")
    (src / "go.sum").write_text("")
    out = tmp_path / "bin-out"
    out.mkdir()
    rk._build_etcd(tmp_path / "cache", out, {})
    lines = calls.read_text().splitlines()
    for mod in rk.ETCD_MODULES:
        assert f"mod edit -require={mod}@{rk.ETCD_VERSION}" in lines
    assert lines.index("mod tidy") < next(i for i, ln in enumerate(lines) if ln.startswith("build"))


def test_a_resolution_off_the_pin_fails_naming_the_module(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_go(tmp_path, "v3.7.3")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "bin-out"
    out.mkdir()
    with pytest.raises(rk.BuildError, match=r"go.etcd.io/etcd/server/v3: pinned v3.6.16, "
                                            r"resolved v3.7.3"):
        rk._build_etcd(tmp_path / "cache", out, {})
    assert not any(ln.startswith("build") for ln in calls.read_text().splitlines())


def test_one_build_at_a_time_per_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """While a build holds the cache's lock another cannot take it, and a waiting one says what
    it waits for; the lock is free again after the block."""
    import fcntl

    from scripts.realkube.build import build_lock

    with build_lock(tmp_path):
        with open(tmp_path / ".build.lock") as probe:
            with pytest.raises(BlockingIOError):
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(tmp_path / ".build.lock") as probe:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
        fcntl.flock(probe, fcntl.LOCK_UN)
    assert capsys.readouterr().err == ""
