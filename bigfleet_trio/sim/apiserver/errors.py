"""Kubernetes ``Status`` errors as the real apiserver shapes them.

Every failure the embedded server returns is an :class:`ApiError` turned into a ``Status``
body whose HTTP status equals ``code``.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An API failure that becomes a ``Status`` object.

    Args:
        code: HTTP status code (also ``Status.code``).
        reason: ``Status.reason`` (NotFound, AlreadyExists, Conflict, Invalid, BadRequest, ...).
        message: human readable ``Status.message``.
        details: optional ``Status.details`` dict (name, group, kind, causes, retryAfterSeconds).
        headers: extra HTTP headers (e.g. Retry-After).
    """

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self) -> dict[str, Any]:
        """Return the ``Status`` body for this error."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            # StatusDetails' fields are all omitempty: an empty group (core) is left out
            body["details"] = {k: v for k, v in self.details.items() if v not in ("", None)}
        body["code"] = self.code
        return body


def _qualified(plural: str, group: str) -> str:
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, group: str, name: str) -> ApiError:
    """404 ``<plural>[.group] "name" not found``."""
    return ApiError(
        404,
        "NotFound",
        f'{_qualified(plural, group)} "{name}" not found',
        {"name": name, "group": group, "kind": plural},
    )


def already_exists(plural: str, group: str, name: str) -> ApiError:
    """409 AlreadyExists."""
    return ApiError(
        409,
        "AlreadyExists",
        f'{_qualified(plural, group)} "{name}" already exists',
        {"name": name, "group": group, "kind": plural},
    )


def conflict(plural: str, group: str, name: str, why: str | None = None) -> ApiError:
    """409 Conflict (stale resourceVersion or failed precondition)."""
    why = why or (
        "the object has been modified; please apply your changes to the latest version "
        "and try again"
    )
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(plural, group)} "{name}": {why}',
        {"name": name, "group": group, "kind": plural},
    )


def invalid(kind: str, group: str, name: str, causes: list[dict[str, str]]) -> ApiError:
    """422 Invalid with ``causes`` = [{reason, message, field}].

    The message joins the causes like the apiserver: one cause inline, several in brackets.
    """
    parts = [f"{c['field']}: {c['message']}" if c.get("field") else c["message"] for c in causes]
    summary = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    qual = f"{kind}.{group}" if group else kind
    return ApiError(
        422,
        "Invalid",
        f'{qual} "{name}" is invalid: {summary}',
        {"name": name, "group": group, "kind": kind, "causes": causes},
    )


def field_cause(reason: str, field: str, message: str) -> dict[str, str]:
    """One ``StatusCause`` (reason is e.g. FieldValueInvalid, FieldValueRequired)."""
    return {"reason": reason, "message": message, "field": field}


def bad_request(message: str) -> ApiError:
    """400 BadRequest."""
    return ApiError(400, "BadRequest", message)


def method_not_allowed() -> ApiError:
    """405 MethodNotAllowed."""
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )


def unsupported_media_type(content_type: str, kind_desc: str | None = None) -> ApiError:
    """415 UnsupportedMediaType (e.g. strategic merge patch on a custom resource)."""
    accepted = (
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
    )
    if kind_desc:
        msg = f"{content_type} is not supported by {kind_desc}"
    else:
        msg = (
            "the body of the request was in an unknown format - accepted media types include: "
            f"{accepted}"
        )
    return ApiError(415, "UnsupportedMediaType", msg)


def expired(message: str) -> ApiError:
    """410 Expired (too old resourceVersion / continue token)."""
    return ApiError(410, "Expired", message)


def too_many_requests(
    message: str, causes: list[dict[str, str]] | None = None, retry_after: int = 0
) -> ApiError:
    """429 TooManyRequests, optionally with causes and ``retryAfterSeconds``."""
    details: dict[str, Any] = {}
    headers: dict[str, str] = {}
    if causes:
        details["causes"] = causes
    if retry_after:
        details["retryAfterSeconds"] = retry_after
        headers["Retry-After"] = str(retry_after)
    return ApiError(429, "TooManyRequests", message, details or None, headers)


def internal(message: str) -> ApiError:
    """500 InternalError."""
    return ApiError(
        500,
        "InternalError",
        f"Internal error occurred: {message}",
        {"causes": [{"message": message}]},
    )


def too_large_resource_version(requested: int, current: int) -> ApiError:
    """504 Timeout for a watch or list from a resourceVersion the server has not reached.

    The shape client-go's reflector recognises (reason Timeout, a ``ResourceVersionTooLarge``
    cause) and answers with a fresh list. The real watch cache waits up to ~3 s for the
    version to appear first; here no write can be in flight, so the refusal is immediate.
    """
    return ApiError(
        504,
        "Timeout",
        f"Timeout: Too large resource version: {requested}, current: {current}",
        {
            "causes": [
                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
            ],
            "retryAfterSeconds": 1,
        },
        {"Retry-After": "1"},
    )
