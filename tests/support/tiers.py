"""Tiers that need something built or installed first, and the one line each prints when it
skipped for want of it (pytest plugin, loaded by tests/conftest.py).

A test of such a tier skips with its tier's reason (:data:`TIERS`); at the end of the run the
terminal summary says, per tier, how many tests skipped and what to build or install, so a plain
``pytest -q`` never skips a tier silently (README.md).
"""

from __future__ import annotations

from typing import Any

from scripts.realkube import BUILD_HINT
from tests.interop._peer import NO_GO
from tests.support.realkube import SKIP_REASON as REALKUBE_SKIP

__all__ = ["CHROMIUM_SKIP", "HELM_SKIP", "MATPLOTLIB_SKIP", "PROMETHEUS_SKIP", "PROMTOOL_SKIP",
           "TIERS",
           "pytest_terminal_summary"]

HELM_SKIP = f"helm not built: run `{BUILD_HINT}`"
PROMTOOL_SKIP = f"promtool not built: run `{BUILD_HINT}`"
PROMETHEUS_SKIP = f"prometheus not built: run `{BUILD_HINT}`"
MATPLOTLIB_SKIP = "matplotlib not installed: pip install -e '.[bench]'"
CHROMIUM_SKIP = "chromium not installed: apt-get install chromium (Debian's package)"

TIERS = {
    "realkube": REALKUBE_SKIP,
    "helm": HELM_SKIP,
    "promtool": PROMTOOL_SKIP,
    "prometheus": PROMETHEUS_SKIP,
    "interop": NO_GO,
    "bench plots": MATPLOTLIB_SKIP,
    "chromium": CHROMIUM_SKIP,
}
"""Tier -> the skip reason its tests give."""


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line for each tier that skipped for want of what it needs."""
    skipped = [str(getattr(r, "longrepr", "")) for r in terminalreporter.stats.get("skipped", [])]
    for tier, reason in TIERS.items():
        count = sum(reason in text for text in skipped)
        if count:
            tests = "test" if count == 1 else "tests"
            terminalreporter.write_line(f"{tier} tier: {count} {tests} skipped, {reason}")
