"""BigFleet's Kubernetes layer on raw httpx (contract: docs/kube-api.md).

Config (:mod:`.config`), client (:mod:`.client`), errors (:mod:`.errors`), resource descriptors
(:mod:`.resources`), sans-IO watch helpers (:mod:`.watch`), informers (:mod:`.informer`) and
Lease leader election (:mod:`.leader`).
"""

from . import resources
from .client import KubeClient, ObjectList, WatchStream
from .config import KubeConfig, load_incluster_config, load_kubeconfig
from .informer import Informer, Store
from .leader import LeaderElector, Leadership
from .resources import *  # noqa: F403
from .watch import WatchEvent

__all__ = [
    "KubeConfig",
    "load_kubeconfig",
    "load_incluster_config",
    "KubeClient",
    "ObjectList",
    "WatchStream",
    "WatchEvent",
    "Informer",
    "Store",
    "LeaderElector",
    "Leadership",
]
__all__ += resources.__all__  # Resource and every descriptor

