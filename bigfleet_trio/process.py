"""The process shell both binaries share: the start-up line, ``bigfleet_build_info``, and
``trio.run`` with a start-up failure unwrapped from Trio's exception groups, so that the CLI
prints every failure the same way (one line ``<command>: <what is wrong>``, exit 1; usage errors
exit 2; SIGTERM or SIGINT: an orderly shutdown, exit 0). docs/reference.md#exit-codes.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Awaitable, Callable

import trio

from bigfleet_trio import __version__
from bigfleet_trio.excgroups import find_in_group
from bigfleet_trio.knobs import ConfigError
from bigfleet_trio.kube.errors import KubeConfigError
from bigfleet_trio.kube.informer import SyncTimeout

__all__ = ["EXPECTED_FAILURES", "announce", "run_trio"]

log = logging.getLogger("bigfleet_trio")

EXPECTED_FAILURES: tuple[type[BaseException], ...] = (
    SyncTimeout, OSError, KubeConfigError, ConfigError)
"""Failures whose message is the whole story (no traceback): caches not synced, a listener
that cannot bind, an unusable kubeconfig, a bad setting."""


def announce(binary: str) -> None:
    """Log the version at start-up and set ``bigfleet_build_info{version,python}`` to 1."""
    from bigfleet_trio.observability.metrics import BUILD_INFO

    python = platform.python_version()
    BUILD_INFO.labels(__version__, python).set(1)
    log.info("bigfleet-trio %s %s starting", binary, __version__,
             extra={"binary": binary, "version": __version__, "python": python})


def run_trio(main: Callable[[], Awaitable[object]]) -> None:
    """``trio.run(main)``; a start-up failure comes out as itself, not inside a group.

    Raises:
        One of :data:`EXPECTED_FAILURES` (unwrapped), or whatever ``main`` raised.
    """
    try:
        trio.run(main)
    except BaseExceptionGroup as group:
        leaf = find_in_group(group, EXPECTED_FAILURES)
        if leaf is None:
            raise
        raise leaf from None
