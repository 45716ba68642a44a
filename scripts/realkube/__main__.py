"""``python -m scripts.realkube build`` | ``up --kubeconfig-out PATH [--nodes N]``.

Exactly these two forms: other tools (the fleet benchmark, CI) drive them.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
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


AGENT_NAMESPACE = "bigfleet-system"
AGENT_SERVICE_ACCOUNTS = {"operator": "bigfleet-operator",
                          "pod-controller": "bigfleet-pod-controller"}


def write_agent_kubeconfigs(cp: ControlPlane, out_dir: Path) -> list[Path]:
    """Run both binaries "as in a cluster": create their namespace, apply the shipped RBAC
    (``config/rbac``: a ServiceAccount per binary and its least-privilege roles) with kubectl,
    and write ``<out_dir>/operator.kubeconfig`` and ``pod-controller.kubeconfig``, each with its
    ServiceAccount's token (TokenRequest, 24 h). Returns the paths.

    Raises:
        ControlPlaneError: no kubectl, or kubectl failed.
    """
    from bigfleet_trio.sim.apiserver.testing import find_kubectl

    kubectl = find_kubectl()
    if kubectl is None:
        raise ControlPlaneError("--agent-kubeconfigs needs kubectl (the test extra installs it)")
    cp.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": AGENT_NAMESPACE}})
    rbac = Path(__file__).resolve().parents[2] / "config" / "rbac"
    done = subprocess.run([kubectl, "--kubeconfig", str(cp.kubeconfig), "apply", "-k", str(rbac)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise ControlPlaneError(f"kubectl apply -k config/rbac: {done.stderr.strip()}")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for binary, sa in AGENT_SERVICE_ACCOUNTS.items():
        path = out_dir / f"{binary}.kubeconfig"
        cp.write_kubeconfig(path, token=cp.token(AGENT_NAMESPACE, sa), user=sa)
        paths.append(path)
    return paths


def up(kubeconfig_out: Path, nodes: int, agent_kubeconfigs: Path | None = None) -> int:
    """Start the control plane, install the project's CRDs (saying so), copy the admin
    kubeconfig to ``kubeconfig_out``, optionally write the binaries' ServiceAccount kubeconfigs
    (:func:`write_agent_kubeconfigs`), print ``ready ...`` and block until SIGTERM/SIGINT (or a
    component exits: exit 1)."""
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
        print("installed the project's CRDs (as `kubectl apply` does, so a later "
              "`kubectl apply -k config/default` updates them quietly)", file=sys.stderr)
        if agent_kubeconfigs is not None:
            for path in write_agent_kubeconfigs(cp, agent_kubeconfigs):
                print(f"wrote {path} (a ServiceAccount token under the shipped RBAC)",
                      file=sys.stderr)
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
    p_up.add_argument("--nodes", type=int, default=3,
                      help="fake Nodes run by kwok (default 3), labelled "
                      "bigfleet.lucy.sh/unmanaged=true: Pods can bind there without any shard, "
                      "and get no CapacityRequest. 0 leaves the cluster with the shard's Nodes "
                      "only, as the pieces path in the README wants (every Pod then waits for "
                      "BigFleet)")
    p_up.add_argument("--agent-kubeconfigs", type=Path, metavar="DIR",
                      help="also apply the shipped RBAC and write DIR/operator.kubeconfig and "
                      "DIR/pod-controller.kubeconfig with each binary's ServiceAccount token, "
                      "to run both binaries as in a cluster")
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
    return up(args.kubeconfig_out, args.nodes, args.agent_kubeconfigs)


if __name__ == "__main__":
    sys.exit(main())
