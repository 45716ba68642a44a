"""Drive a shard-frame handler as the session does: repeat it while it raises a retriable error."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from bigfleet_trio.kube.retry import RECONCILE_RETRIABLE


async def until_reconciled(fn: Callable[..., Awaitable[Any]], *args: Any,
                           attempts: int = 50, delay: float = 0.5) -> int:
    """``await fn(*args)`` again after each :data:`RECONCILE_RETRIABLE` failure, ``delay``
    seconds apart (the test's clock), at most ``attempts`` times. Returns the failures seen.

    Raises:
        AssertionError: it never landed.
    """
    for failures in range(attempts):
        try:
            await fn(*args)
        except RECONCILE_RETRIABLE:
            await trio.sleep(delay)
            continue
        return failures
    raise AssertionError(f"not reconciled after {attempts} attempts")
