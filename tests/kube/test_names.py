"""Kubernetes name syntax (apimachinery validation), worked out from the Kubernetes docs."""

from __future__ import annotations

import pytest

from bigfleet_trio.kube.names import (
    is_dns1123_label,
    is_dns1123_subdomain,
    is_label_value,
    is_qualified_name,
    is_qualified_name_part,
)


@pytest.mark.parametrize(
    ("s", "label", "subdomain"),
    [
        ("a", True, True),
        ("my-name", True, True),
        ("123-abc", True, True),
        ("example.com", False, True),
        ("un-m-1", True, True),
        ("", False, False),
        ("-a", False, False),
        ("a-", False, False),
        ("A", False, False),
        ("a_b", False, False),
        ("a..b", False, False),
        ("a.-b", False, False),
        ("a-.b", False, False),
        ("abc\n", False, False),  # '$' would accept this; the apiserver does not
        ("a" * 63, True, True),
        ("a" * 64, False, True),
        (".".join(["a" * 63] * 4)[:253].rstrip("."), False, True),
        ("a" * 254, False, False),
    ],
)
def test_dns1123(s: str, label: bool, subdomain: bool) -> None:
    assert is_dns1123_label(s) is label
    assert is_dns1123_subdomain(s) is subdomain


@pytest.mark.parametrize(
    ("s", "ok"),
    [
        ("app", True),
        ("App_1.x-y", True),
        ("kubernetes.io/hostname", True),
        ("node.kubernetes.io/instance-type", True),
        ("nvidia.com/gpu", True),
        ("/x", False),
        ("x/", False),
        ("Upper.io/x", False),
        ("a/b/c", False),
        ("-x", False),
        ("x\n", False),
        ("x" * 63, True),
        ("x" * 64, False),
    ],
)
def test_qualified_name(s: str, ok: bool) -> None:
    assert is_qualified_name(s) is ok


def test_label_value_and_name_part() -> None:
    assert is_label_value("") and not is_qualified_name_part("")
    assert is_label_value("v1.2_x") and is_label_value("Z")
    assert not is_label_value("-v") and not is_label_value("v\n") and not is_label_value("a/b")
    assert is_label_value("v" * 63) and not is_label_value("v" * 64)
