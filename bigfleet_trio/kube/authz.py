"""Delegated authentication and authorization of the diagnostics listener (``--metrics-auth``).

controller-runtime's model (its ``WithAuthenticationAndAuthorization`` filter): a caller of
``/metrics`` or ``/events`` sends a bearer token; a ``TokenReview`` says who it is, and a
``SubjectAccessReview`` for the non-resource URL (``get /metrics``) says whether that user may
read it. Grant it with the shipped ``bigfleet-metrics-reader`` ClusterRole. Decisions are cached
for ``ttl`` seconds per (token, path), as the apiserver's delegating authenticator and authorizer
cache theirs, so a scrape every 15 s costs two reviews per token at most every ``ttl``; the
reviews in flight are capped and run on a client of their own.
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
from .config import KubeConfig
from .errors import ApiError, KubeTransportError
from .resources import SUBJECT_ACCESS_REVIEWS, TOKEN_REVIEWS

__all__ = ["KubeAuthorizer", "review_client"]

log = logging.getLogger(__name__)


def review_client(config: KubeConfig, user_agent: str = "bigfleet-trio") -> KubeClient:
    """A client for the reviews alone (``<user_agent>/auth-delegator``): its own token bucket,
    429 hold and connections, so a throttled TokenReview never holds the binary's writes or its
    Lease renewals (docs/crds.md#diagnostics-access). One attempt per review: a failed review
    is that request's 500, and the scraper asks again at its next interval."""
    return KubeClient(config, qps=20.0, burst=40, max_attempts=1, max_retry_after=5.0,
                      user_agent=f"{user_agent}/auth-delegator")


class KubeAuthorizer:
    """TokenReview + SubjectAccessReview against the cluster the binary already talks to.

    Bounded, since every unseen token on an open listener costs a review: at most
    ``max_in_flight`` reviews at once (a request beyond that is refused at once with a 429
    decision, counted as ``refused``), and two LRU caches, so a flood of unseen tokens (each
    one unauthenticated) never pushes a known caller's decision out.

    Args:
        client: a KubeClient for the reviews, ideally :func:`review_client`'s (its
            ServiceAccount needs ``create`` on ``tokenreviews`` and ``subjectaccessreviews``:
            the shipped ``bigfleet-metrics-auth`` ClusterRole).
        ttl: seconds a decision is reused for the same token and path (10).
        max_entries: bound of the cache of authenticated callers' decisions (LRU).
        max_rejected: bound of the cache of unauthenticated tokens (LRU).
        max_in_flight: reviews at once; more are refused.
        clock: monotonic seconds (tests inject one).
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        ttl: float = 10.0,
        max_entries: int = 1024,
        max_rejected: int = 256,
        max_in_flight: int = 4,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.client = client
        self.ttl = ttl
        self._clock = clock or trio.current_time
        self._known = _LRU(max_entries)
        self._rejected = _LRU(max_rejected)
        self._slots = trio.Semaphore(max_in_flight)

    async def check(self, authorization: str | None, path: str, verb: str = "get") -> Decision:
        """Decide one request from its ``Authorization`` header.

        Never raises: a failed review is a 500 decision (and an ERROR naming the missing grant
        for a 403 from the apiserver); a review beyond ``max_in_flight`` is a 429 decision.
        """
        token = bearer_token(authorization)
        if token is None:
            return counted(Decision(401, "a bearer token is required (Authorization: Bearer)"))
        key = (hashlib.sha256(token.encode()).hexdigest(), path, verb)
        now = self._clock()
        hit = self._known.get(key, now) or self._rejected.get(key, now)
        if hit is not None:
            return counted(hit)
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            return counted(Decision(429, "too many authorization reviews in flight; retry"))
        try:
            decision = await self._review(token, path, verb)
        finally:
            self._slots.release()
        if decision.status == 401:
            self._rejected.put(key, now + self.ttl, decision)
        elif decision.status != 500:  # an outage is not remembered
            self._known.put(key, now + self.ttl, decision)
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



class _LRU:
    """Decisions by key with an expiry each; the least recently used goes first when full."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._items: OrderedDict[tuple[str, str, str], tuple[float, Decision]] = OrderedDict()

    def get(self, key: tuple[str, str, str], now: float) -> Decision | None:
        hit = self._items.get(key)
        if hit is None:
            return None
        if hit[0] <= now:
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return hit[1]

    def put(self, key: tuple[str, str, str], expires: float, decision: Decision) -> None:
        self._items[key] = (expires, decision)
        self._items.move_to_end(key)
        while len(self._items) > self.bound:
            self._items.popitem(last=False)
