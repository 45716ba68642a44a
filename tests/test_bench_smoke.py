"""Smoke test of the benchmark harness (issue 8): every sub-command registers, and the cheapest
configuration of one scenario produces a well-formed result. No timing is asserted (speed is
measured by ``scripts/bench.py``, never in tests)."""

from __future__ import annotations

import argparse
import importlib.util
import io
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_scenario_registers() -> None:
    bench = _load(SCRIPTS / "bench.py", "bench_entry_under_test")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--quick", action="store_true")
    common.add_argument("--json", action="store_true")
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    names = bench._load_plugins(sub, common)
    assert sorted(names) == sorted(
        ["rollup", "informer", "nodestate", "podcontroller", "reclaim", "connect", "apiserver"]
    )
    assert set(bench.ALL_ORDER) == {*names, "stream"}


def test_rollup_smallest_result_is_well_formed() -> None:
    sys.path.insert(0, str(SCRIPTS / "bench"))
    rollup = _load(SCRIPTS / "bench" / "rollup.py", "bench_rollup_under_test")
    common = _load(SCRIPTS / "bench" / "_common.py", "bench_common_under_test")
    args = argparse.Namespace(quick=False, json=False, sizes="50,100", repeat=1)
    res = rollup.run(args)
    assert res["scenario"] == "rollup"
    assert res["notes"] == []  # the incremental aggregate equals the from-scratch rebuild
    for row in res["figures"]:
        assert {"figure", "unit", "median", "min", "max", "ratio", "target", "met"} <= set(row)
        assert row["min"] <= row["median"] <= row["max"]
    out = io.StringIO()
    common.print_result(res, out)
    assert "idle cycle @100 CRs" in out.getvalue()
