"""Test hooks: fault injection and request counters.

Faults apply to HTTP requests only (in-process helpers bypass them).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import ApiError

if TYPE_CHECKING:
    from .store import Store

_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass
class _Rule:
    count: int
    code: int
    verb: str | None
    resource: str | None
    name: str | None = None
    message: str | None = None
    retry_after: int = 1

    def matches(self, verb: str, resource: str, name: str | None = None) -> bool:
        return (
            (self.verb is None or self.verb == verb)
            and (self.resource is None or self.resource == resource)
            and (self.name is None or self.name == name)
        )


@dataclass
class _Latency:
    seconds: float
    verb: str | None
    resource: str | None


class Faults:
    """Fault injection.

    ``verb`` is one of get/list/watch/create/update/patch/delete/deletecollection; ``resource``
    is the plural, with ``/subresource`` for subresources (``pods/eviction``,
    ``capacityrequests/status``); ``name`` the object a request names (none for a list).
    None matches anything.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._rules: list[_Rule] = []
        self._latency: list[_Latency] = []

    def fail_next(
        self,
        n: int = 1,
        *,
        code: int = 500,
        verb: str | None = None,
        resource: str | None = None,
        name: str | None = None,
        message: str | None = None,
        retry_after: int = 1,
    ) -> None:
        """Make the next ``n`` matching requests fail with ``code`` (a Status body whose
        message is ``message``, or ``injected fault (<verb> <resource>)``). With ``name``, only
        requests on that object match: a per-Pod eviction answer is ``fail_next(code=429,
        verb="create", resource="pods/eviction", name="web")``. A 429 carries ``Retry-After:
        retry_after`` (seconds) and the same ``retryAfterSeconds`` detail."""
        self._rules.append(_Rule(n, code, verb, resource, name, message, retry_after))

    def add_latency(
        self, seconds: float, *, verb: str | None = None, resource: str | None = None
    ) -> None:
        """Delay every matching request by ``seconds`` before it is handled."""
        self._latency.append(_Latency(seconds, verb, resource))

    def clear(self) -> None:
        """Remove all failure and latency rules."""
        self._rules.clear()
        self._latency.clear()

    def drop_watches(self) -> int:
        """End every open watch stream now; returns how many were ended."""
        return self._store.drop_watches()

    def compact(self) -> None:
        """Forget watch history so a watch from any earlier resourceVersion gets 410."""
        self._store.compact()

    # ---- used by the app ---------------------------------------------------------------------

    def latency_for(self, verb: str, resource: str) -> float:
        return sum(
            rule.seconds
            for rule in self._latency
            if (rule.verb in (None, verb)) and (rule.resource in (None, resource))
        )

    def take(self, verb: str, resource: str, name: str | None = None) -> ApiError | None:
        """Consume a matching failure rule, returning the error to answer with."""
        for rule in self._rules:
            if rule.count > 0 and rule.matches(verb, resource, name):
                rule.count -= 1
                if rule.count == 0:
                    self._rules.remove(rule)
                reason = _REASONS.get(rule.code, "InternalError")
                throttled = rule.code == 429
                headers = {"Retry-After": str(rule.retry_after)} if throttled else None
                details = {"retryAfterSeconds": rule.retry_after} if throttled else None
                message = rule.message or f"injected fault ({verb} {resource})"
                return ApiError(rule.code, reason, message, details, headers)
        return None


class Counters:
    """Requests counted by ``(verb, resource)``; ``counters[("create", "pods")]``."""

    def __init__(self) -> None:
        self.by_key: collections.Counter[tuple[str, str]] = collections.Counter()

    def __getitem__(self, key: tuple[str, str]) -> int:
        return self.by_key[key]

    def add(self, verb: str, resource: str) -> None:
        self.by_key[(verb, resource)] += 1

    def total(self, verb: str | None = None, resource: str | None = None) -> int:
        """Sum over matching keys (None matches anything)."""
        return sum(
            n for (v, r), n in self.by_key.items() if verb in (None, v) and resource in (None, r)
        )

    def reset(self) -> None:
        self.by_key.clear()

    def snapshot(self) -> dict[tuple[str, str], int]:
        return dict(self.by_key)
