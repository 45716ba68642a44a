"""The real Kubernetes control plane for tests and benchmarks (run from the repository root).

- ``python -m scripts.realkube build``: builds the pinned kube-apiserver, kube-controller-manager,
  kube-scheduler, etcd and kwok from their Go modules into a cache outside the repository
  (:mod:`.build`);
- ``python -m scripts.realkube up --kubeconfig-out PATH [--nodes N]``: starts them on loopback,
  writes an admin kubeconfig, prints one ``ready`` line and runs until SIGTERM or Ctrl-C
  (:mod:`.controlplane`, :class:`ControlPlane`, the same code the pytest fixture uses).

Needs the ``test`` extra (``cryptography`` via trustme, for the certificates).
"""

from .build import BINARIES, Binaries, BuildError, build, cache_dir, find_binaries
from .controlplane import ControlPlane, ControlPlaneError, free_port

BUILD_HINT = "python -m scripts.realkube build"

__all__ = ["BINARIES", "BUILD_HINT", "Binaries", "BuildError", "ControlPlane",
           "ControlPlaneError", "build", "cache_dir", "find_binaries", "free_port"]
