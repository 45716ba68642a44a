"""The helm tier's support: the pinned helm binary (scripts/realkube/tools.py) or a skip.

Without the binary every helm test skips, and the run ends with one line naming the build
command (tests/support/tiers.py); with ``BIGFLEET_REQUIRE_REALKUBE=1`` (CI, where Go is
present) that is a failure instead.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts.realkube.tools import find_tool
from tests.support.realkube import REQUIRE_ENV
from tests.support.tiers import HELM_SKIP

CHART = Path(__file__).resolve().parents[2] / "charts" / "bigfleet-trio"


def helm_binary() -> str:
    """The built helm; else skip (fail under ``BIGFLEET_REQUIRE_REALKUBE``)."""
    found = find_tool("helm")
    if found is None:
        msg = HELM_SKIP
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{msg} ({REQUIRE_ENV} is set)", pytrace=False)
        pytest.skip(msg)
    return found


def helm(*args: str, check: bool = True, env: dict[str, str] | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run helm (its caches under the test's own HOME-less dirs); raise on failure if ``check``."""
    proc = subprocess.run([helm_binary(), *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def template(*args: str, namespace: str = "bigfleet-system") -> list[dict[str, Any]]:
    """``helm template`` of the chart as parsed documents (no CRDs unless asked)."""
    out = helm("template", "bigfleet-trio", str(CHART), "--namespace", namespace, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]
