"""``python -m scripts.realkube build`` | ``up --kubeconfig-out PATH [--nodes N]``.

Exactly these two forms: other tools (the fleet benchmark, CI) drive them.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from . import BUILD_HINT, BuildError, ControlPlane, ControlPlaneError, build, find_binaries
from .tools import build_tools


class _Stop(Exception):
    pass


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


def up(kubeconfig_out: Path, nodes: int) -> int:
    """Start the control plane, install the project's CRDs, copy the admin kubeconfig to
    ``kubeconfig_out``, print ``ready ...`` and block until SIGTERM/SIGINT (or a component
    exits: exit 1)."""
    binaries = find_binaries()
    if binaries is None:
        print(f"the real control-plane binaries are not built: run `{BUILD_HINT}`",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    workdir = Path(tempfile.mkdtemp(prefix="realkube-"))
    cp = ControlPlane(binaries, workdir, nodes=nodes)
    try:
        cp.start()
        cp.install_crds()  # so the agent's pieces run against it as they are
        # the kubeconfig names the certificates inside workdir by absolute path
        kubeconfig_out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cp.kubeconfig, kubeconfig_out)
        kubeconfig_out.chmod(0o600)
        pids = " ".join(f"{n}={p}" for n, p in cp.pids().items())
        print(f"ready server={cp.server} kubeconfig={kubeconfig_out} nodes={nodes} "
              f"workdir={workdir} {pids}", flush=True)
        while True:
            time.sleep(1)
            cp.check_alive()
    except _Stop as stop:
        print(f"{stop}: stopping", file=sys.stderr)
        return 0
    except ControlPlaneError as exc:
        print(f"realkube: {exc}", file=sys.stderr)
        return 1
    finally:
        # ignore a second Ctrl-C while the components stop
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cp.stop()
        cp.remove()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.realkube", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build the pinned binaries, helm and promtool (cached; prints "
                   "versions and times)")
    p_up = sub.add_parser("up", help="start the control plane on loopback until SIGTERM/Ctrl-C")
    p_up.add_argument("--kubeconfig-out", type=Path, required=True,
                      help="where to write the admin kubeconfig")
    p_up.add_argument("--nodes", type=int, default=3, help="fake Nodes run by kwok (default 3)")
    args = parser.parse_args(argv)
    if args.command == "build":
        try:
            build()
            build_tools()
        except BuildError as exc:
            print(f"realkube build: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.nodes < 0:
        parser.error("--nodes must be >= 0")
    return up(args.kubeconfig_out, args.nodes)


if __name__ == "__main__":
    sys.exit(main())
