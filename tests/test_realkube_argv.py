"""scripts/realkube's command lines without the binaries: a scale test's extra flags go last,
per component, and a misspelt component name is refused rather than silently ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.bench._realkube import SCALE_ARGS
from scripts.realkube.build import Binaries
from scripts.realkube.controlplane import COMPONENTS, ControlPlane
from scripts.realkube.pki import write_pki


def plane(tmp_path: Path, **kw: object) -> ControlPlane:
    bins = tmp_path / "bin"
    bins.mkdir(parents=True)
    for name in ("kwok", "kwok-stages.yaml"):
        (bins / name).write_text("")
    cp = ControlPlane(Binaries(bins), tmp_path / "cp", **kw)  # type: ignore[arg-type]
    cp.pki = write_pki(tmp_path / "pki")
    return cp


def test_extra_args_are_appended_to_their_component_only(tmp_path: Path) -> None:
    plain = plane(tmp_path / "a")
    scaled = plane(tmp_path / "b", extra_args=SCALE_ARGS)
    for name in COMPONENTS:
        base, extra = plain.argv(name), list(SCALE_ARGS.get(name, ()))
        got = scaled.argv(name)
        # same flags as the plain plane up to the ports each plane chose
        assert len(got) == len(base) + len(extra)
        assert got[len(base):] == extra, name


def test_extra_args_for_an_unknown_component_are_refused(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="kube-schedular"):
        plane(tmp_path, extra_args={"kube-schedular": ("--v", "2")})


def test_nice_runs_each_component_under_nice_with_its_own_command_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    started: list[list[str]] = []

    class Proc:
        def __init__(self, argv: list[str], **_: object) -> None:
            started.append(argv)

    cp = plane(tmp_path, nice=10)
    cp.logs_dir.mkdir(parents=True)
    monkeypatch.setattr(subprocess, "Popen", Proc)
    monkeypatch.setattr(cp, "_wait", lambda *a, **k: None)
    cp._start("kube-apiserver")
    assert started == [["nice", "-n", "10", *cp.argv("kube-apiserver")]]
    plain = plane(tmp_path / "plain")
    plain.logs_dir.mkdir(parents=True)
    monkeypatch.setattr(plain, "_wait", lambda *a, **k: None)
    plain._start("etcd")
    assert started[1] == plain.argv("etcd")
