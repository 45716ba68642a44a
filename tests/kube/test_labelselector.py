"""The label-selector text parser the pod controller's flags and the embedded apiserver share."""

from __future__ import annotations

import pytest

from bigfleet_trio.kube.labelselector import LabelSelectorError, match_labels, parse_label_selector


@pytest.mark.parametrize("selector, labels, expected", [
    ("node-role.kubernetes.io/control-plane", {"node-role.kubernetes.io/control-plane": ""}, True),
    ("node-role.kubernetes.io/control-plane", {}, False),
    ("!k", {}, True),
    ("!k", {"k": "v"}, False),
    ("k=v", {"k": "v"}, True),
    ("k==v", {"k": "w"}, False),
    ("k!=v", {}, True),
    ("k!=v", {"k": "v"}, False),
    ("k in (a, b)", {"k": "b"}, True),
    ("k in (a,b)", {"k": "c"}, False),
    ("k notin (a)", {}, True),
    ("k notin (a)", {"k": "a"}, False),
    ("a=1,b", {"a": "1", "b": "x"}, True),
    ("a=1,b", {"a": "1"}, False),
    ("", {"any": "thing"}, True),
])
def test_selectors_match_like_kubectl(selector: str, labels: dict[str, str],
                                      expected: bool) -> None:
    assert match_labels(parse_label_selector(selector), labels) is expected


@pytest.mark.parametrize("selector", ["k in ()", "a=1,,b", "k=(", "bad key!", "-k=v", "k>x"])
def test_bad_selectors_raise_with_the_apiservers_wording(selector: str) -> None:
    with pytest.raises(LabelSelectorError, match="unable to parse requirement"):
        parse_label_selector(selector)


def test_the_error_is_a_value_error() -> None:
    assert issubclass(LabelSelectorError, ValueError)
