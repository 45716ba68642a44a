"""Shared helpers for the ``python -m scripts.bench`` sub-commands.

Every sub-command's ``run(args)`` returns a *result* dict::

    {
      "scenario": "nodestate",
      "params": {...},                       # sizes, rounds, knobs
      "figures": [                           # one row per figure (see :func:`figure`)
        {"figure": ..., "unit": ..., "median": ..., "min": ..., "max": ..., "n": ...,
         "baseline": ..., "baseline_label": ..., "ratio": ..., "target": ..., "met": ...},
      ],
      "notes": [...],                        # free text (what bounds the figure)
      "extra": {...},                        # anything else (raw samples, counters)
    }

:func:`print_result` renders it as a table. Timing targets are *reported* (``met``), never
asserted: the CI smoke run (``python -m scripts.bench all --quick``) must not fail on a
slow machine.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent.parent
ROOT = SCRIPTS.parent


def stats(samples: Sequence[float]) -> dict[str, float]:
    """Median, min and max of ``samples`` (all equal to the one sample when there is one)."""
    if not samples:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {
        "median": float(statistics.median(samples)),
        "min": float(min(samples)),
        "max": float(max(samples)),
        "n": len(samples),
    }


def figure(
    name: str,
    unit: str,
    samples: Sequence[float] | float,
    *,
    baseline: Sequence[float] | float | None = None,
    baseline_label: str = "",
    ratio: float | None = None,
    target: str = "",
    met: Callable[[float, float | None], bool] | bool | None = None,
) -> dict[str, Any]:
    """One table row.

    Args:
        name: what is measured.
        unit: of ``samples`` and ``baseline``.
        samples: the repeated measurements (or one number).
        baseline: the same quantity measured on the baseline path in the same run.
        baseline_label: what the baseline is.
        ratio: explicit ratio; default: with a baseline, the median of the per-round ratios
            when both have the same number (>1) of samples (rounds are paired: a shared
            machine's load changes between rounds), else median / baseline median.
        target: the figure's target (BENCHMARKS.md's target column), as text.
        met: a bool, or ``f(median, ratio) -> bool``, or None (no target).
    """
    s = stats([samples] if isinstance(samples, (int, float)) else list(samples))
    row: dict[str, Any] = {"figure": name, "unit": unit, **s}
    if baseline is not None:
        b = stats([baseline] if isinstance(baseline, (int, float)) else list(baseline))
        row["baseline"] = b["median"]
        row["baseline_min"] = b["min"]
        row["baseline_max"] = b["max"]
        row["baseline_label"] = baseline_label
        if ratio is None:
            base_list = [baseline] if isinstance(baseline, (int, float)) else list(baseline)
            own = [samples] if isinstance(samples, (int, float)) else list(samples)
            if len(own) == len(base_list) > 1 and all(base_list):
                # paired rounds (same round = same machine conditions): median of the ratios
                ratio = float(statistics.median(a / b for a, b in zip(own, base_list, strict=True)))
            elif b["median"]:
                ratio = s["median"] / b["median"]
    row["ratio"] = ratio
    row["target"] = target
    if callable(met):
        row["met"] = bool(met(s["median"], ratio))
    else:
        row["met"] = met
    return row


def result(
    scenario: str,
    params: dict[str, Any],
    figures: list[dict[str, Any]],
    notes: list[str] | None = None,
    extra: dict[str, Any] | None = None,
    tables: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """The common result dict (see module docstring); adds the machine facts. ``tables``:
    title -> preformatted text lines, printed after the notes (e.g. requests per Pod)."""
    out = {
        "scenario": scenario,
        "params": params,
        "machine": machine(),
        "figures": figures,
        "notes": notes or [],
        "extra": extra or {},
    }
    if tables:
        out["tables"] = tables
    return out


def machine() -> dict[str, Any]:
    """nproc, Python version and the 1-minute load average (noisy machines are noted)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    return {
        "nproc": os.cpu_count(),
        "python": sys.version.split()[0],
        "loadavg_1m": round(load, 2),
    }


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if value != value:  # nan
            return "nan"
        a = abs(value)
        if a >= 1000:
            return f"{value:,.0f}"
        if a >= 100:
            return f"{value:.1f}"
        if a >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


def print_result(res: dict[str, Any], out: Any = None) -> None:
    """Print a result as a fixed-width table (figures), then params and notes."""
    out = out or sys.stdout
    params = ", ".join(f"{k}={v}" for k, v in res.get("params", {}).items())
    mach = res.get("machine", {})
    print(
        f"== {res.get('scenario')}  ({params})  [nproc={mach.get('nproc')} "
        f"python={mach.get('python')} load1m={mach.get('loadavg_1m')}]",
        file=out,
    )
    cols = ["figure", "unit", "median", "min", "max", "n", "baseline", "ratio", "target", "met"]
    rows = [[_fmt(r.get(c)) for c in cols] for r in res.get("figures", [])]
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)), file=out)
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)), file=out)
    labels = {r["baseline_label"] for r in res.get("figures", []) if r.get("baseline_label")}
    for label in sorted(labels):
        print(f"   baseline: {label}", file=out)
    for note in res.get("notes", []):
        print(f"   note: {note}", file=out)
    for title, lines in (res.get("tables") or {}).items():
        print(f"   {title}", file=out)
        for line in lines:
            print(f"     {line}", file=out)


_SERVER = """
import sys, trio
from bigfleet_trio.sim.apiserver import ApiServer, serve
async def main():
    api = ApiServer(pdb_controller=sys.argv[2] == "1")
    async with trio.open_nursery() as n:
        url = await n.start(lambda task_status: serve(api, engine=sys.argv[1],
                                                      task_status=task_status))
        print(url, flush=True)
        await trio.sleep_forever()
trio.run(main)
"""


class ApiServerProcess:
    """The embedded apiserver in a child process (its own CPU), over loopback HTTP.

    Usage: ``with ApiServerProcess(engine="fast") as srv: srv.url, srv.cpu()``.
    """

    def __init__(self, engine: str = "fast", pdb_controller: bool = False) -> None:
        self.engine = engine
        self.pdb_controller = pdb_controller
        self.url = ""
        self.proc: Any = None

    def __enter__(self) -> ApiServerProcess:
        import subprocess

        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER, self.engine, "1" if self.pdb_controller else "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http"):
            self.proc.kill()
            raise RuntimeError(f"apiserver did not start: {self.url!r}")
        return self

    def cpu(self) -> float:
        """CPU seconds (user+sys) the server process has used."""
        with open(f"/proc/{self.proc.pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except Exception:  # noqa: BLE001 - bench clean-up
            self.proc.kill()


class CountingClient:
    """Wraps a KubeClient and counts the requests the code under test sends, by verb."""

    WRITES = ("create", "patch", "update", "delete", "evict")

    def __init__(self, client: Any) -> None:
        self._client = client
        self.counts: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        async def counted(*args: Any, **kwargs: Any) -> Any:
            key = name
            if name == "patch" and kwargs.get("subresource"):
                key = f"patch/{kwargs['subresource']}"
            self.counts[key] = self.counts.get(key, 0) + 1
            return await attr(*args, **kwargs)

        return counted

    def writes(self) -> int:
        return sum(n for k, n in self.counts.items() if k.split("/")[0] in self.WRITES)

    def reset(self) -> None:
        self.counts.clear()
