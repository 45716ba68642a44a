"""The Go reference's known bugs (``docs/reference.md#known-bugs-we-fix``) that no other suite
pins down as a case of its own. Each test is named after the bug's number in the reference's
list; FAULTS.md maps every bug to its test (most live next to their code: tests/operator,
tests/podcontroller).
"""

from __future__ import annotations

from typing import Any

from bigfleet_trio.operator.bootstrap import (
    DEFAULT_BOOTSTRAP_TTL_SECONDS,
    BootstrapHandler,
    FileRenderer,
)
from bigfleet_trio.operator.rollup.translate import contribution_from_cr
from bigfleet_trio.operator.upcoming.plan import spec_equal
from bigfleet_trio.proto import pb
from tests.support import capacity


def _cr(reqs: list[dict[str, Any]], spread: list[dict[str, Any]] | None = None) -> Any:
    extra = {"topologySpread": spread} if spread else {}
    return contribution_from_cr(capacity.cr("x", 1, {"cpu": "1"}, requirements=reqs, **extra))


def test_18_17_fingerprint_is_injective_for_delimiters_in_values() -> None:
    """In ["a,b"] and In ["a", "b"] are different profiles, so different needs (the Go
    fingerprint joins values with "," unescaped and merges their demand)."""
    pairs = [
        ([{"key": "k", "operator": "In", "values": ["a,b"]}],
         [{"key": "k", "operator": "In", "values": ["a", "b"]}]),
        ([{"key": "k;x", "operator": "In", "values": ["a"]}],
         [{"key": "k", "operator": "In", "values": ["x;a"]}]),
        ([{"key": "k:1", "operator": "Exists"}],
         [{"key": "k", "operator": "In", "values": ["1:"]}]),
        ([{"key": "a|spr=b", "operator": "Exists"}],
         [{"key": "a", "operator": "Exists"}]),
    ]
    for left, right in pairs:
        assert _cr(left).need_key != _cr(right).need_key, (left, right)
    # the ordinary form is unchanged (``docs/rules.md#roll-up-profile``)
    plain = _cr([{"key": "zone", "operator": "In", "values": ["b", "a"]}])
    assert plain.profile.fingerprint == "p=1|ipb=0|rpb=0|reqs=zone:1:a,b;|spr="


def test_18_7_missing_label_key_is_not_equal_to_empty_value() -> None:
    assert not spec_equal({"labels": {}}, {"labels": {"k": ""}})
    assert not spec_equal({"labels": {"k": ""}}, {"labels": {}})


def test_18_12_file_renderer_gets_the_ttl_not_zero() -> None:
    resp = BootstrapHandler(FileRenderer("#cloud-config\n"), "c1").respond(
        pb.BootstrapRequest(request_id="r"))
    assert resp.ttl_seconds == DEFAULT_BOOTSTRAP_TTL_SECONDS == 600
    assert resp.user_data == b"#cloud-config\n"
