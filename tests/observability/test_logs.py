"""Tests for observability.logs (structured, one line per decision, secrets redacted)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from bigfleet_trio.observability.logs import REDACTED, redact, setup_logging

PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7\nabcdef==\n-----END RSA PRIVATE KEY-----"
JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJl"


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved_level = root.level
    saved_handlers = list(root.handlers)  # pytest's capture handlers would format records too
    for h in saved_handlers:
        root.removeHandler(h)
    buf = io.StringIO()
    yield buf
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in saved_handlers:
        root.addHandler(h)
    root.setLevel(saved_level)


def _lines(buf: io.StringIO) -> list[str]:
    return [line for line in buf.getvalue().splitlines() if line]


def test_json_one_object_per_line_with_extras(stream: io.StringIO) -> None:
    setup_logging("json", "info", stream=stream)
    log = logging.getLogger("bigfleet_trio.operator.reclaim")
    log.info("reclaim acknowledged", extra={"cluster": "c1", "node": "n-1", "grace_s": 30})
    log.debug("hidden")
    (line,) = _lines(stream)
    obj = json.loads(line)
    assert obj["level"] == "info"
    assert obj["logger"] == "bigfleet_trio.operator.reclaim"
    assert obj["msg"] == "reclaim acknowledged"
    assert obj["cluster"] == "c1" and obj["node"] == "n-1" and obj["grace_s"] == 30
    assert obj["ts"].endswith("Z") and obj["ts"][10] == "T"
    assert list(obj)[:4] == ["ts", "level", "logger", "msg"]


def test_json_non_serialisable_extras_and_exception(stream: io.StringIO) -> None:
    setup_logging("json", "debug", stream=stream)
    log = logging.getLogger("x")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception(
            "failed", extra={"obj": object(), "items": (1, "a"), "m": {"k": {1, 2} and [1]}}
        )
    (line,) = _lines(stream)
    obj = json.loads(line)
    assert obj["msg"] == "failed"
    assert obj["items"] == [1, "a"]
    assert obj["obj"].startswith("<object object")
    assert "RuntimeError: boom" in obj["exc"]
    assert obj["level"] == "error"


def test_text_format(stream: io.StringIO) -> None:
    setup_logging("text", "info", stream=stream)
    logging.getLogger("bigfleet_trio.sim").warning(
        "machine %s ready",
        "m-1",
        extra={
            "phase": "Configured",
            "note": "two words",
            "n": 3,
            "ok": True,
            "labels": {"zone": "a"},
        },
    )
    (line,) = _lines(stream)
    ts, level, logger, rest = line.split(" ", 3)
    assert ts.endswith("Z")
    assert level == "WARNING"
    assert logger == "bigfleet_trio.sim"
    assert (
        rest
        == 'machine m-1 ready phase=Configured note="two words" n=3 ok=true labels={"zone":"a"}'
    )


def test_text_multiline_message_stays_one_line(stream: io.StringIO) -> None:
    setup_logging("text", "info", stream=stream)
    logging.getLogger("x").info("a\nb")
    assert _lines(stream) == [_lines(stream)[0]]
    assert _lines(stream)[0].endswith(" x a\\nb")


def test_setup_is_idempotent_and_levels(stream: io.StringIO) -> None:
    setup_logging("text", "error", stream=stream)
    setup_logging("json", "warn", stream=stream)
    ours = [h for h in logging.getLogger().handlers if getattr(h, "_bigfleet", False)]
    assert len(ours) == 1
    logging.getLogger("x").info("no")
    logging.getLogger("x").warning("yes")
    assert [json.loads(x)["msg"] for x in _lines(stream)] == ["yes"]
    assert logging.getLogger("httpx").level == logging.WARNING


@pytest.mark.parametrize(("fmt", "level"), [("xml", "info"), ("text", "loud")])
def test_setup_rejects_bad_values(fmt: str, level: str) -> None:
    with pytest.raises(ValueError):
        setup_logging(fmt, level, stream=io.StringIO())


# ------------------------------------------------------------------------------ redaction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Bearer abc.def-123", "Authorization: Bearer [REDACTED]"),
        (
            "headers={'authorization': 'Bearer s3cr3t'}",
            "headers={'authorization': 'Bearer [REDACTED]'}",
        ),
        ("authorization=Basic dXNlcjpwYXNz", "authorization=Basic [REDACTED]"),
        ("using bearer XyZ123== now", "using bearer [REDACTED] now"),
        (f"token {JWT} end", "token [REDACTED] end"),
        ("token=abc123 user=bob", "token=[REDACTED] user=bob"),
        ('{"password": "hunter2", "user": "bob"}', '{"password": "[REDACTED]", "user": "bob"}'),
        ("client-key-data: LS0tLS1CRUdJTg==", "client-key-data: [REDACTED]"),
        (f"key is {PEM} done", "key is [REDACTED PEM RSA PRIVATE KEY] done"),
        ("-----BEGIN CERTIFICATE-----\nMIIB\n(truncated", "[REDACTED PEM CERTIFICATE]"),
        ("tokens=5 max_skew=1 key=zone", "tokens=5 max_skew=1 key=zone"),
        ("nothing to see", "nothing to see"),
    ],
)
def test_redact(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_redaction_in_messages_args_and_extras(stream: io.StringIO) -> None:
    setup_logging("json", "info", stream=stream)
    logging.getLogger("kube").info(
        "request headers %s",
        {"Authorization": "Bearer topsecret"},
        extra={
            "token": "topsecret",
            "user_data": "#cloud-config\njoin: topsecret",
            "body": {"password": "topsecret", "name": "ok"},
            "cert": PEM,
            "node": "n1",
        },
    )
    out = stream.getvalue()
    assert "topsecret" not in out
    assert "MIIEpAIBAAKCAQEA7" not in out
    obj = json.loads(out)
    assert obj["token"] == REDACTED
    assert obj["user_data"] == REDACTED
    assert obj["body"] == {"password": REDACTED, "name": "ok"}
    assert obj["cert"] == "[REDACTED PEM RSA PRIVATE KEY]"
    assert obj["node"] == "n1"


def test_redaction_in_tracebacks(stream: io.StringIO) -> None:
    setup_logging("text", "info", stream=stream)
    try:
        raise ValueError("bad header Authorization: Bearer topsecret")
    except ValueError:
        logging.getLogger("x").exception("failed")
    assert "topsecret" not in stream.getvalue()
    assert "Bearer [REDACTED]" in stream.getvalue()


def test_broken_format_args_do_not_kill_logging(stream: io.StringIO) -> None:
    handler = setup_logging("text", "info", stream=stream)
    # Fed to our handler directly: pytest's own capture handler would choke on this record.
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "%d items", ("nan",), None)
    handler.handle(record)
    assert stream.getvalue().rstrip().endswith(" INFO x %d items")


def test_json_lifts_identity_pairs_from_the_message(stream: io.StringIO) -> None:
    setup_logging("json", "info", stream=stream)
    log = logging.getLogger("bigfleet_trio.operator.upcoming")
    log.info("upcoming: wrote machine_id=m-1 node=n-1 phase=Ready bytes=12 (retry=2)",
             extra={"node": "from-extra"})
    log.info("no pairs here: a=b, x==y")
    first, second = (json.loads(line) for line in _lines(stream))
    assert first["machine_id"] == "m-1"
    assert first["node"] == "from-extra"  # extra= wins over the text
    assert first["phase"] == "Ready"
    assert "bytes" not in first and "retry" not in first  # only identifying keys
    assert set(second) == {"ts", "level", "logger", "msg"}


def test_operator_log_lines_carry_their_keys(stream: io.StringIO) -> None:
    """The operator process's own decision lines pass ``extra=`` (JSON keys, text k=v)."""
    setup_logging("text", "info", stream=stream)
    logging.getLogger("bigfleet_trio.operator.app").info(
        "operator: stopped", extra={"cluster": "c1"})
    (line,) = _lines(stream)
    assert line.endswith("INFO bigfleet_trio.operator.app operator: stopped cluster=c1")


def test_json_values_of_the_message_are_keys(stream: io.StringIO) -> None:
    """Every ``key=%s`` of the format string is a JSON key with its value, typed as passed."""
    setup_logging("json", "info", stream=stream)
    log = logging.getLogger("bigfleet_trio.kube.informer")
    log.info("kube listed informer=%s rv=%s objects=%d diff=%s", "pods", "155", 0, {"ADDED": 0})
    log.info("session established cluster=%s protocol=%s after %.1fs", "c1", "v1alpha1", 0.5)
    log.info("token=%s", "s3cret")
    first, second, third = (json.loads(ln) for ln in _lines(stream))
    assert (first["informer"], first["rv"], first["objects"], first["diff"]) == (
        "pods", "155", 0, {"ADDED": 0})
    assert (second["cluster"], second["protocol"]) == ("c1", "v1alpha1")
    assert third["token"] == REDACTED


def test_text_lines_do_not_repeat_keys(stream: io.StringIO) -> None:
    setup_logging("text", "info", stream=stream)
    logging.getLogger("x").info("upcoming node written phase=%s", "Launched",
                                extra={"phase": "Launched", "node": "n-1"})
    (line,) = _lines(stream)
    assert line.count("phase=") == 1 and line.endswith("phase=Launched node=n-1")
