"""Shared pytest configuration. Trio mode is on for every async test (pyproject: trio_mode)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture
def restore_root_logging() -> Iterator[None]:
    """Leave the root logger as found: ``cli.main`` installs a handler and sets the level."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)
