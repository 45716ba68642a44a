"""Structured logging: one line per decision, ``text`` or ``json``, with secret redaction.

One line per decision, with the cluster, machine, instruction or CR as fields. Callers use the
standard library::

    log = logging.getLogger(__name__)
    log.info("reclaim acknowledged", extra={"cluster": cid, "node": name, "grace_s": 30})

``json`` prints one object per line: ``{"ts", "level", "logger", "msg", **extra}`` (plus ``exc``
with the traceback when there is one); every ``key=%s`` placeholder of the format string becomes
a key with its argument's value, and identifying ``key=value`` text in the message
(``cluster=``, ``machine_id=``, ``node=`` …) too, when no ``extra`` gave them. ``text`` prints
``ts LEVEL logger msg k=v ...``, leaving out an ``extra`` key the message already shows.

A redaction filter on the handler scrubs bearer tokens, ``Authorization`` headers, PEM blocks,
JWTs and values of secret-named fields (token, password, key data, user_data…) so credentials
never reach the logs, whatever the caller passed.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

__all__ = [
    "IDENTITY_KEYS",
    "setup_logging",
    "JsonFormatter",
    "TextFormatter",
    "RedactingFilter",
    "redact",
    "REDACTED",
]

REDACTED = "[REDACTED]"

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
) | {"message", "asctime", "taskName", "_bf_redacted", "_bf_pairs"}

# Field names whose values are secrets (substring match, case-insensitive, "-" == "_").
_SECRET_NAME_PARTS = (
    "token",
    "password",
    "passwd",
    "secret",
    "authorization",
    "private_key",
    "key_data",
    "api_key",
    "user_data",
    "userdata",
    "cookie",
    "credential",
)

_PEM_RE = re.compile(
    r"-----BEGIN ([A-Z0-9 ]+)-----.*?(?:-----END \1-----|\Z)", re.DOTALL
)
_AUTH_HEADER_RE = re.compile(
    r"(?i)(\bauthorization\b[\"']?\s*[:=]\s*[\"']?)(?:(bearer|basic)\s+)?[^\s\"',}\]]+"
)
_BEARER_RE = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9\-._~+/]+=*")
_JWT_RE = re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")
_KV_SECRET_RE = re.compile(
    r"(?i)([\"']?\b(?:[a-z0-9_-]*(?:token|password|passwd|secret|client-key-data|"
    r"client_key_data|private[_-]key|api[_-]key))[\"']?\s*[:=]\s*)"
    r"(?!\[REDACTED)([\"']?)[^\s\"',}\]]+\2"
)


def _is_secret_name(name: str) -> bool:
    low = name.lower().replace("-", "_")
    return any(part in low for part in _SECRET_NAME_PARTS)


def redact(text: str) -> str:
    """Remove credentials from free text.

    Scrubs PEM blocks (``-----BEGIN …-----`` to the matching END, or to the end of the text),
    ``Authorization: …`` header values, ``Bearer <token>``, JWT-shaped strings and
    ``token=…`` / ``password: …`` / ``client-key-data: …`` style pairs.

    Args:
        text: any string.

    Returns:
        The text with each secret replaced by ``[REDACTED]`` (PEM: ``[REDACTED PEM <label>]``).
    """
    if not text:
        return text
    out = _PEM_RE.sub(lambda m: f"[REDACTED PEM {m.group(1)}]", text)
    out = _AUTH_HEADER_RE.sub(
        lambda m: m.group(1) + ((m.group(2) + " ") if m.group(2) else "") + REDACTED, out
    )
    out = _BEARER_RE.sub(lambda m: m.group(1) + " " + REDACTED, out)
    out = _JWT_RE.sub(REDACTED, out)
    out = _KV_SECRET_RE.sub(lambda m: m.group(1) + m.group(2) + REDACTED + m.group(2), out)
    return out


def _redact_value(name: str, value: Any, depth: int = 0) -> Any:
    if _is_secret_name(name):
        return REDACTED if value not in (None, "") else value
    if depth > 6:
        return value
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, bytes):
        return redact(value.decode("utf-8", "replace"))
    if isinstance(value, Mapping):
        return {str(k): _redact_value(str(k), v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact_value("", v, depth + 1) for v in value]
    return value


class RedactingFilter(logging.Filter):
    """Handler filter that rewrites a record so no secret survives formatting.

    The message is rendered (``getMessage()``) and scrubbed with :func:`redact`; ``args`` are
    cleared; every ``extra`` field is scrubbed, and fields with secret-looking names are replaced
    wholesale. Never drops a record.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_bf_redacted", False):
            return True
        try:
            # the values of "key=%s" placeholders, before args go (JSON lines carry them)
            record._bf_pairs = {k: _redact_value(k, _jsonable(v))
                                for k, v in _template_pairs(record).items()}
            record.msg = redact(record.getMessage())
            record.args = None
        except Exception:  # a broken %-format must not kill logging
            record.msg = redact(str(record.msg))
            record.args = None
        for key in list(vars(record)):
            if key in _STANDARD_ATTRS or key.startswith("_"):
                continue
            try:
                setattr(record, key, _redact_value(key, getattr(record, key)))
            except Exception:
                setattr(record, key, REDACTED)
        record._bf_redacted = True
        return True


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {
        k: v
        for k, v in vars(record).items()
        if k not in _STANDARD_ATTRS and not k.startswith("_")
    }


def _iso(ts: float) -> str:
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts))
    return f"{base}.{int((ts % 1) * 1000):03d}Z"


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    return str(value)


IDENTITY_KEYS = frozenset({
    "cluster", "cluster_id", "machine_id", "node", "cr", "instruction_id", "request_id",
    "upcoming_node", "pod", "namespace", "name", "uid", "kind", "phase", "state", "lease",
    "identity", "supersedes_key", "instance_type", "zone", "outcome", "reason",
})
"""Keys :class:`JsonFormatter` lifts out of ``key=value`` text in a message (see the module
docstring); ``extra=`` is the way to pass them, this only keeps older call sites searchable."""

_MSG_PAIR_RE = re.compile(r"(?<![\w.-])([a-z][a-z0-9_]*)=([^\s,;()\[\]{}\"']+)")


def _pairs_in(msg: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for m in _MSG_PAIR_RE.finditer(msg):
        key, value = m.group(1), m.group(2)
        if key in IDENTITY_KEYS and key not in out:
            out[key] = value
    return out


_CONVERSION_RE = re.compile(
    r"%(?:\((?P<mapkey>\w+)\))?[#0\- +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?"
    r"(?P<conv>[diouxXeEfFgGcrsa%])"
)
_KEY_BEFORE_RE = re.compile(r"(?<![\w.-])([a-z][a-z0-9_]*)=$")


def _template_pairs(record: logging.LogRecord) -> dict[str, Any]:
    """``key=%s`` placeholders of the record's format string, with their argument values
    (``"kube listed informer=%s rv=%s objects=%d"`` -> informer, rv, objects): every value a
    message carries becomes a JSON key, typed as passed, not only text inside ``msg``."""
    msg, args = record.msg, record.args
    if not isinstance(msg, str) or not args:
        return {}
    out: dict[str, Any] = {}
    index = 0
    for m in _CONVERSION_RE.finditer(msg):
        if m.group("conv") == "%":
            continue
        key_m = _KEY_BEFORE_RE.search(msg, 0, m.start())
        if m.group("mapkey") is not None:  # "%(name)s" with a mapping argument
            if isinstance(args, Mapping) and key_m is not None:
                out.setdefault(key_m.group(1), args.get(m.group("mapkey")))
            continue
        if not isinstance(args, tuple) or index >= len(args):
            return out
        if key_m is not None:
            out.setdefault(key_m.group(1), args[index])
        index += 1
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (RFC 3339 UTC, ms), ``level``, ``logger``, ``msg``,
    then the record's ``extra`` fields, then identifying ``key=value`` pairs of the message
    (:data:`IDENTITY_KEYS`) that ``extra`` did not give, then ``exc`` (traceback) if any."""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "ts": _iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in _extras(record).items():
            if k not in obj:
                obj[k] = _jsonable(v)
        pairs = getattr(record, "_bf_pairs", None)
        if pairs is None:
            pairs = {k: _redact_value(k, _jsonable(v))
                     for k, v in _template_pairs(record).items()}
        for k, v in pairs.items():
            if k not in obj:
                obj[k] = v
        for k, v in _pairs_in(obj["msg"]).items():
            obj.setdefault(k, v)
        if record.exc_info:
            obj["exc"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            obj["exc"] = redact(record.exc_text)
        if record.stack_info:
            obj["stack"] = record.stack_info
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _text_value(value: Any) -> str:
    if isinstance(value, str):
        if value and not any(c.isspace() or c in "\"=\\" for c in value):
            return value
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (Mapping, list, tuple, set, frozenset)):
        return json.dumps(_jsonable(value), ensure_ascii=False, separators=(",", ":"))
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return _text_value(str(value)) if not isinstance(value, (int, float)) else str(value)


class TextFormatter(logging.Formatter):
    """``ts LEVEL logger msg k=v ...`` on one line (values with spaces are JSON-quoted; a
    traceback, if any, is appended as ``exc="…"`` so the record stays one line)."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage().replace("\n", "\\n")
        parts = [_iso(record.created), record.levelname, record.name, msg]
        for k, v in _extras(record).items():
            if re.search(rf"(?<![\w.-]){re.escape(k)}=", msg):
                continue  # the message already says it: no "phase=X ... phase=X"
            parts.append(f"{k}={_text_value(v)}")
        if record.exc_info:
            parts.append("exc=" + json.dumps(redact(self.formatException(record.exc_info))))
        elif record.exc_text:
            parts.append("exc=" + json.dumps(redact(record.exc_text)))
        return " ".join(parts)


_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

_NOISY = ("httpx", "httpcore", "hpack", "hypercorn.access", "trio_websocket", "asyncio")


def _level_number(level: str | int) -> int:
    if isinstance(level, int):
        return level
    try:
        return _LEVELS[level.strip().lower()]
    except KeyError:
        raise ValueError(
            f"invalid log level {level!r} (use debug, info, warning, error)"
        ) from None


def setup_logging(
    format: str = "text",  # noqa: A002 - mirrors the flag name
    level: str | int = "info",
    *,
    stream: IO[str] | None = None,
) -> logging.Handler:
    """Configure the root logger for the process: one handler on stderr, redaction on.

    Idempotent: a handler installed by an earlier call is replaced, others are left alone.
    Chatty third-party loggers (httpx, httpcore, hpack, hypercorn.access) are held at WARNING
    unless ``level`` is debug.

    Args:
        format: ``"text"`` or ``"json"``.
        level: ``"debug"``, ``"info"``, ``"warning"`` (``"warn"``), ``"error"`` or a number.
        stream: where to write (default ``sys.stderr`` at the time of each write).

    Returns:
        The installed handler.

    Raises:
        ValueError: unknown format or level.
    """
    if format not in ("text", "json"):
        raise ValueError(f"invalid log format {format!r} (use text or json)")
    lvl = _level_number(level)
    handler: logging.Handler
    if stream is None:
        handler = _StderrHandler()
    else:
        handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if format == "json" else TextFormatter())
    handler.addFilter(RedactingFilter())
    setattr(handler, "_bigfleet", True)  # noqa: B010 - marker for idempotent setup
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_bigfleet", False):
            root.removeHandler(old)
            old.close()
    root.addHandler(handler)
    root.setLevel(lvl)
    for name in _NOISY:
        logging.getLogger(name).setLevel(logging.DEBUG if lvl <= logging.DEBUG else logging.WARNING)
    logging.captureWarnings(True)
    return handler


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg,unused-ignore]
    """StreamHandler bound to whatever ``sys.stderr`` is at emit time (works under capsys)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, value: IO[str]) -> None:
        pass
