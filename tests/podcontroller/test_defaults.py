"""The PriorityClass penalty defaults file (--priority-class-defaults)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bigfleet_trio.podcontroller.defaults import (
    PenaltyDefaults,
    PriorityClassDefaults,
    PriorityClassDefaultsError,
    load_priority_class_defaults,
    parse_priority_class_defaults,
)


def _strs(d: PriorityClassDefaults) -> dict[str, tuple[str | None, str | None]]:
    return {
        name: (
            None if v.interruption_penalty is None else str(v.interruption_penalty),
            None if v.reclamation_penalty is None else str(v.reclamation_penalty),
        )
        for name, v in d.classes.items()
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            'ml-research: {interruptionPenalty: "8192", reclamationPenalty: "65536"}\n'
            'batch-best-effort: {interruptionPenalty: "16", reclamationPenalty: "0"}\n',
            {"ml-research": ("8192", "65536"), "batch-best-effort": ("16", "0")},
            id="reference-example",
        ),
        pytest.param(
            'a: {interruptionPenalty: "8000", reclamationPenalty: "1500m"}\n',
            {"a": ("8k", "1500m")},
            id="canonical-form",
        ),
        pytest.param(
            'a: {interruptionPenalty: "-2", reclamationPenalty: "0.25"}\n',
            {"a": ("-2", "250m")},
            id="negative-and-fractional-accepted",
        ),
        pytest.param(
            'a: {interruptionPenalty: "5"}\n'
            'b: {reclamationPenalty: ""}\n'
            "c: {interruptionPenalty: null}\n",
            {"a": ("5", None), "b": (None, None), "c": (None, None)},
            id="missing-empty-null-fields-absent",
        ),
        pytest.param("a:\n", {"a": (None, None)}, id="null-entry"),
        pytest.param("", {}, id="empty-document"),
        pytest.param("# only a comment\n", {}, id="comment-only"),
    ],
)
def test_parse_valid(text: str, expected: dict[str, tuple[str | None, str | None]]) -> None:
    assert _strs(parse_priority_class_defaults(text)) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param(
            "a: {interruptionPenalty: 8192}\n",
            'PriorityClass "a" interruptionPenalty: must be a quoted string',
            id="unquoted-int",
        ),
        pytest.param(
            "a: {reclamationPenalty: 1.5}\n",
            'PriorityClass "a" reclamationPenalty: must be a quoted string',
            id="unquoted-float",
        ),
        pytest.param(
            'a: {interruptionPenalty: "lots"}\n',
            "PriorityClass \"a\" interruptionPenalty: 'lots' is not a quantity",
            id="bad-quantity",
        ),
        pytest.param("- a\n- b\n", "the top level must be a map", id="top-level-list"),
        pytest.param("a: 5\n", 'PriorityClass "a": must be a map', id="entry-scalar"),
        pytest.param(
            '1: {interruptionPenalty: "1"}\n',
            "PriorityClass names must be non-empty strings",
            id="int-key",
        ),
        pytest.param("a: {interruptionPenalty: [\n", "parse:", id="yaml-syntax"),
        pytest.param(
            'a: {interruptionPenalty: "3", colour: blue, reclamationPenalty: "4"}\n',
            'PriorityClass "a": unknown key \'colour\' (known: interruptionPenalty, '
            "reclamationPenalty)",
            id="unknown-key-rejected",
        ),
        pytest.param(
            'gold: {interuptionPenalty: "8192"}\n',
            "PriorityClass \"gold\": unknown key 'interuptionPenalty' (known: "
            "interruptionPenalty, reclamationPenalty); did you mean 'interruptionPenalty'?",
            id="misspelt-key-rejected-with-hint",
        ),
        pytest.param(
            'a: {zeta: "1", alpha: "2"}\n',
            "unknown key 'alpha', 'zeta' (known:",
            id="all-unknown-keys-named",
        ),
    ],
)
def test_parse_invalid(text: str, fragment: str) -> None:
    with pytest.raises(PriorityClassDefaultsError) as info:
        parse_priority_class_defaults(text)
    assert str(info.value).startswith("priority-class-defaults: ")
    assert fragment in str(info.value)


def test_get() -> None:
    d = parse_priority_class_defaults('a: {interruptionPenalty: "1"}\n')
    assert d.get("a") == PenaltyDefaults(interruption_penalty=d.classes["a"].interruption_penalty)
    assert d.get("b") is None
    assert d.get("") is None
    assert d.get(None) is None
    assert len(d) == 1


def test_read_only() -> None:
    d = parse_priority_class_defaults('a: {interruptionPenalty: "1"}\n')
    with pytest.raises(TypeError):
        d.classes["b"] = PenaltyDefaults()  # type: ignore[index]


def test_load_file(tmp_path: Path) -> None:
    p = tmp_path / "defaults.yaml"
    p.write_text('ml: {interruptionPenalty: "8000"}\n')
    assert _strs(load_priority_class_defaults(p)) == {"ml": ("8k", None)}
    assert _strs(load_priority_class_defaults(str(p))) == {"ml": ("8k", None)}


@pytest.mark.parametrize("path", [None, ""])
def test_load_no_path_means_no_defaults(path: str | None) -> None:
    assert len(load_priority_class_defaults(path)) == 0


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(
        PriorityClassDefaultsError, match=r"^priority-class-defaults: read .*nope\.yaml"
    ):
        load_priority_class_defaults(tmp_path / "nope.yaml")


def test_load_invalid_file(tmp_path: Path) -> None:
    p = tmp_path / "d.yaml"
    p.write_text("a: {interruptionPenalty: 3}\n")
    with pytest.raises(PriorityClassDefaultsError, match="must be a quoted string"):
        load_priority_class_defaults(p)
