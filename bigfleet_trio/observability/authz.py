"""Who may read the diagnostics listener's ``/metrics`` and ``/events`` (``--metrics-auth``).

The listener asks an :class:`Authorizer` for a :class:`Decision` per request; the Kubernetes one
(TokenReview + SubjectAccessReview, controller-runtime's model) is
:class:`bigfleet_trio.kube.authz.KubeAuthorizer`. docs/crds.md#diagnostics-access.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["Authorizer", "Decision", "PROTECTED_PATHS", "bearer_token", "counted"]

PROTECTED_PATHS = ("/metrics", "/events", "/debug/tasks", "/debug/pprof/profile")
"""Paths behind the check (the ``/debug`` ones exist only with ``--enable-profiling``); probes
(/healthz, /livez, /readyz) stay open for the kubelet."""


@dataclass(frozen=True)
class Decision:
    """``status`` is the HTTP answer: 200 allowed, 401 no or bad token, 403 not authorized,
    429 too many checks in flight, 500 the check itself failed (``reason`` says why)."""

    status: int
    reason: str
    user: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == 200


class Authorizer(Protocol):
    async def check(self, authorization: str | None, path: str, verb: str = "get") -> Decision:
        """Decide one request from its ``Authorization`` header; never raises."""
        ...


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def counted(decision: Decision) -> Decision:
    """Count ``decision`` in ``bigfleet_diagnostics_auth_decisions_total`` and return it."""
    from bigfleet_trio.observability.metrics import DIAGNOSTICS_AUTH

    label = {200: "allowed", 401: "unauthenticated", 403: "forbidden",
             429: "refused"}.get(decision.status, "error")
    DIAGNOSTICS_AUTH.labels(label).inc()
    return decision
