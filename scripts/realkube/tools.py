"""The operator-facing tools the helm and alerting tiers use, built from their Go modules into
the same cache as the control plane (never into the repository): ``helm`` (the chart under
charts/), ``promtool`` (the alert rules under config/monitoring/) and ``prometheus`` (the same
rules evaluated over the running binaries' scrapes, tests/sim/test_pieces_alerts.py).

Layout: ``<cache>/tools/helm-v3.21.4/helm``, ``<cache>/tools/promtool-v0.316.0/promtool``,
``<cache>/tools/prometheus-v0.316.0/prometheus``.
Idempotent: a tool that exists is not rebuilt; a new pin is a new directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .build import BuildError, cache_dir

__all__ = ["HELM_VERSION", "PROMTOOL_VERSION", "TAGS", "TOOLS", "build_tools", "find_tool"]

HELM_VERSION = "v3.21.4"
PROMTOOL_VERSION = "v0.316.0"
TOOLS = {
    "helm": ("helm.sh/helm/v3/cmd/helm", HELM_VERSION),
    "promtool": ("github.com/prometheus/prometheus/cmd/promtool", PROMTOOL_VERSION),
    "prometheus": ("github.com/prometheus/prometheus/cmd/prometheus", PROMTOOL_VERSION),
}
"""Tool name -> (Go package, pinned module version)."""
TAGS = {"prometheus": "remove_all_sd"}
"""Tool name -> Go build tags. Prometheus without its cloud service discoveries (static targets
are all the tests scrape): about 3 minutes to build instead of many more, and a smaller binary."""


def _path(name: str, root: Path | None = None) -> Path:
    _pkg, version = TOOLS[name]
    return (root or cache_dir()) / "tools" / f"{name}-{version}" / name


def find_tool(name: str, root: Path | None = None) -> str | None:
    """The built tool's path (``helm``, ``promtool`` or ``prometheus``), or None."""
    path = _path(name, root)
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def build_tools(root: Path | None = None) -> dict[str, str]:
    """``go install`` each missing tool at its pin; print one line per tool.

    Returns tool name -> path. Raises BuildError without go or when a build fails (the log is
    ``<cache>/tools/<name>-<version>.log``).
    """
    if shutil.which("go") is None:
        raise BuildError("no go toolchain on PATH (https://go.dev/doc/install)")
    out: dict[str, str] = {}
    for name, (pkg, version) in TOOLS.items():
        path = _path(name, root)
        if find_tool(name, root) is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            log = path.parent.with_suffix(".log")
            start = time.monotonic()
            with log.open("w") as fh:
                tags = ["-tags", TAGS[name]] if name in TAGS else []
                proc = subprocess.run(["go", "install", *tags, f"{pkg}@{version}"], stdout=fh,
                                      stderr=subprocess.STDOUT, check=False,
                                      env={**os.environ, "GOBIN": str(path.parent),
                                           "CGO_ENABLED": "0"})
            if proc.returncode != 0:
                raise BuildError(f"go install {pkg}@{version} failed (exit {proc.returncode}), "
                                 f"log {log}")
            print(f"{name:<24} {version:<12} built in {time.monotonic() - start:.0f}s  {path}",
                  file=sys.stderr)
        else:
            print(f"{name:<24} {version:<12} cached  {path}", file=sys.stderr)
        out[name] = str(path)
    return out
