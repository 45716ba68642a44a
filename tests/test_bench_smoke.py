"""Smoke test of the benchmark harness: every sub-command registers, and the cheapest
configuration of one scenario produces a well-formed result. No timing is asserted (speed is
measured by ``python -m scripts.bench``, never in tests)."""

from __future__ import annotations

import argparse
import io
from typing import Any

from scripts.bench import _common as common
from scripts.bench import rollup
from scripts.bench.__main__ import load_scenarios


def test_every_scenario_registers() -> None:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--quick", action="store_true")
    parent.add_argument("--json", action="store_true")
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    names = load_scenarios(sub, parent)
    assert {
        "rollup", "informer", "nodestate", "podcontroller", "reclaim", "connect", "apiserver",
        "stream", "kubehttp",
    } <= set(names)


def test_rollup_smallest_result_is_well_formed() -> None:
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


def test_help_hides_internal_sub_commands() -> None:
    """``python -m scripts.bench --help`` lists the scenarios, not the helpers they start."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "scripts.bench", "--help"], check=True,
                         capture_output=True, text=True).stdout
    assert "_stream-server" not in out and "_bootstrap-burst-shard" not in out
    assert "rollup" in out


def test_podcontroller_contestants_go_first_in_turn() -> None:
    from scripts.bench.podcontroller import rotate

    orders = [rotate(["ours", "go", "kopf"], r) for r in range(3)]
    assert [o[0] for o in orders] == ["ours", "go", "kopf"]
    assert all(sorted(o) == ["go", "kopf", "ours"] for o in orders)
    assert rotate([], 1) == []


def test_podcontroller_go_peer_skips_in_one_line_without_go(monkeypatch: Any) -> None:
    import shutil

    from scripts.bench import podcontroller

    monkeypatch.setattr(shutil, "which", lambda _name: None)
    binary, reason = podcontroller.go_peer()
    assert binary is None
    assert reason == "Go peer skipped: no Go toolchain (`go` not on PATH)"
