"""Fixtures for the embedded apiserver tests: a fresh server and an in-process httpx client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.testing import open_client


@pytest.fixture
def api() -> ApiServer:
    return ApiServer()


@pytest.fixture
async def client(api: ApiServer) -> AsyncIterator[httpx.AsyncClient]:
    async with open_client(api) as c:
        yield c
