"""Kubernetes RBAC authorization as a pure function over Role / ClusterRole / RoleBinding /
ClusterRoleBinding objects: who the request is (:class:`User`), what it asks
(:class:`Attributes`), and whether any bound rule allows it, with the apiserver's 403 text.

Matching follows the upstream RBAC authorizer: verbs, apiGroups, resources (``*``,
``resource/subresource``, ``*/subresource``), resourceNames, nonResourceURLs (``*`` suffix
prefix match); a RoleBinding grants its Role's or ClusterRole's rules only in its own
namespace; a ClusterRoleBinding grants everywhere. There is no deny rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError

RBAC_GROUP = "rbac.authorization.k8s.io"
MASTERS = "system:masters"
SA_PREFIX = "system:serviceaccount:"


@dataclass(frozen=True)
class User:
    """An authenticated identity: user name and groups."""

    name: str
    groups: tuple[str, ...] = ()


def service_account_user(namespace: str, name: str) -> User:
    """The identity a ServiceAccount token authenticates as."""
    return User(
        f"{SA_PREFIX}{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
    )


ANONYMOUS = User("system:anonymous", ("system:unauthenticated",))
ADMIN = User("admin", (MASTERS, "system:authenticated"))


@dataclass(frozen=True)
class Attributes:
    """What one request asks for, as the apiserver's request info derives it.

    ``resource_request`` False means a non-resource path (discovery, /healthz, /openapi);
    then only ``verb`` (the lower-case HTTP method) and ``path`` count.
    """

    user: User
    verb: str
    resource_request: bool = True
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    namespace: str = ""
    path: str = ""


@dataclass(frozen=True)
class Decision:
    """The authorizer's answer; ``reason`` explains a denial caused by a dangling roleRef."""

    allowed: bool
    reason: str = ""
    errors: tuple[str, ...] = field(default=())


def _strs(v: Any) -> list[str]:
    return [str(x) for x in v] if isinstance(v, list) else []


def rule_allows(attrs: Attributes, rule: Mapping[str, Any]) -> bool:
    """Whether one PolicyRule allows the request."""
    verbs = _strs(rule.get("verbs"))
    if "*" not in verbs and attrs.verb not in verbs:
        return False
    if not attrs.resource_request:
        for url in _strs(rule.get("nonResourceURLs")):
            if url == "*" or url == attrs.path:
                return True
            if url.endswith("*") and attrs.path.startswith(url[:-1]):
                return True
        return False
    groups = _strs(rule.get("apiGroups"))
    if "*" not in groups and attrs.api_group not in groups:
        return False
    combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    resources = _strs(rule.get("resources"))
    if not any(
        r == "*"
        or r == combined
        or (attrs.subresource and r == f"*/{attrs.subresource}")
        for r in resources
    ):
        return False
    names = _strs(rule.get("resourceNames"))
    return not names or attrs.name in names


def subject_matches(subject: Mapping[str, Any], user: User, binding_namespace: str) -> bool:
    """Whether a binding subject (User, Group or ServiceAccount) names ``user``."""
    kind = subject.get("kind")
    name = str(subject.get("name", ""))
    if kind == "User":
        return name == user.name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        ns = str(subject.get("namespace") or binding_namespace)
        return user.name == f"{SA_PREFIX}{ns}:{name}"
    return False


@dataclass
class Policy:
    """The RBAC objects of a cluster, keyed for lookup.

    Attributes:
        roles: (namespace, name) -> Role.
        cluster_roles: name -> ClusterRole.
        role_bindings: RoleBindings (any namespace).
        cluster_role_bindings: ClusterRoleBindings.
    """

    roles: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    cluster_roles: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    role_bindings: list[Mapping[str, Any]] = field(default_factory=list)
    cluster_role_bindings: list[Mapping[str, Any]] = field(default_factory=list)

    @classmethod
    def from_objects(
        cls,
        roles: Iterable[Mapping[str, Any]],
        cluster_roles: Iterable[Mapping[str, Any]],
        role_bindings: Iterable[Mapping[str, Any]],
        cluster_role_bindings: Iterable[Mapping[str, Any]],
    ) -> Policy:
        """Index stored objects."""
        return cls(
            {(r["metadata"].get("namespace", ""), r["metadata"]["name"]): r for r in roles},
            {r["metadata"]["name"]: r for r in cluster_roles},
            list(role_bindings),
            list(cluster_role_bindings),
        )


def _rules(
    policy: Policy, ref: Any, namespace: str, errors: list[str]
) -> list[Mapping[str, Any]]:
    if not isinstance(ref, Mapping):
        return []
    kind, name = ref.get("kind"), str(ref.get("name", ""))
    role: Mapping[str, Any] | None
    if kind == "ClusterRole":
        role = policy.cluster_roles.get(name)
        what = f'clusterrole.{RBAC_GROUP} "{name}" not found'
    elif kind == "Role":
        role = policy.roles.get((namespace, name))
        what = f'role.{RBAC_GROUP} "{name}" not found'
    else:
        return []
    if role is None:
        errors.append(what)
        return []
    return [r for r in role.get("rules") or () if isinstance(r, Mapping)]


def authorize(attrs: Attributes, policy: Policy) -> Decision:
    """Decide one request against ``policy`` (system:masters is always allowed).

    Cluster-scoped requests (and non-resource paths) are granted only by ClusterRoleBindings;
    a namespaced request also by the RoleBindings of its namespace.
    """
    if MASTERS in attrs.user.groups:
        return Decision(True)
    errors: list[str] = []
    for crb in policy.cluster_role_bindings:
        if any(
            isinstance(s, Mapping) and subject_matches(s, attrs.user, "")
            for s in crb.get("subjects") or ()
        ):
            if any(rule_allows(attrs, r) for r in _rules(policy, crb.get("roleRef"), "", errors)):
                return Decision(True)
    if attrs.resource_request and attrs.namespace:
        for rb in policy.role_bindings:
            ns = rb["metadata"].get("namespace", "")
            if ns != attrs.namespace:
                continue
            if any(
                isinstance(s, Mapping) and subject_matches(s, attrs.user, ns)
                for s in rb.get("subjects") or ()
            ):
                rules = _rules(policy, rb.get("roleRef"), ns, errors)
                if any(rule_allows(attrs, r) for r in rules):
                    return Decision(True)
    reason = f"RBAC: [{', '.join(errors)}]" if len(errors) > 1 else (
        f"RBAC: {errors[0]}" if errors else ""
    )
    return Decision(False, reason, tuple(errors))


def forbidden_message(attrs: Attributes) -> str:
    """The "User ... cannot ..." text of a denial, worded as the apiserver words it."""
    user = attrs.user.name
    if not attrs.resource_request:
        return f'User "{user}" cannot {attrs.verb} path "{attrs.path}"'
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    where = (
        f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    )
    return (
        f'User "{user}" cannot {attrs.verb} resource "{resource}" in API group '
        f'"{attrs.api_group}" {where}'
    )


def forbidden(attrs: Attributes, reason: str = "") -> ApiError:
    """The 403 Forbidden Status for a denied request.

    Message: ``<resource>[.<group>] ["<name>"] is forbidden: User "u" cannot ...`` (plus
    ``: <reason>``), ``forbidden: User "u" cannot get path "/x"`` for non-resource paths.
    """
    msg = forbidden_message(attrs)
    if reason:
        msg = f"{msg}: {reason}"
    details: dict[str, Any] = {}
    if not attrs.resource_request or not attrs.resource:
        return ApiError(403, "Forbidden", f"forbidden: {msg}", details)
    qualified = f"{attrs.resource}.{attrs.api_group}" if attrs.api_group else attrs.resource
    if attrs.name:
        text = f'{qualified} "{attrs.name}" is forbidden: {msg}'
        details["name"] = attrs.name
    else:
        text = f"{qualified} is forbidden: {msg}"
    if attrs.api_group:
        details["group"] = attrs.api_group
    details["kind"] = attrs.resource
    return ApiError(403, "Forbidden", text, details)
