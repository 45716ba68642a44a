"""The embedded apiserver as a separate process over real HTTP(S), for tests that need a server
they reach like any other (the differential test): ``bigfleet-trio sim apiserver`` with RBAC.
Also :data:`SHARD_LISTENING`, how a test finds the port ``bigfleet-trio sim shard --port 0``
bound.

Usage::

    with sim_apiserver_process(tmp_path) as kubeconfig:   # path of the admin kubeconfig
        ...
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["SHARD_LISTENING", "sim_apiserver_process"]

#: The line ``bigfleet-trio sim shard`` logs once it listens; group 1 is the port it bound
#: (with ``--port 0``, one the kernel picked: no other process can take it between a test's
#: choice and the bind). Written by bigfleet_trio/sim/shard/cli.py.
SHARD_LISTENING = re.compile(r"sim shard listening on \S+:(\d+)")


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
