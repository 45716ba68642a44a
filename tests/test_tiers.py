"""Each tier that needs something built or installed skips with one line for the whole tier
(tests/support/tiers.py), as README.md promises; the README names every such tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tiers import TIERS

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]


def test_each_tier_that_skipped_prints_one_line(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["tests.support.tiers"]\n')
    tests = [f"def test_{n}_{i}():\n    pytest.skip({reason!r})\n"
             for n, (tier, reason) in enumerate(TIERS.items()) for i in range(n + 1)]
    pytester.makepyfile("import pytest\n\n" + "\n".join(tests) + "\ndef test_runs():\n    pass\n")
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=sum(range(1, len(TIERS) + 1)))
    lines = [line for line in result.outlines if " tier: " in line]
    assert lines == [f"{tier} tier: {n + 1} test{'s' if n else ''} skipped, {reason}"
                     for n, (tier, reason) in enumerate(TIERS.items())]


def test_nothing_printed_when_nothing_skipped(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["tests.support.tiers"]\n')
    pytester.makepyfile("def test_runs():\n    pass\n")
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    assert not [line for line in result.outlines if " tier: " in line]


def test_the_readme_names_every_tier_that_skips() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    for tier in TIERS:
        assert f"`{tier}`" in readme, tier
