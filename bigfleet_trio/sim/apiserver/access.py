"""Authentication and authorization of the embedded apiserver: bearer tokens (an admin token
in ``system:masters`` and ServiceAccount tokens issued by the TokenRequest subresource) and,
with ``authorization_mode="RBAC"``, the RBAC authorizer of :mod:`.rbac` over the stored
Roles and bindings. The default mode ``AlwaysAllow`` ignores credentials (an open test server).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from typing import Any

from . import errors as E
from .errors import ApiError
from .rbac import (
    ADMIN,
    ANONYMOUS,
    SA_PREFIX,
    Attributes,
    Policy,
    User,
    authorize,
    forbidden,
)
from .rbac import service_account_user as sa_user

log = logging.getLogger(__name__)

MODES = ("AlwaysAllow", "RBAC")
ISSUER = "https://kubernetes.default.svc.cluster.local"
MIN_EXPIRATION = 600  # seconds, as the apiserver's TokenRequest validation
DEFAULT_EXPIRATION = 3600

Objects = Callable[[str], Iterable[dict[str, Any]]]  # RBAC plural -> stored objects


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenAuthority:
    """Signs and verifies ServiceAccount tokens (JWTs, HS256 with a per-server key).

    The claims are those of a bound ServiceAccount token (``sub``, ``aud``, ``exp``,
    ``kubernetes.io.serviceaccount``); a token stays valid only while the ServiceAccount
    with that uid exists (checked by :meth:`AccessControl.authenticate`).
    """

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def issue(
        self, namespace: str, name: str, uid: str, audiences: list[str], seconds: int, now: float
    ) -> tuple[str, int]:
        """A signed token and its expiry (unix seconds)."""
        exp = int(now) + seconds
        claims = {
            "iss": ISSUER,
            "sub": f"system:serviceaccount:{namespace}:{name}",
            "aud": audiences,
            "iat": int(now),
            "nbf": int(now),
            "exp": exp,
            "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": name, "uid": uid}},
        }
        head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
        body = _b64(json.dumps(claims, separators=(",", ":")).encode())
        sig = _b64(hmac.new(self._key, f"{head}.{body}".encode(), hashlib.sha256).digest())
        return f"{head}.{body}.{sig}", exp

    def verify(self, token: str, now: float) -> dict[str, Any] | None:
        """The claims of a token this authority signed and that has not expired, else None."""
        parts = token.split(".")
        if len(parts) != 3:
            return None
        want = hmac.new(self._key, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest()
        try:
            if not hmac.compare_digest(want, _unb64(parts[2])):
                return None
            claims = json.loads(_unb64(parts[1]))
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(claims, dict) or not isinstance(claims.get("exp"), int):
            return None
        return claims if claims["exp"] > now else None


class AccessControl:
    """Who a request is and whether it may proceed.

    Args:
        mode: ``AlwaysAllow`` (credentials ignored, everything allowed) or ``RBAC``.
        objects: reads stored objects by plural (roles, clusterroles, rolebindings,
            clusterrolebindings, serviceaccounts lookups).
        service_account_uid: (namespace, name) -> uid of the live ServiceAccount, or None.

    Attributes:
        admin_token: bearer token of the ``admin`` user (group system:masters).
        denials: every request refused with 403, in order (tests assert none happened).
    """

    def __init__(
        self,
        mode: str,
        objects: Objects,
        service_account_uid: Callable[[str, str], str | None],
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"authorization mode must be one of {', '.join(MODES)}: {mode!r}")
        self.mode = mode
        self._objects = objects
        self._sa_uid = service_account_uid
        self.tokens = TokenAuthority()
        self.admin_token = "admin-" + secrets.token_hex(16)
        self.denials: list[Attributes] = []

    @property
    def enforcing(self) -> bool:
        """True when requests are authenticated and authorized (RBAC mode)."""
        return self.mode == "RBAC"

    def authenticate(self, authorization: str | None) -> User:
        """The user of a request's ``Authorization`` header (no header: system:anonymous).

        Raises:
            ApiError: 401 Unauthorized for a bearer token that is not valid (RBAC mode).
        """
        if not self.enforcing:
            return ADMIN
        if not authorization:
            return ANONYMOUS
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthorized()
        if hmac.compare_digest(token, self.admin_token):
            return ADMIN
        claims = self.tokens.verify(token, time.time())
        if claims is None:
            raise unauthorized()
        k8s = claims.get("kubernetes.io") or {}
        sa = k8s.get("serviceaccount") or {}
        ns, name, uid = str(k8s.get("namespace", "")), str(sa.get("name", "")), sa.get("uid")
        if not uid or self._sa_uid(ns, name) != uid:
            raise unauthorized()
        return sa_user(ns, name)

    def check(self, attrs: Attributes) -> None:
        """Authorize one request (nothing in AlwaysAllow mode).

        Raises:
            ApiError: 403 Forbidden in Kubernetes' message shape.
        """
        if not self.enforcing:
            return
        decision = authorize(attrs, self._policy())
        if decision.allowed:
            return
        self.denials.append(attrs)
        err = forbidden(attrs, decision.reason)
        log.info("forbidden: %s", err.message, extra={"user": attrs.user.name})
        raise err

    def _policy(self) -> Policy:
        return Policy.from_objects(
            self._objects("roles"),
            self._objects("clusterroles"),
            self._objects("rolebindings"),
            self._objects("clusterrolebindings"),
        )

    def impersonate(self, user: User, headers: dict[str, str]) -> User:
        """The user a request acts as: ``Impersonate-User`` / ``Impersonate-Group`` when the
        caller may ``impersonate`` those users (serviceaccounts for SA names), groups.

        Raises:
            ApiError: 403 when the caller may not impersonate them; 400 groups without a user.
        """
        if not self.enforcing:
            return user
        name = headers.get("impersonate-user")
        groups = [g.strip() for g in headers.get("impersonate-group", "").split(",") if g.strip()]
        if name is None and not groups:
            return user
        if not name:
            raise E.bad_request("requested impersonation of groups without a user")
        targets: list[Attributes] = []
        if name.startswith(SA_PREFIX) and name.count(":") == 3:
            ns, sa = name[len(SA_PREFIX):].split(":")
            targets.append(Attributes(user, "impersonate", resource="serviceaccounts",
                                      name=sa, namespace=ns))
            as_user = sa_user(ns, sa)
        else:
            targets.append(Attributes(user, "impersonate", resource="users", name=name))
            as_user = User(name, ("system:authenticated",))
        targets += [Attributes(user, "impersonate", resource="groups", name=g) for g in groups]
        for attrs in targets:
            self.check(attrs)
        extra = tuple(g for g in groups if g not in as_user.groups)
        return User(as_user.name, as_user.groups + extra)

    def review(self, user: User, body: Any, *, subject: bool) -> dict[str, Any]:
        """Answer a SelfSubjectAccessReview (``user`` asks about itself) or, with
        ``subject``, a SubjectAccessReview (about ``spec.user`` / ``spec.groups``).

        Raises:
            ApiError: 400 a body without resourceAttributes or nonResourceAttributes.
        """
        spec = body.get("spec") if isinstance(body, dict) else None
        if not isinstance(spec, dict):
            raise E.bad_request("spec must be an object")
        if subject:
            user = User(str(spec.get("user", "")), tuple(str(g) for g in spec.get("groups") or ()))
        ra, nra = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
        if isinstance(ra, dict):
            attrs = Attributes(
                user,
                str(ra.get("verb", "")),
                api_group=str(ra.get("group", "")),
                resource=str(ra.get("resource", "")),
                subresource=str(ra.get("subresource", "")),
                name=str(ra.get("name", "")),
                namespace=str(ra.get("namespace", "")),
            )
        elif isinstance(nra, dict):
            attrs = Attributes(user, str(nra.get("verb", "")), resource_request=False,
                               path=str(nra.get("path", "")))
        else:
            raise E.bad_request("resourceAttributes or nonResourceAttributes is required")
        decision = authorize(attrs, self._policy()) if self.enforcing else None
        allowed = decision is None or decision.allowed
        status: dict[str, Any] = {"allowed": allowed}
        if decision is not None and decision.reason:
            status["evaluationError"] = decision.reason
        if allowed and decision is not None:
            status["reason"] = "allowed by RBAC"
        out = dict(body)
        out["status"] = status
        out.setdefault("metadata", {})
        return out

    def token_review(self, body: Any) -> dict[str, Any]:
        """Answer a TokenReview: who ``spec.token`` authenticates as (the same check as a
        request's bearer token; the admin token and live ServiceAccount tokens), as the
        delegated authentication of an agent's diagnostics listener asks it.

        Raises:
            ApiError: 400 a body without ``spec``.
        """
        spec = body.get("spec") if isinstance(body, dict) else None
        if not isinstance(spec, dict):
            raise E.bad_request("spec must be an object")
        token = str(spec.get("token") or "")
        status: dict[str, Any]
        try:
            user = self.authenticate(f"Bearer {token}") if token else None
        except ApiError:
            user = None
        if user is None or user is ANONYMOUS:
            status = {"authenticated": False, "error": "invalid bearer token"}
        else:
            status = {"authenticated": True,
                      "user": {"username": user.name, "groups": list(user.groups)},
                      "audiences": list(spec.get("audiences") or [ISSUER])}
        return {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}

    def token_request(
        self, namespace: str, name: str, uid: str, body: Any, now: float | None = None
    ) -> dict[str, Any]:
        """Answer a TokenRequest for the ServiceAccount ``namespace/name`` (uid ``uid``).

        Raises:
            ApiError: 400 a body that is not an object; 422 expirationSeconds under 600.
        """
        now = time.time() if now is None else now
        if body is not None and not isinstance(body, dict):
            raise E.bad_request("the object provided is unrecognized (must be a JSON object)")
        spec = (body or {}).get("spec") or {}
        if not isinstance(spec, dict):
            raise E.bad_request("spec must be an object")
        seconds = spec.get("expirationSeconds") or DEFAULT_EXPIRATION
        if not isinstance(seconds, int) or seconds < MIN_EXPIRATION:
            raise E.invalid(
                "TokenRequest",
                "authentication.k8s.io",
                name,
                [
                    E.field_cause(
                        "FieldValueInvalid",
                        "spec.expirationSeconds",
                        f"Invalid value: {seconds!r}: may not specify a duration less than 10 "
                        "minutes",
                    )
                ],
            )
        audiences = [str(a) for a in spec.get("audiences") or [ISSUER]]
        token, exp = self.tokens.issue(namespace, name, uid, audiences, seconds, now)
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(exp))
        return {
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": None},
            "spec": {
                "audiences": audiences,
                "expirationSeconds": seconds,
                "boundObjectRef": spec.get("boundObjectRef"),
            },
            "status": {"token": token, "expirationTimestamp": expires},
        }


def unauthorized() -> ApiError:
    """401 Unauthorized (the apiserver says no more than that)."""
    return ApiError(401, "Unauthorized", "Unauthorized")


# Bootstrap policy an RBAC-enforcing server starts with (a subset of the upstream defaults):
# admins are cluster-admin through system:masters; every client may read discovery, OpenAPI,
# health and version; every authenticated client may ask what it may do (kubectl auth can-i).
BOOTSTRAP_CLUSTER_ROLES: list[dict[str, Any]] = [
    {
        "metadata": {"name": "cluster-admin"},
        "rules": [
            {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
            {"nonResourceURLs": ["*"], "verbs": ["*"]},
        ],
    },
    {
        "metadata": {"name": "system:discovery"},
        "rules": [
            {
                "nonResourceURLs": [
                    "/api", "/api/*", "/apis", "/apis/*", "/openapi", "/openapi/*",
                    "/healthz", "/livez", "/readyz", "/version", "/version/",
                ],
                "verbs": ["get"],
            }
        ],
    },
    {
        "metadata": {"name": "system:basic-user"},
        "rules": [
            {
                "apiGroups": ["authorization.k8s.io"],
                "resources": ["selfsubjectaccessreviews"],
                "verbs": ["create"],
            }
        ],
    },
    {
        "metadata": {"name": "system:public-info-viewer"},
        "rules": [
            {
                "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"],
                "verbs": ["get"],
            }
        ],
    },
]
BOOTSTRAP_CLUSTER_ROLE_BINDINGS: list[dict[str, Any]] = [
    {
        "metadata": {"name": "cluster-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                      "name": "system:masters"}],
    },
    {
        "metadata": {"name": "system:discovery"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "system:discovery"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                      "name": "system:authenticated"}],
    },
    {
        "metadata": {"name": "system:basic-user"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "system:basic-user"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                      "name": "system:authenticated"}],
    },
    {
        "metadata": {"name": "system:public-info-viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "system:public-info-viewer"},
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
             "name": "system:authenticated"},
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
             "name": "system:unauthenticated"},
        ],
    },
]


def bootstrap_policy() -> list[tuple[str, dict[str, Any]]]:
    """(plural, fresh object) of every bootstrap ClusterRole and ClusterRoleBinding."""
    return [("clusterroles", copy.deepcopy(o)) for o in BOOTSTRAP_CLUSTER_ROLES] + [
        ("clusterrolebindings", copy.deepcopy(o)) for o in BOOTSTRAP_CLUSTER_ROLE_BINDINGS
    ]
