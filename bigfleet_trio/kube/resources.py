"""Resource descriptors for the kinds the agent touches (built-ins and our CRDs, docs/crds.md).

A :class:`Resource` is everything the client needs to build a URL: API group, version, plural
and scope. The BigFleet CRDs live in group ``bigfleet.lucy.sh`` version ``v1alpha1``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
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
    "BIGFLEET_GROUP",
    "TOKEN_REVIEWS",
    "SUBJECT_ACCESS_REVIEWS",
]

BIGFLEET_GROUP = "bigfleet.lucy.sh"


@dataclass(frozen=True, slots=True)
class Resource:
    """One Kubernetes resource type.

    Attributes:
        group: API group, ``""`` for the core group.
        version: API version within the group, e.g. "v1".
        plural: URL path segment, e.g. "pods".
        kind: object kind, e.g. "Pod".
        namespaced: True for namespace-scoped resources.
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        """``"v1"`` for core, else ``"group/version"`` (the objects' ``apiVersion``)."""
        return self.version if not self.group else f"{self.group}/{self.version}"

    def collection_path(self, namespace: str | None = None) -> str:
        """URL path of the collection; cluster-wide for namespaced kinds when namespace is None.

        Raises:
            ValueError: namespace given for a cluster-scoped resource.
        """
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if namespace is not None and namespace != "":
            if not self.namespaced:
                raise ValueError(f"{self.plural} is cluster-scoped; no namespace allowed")
            return f"{base}/namespaces/{namespace}/{self.plural}"
        return f"{base}/{self.plural}"

    def object_path(
        self, name: str, namespace: str | None = None, subresource: str | None = None
    ) -> str:
        """URL path of one object (optionally a subresource such as "status").

        Raises:
            ValueError: empty name, or a namespaced resource without namespace (and vice versa).
        """
        if not name:
            raise ValueError(f"{self.plural}: object name must not be empty")
        if self.namespaced and not namespace:
            raise ValueError(f"{self.plural} is namespaced; namespace required for {name!r}")
        path = f"{self.collection_path(namespace if self.namespaced else None)}/{name}"
        return f"{path}/{subresource}" if subresource else path


PODS = Resource("", "v1", "pods", "Pod", True)
NODES = Resource("", "v1", "nodes", "Node", False)
EVENTS = Resource("", "v1", "events", "Event", True)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", False)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", True)
PRIORITY_CLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False)
RUNTIME_CLASSES = Resource("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False)
PDBS = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True)
DAEMONSETS = Resource("apps", "v1", "daemonsets", "DaemonSet", True)
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment", True)
REPLICASETS = Resource("apps", "v1", "replicasets", "ReplicaSet", True)
STATEFULSETS = Resource("apps", "v1", "statefulsets", "StatefulSet", True)
JOBS = Resource("batch", "v1", "jobs", "Job", True)
TOKEN_REVIEWS = Resource("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False)
SUBJECT_ACCESS_REVIEWS = Resource(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", False
)
CRDS = Resource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False
)
CAPACITY_REQUESTS = Resource(
    BIGFLEET_GROUP, "v1alpha1", "capacityrequests", "CapacityRequest", True
)
UPCOMING_NODES = Resource(BIGFLEET_GROUP, "v1alpha1", "upcomingnodes", "UpcomingNode", False)
AVAILABLE_CAPACITIES = Resource(
    BIGFLEET_GROUP, "v1alpha1", "availablecapacities", "AvailableCapacity", False
)
