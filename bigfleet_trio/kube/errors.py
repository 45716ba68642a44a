"""Exception hierarchy of the Kubernetes layer (everything the agent's apiserver access raises).

Every failure surfaced by :mod:`bigfleet_trio.kube` is a :class:`KubeError`:

* :class:`ApiError` and its subclasses: the apiserver answered with a non-2xx status. The
  subclass is chosen from the HTTP status and, where it disambiguates, ``Status.reason``
  (409 AlreadyExists vs Conflict).
* :class:`KubeTransportError`: the request never got an answer (connect/read failure, timeout,
  malformed response). :class:`WatchInactivityTimeout` is the watch-specific flavour.
* :class:`KubeConfigError`: kubeconfig / in-cluster configuration is missing or broken.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "KubeError",
    "ApiError",
    "BadRequest",
    "NotFound",
    "AlreadyExists",
    "Conflict",
    "Invalid",
    "TooManyRequests",
    "Expired",
    "Forbidden",
    "Unauthorized",
    "ServerError",
    "KubeTransportError",
    "WatchInactivityTimeout",
    "KubeConfigError",
    "error_from_status",
    "parse_retry_after",
]


class KubeError(Exception):
    """Base class of every error raised by the Kubernetes layer."""


class ApiError(KubeError):
    """The apiserver answered with an error status.

    Attributes:
        status: HTTP status code (e.g. 404).
        reason: ``Status.reason`` (e.g. "NotFound"), or the HTTP reason phrase if the body was
            not a Status object.
        message: ``Status.message`` or the (truncated) response text.
        body: the decoded ``Status`` dict, or None if the body was not JSON.
    """

    def __init__(self, status: int, reason: str, message: str, body: dict[str, Any] | None = None):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body


class BadRequest(ApiError):
    """400 / 415 and other 4xx statuses without a dedicated class."""


class NotFound(ApiError):
    """404: the object (or its namespace) does not exist."""


class AlreadyExists(ApiError):
    """409 with reason AlreadyExists: create of an existing name."""


class Conflict(ApiError):
    """409 otherwise: stale resourceVersion or failed delete preconditions."""


class Invalid(ApiError):
    """422: validation failed; ``body["details"]["causes"]`` lists the fields."""


class TooManyRequests(ApiError):
    """429: client throttled by the apiserver, or an eviction blocked by a PodDisruptionBudget.

    Attributes:
        retry_after: seconds from the ``Retry-After`` header or ``details.retryAfterSeconds``,
            None if the server gave no hint.
    """

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ):
        super().__init__(status, reason, message, body)
        self.retry_after = retry_after


class Expired(ApiError):
    """410 Gone / reason Expired: resourceVersion or continue token too old (relist)."""


class Forbidden(ApiError):
    """403: RBAC denies the request."""


class Unauthorized(ApiError):
    """401: credentials missing, expired or rejected."""


class ServerError(ApiError):
    """5xx: apiserver-side failure (retryable for reads)."""


class KubeTransportError(KubeError):
    """No usable answer: connection refused/reset, request timed out, malformed body."""


class WatchInactivityTimeout(KubeTransportError):
    """No watch line (not even a BOOKMARK) arrived within the inactivity timeout."""


class KubeConfigError(KubeError):
    """Kubeconfig or in-cluster configuration missing or unusable (message says which/why)."""


def parse_retry_after(value: str | None) -> float | None:
    """Parse a ``Retry-After`` header in its delta-seconds form.

    Returns:
        Non-negative seconds, or None when absent/unparseable (HTTP-date form is not used by
        the apiserver and is treated as absent).
    """
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    if seconds != seconds or seconds < 0:  # NaN or negative
        return None
    return seconds


def _status_class(status: int, reason: str) -> type[ApiError]:
    if status == 404:
        return NotFound
    if status == 409:
        return AlreadyExists if reason == "AlreadyExists" else Conflict
    if status == 422:
        return Invalid
    if status == 429:
        return TooManyRequests
    if status == 410 or reason in ("Expired", "Gone"):
        return Expired
    if status == 403:
        return Forbidden
    if status == 401:
        return Unauthorized
    if status >= 500:
        return ServerError
    return BadRequest


def error_from_status(
    status: int,
    body: bytes | str | Mapping[str, Any] | None,
    headers: Mapping[str, str] | None = None,
) -> ApiError:
    """Map an error answer (HTTP status + body) to the matching :class:`ApiError` subclass.

    Args:
        status: HTTP status code; for in-stream watch ERROR events pass ``Status.code``.
        body: raw response body or an already decoded ``Status`` dict.
        headers: response headers (for ``Retry-After``); may be None.

    Returns:
        The exception instance (not raised).
    """
    decoded: dict[str, Any] | None = None
    if isinstance(body, Mapping):
        decoded = dict(body)
    elif body:
        try:
            candidate = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            candidate = None
        if isinstance(candidate, dict):
            decoded = candidate
    if decoded is not None and decoded.get("kind") == "Status":
        reason = str(decoded.get("reason") or "")
        message = str(decoded.get("message") or "")
        code = decoded.get("code")
        if isinstance(code, int) and code >= 400 and status < 400:
            status = code
    else:
        decoded = decoded if decoded is not None else None
        reason = ""
        # a plain-text answer ("404 page not found\n"): one line in a log, no trailing newline
        if isinstance(body, bytes):
            message = body[:500].decode("utf-8", "replace").strip()
        elif isinstance(body, str):
            message = body[:500].strip()
        else:
            message = ""
    if not reason:
        reason = _DEFAULT_REASONS.get(status, "ServerError" if status >= 500 else "Unknown")
    cls = _status_class(status, reason)
    if cls is TooManyRequests:
        retry_after = parse_retry_after((headers or {}).get("retry-after"))
        if retry_after is None and decoded is not None:
            details = decoded.get("details")
            if isinstance(details, dict):
                ras = details.get("retryAfterSeconds")
                if isinstance(ras, (int, float)) and ras >= 0:
                    retry_after = float(ras)
        return TooManyRequests(status, reason, message, decoded, retry_after)
    return cls(status, reason, message, decoded)


_DEFAULT_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
}
