"""Resource types served by the embedded apiserver: the built-in kinds the agent and kubectl use
and custom resources registered from CRDs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .validation import SchemaValidator

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
COMMON_FIELDS = frozenset({"metadata.name", "metadata.namespace"})

Column = dict[str, Any]  # name, type, format, description, priority, jsonPath | fn


@dataclass
class ResourceType:
    """One REST resource (collection) and how the server treats it.

    Attributes:
        group: API group ("" for core).
        version: API version.
        plural: resource name in URLs.
        kind: object kind.
        namespaced: True for namespaced resources.
        short_names / categories / singular: discovery metadata.
        status: True when a ``/status`` subresource splits spec and status.
        extra_subresources: other subresources (``eviction`` for pods).
        selectable: field paths usable in field selectors (besides metadata.name/namespace).
        field_defaults: value a selectable field takes when absent (e.g. ``spec.unschedulable``).
        columns: Table printer columns after Name.
        validator: CRD schema validator (None for built-ins).
        custom: True for CRD-backed resources (strategic merge patch answers 415).
        verbs: the verbs served (``("create",)`` for the access reviews, which store nothing).
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    singular: str = ""
    status: bool = False
    extra_subresources: tuple[str, ...] = ()
    selectable: frozenset[str] = frozenset()
    field_defaults: dict[str, str] = field(default_factory=dict)
    columns: list[Column] = field(default_factory=list)
    validator: SchemaValidator | None = None
    custom: bool = False
    list_kind: str = ""
    verbs: tuple[str, ...] = ALL_VERBS

    def __post_init__(self) -> None:
        if not self.singular:
            self.singular = self.kind.lower()
        if not self.list_kind:
            self.list_kind = self.kind + "List"
        self.selectable = COMMON_FIELDS | frozenset(self.selectable)

    @property
    def key(self) -> str:
        """Unique key ``plural.group`` (``plural`` for core)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def api_version(self) -> str:
        """``v1`` or ``group/version``."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> str:
        return self.api_version

    def field_value(self, obj: dict[str, Any], path: str) -> str:
        """Selectable value of ``path`` (defaults applied)."""
        from .selectors import field_value

        v = field_value(obj, path)
        if v == "" and path in self.field_defaults:
            return self.field_defaults[path]
        return v


# ---- Table printers for built-ins -------------------------------------------------------------


def _pod_ready(obj: dict[str, Any]) -> str:
    total = len((obj.get("spec") or {}).get("containers") or [])
    ready = sum(
        1 for c in (obj.get("status") or {}).get("containerStatuses") or [] if c.get("ready")
    )
    return f"{ready}/{total}"


def _pod_status(obj: dict[str, Any]) -> str:
    if obj["metadata"].get("deletionTimestamp"):
        return "Terminating"
    st = obj.get("status") or {}
    return st.get("reason") or st.get("phase") or "Pending"


def _pod_restarts(obj: dict[str, Any]) -> int:
    return sum(
        int(c.get("restartCount", 0))
        for c in (obj.get("status") or {}).get("containerStatuses") or []
    )


def _node_status(obj: dict[str, Any]) -> str:
    conds = (obj.get("status") or {}).get("conditions") or []
    ready = next((c for c in conds if c.get("type") == "Ready"), None)
    s = "Ready" if ready and ready.get("status") == "True" else ("NotReady" if ready else "Unknown")
    if (obj.get("spec") or {}).get("unschedulable"):
        s += ",SchedulingDisabled"
    return s


def _node_roles(obj: dict[str, Any]) -> str:
    roles = sorted(
        k.split("/", 1)[1]
        for k in (obj["metadata"].get("labels") or {})
        if k.startswith("node-role.kubernetes.io/")
    )
    return ",".join(roles) or "<none>"


def _col(
    name: str,
    typ: str = "string",
    *,
    path: str | None = None,
    fn: Callable[[dict[str, Any]], Any] | None = None,
    priority: int = 0,
    fmt: str = "",
    desc: str = "",
) -> Column:
    c: Column = {
        "name": name,
        "type": typ,
        "format": fmt,
        "description": desc or name,
        "priority": priority,
    }
    if path is not None:
        c["jsonPath"] = path
    if fn is not None:
        c["fn"] = fn
    return c


AGE = _col("Age", "date", path=".metadata.creationTimestamp")

POD_FIELDS = frozenset(
    {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.podIPs",
        "status.nominatedNodeName",
    }
)


def builtin_resources() -> list[ResourceType]:
    """The built-in resource types (fresh instances)."""
    R = ResourceType
    return [
        R(
            "",
            "v1",
            "namespaces",
            "Namespace",
            False,
            ("ns",),
            status=True,
            # kube-apiserver serves no deletecollection of namespaces
            verbs=tuple(v for v in ALL_VERBS if v != "deletecollection"),
            selectable=frozenset({"status.phase"}),
            columns=[_col("Status", path=".status.phase"), AGE],
        ),
        R(
            "",
            "v1",
            "pods",
            "Pod",
            True,
            ("po",),
            ("all",),
            status=True,
            extra_subresources=("eviction",),
            selectable=POD_FIELDS,
            field_defaults={"spec.hostNetwork": "false"},
            columns=[
                _col("Ready", fn=_pod_ready),
                _col("Status", fn=_pod_status),
                _col("Restarts", "integer", fn=_pod_restarts),
                AGE,
                _col("IP", path=".status.podIP", priority=1),
                _col("Node", path=".spec.nodeName", priority=1),
            ],
        ),
        R(
            "",
            "v1",
            "nodes",
            "Node",
            False,
            ("no",),
            status=True,
            selectable=frozenset({"spec.unschedulable"}),
            field_defaults={"spec.unschedulable": "false"},
            columns=[
                _col("Status", fn=_node_status),
                _col("Roles", fn=_node_roles),
                AGE,
                _col("Version", path=".status.nodeInfo.kubeletVersion"),
            ],
        ),
        R(
            "",
            "v1",
            "events",
            "Event",
            True,
            ("ev",),
            selectable=frozenset(
                {
                    "involvedObject.kind",
                    "involvedObject.namespace",
                    "involvedObject.name",
                    "involvedObject.uid",
                    "involvedObject.apiVersion",
                    "involvedObject.resourceVersion",
                    "involvedObject.fieldPath",
                    "reason",
                    "reportingComponent",
                    "source",
                    "type",
                }
            ),
            columns=[
                _col("Type", path=".type"),
                _col("Reason", path=".reason"),
                _col("Object", path=".involvedObject.name"),
                _col("Message", path=".message"),
            ],
        ),
        R("", "v1", "configmaps", "ConfigMap", True, ("cm",), columns=[AGE]),
        R(
            "",
            "v1",
            "secrets",
            "Secret",
            True,
            (),
            selectable=frozenset({"type"}),
            columns=[_col("Type", path=".type"), AGE],
        ),
        R(
            "",
            "v1",
            "serviceaccounts",
            "ServiceAccount",
            True,
            ("sa",),
            extra_subresources=("token",),
            columns=[AGE],
        ),
        R(
            "",
            "v1",
            "services",
            "Service",
            True,
            ("svc",),
            ("all",),
            status=True,
            columns=[
                _col("Type", path=".spec.type"),
                _col("Cluster-IP", path=".spec.clusterIP"),
                AGE,
            ],
        ),
        R(
            "apps",
            "v1",
            "deployments",
            "Deployment",
            True,
            ("deploy",),
            ("all",),
            status=True,
            extra_subresources=("scale",),
            columns=[
                _col("Ready", path=".status.readyReplicas"),
                _col("Up-to-date", path=".status.updatedReplicas"),
                _col("Available", path=".status.availableReplicas"),
                AGE,
            ],
        ),
        R(
            "apps",
            "v1",
            "replicasets",
            "ReplicaSet",
            True,
            ("rs",),
            ("all",),
            status=True,
            extra_subresources=("scale",),
            columns=[
                _col("Desired", "integer", path=".spec.replicas"),
                _col("Current", "integer", path=".status.replicas"),
                _col("Ready", "integer", path=".status.readyReplicas"),
                AGE,
            ],
        ),
        R(
            "apps",
            "v1",
            "statefulsets",
            "StatefulSet",
            True,
            ("sts",),
            ("all",),
            status=True,
            extra_subresources=("scale",),
            columns=[_col("Ready", path=".status.readyReplicas"), AGE],
        ),
        R(
            "apps",
            "v1",
            "daemonsets",
            "DaemonSet",
            True,
            ("ds",),
            ("all",),
            status=True,
            columns=[
                _col("Desired", "integer", path=".status.desiredNumberScheduled"),
                _col("Current", "integer", path=".status.currentNumberScheduled"),
                _col("Ready", "integer", path=".status.numberReady"),
                AGE,
            ],
        ),
        R(
            "batch",
            "v1",
            "jobs",
            "Job",
            True,
            (),
            ("all",),
            status=True,
            selectable=frozenset({"status.successful"}),
            columns=[
                _col("Status", path=".status.conditions[0].type"),
                _col("Completions", "integer", path=".spec.completions"),
                AGE,
            ],
        ),
        R(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            True,
            ("pdb",),
            status=True,
            columns=[
                _col("Min Available", path=".spec.minAvailable"),
                _col("Max Unavailable", path=".spec.maxUnavailable"),
                _col("Allowed Disruptions", "integer", path=".status.disruptionsAllowed"),
                AGE,
            ],
        ),
        R(
            "coordination.k8s.io",
            "v1",
            "leases",
            "Lease",
            True,
            (),
            columns=[_col("Holder", path=".spec.holderIdentity"), AGE],
        ),
        R(
            "scheduling.k8s.io",
            "v1",
            "priorityclasses",
            "PriorityClass",
            False,
            ("pc",),
            columns=[
                _col("Value", "integer", path=".value"),
                _col("Global-Default", "boolean", path=".globalDefault"),
                AGE,
            ],
        ),
        R(
            "node.k8s.io",
            "v1",
            "runtimeclasses",
            "RuntimeClass",
            False,
            (),
            columns=[_col("Handler", path=".handler"), AGE],
        ),
        *rbac_resources(),
        ResourceType("authorization.k8s.io", "v1", "selfsubjectaccessreviews",
                     "SelfSubjectAccessReview", False, verbs=("create",)),
        ResourceType("authorization.k8s.io", "v1", "subjectaccessreviews",
                     "SubjectAccessReview", False, verbs=("create",)),
        ResourceType("authentication.k8s.io", "v1", "tokenreviews",
                     "TokenReview", False, verbs=("create",)),
        R(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            False,
            ("crd", "crds"),
            ("api-extensions",),
            status=True,
            columns=[_col("Created At", "date", path=".metadata.creationTimestamp")],
        ),
    ]


def rbac_resources() -> list[ResourceType]:
    """Roles, ClusterRoles and their bindings (``rbac.authorization.k8s.io/v1``)."""
    g = "rbac.authorization.k8s.io"
    role_ref = _col("Role", path=".roleRef.name")
    return [
        ResourceType(g, "v1", "roles", "Role", True, columns=[_col("Created At", "date",
                     path=".metadata.creationTimestamp")]),
        ResourceType(g, "v1", "clusterroles", "ClusterRole", False, columns=[_col(
            "Created At", "date", path=".metadata.creationTimestamp")]),
        ResourceType(g, "v1", "rolebindings", "RoleBinding", True, columns=[role_ref, AGE]),
        ResourceType(
            g, "v1", "clusterrolebindings", "ClusterRoleBinding", False, columns=[role_ref, AGE]
        ),
    ]


def resource_from_crd(crd: dict[str, Any]) -> ResourceType:
    """Build the ResourceType a CRD declares (its storage version, or the first served one).

    Raises:
        ValueError: when the CRD lacks group, names or versions.
    """
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    versions = spec.get("versions") or []
    if not spec.get("group") or not names.get("plural") or not names.get("kind") or not versions:
        raise ValueError(
            "CRD needs spec.group, spec.names.plural, spec.names.kind and spec.versions"
        )
    ver = next((v for v in versions if v.get("storage")), None) or next(
        (v for v in versions if v.get("served", True)), versions[0]
    )
    schema = ((ver.get("schema") or {}).get("openAPIV3Schema")) or None
    subres = ver.get("subresources") or spec.get("subresources") or {}
    columns: list[Column] = []
    pcols = ver.get("additionalPrinterColumns")
    if pcols is None:
        columns = [AGE]
    else:
        for c in pcols:
            columns.append(
                {
                    "name": c.get("name", ""),
                    "type": c.get("type", "string"),
                    "format": c.get("format", ""),
                    "description": c.get("description", ""),
                    "priority": int(c.get("priority", 0)),
                    "jsonPath": c.get("jsonPath", ""),
                }
            )
    selectable = frozenset(
        str(f.get("jsonPath", "")).lstrip(".")
        for f in ver.get("selectableFields") or []
        if f.get("jsonPath")
    )
    return ResourceType(
        group=spec["group"],
        version=ver.get("name", "v1"),
        plural=names["plural"],
        kind=names["kind"],
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        short_names=tuple(names.get("shortNames") or ()),
        categories=tuple(names.get("categories") or ()),
        singular=names.get("singular") or names["kind"].lower(),
        list_kind=names.get("listKind") or names["kind"] + "List",
        status="status" in subres,
        selectable=selectable,
        columns=columns,
        validator=SchemaValidator(schema) if isinstance(schema, dict) else None,
        custom=True,
    )
