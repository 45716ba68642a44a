"""Benchmark dispatcher: ``python -m scripts.bench <command> [--quick] [--json]`` (from the
repository root).

Commands (each prints a table: median/min/max of repeated runs and the baseline measured in the
same run; ``--quick`` small, ``--json`` machine-readable); ``--help`` lists them all, ``all``
runs every scenario, one process each (``all --quick`` is the CI smoke run: it reports, it never
asserts on timing).

Adding a command: add a module ``scripts/bench/<name>.py`` defining ``register(subparsers)``; it
adds its own sub-parser with ``set_defaults(func=run)`` and ``parents=[subparsers.common]``
(``--quick``/``--json``), where ``run(args) -> dict`` returns a result built with
``scripts.bench._common.result``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import subprocess
import sys
import time
from typing import Any

import scripts.bench as package
from scripts.bench import _common as C

ALL_ORDER = [
    "rollup", "informer", "stream", "nodestate", "podcontroller", "reclaim", "connect", "apiserver"
]


def load_scenarios(sub: Any, common: argparse.ArgumentParser) -> list[str]:
    """Import every public module of this package and let it register its sub-command."""
    names: list[str] = []
    sub.common = common
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
            names.append(info.name)
    return names


def _run_all(args: argparse.Namespace, scenarios: list[str]) -> dict[str, Any]:
    """Run every scenario in its own process (fresh memory, no cross-talk), one at a time."""
    chosen = [s for s in ALL_ORDER if s in scenarios] + sorted(set(scenarios) - set(ALL_ORDER))
    if args.only:
        chosen = [s for s in chosen if s in args.only.split(",")]
    results: dict[str, Any] = {}
    timings: list[dict[str, Any]] = []
    failed: list[str] = []
    for name in chosen:
        cmd = [sys.executable, "-m", "scripts.bench", name, "--json"]
        if args.quick:
            cmd.append("--quick")
        print(f"-- {name}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=C.ROOT)
        secs = time.perf_counter() - t0
        timings.append(C.figure(f"{name} wall time", "s", secs))
        if proc.returncode != 0:
            failed.append(name)
            print(f"!! {name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}",
                  file=sys.stderr, flush=True)
            continue
        try:
            res = json.loads(proc.stdout)
        except json.JSONDecodeError:
            failed.append(name)
            print(f"!! {name}: output is not JSON:\n{proc.stdout[-2000:]}", file=sys.stderr)
            continue
        results[name] = res
        if not args.json:
            C.print_result(res)
            print(flush=True)
    summary = C.result("all", {"quick": args.quick, "scenarios": chosen}, timings,
                       [f"FAILED: {', '.join(failed)}"] if failed else [])
    summary["results"] = results
    summary["failed"] = failed
    return summary


def main(argv: list[str] | None = None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--quick", action="store_true", help="small, fast run")
    common.add_argument("--json", action="store_true", help="print figures as JSON")
    parser = argparse.ArgumentParser(
        prog="python -m scripts.bench",
        description="Benchmarks (run from the repository root); every figure is reported beside "
        "a baseline measured in the same run",
        epilog="Sub-commands: " + ", ".join(ALL_ORDER) + ", all (every scenario, one process "
        "each; `all --quick` is the CI smoke run: it reports, it never asserts on timing).",
    )
    # SCENARIO, not the choices: the internal sub-commands (_stream-server...) stay out of --help
    sub = parser.add_subparsers(dest="command", required=True, metavar="SCENARIO")
    scenarios = load_scenarios(sub, common)
    p_all = sub.add_parser("all", parents=[common], help="run every scenario, one at a time")
    p_all.add_argument("--only", default="", help="comma-separated subset")
    p_all.set_defaults(func=lambda a: _run_all(a, scenarios))
    args = parser.parse_args(argv)
    result = args.func(args)
    if getattr(args, "internal", False):
        return 0
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
    elif isinstance(result, dict) and "figures" in result:
        C.print_result(result)
    else:
        for key, value in result.items():
            print(f"{key:32} {value}")
    if args.command == "all" and result.get("failed"):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
