"""BigFleet's Kubernetes layer on raw httpx (contract: docs/kube-api.md).

Config (:mod:`.config`), client (:mod:`.client`), errors (:mod:`.errors`), resource descriptors
(:mod:`.resources`), sans-IO watch helpers (:mod:`.watch`), informers (:mod:`.informer`) and
Lease leader election (:mod:`.leader`).
"""

from .client import KubeClient, ObjectList, WatchStream
from .config import KubeConfig, load_incluster_config, load_kubeconfig
from .informer import Informer, Store
from .leader import LeaderElector, Leadership
from .resources import (
    AVAILABLE_CAPACITIES,
    CAPACITY_REQUESTS,
    CRDS,
    DAEMONSETS,
    DEPLOYMENTS,
    EVENTS,
    JOBS,
    LEASES,
    NAMESPACES,
    NODES,
    PDBS,
    PODS,
    PRIORITY_CLASSES,
    REPLICASETS,
    RUNTIME_CLASSES,
    STATEFULSETS,
    UPCOMING_NODES,
    Resource,
)
from .watch import WatchEvent

__all__ = [
    "KubeConfig",
    "load_kubeconfig",
    "load_incluster_config",
    "KubeClient",
    "ObjectList",
    "WatchStream",
    "WatchEvent",
    "Resource",
    "PODS",
    "NODES",
    "EVENTS",
    "LEASES",
    "NAMESPACES",
    "PRIORITY_CLASSES",
    "RUNTIME_CLASSES",
    "PDBS",
    "DAEMONSETS",
    "DEPLOYMENTS",
    "REPLICASETS",
    "STATEFULSETS",
    "JOBS",
    "CRDS",
    "CAPACITY_REQUESTS",
    "UPCOMING_NODES",
    "AVAILABLE_CAPACITIES",
    "Informer",
    "Store",
    "LeaderElector",
    "Leadership",
]

