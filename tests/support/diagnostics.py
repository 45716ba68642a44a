"""The diagnostics listener on a free loopback port, for tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import trio

from bigfleet_trio.observability.http import serve_observability


@asynccontextmanager
async def diagnostics_server(**kw: object) -> AsyncIterator[str]:
    """``serve_observability`` on ``127.0.0.1:0`` with ``kw``; yields its ``HOST:PORT`` and
    stops it on exit."""
    async with trio.open_nursery() as nursery:
        addr = await nursery.start(partial(serve_observability, "127.0.0.1:0", **kw))
        assert isinstance(addr, str)
        try:
            yield addr
        finally:
            nursery.cancel_scope.cancel()
