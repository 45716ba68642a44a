"""Delegated authentication and authorization of the diagnostics listener (``--metrics-auth``).

controller-runtime's model (its ``WithAuthenticationAndAuthorization`` filter): a caller of
``/metrics`` or ``/events`` sends a bearer token; a ``TokenReview`` says who it is, and a
``SubjectAccessReview`` for the non-resource URL (``get /metrics``) says whether that user may
read it. Grant it with the shipped ``bigfleet-metrics-reader`` ClusterRole. Decisions are cached
for ``ttl`` seconds per (token, path), as the apiserver's delegating authenticator and authorizer
cache theirs, so a scrape every 15 s costs two reviews per token at most every ``ttl``.
docs/crds.md#diagnostics-access.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import trio

from bigfleet_trio.observability.authz import Decision, bearer_token, counted

from .client import KubeClient
from .errors import ApiError, KubeTransportError
from .resources import SUBJECT_ACCESS_REVIEWS, TOKEN_REVIEWS

__all__ = ["KubeAuthorizer"]

log = logging.getLogger(__name__)


class KubeAuthorizer:
    """TokenReview + SubjectAccessReview against the cluster the binary already talks to.

    Args:
        client: the binary's KubeClient (its ServiceAccount needs ``create`` on
            ``tokenreviews`` and ``subjectaccessreviews``: the shipped
            ``bigfleet-metrics-auth`` ClusterRole).
        ttl: seconds a decision is reused for the same token and path (10).
        max_entries: cache bound; the oldest entry goes first.
        clock: monotonic seconds (tests inject one).
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        ttl: float = 10.0,
        max_entries: int = 1024,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.client = client
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock or trio.current_time
        self._cache: OrderedDict[tuple[str, str, str], tuple[float, Decision]] = OrderedDict()

    async def check(self, authorization: str | None, path: str, verb: str = "get") -> Decision:
        """Decide one request from its ``Authorization`` header.

        Never raises: a failed review is a 500 decision (and an ERROR naming the missing grant
        for a 403 from the apiserver).
        """
        token = bearer_token(authorization)
        if token is None:
            return counted(Decision(401, "a bearer token is required (Authorization: Bearer)"))
        key = (hashlib.sha256(token.encode()).hexdigest(), path, verb)
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return counted(hit[1])
        decision = await self._review(token, path, verb)
        if decision.status != 500:  # an outage is not remembered
            self._cache[key] = (now + self.ttl, decision)
            self._cache.move_to_end(key)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return counted(decision)

    async def _review(self, token: str, path: str, verb: str) -> Decision:
        try:
            review = await self.client.create(TOKEN_REVIEWS, {"spec": {"token": token}})
            status: dict[str, Any] = review.get("status") or {}
            if not status.get("authenticated"):
                return Decision(401, "the bearer token is not valid")
            user = status.get("user") or {}
            name = str(user.get("username") or "")
            sar = await self.client.create(SUBJECT_ACCESS_REVIEWS, {"spec": {
                "user": name, "groups": list(user.get("groups") or []),
                "uid": str(user.get("uid") or ""), "extra": user.get("extra") or {},
                "nonResourceAttributes": {"path": path, "verb": verb},
            }})
        except (ApiError, KubeTransportError) as exc:
            if isinstance(exc, ApiError) and exc.status == 403:
                log.error(
                    "diagnostics auth: the apiserver refused the review: %s; fix: grant this "
                    "ServiceAccount create on tokenreviews.authentication.k8s.io and "
                    "subjectaccessreviews.authorization.k8s.io (the shipped ClusterRole "
                    "bigfleet-metrics-auth)", exc, extra={"path": path})
            else:
                log.warning("diagnostics auth: review failed: %s", exc, extra={"path": path})
            return Decision(500, f"authorization check failed: {exc}")
        if (sar.get("status") or {}).get("allowed"):
            return Decision(200, "allowed", name)
        return Decision(403, f'user "{name}" cannot {verb} path "{path}" (bind the ClusterRole '
                        "bigfleet-metrics-reader)", name)

