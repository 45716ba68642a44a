"""Request and response values of the embedded apiserver's HTTP side: the decoded request,
body decoding (JSON, YAML, kubectl's protobuf), and JSON / Status responses.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import yaml

from . import errors as E
from .errors import ApiError
from .store import dumps

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON_CT = b"application/json"
NOT_FOUND_MESSAGE = "the server could not find the requested resource"


class Response:
    """A complete (non-streaming) HTTP response."""

    __slots__ = ("status", "body", "content_type", "headers")

    def __init__(
        self,
        status: int,
        body: bytes,
        content_type: bytes = JSON_CT,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers or []


def json_response(
    status: int, obj: Any, ct: bytes = JSON_CT, warnings: list[str] | None = None
) -> Response:
    """``obj`` as JSON; each warning becomes a ``Warning: 299`` header (kubectl prints them)."""
    headers = [(b"warning", f'299 - "{w}"'.encode()) for w in warnings or ()]
    return Response(status, dumps(obj), ct, headers)


def error_response(err: ApiError) -> Response:
    """The ``Status`` body of ``err`` with its HTTP code and extra headers."""
    headers = [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    return Response(err.code, dumps(err.status()), JSON_CT, headers)


def not_found() -> ApiError:
    """404 for a path the server does not serve."""
    return ApiError(404, "NotFound", NOT_FOUND_MESSAGE, {})


class Request:
    """One decoded HTTP request (query parameters: last value wins)."""

    __slots__ = ("method", "path", "query", "headers", "body")

    def __init__(
        self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: bytes
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body

    def q(self, name: str, default: str | None = None) -> str | None:
        """A query parameter."""
        return self.query.get(name, default)

    def flag(self, name: str) -> bool:
        """A boolean query parameter (``true`` / ``1``)."""
        return (self.query.get(name) or "").lower() in ("true", "1")

    def decode(self, *, allow_yaml: bool = True) -> Any:
        """Decode a JSON (or YAML) body; 400 on malformed input, 415 on unknown types."""
        ct = self.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if not self.body:
            raise E.bad_request("the request body is empty")
        if "protobuf" in ct:
            from .protobuf import ProtobufError, decode

            try:
                return decode(self.body)
            except (ProtobufError, UnicodeDecodeError) as exc:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types "
                    f"include: application/json, application/yaml ({exc})",
                ) from None
        if "cbor" in ct:
            raise E.unsupported_media_type(ct)
        if allow_yaml and ("yaml" in ct):
            try:
                return yaml.safe_load(self.body)
            except yaml.YAMLError as exc:
                raise E.bad_request(f"error converting YAML to JSON: {exc}") from None
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise E.bad_request(f"couldn't get version/kind; json parse error: {exc}") from None
