"""Status-body → exception mapping (docs/kube-api.md, "Errors")."""

import json

import pytest

from bigfleet_trio.kube.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Conflict,
    Expired,
    Forbidden,
    Invalid,
    NotFound,
    ServerError,
    TooManyRequests,
    Unauthorized,
    error_from_status,
    parse_retry_after,
)


def _status(code: int, reason: str, message: str = "m", **details: object) -> bytes:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
    if details:
        body["details"] = details
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("code", "reason", "cls"),
    [
        (404, "NotFound", NotFound),
        (409, "AlreadyExists", AlreadyExists),
        (409, "Conflict", Conflict),
        (422, "Invalid", Invalid),
        (429, "TooManyRequests", TooManyRequests),
        (410, "Expired", Expired),
        (410, "Gone", Expired),
        (403, "Forbidden", Forbidden),
        (401, "Unauthorized", Unauthorized),
        (500, "InternalError", ServerError),
        (503, "ServiceUnavailable", ServerError),
        (400, "BadRequest", BadRequest),
        (415, "UnsupportedMediaType", BadRequest),
    ],
)
def test_status_mapping(code: int, reason: str, cls: type) -> None:
    err = error_from_status(code, _status(code, reason, "boom"))
    assert type(err) is cls
    assert isinstance(err, ApiError)
    assert (err.status, err.reason, err.message) == (code, reason, "boom")
    assert err.body is not None and err.body["code"] == code


def test_conflict_message_kept() -> None:
    msg = (
        'Operation cannot be fulfilled on leases.coordination.k8s.io "x": the object has been '
        "modified; please apply your changes to the latest version and try again"
    )
    err = error_from_status(409, _status(409, "Conflict", msg))
    assert isinstance(err, Conflict) and err.message == msg


def test_non_json_body() -> None:
    err = error_from_status(502, b"<html>bad gateway</html>")
    assert isinstance(err, ServerError)
    assert err.body is None and err.reason == "ServerError" and "bad gateway" in err.message
    assert isinstance(error_from_status(404, b""), NotFound)


def test_retry_after_header_wins_over_details() -> None:
    err = error_from_status(
        429, _status(429, "TooManyRequests", retryAfterSeconds=7), {"retry-after": "3"}
    )
    assert isinstance(err, TooManyRequests) and err.retry_after == 3.0
    err = error_from_status(429, _status(429, "TooManyRequests", retryAfterSeconds=7))
    assert isinstance(err, TooManyRequests) and err.retry_after == 7.0
    err = error_from_status(429, b"")
    assert isinstance(err, TooManyRequests) and err.retry_after is None


def test_watch_error_event_status_dict() -> None:
    obj = {
        "kind": "Status",
        "code": 410,
        "reason": "Expired",
        "message": "too old resource version: 5 (9)",
    }
    err = error_from_status(200, obj)
    assert isinstance(err, Expired) and err.status == 410


@pytest.mark.parametrize(
    ("raw", "want"),
    [("5", 5.0), (" 1.5 ", 1.5), ("-1", None), ("soon", None), (None, None), ("nan", None)],
)
def test_parse_retry_after(raw: str | None, want: float | None) -> None:
    assert parse_retry_after(raw) == want


def test_a_plain_text_answer_is_one_line() -> None:
    from bigfleet_trio.kube.errors import error_from_status

    err = error_from_status(404, b"404 page not found\n", {})
    assert "\n" not in str(err) and str(err).endswith("404 page not found")
