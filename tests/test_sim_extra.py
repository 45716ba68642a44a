"""The simulation's own dependencies: the `sim` extra, never product code's nor the image's."""

from __future__ import annotations

import ast
import importlib
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from bigfleet_trio import cli

ROOT = Path(__file__).resolve().parent.parent


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


def test_sim_only_distributions_are_the_sim_extra() -> None:
    project = _project()
    sim = {Requirement(r).name for r in project["optional-dependencies"]["sim"]}
    assert {"jsonpatch", "jsonschema"} <= sim
    runtime = " ".join(project["dependencies"])
    for dist in cli.SIM_ONLY:
        assert dist not in runtime, f"{dist} is simulation-only: the `sim` extra, not dependencies"
    assert "bigfleet-trio[sim]" in project["optional-dependencies"]["test"]


def test_the_image_installs_no_sim_only_distribution() -> None:
    constraints = (ROOT / "constraints.txt").read_text().lower()
    dockerfile = (ROOT / "Dockerfile").read_text()
    for dist in cli.SIM_ONLY:
        assert f"\n{dist}==" not in constraints, f"constraints.txt (the image's closure) has {dist}"
    assert "[sim]" not in dockerfile and "[test]" not in dockerfile
    assert "pip install --no-deps --no-build-isolation ." in dockerfile


def test_product_code_imports_no_sim_only_distribution() -> None:
    bad = []
    for path in sorted((ROOT / "bigfleet_trio").rglob("*.py")):
        if "sim" in path.relative_to(ROOT / "bigfleet_trio").parts[:-1]:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module
                     and not node.level else [])
            bad += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                    if n.partition(".")[0] in cli.SIM_ONLY]
    assert not bad, "product code imports simulation-only distributions:\n" + "\n".join(bad)


def test_demo_without_the_sim_extra_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.import_module

    def no_jsonpatch(name: str, *a: Any) -> Any:
        if name == cli.SIM_COMMANDS:
            raise ModuleNotFoundError("No module named 'jsonpatch'", name="jsonpatch")
        return real(name, *a)

    monkeypatch.setattr(importlib, "import_module", no_jsonpatch)
    monkeypatch.setattr(cli, "_sim_missing", [])
    assert cli.main(["demo"]) == cli.USAGE_EXIT
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["demo: the simulation needs the sim extra: pip install -e '.[sim]' "
                   "(jsonpatch is missing)"]
