"""The embedded apiserver as a separate process over real HTTP(S), for tests that need a server
they reach like any other (the differential test): ``bigfleet-trio sim apiserver`` with RBAC.

Usage::

    with sim_apiserver_process(tmp_path) as kubeconfig:   # path of the admin kubeconfig
        ...
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["sim_apiserver_process"]


@contextmanager
def sim_apiserver_process(tmp: Path, *, authorization_mode: str = "RBAC") -> Iterator[str]:
    """Start ``bigfleet-trio sim apiserver --port 0`` and yield its kubeconfig path; the
    process is terminated (by pid) on exit.

    Raises:
        RuntimeError: the process exited or printed no ready line within 60 s.
    """
    kubeconfig = tmp / "sim-apiserver.kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bigfleet_trio", "sim", "apiserver", "--port", "0",
         "--kubeconfig-out", str(kubeconfig), "--authorization-mode", authorization_mode],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "apiserver listening on URL; kubeconfig written to ..."
        if "listening" not in line:
            raise RuntimeError(f"sim apiserver did not start (exit {proc.poll()}): {line!r}")
        yield str(kubeconfig)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
