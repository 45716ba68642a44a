"""The Go peer's generated code (interop/goshard/bigfleetpb) is what ``scripts/gen-goshard``
makes from proto/ today, with the generator versions go.mod pins (docs/wire.md#go-interop)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.interop._peer import REPO

pytestmark = [pytest.mark.interop, pytest.mark.slow]


def test_generated_go_code_is_current(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(REPO / "scripts" / "gen-goshard"), str(tmp_path)],
        capture_output=True, text=True, timeout=1200, env={**os.environ, "PYTHON": sys.executable},
    )
    assert out.returncode == 0, out.stderr
    committed = REPO / "interop" / "goshard" / "bigfleetpb"
    fresh = {p.name: p.read_bytes() for p in tmp_path.glob("*.go")}
    assert sorted(fresh) == sorted(p.name for p in committed.glob("*.go"))
    stale = [name for name, data in fresh.items() if (committed / name).read_bytes() != data]
    assert not stale, f"regenerate with scripts/gen-goshard: {stale} differ"
