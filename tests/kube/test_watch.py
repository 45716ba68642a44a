"""Sans-IO watch helpers: line decoder, resourceVersion bookkeeping, relist diff."""

import pytest

from bigfleet_trio.kube.watch import (
    ResourceVersionTracker,
    WatchDecodeError,
    WatchEvent,
    decode_watch_line,
    is_expired,
    object_key,
)


def test_decode_lines() -> None:
    ev = decode_watch_line(
        b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"}}}\n'
    )
    assert ev == WatchEvent("ADDED", {"metadata": {"name": "a", "resourceVersion": "5"}})
    assert decode_watch_line("   \n") is None
    assert decode_watch_line("") is None
    bm = decode_watch_line(
        '{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"9"}}}'
    )
    assert bm is not None and bm.type == "BOOKMARK"


@pytest.mark.parametrize(
    "line",
    [
        "{not json",
        "[1,2]",
        '{"type":"WHAT","object":{}}',
        '{"type":"ADDED"}',
        '{"type":"ADDED","object":[]}',
        b"\xff\xfe",
    ],
)
def test_decode_rejects(line: str | bytes) -> None:
    with pytest.raises(WatchDecodeError):
        decode_watch_line(line)


def test_rv_tracker() -> None:
    t = ResourceVersionTracker()
    t.listed("10")
    assert t.observe(WatchEvent("ADDED", {"metadata": {"resourceVersion": "11"}}))
    assert t.observe(WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "20"}}))
    assert not t.observe(
        WatchEvent("ERROR", {"kind": "Status", "code": 410, "metadata": {"resourceVersion": "1"}})
    )
    assert not t.observe(WatchEvent("MODIFIED", {"metadata": {}}))
    assert t.resource_version == "20"
    t.observe(WatchEvent("DELETED", {"metadata": {"resourceVersion": "21"}}))
    assert t.resource_version == "21"


def test_is_expired() -> None:
    assert is_expired(WatchEvent("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"}))
    assert is_expired(WatchEvent("ERROR", {"kind": "Status", "reason": "Gone"}))
    assert not is_expired(WatchEvent("ERROR", {"kind": "Status", "code": 500}))
    assert not is_expired(WatchEvent("DELETED", {"code": 410}))


def test_object_key() -> None:
    assert object_key({"metadata": {"name": "a", "namespace": "ns"}}) == "ns/a"
    assert object_key({"metadata": {"name": "n1"}}) == "n1"
    with pytest.raises(ValueError):
        object_key({"metadata": {}})


