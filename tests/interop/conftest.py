"""The interop tier (marker ``interop``): the real operator against a Go shard peer built from
``interop/goshard`` (docs/wire.md#go-interop). Without a Go toolchain only
``test_go_toolchain.py`` is collected, so the tier shows as ONE skipped line; CI sets
``BIGFLEET_REQUIRE_GO=1`` and a missing toolchain fails instead."""

from __future__ import annotations

import pytest

from tests.interop._peer import GO, REQUIRE_GO, build_goshard

if GO is None and not REQUIRE_GO:
    collect_ignore_glob = ["test_goshard_*.py"]


@pytest.fixture(scope="session")
def goshard(pytestconfig: pytest.Config) -> str:
    """Path of the built Go peer (built once per run into the cache outside the repository; a
    build says so with one line on the terminal, past pytest's output capture)."""
    def announce(line: str) -> None:
        capture = pytestconfig.pluginmanager.getplugin("capturemanager")
        terminal = pytestconfig.pluginmanager.getplugin("terminalreporter")
        with capture.global_and_fixture_disabled():
            terminal.write_line(line)
    return build_goshard(announce)
