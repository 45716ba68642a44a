"""The RBAC authorizer as a pure function (rule matching, subjects, binding scope, 403 text)
and the embedded apiserver enforcing it over HTTP: bearer tokens, TokenRequest, 401/403."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.access import TokenAuthority
from bigfleet_trio.sim.apiserver.rbac import (
    ADMIN,
    ANONYMOUS,
    Attributes,
    Policy,
    User,
    authorize,
    forbidden,
    rule_allows,
    service_account_user,
    subject_matches,
)
from bigfleet_trio.sim.apiserver.testing import open_client

SA = service_account_user("ns", "sa")
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def attrs(verb: str = "get", resource: str = "pods", **kw: Any) -> Attributes:
    return Attributes(user=kw.pop("user", SA), verb=verb, resource=resource, **kw)


# ---- rule matching -----------------------------------------------------------------------

POD_RULE = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}


@pytest.mark.parametrize(
    ("rule", "request_attrs", "allowed"),
    [
        (POD_RULE, attrs("get"), True),
        (POD_RULE, attrs("list"), True),
        (POD_RULE, attrs("watch"), False),
        (POD_RULE, attrs("delete"), False),
        (POD_RULE, attrs("deletecollection"), False),
        (POD_RULE, attrs("get", api_group="apps"), False),
        (POD_RULE, attrs("get", "nodes"), False),
        (POD_RULE, attrs("get", subresource="status"), False),  # pods does not cover pods/status
        (POD_RULE, attrs("get", subresource="log"), False),
        ({"apiGroups": ["*"], "resources": ["pods"], "verbs": ["get"]}, attrs(api_group="x"), True),
        ({"apiGroups": [""], "resources": ["*"], "verbs": ["get"]}, attrs(resource="nodes"), True),
        # "*" as a resource covers subresources too
        (
            {"apiGroups": [""], "resources": ["*"], "verbs": ["create"]},
            attrs("create", subresource="eviction"),
            True,
        ),
        ({"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}, attrs("watch"), True),
        (
            {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
            attrs("create", subresource="eviction"),
            True,
        ),
        (
            {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
            attrs("create"),
            False,
        ),
        (
            {"apiGroups": ["x"], "resources": ["*/status"], "verbs": ["patch"]},
            attrs("patch", "capacityrequests", api_group="x", subresource="status"),
            True,
        ),
        (
            {"apiGroups": ["x"], "resources": ["*/status"], "verbs": ["patch"]},
            attrs("patch", "capacityrequests", api_group="x"),
            False,
        ),
        (
            {"apiGroups": ["x"], "resources": ["capacityrequests/status"], "verbs": ["patch"]},
            attrs("patch", "capacityrequests", api_group="x", subresource="status"),
            True,
        ),
        (
            {"apiGroups": ["x"], "resources": ["capacityrequests/status"], "verbs": ["patch"]},
            attrs("update", "capacityrequests", api_group="x", subresource="status"),
            False,
        ),
        # resourceNames: only requests naming one of them
        ({**POD_RULE, "resourceNames": ["a"]}, attrs("get", name="a"), True),
        ({**POD_RULE, "resourceNames": ["a"]}, attrs("get", name="b"), False),
        ({**POD_RULE, "resourceNames": ["a"]}, attrs("list"), False),
        ({**POD_RULE, "resourceNames": ["a"]}, attrs("list", name="a"), True),
        ({**POD_RULE, "resourceNames": []}, attrs("get", name="b"), True),
        # a resource rule never matches a non-resource path and vice versa
        (POD_RULE, attrs("get", resource_request=False, path="/api"), False),
        (
            {"nonResourceURLs": ["/api"], "verbs": ["get"]},
            attrs("get", resource_request=False, path="/api"),
            True,
        ),
        (
            {"nonResourceURLs": ["/api"], "verbs": ["get"]},
            attrs("get", resource_request=False, path="/api/v1"),
            False,
        ),
        (
            {"nonResourceURLs": ["/api/*"], "verbs": ["get"]},
            attrs("get", resource_request=False, path="/api/v1"),
            True,
        ),
        (
            {"nonResourceURLs": ["*"], "verbs": ["get"]},
            attrs("get", resource_request=False, path="/metrics"),
            True,
        ),
        (
            {"nonResourceURLs": ["/api/*"], "verbs": ["get"]},
            attrs("post", resource_request=False, path="/api/v1"),
            False,
        ),
        ({"nonResourceURLs": ["*"], "verbs": ["*"]}, attrs("get"), False),
        # malformed rules match nothing
        ({"apiGroups": "", "resources": "pods", "verbs": "get"}, attrs("get"), False),
        ({}, attrs("get"), False),
    ],
)
def test_rule_allows(rule: dict[str, Any], request_attrs: Attributes, allowed: bool) -> None:
    assert rule_allows(request_attrs, rule) is allowed


@pytest.mark.parametrize(
    ("subject", "user", "binding_ns", "matches"),
    [
        ({"kind": "ServiceAccount", "name": "sa", "namespace": "ns"}, SA, "", True),
        ({"kind": "ServiceAccount", "name": "sa", "namespace": "other"}, SA, "", False),
        ({"kind": "ServiceAccount", "name": "sa"}, SA, "ns", True),  # binding's namespace
        ({"kind": "ServiceAccount", "name": "other", "namespace": "ns"}, SA, "", False),
        ({"kind": "User", "name": "system:serviceaccount:ns:sa"}, SA, "", True),
        ({"kind": "User", "name": "alice"}, User("alice"), "", True),
        ({"kind": "User", "name": "alice"}, User("bob"), "", False),
        ({"kind": "Group", "name": "system:serviceaccounts"}, SA, "", True),
        ({"kind": "Group", "name": "system:serviceaccounts:ns"}, SA, "", True),
        ({"kind": "Group", "name": "system:serviceaccounts:other"}, SA, "", False),
        ({"kind": "Group", "name": "system:authenticated"}, ANONYMOUS, "", False),
        ({"kind": "Group", "name": "system:unauthenticated"}, ANONYMOUS, "", True),
        ({"kind": "Robot", "name": "sa"}, SA, "ns", False),
    ],
)
def test_subject_matches(
    subject: dict[str, Any], user: User, binding_ns: str, matches: bool
) -> None:
    assert subject_matches(subject, user, binding_ns) is matches


# ---- bindings ----------------------------------------------------------------------------


def meta(name: str, ns: str | None = None) -> dict[str, Any]:
    return {"name": name, **({"namespace": ns} if ns else {})}


SA_SUBJECT = [{"kind": "ServiceAccount", "name": "sa", "namespace": "ns"}]
ROLE_POD_READER = {"metadata": meta("pod-reader", "ns"), "rules": [POD_RULE]}
CR_POD_READER = {"metadata": meta("pod-reader"), "rules": [POD_RULE]}
CR_NODES = {
    "metadata": meta("nodes"),
    "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}],
}


def binding(name: str, kind: str, role: str, ns: str | None = None) -> dict[str, Any]:
    return {
        "metadata": meta(name, ns),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        "subjects": SA_SUBJECT,
    }


def policy(
    rbs: list[dict[str, Any]] | None = None, crbs: list[dict[str, Any]] | None = None
) -> Policy:
    return Policy.from_objects(
        [ROLE_POD_READER], [CR_POD_READER, CR_NODES], rbs or [], crbs or []
    )


@pytest.mark.parametrize(
    ("pol", "request_attrs", "allowed"),
    [
        # a RoleBinding grants its Role only in its own namespace
        (policy([binding("b", "Role", "pod-reader", "ns")]), attrs(namespace="ns"), True),
        (policy([binding("b", "Role", "pod-reader", "ns")]), attrs(namespace="other"), False),
        (policy([binding("b", "Role", "pod-reader", "ns")]), attrs(), False),  # all namespaces
        # a ClusterRole through a RoleBinding: still only that namespace
        (policy([binding("b", "ClusterRole", "pod-reader", "ns")]), attrs(namespace="ns"), True),
        (
            policy([binding("b", "ClusterRole", "pod-reader", "ns")]),
            attrs(namespace="other"),
            False,
        ),
        (policy([binding("b", "ClusterRole", "nodes", "ns")]), attrs("get", "nodes"), False),
        # a ClusterRoleBinding: every namespace, all namespaces and cluster scope
        (policy(crbs=[binding("c", "ClusterRole", "pod-reader")]), attrs(namespace="x"), True),
        (policy(crbs=[binding("c", "ClusterRole", "pod-reader")]), attrs("list"), True),
        (policy(crbs=[binding("c", "ClusterRole", "nodes")]), attrs("get", "nodes"), True),
        # a ClusterRoleBinding cannot reference a Role
        (policy(crbs=[binding("c", "Role", "pod-reader")]), attrs(namespace="ns"), False),
        # a Role of another namespace does not resolve
        (policy([binding("b", "Role", "pod-reader", "other")]), attrs(namespace="other"), False),
        # nothing bound
        (policy(), attrs(namespace="ns"), False),
        # system:masters needs no binding
        (policy(), attrs("delete", "nodes", user=ADMIN), True),
    ],
)
def test_authorize_binding_scope(pol: Policy, request_attrs: Attributes, allowed: bool) -> None:
    assert authorize(request_attrs, pol).allowed is allowed


def test_dangling_role_ref_is_the_reason() -> None:
    pol = policy([binding("b", "Role", "missing", "ns")], [binding("c", "ClusterRole", "gone")])
    d = authorize(attrs(namespace="ns"), pol)
    assert not d.allowed
    assert d.reason == (
        'RBAC: [clusterrole.rbac.authorization.k8s.io "gone" not found, '
        'role.rbac.authorization.k8s.io "missing" not found]'
    )
    d = authorize(attrs(namespace="ns"), policy([binding("b", "Role", "missing", "ns")]))
    assert d.reason == 'RBAC: role.rbac.authorization.k8s.io "missing" not found'


@pytest.mark.parametrize(
    ("request_attrs", "message", "details"),
    [
        (
            attrs("get", name="x", namespace="ns"),
            'pods "x" is forbidden: User "system:serviceaccount:ns:sa" cannot get resource '
            '"pods" in API group "" in the namespace "ns"',
            {"name": "x", "kind": "pods"},
        ),
        (
            attrs("list", "capacityrequests", api_group="bigfleet.lucy.sh"),
            'capacityrequests.bigfleet.lucy.sh is forbidden: User "system:serviceaccount:ns:sa" '
            'cannot list resource "capacityrequests" in API group "bigfleet.lucy.sh" at the '
            "cluster scope",
            {"group": "bigfleet.lucy.sh", "kind": "capacityrequests"},
        ),
        (
            attrs("create", name="p", namespace="ns", subresource="eviction"),
            'pods "p" is forbidden: User "system:serviceaccount:ns:sa" cannot create resource '
            '"pods/eviction" in API group "" in the namespace "ns"',
            {"name": "p", "kind": "pods"},
        ),
        (
            attrs("get", user=ANONYMOUS, resource_request=False, path="/metrics"),
            'forbidden: User "system:anonymous" cannot get path "/metrics"',
            {},
        ),
    ],
)
def test_forbidden_message_shape(
    request_attrs: Attributes, message: str, details: dict[str, Any]
) -> None:
    err = forbidden(request_attrs)
    assert (err.code, err.reason, err.message) == (403, "Forbidden", message)
    assert err.details == details


def test_token_authority_signs_and_expires() -> None:
    ta = TokenAuthority(b"k" * 32)
    token, exp = ta.issue("ns", "sa", "uid-1", ["aud"], 600, now=1000.0)
    assert exp == 1600
    claims = ta.verify(token, now=1599.0)
    assert claims is not None and claims["sub"] == "system:serviceaccount:ns:sa"
    assert ta.verify(token, now=1600.0) is None  # expired
    assert TokenAuthority(b"x" * 32).verify(token, now=1000.0) is None  # another key
    head, body, sig = token.split(".")
    assert ta.verify(f"{head}.{body}x.{sig}", now=1000.0) is None  # tampered
    assert ta.verify("not-a-jwt", now=1000.0) is None


# ---- over HTTP ---------------------------------------------------------------------------


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def sa_token(client: httpx.AsyncClient, api: ApiServer, ns: str, name: str) -> str:
    admin = bearer(api.access.admin_token)
    r = await client.post(
        f"/api/v1/namespaces/{ns}/serviceaccounts", json={"metadata": {"name": name}},
        headers=admin,
    )
    assert r.status_code == 201, r.text
    r = await client.post(
        f"/api/v1/namespaces/{ns}/serviceaccounts/{name}/token",
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        headers=admin,
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["kind"] == "TokenRequest" and body["spec"]["expirationSeconds"] == 3600
    token: str = body["status"]["token"]
    return token


async def test_rbac_mode_authenticates_and_authorizes() -> None:
    api = ApiServer(authorization_mode="RBAC")
    async with open_client(api) as client:
        token = await sa_token(client, api, "default", "reader")
        sa = bearer(token)
        # no binding yet: discovery is allowed (system:discovery), pods are not
        assert (await client.get("/api/v1", headers=sa)).status_code == 200
        r = await client.get("/api/v1/namespaces/default/pods/x", headers=sa)
        assert r.status_code == 403
        assert r.json()["message"] == (
            'pods "x" is forbidden: User "system:serviceaccount:default:reader" cannot get '
            'resource "pods" in API group "" in the namespace "default"'
        )
        assert len(api.access.denials) == 1
        admin = bearer(api.access.admin_token)
        role = {
            "metadata": {"name": "pods"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        }
        assert (
            await client.post(f"{RBAC}/namespaces/default/roles", json=role, headers=admin)
        ).status_code == 201
        rb = {
            "metadata": {"name": "pods"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "default"}],
        }
        assert (
            await client.post(f"{RBAC}/namespaces/default/rolebindings", json=rb, headers=admin)
        ).status_code == 201
        assert (await client.get("/api/v1/namespaces/default/pods", headers=sa)).status_code == 200
        r = await client.get("/api/v1/namespaces/kube-system/pods", headers=sa)
        assert r.status_code == 403
        assert (await client.get("/api/v1/pods", headers=sa)).status_code == 403
        # bad and missing credentials
        r = await client.get("/api/v1/namespaces/default/pods", headers=bearer("nope"))
        assert r.status_code == 401 and r.json()["reason"] == "Unauthorized"
        r = await client.get("/api/v1/namespaces/default/pods")
        assert r.status_code == 403
        assert 'User "system:anonymous" cannot list' in r.json()["message"]
        assert (await client.get("/healthz")).status_code == 200  # public info
        # deleting the ServiceAccount invalidates its tokens
        await client.delete("/api/v1/namespaces/default/serviceaccounts/reader", headers=admin)
        r = await client.get("/api/v1/namespaces/default/pods", headers=sa)
        assert r.status_code == 401


async def test_always_allow_mode_ignores_credentials(client: httpx.AsyncClient) -> None:
    assert (await client.get("/api/v1/pods", headers=bearer("anything"))).status_code == 200


async def test_token_request_validation(client: httpx.AsyncClient) -> None:
    path = "/api/v1/namespaces/default/serviceaccounts"
    assert (await client.post(f"{path}/missing/token", json={})).status_code == 404
    await client.post(path, json={"metadata": {"name": "sa"}})
    r = await client.post(f"{path}/sa/token", json={"spec": {"expirationSeconds": 60}})
    assert r.status_code == 422
    assert "may not specify a duration less than 10 minutes" in r.json()["message"]
    r = await client.post(
        f"{path}/sa/token", json={"spec": {"expirationSeconds": 7200, "audiences": ["a"]}}
    )
    assert r.status_code == 201
    assert r.json()["spec"]["audiences"] == ["a"]


async def test_discovery_lists_rbac_and_token_request(client: httpx.AsyncClient) -> None:
    names = {r["name"] for r in (await client.get(RBAC)).json()["resources"]}
    assert names == {"roles", "clusterroles", "rolebindings", "clusterrolebindings"}
    core = {r["name"]: r for r in (await client.get("/api/v1")).json()["resources"]}
    tok = core["serviceaccounts/token"]
    assert (tok["group"], tok["kind"], tok["verbs"]) == (
        "authentication.k8s.io",
        "TokenRequest",
        ["create"],
    )


AUTHZ = "/apis/authorization.k8s.io/v1"


async def test_access_reviews_and_impersonation() -> None:
    api = ApiServer(authorization_mode="RBAC")
    async with open_client(api) as client:
        token = await sa_token(client, api, "default", "reader")
        admin = bearer(api.access.admin_token)
        ssar = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": "list", "resource": "pods",
                                            "namespace": "default"}},
        }
        rv = api.store.rv
        r = await client.post(f"{AUTHZ}/selfsubjectaccessreviews", json=ssar, headers=admin)
        assert r.status_code == 201 and r.json()["status"]["allowed"] is True
        assert api.store.rv == rv  # answered, not stored
        r = await client.post(
            f"{AUTHZ}/selfsubjectaccessreviews", json=ssar, headers=bearer(token)
        )
        assert r.status_code == 201 and r.json()["status"] == {"allowed": False}
        sar = {"spec": {"user": "system:serviceaccount:default:reader",
                        "nonResourceAttributes": {"verb": "get", "path": "/api"}}}
        r = await client.post(f"{AUTHZ}/subjectaccessreviews", json=sar, headers=admin)
        assert r.json()["status"]["allowed"] is False  # no groups given: no system:discovery
        sar["spec"]["groups"] = ["system:authenticated"]
        r = await client.post(f"{AUTHZ}/subjectaccessreviews", json=sar, headers=admin)
        assert r.json()["status"]["allowed"] is True
        r = await client.get(f"{AUTHZ}/selfsubjectaccessreviews", headers=admin)
        assert r.status_code == 405
        names = [o["metadata"]["name"] for o in api.store.items(api.find("clusterroles"))]
        assert "system:basic-user" in names
        # the admin acts as the ServiceAccount; the ServiceAccount cannot act as anyone
        as_sa = {**admin, "impersonate-user": "system:serviceaccount:default:reader"}
        r = await client.get("/api/v1/namespaces/default/pods", headers=as_sa)
        assert r.status_code == 403
        assert 'User "system:serviceaccount:default:reader" cannot list' in r.json()["message"]
        r = await client.get(
            "/api/v1/nodes", headers={**bearer(token), "impersonate-user": "admin"}
        )
        assert r.status_code == 403
        assert r.json()["message"] == (
            'users "admin" is forbidden: User "system:serviceaccount:default:reader" cannot '
            'impersonate resource "users" in API group "" at the cluster scope'
        )
        as_group = {**admin, "impersonate-user": "alice", "impersonate-group": "system:masters"}
        assert (await client.get("/api/v1/nodes", headers=as_group)).status_code == 200
        r = await client.get("/api/v1/nodes", headers={**admin, "impersonate-group": "g"})
        assert r.status_code == 400
        # repeated Impersonate-Group headers are all applied
        two = httpx.Headers([
            *admin.items(),
            ("impersonate-user", "bob"),
            ("impersonate-group", "system:masters"),
            ("impersonate-group", "team"),  # last: a last-wins header dict would drop masters
        ])
        assert (await client.get("/api/v1/nodes", headers=two)).status_code == 200
