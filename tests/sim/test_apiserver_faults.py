"""Fault injection and request counters."""

from __future__ import annotations

from typing import Any

import httpx
import trio

from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.testing import CR_PATH, cr_body, patch


async def test_fail_next_matching_requests(api: ApiServer, client: httpx.AsyncClient) -> None:
    await client.post(CR_PATH, json=cr_body("a"))
    api.faults.fail_next(2, code=500, verb="patch", resource="capacityrequests")
    assert (await client.get(f"{CR_PATH}/a")).status_code == 200
    r = await patch(client, f"{CR_PATH}/a", {"spec": {"priority": 2}})
    assert r.status_code == 500 and r.json()["reason"] == "InternalError"
    assert (await patch(client, f"{CR_PATH}/a", {"spec": {"priority": 2}})).status_code == 500
    assert (await patch(client, f"{CR_PATH}/a", {"spec": {"priority": 2}})).status_code == 200
    api.faults.fail_next(1, code=429, resource="capacityrequests/status")
    r = await patch(client, f"{CR_PATH}/a/status", {"status": {"phase": "Pending"}})
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    api.faults.fail_next(1, code=409)
    assert (await client.get(f"{CR_PATH}/a")).status_code == 409


async def test_fail_next_for_one_object_with_its_message(
    api: ApiServer, client: httpx.AsyncClient
) -> None:
    # a rule naming an object answers only requests on that object (a per-Pod eviction answer)
    await client.post(CR_PATH, json=cr_body("a"))
    await client.post(CR_PATH, json=cr_body("b"))
    api.faults.fail_next(1, code=429, verb="get", resource="capacityrequests", name="b",
                         message="budget says no")
    assert (await client.get(f"{CR_PATH}/a")).status_code == 200
    assert (await client.get(CR_PATH)).status_code == 200  # a list names no object
    r = await client.get(f"{CR_PATH}/b")
    assert r.status_code == 429 and r.json()["message"] == "budget says no"
    assert (await client.get(f"{CR_PATH}/b")).status_code == 200


async def test_counters(api: ApiServer, client: httpx.AsyncClient) -> None:
    await client.post(CR_PATH, json=cr_body("a"))
    await client.get(CR_PATH)
    await client.get(f"{CR_PATH}/a")
    await patch(client, f"{CR_PATH}/a/status", {"status": {"phase": "Pending"}})
    assert api.counters[("create", "capacityrequests")] == 1
    assert api.counters[("list", "capacityrequests")] == 1
    assert api.counters[("get", "capacityrequests")] == 1
    assert api.counters[("patch", "capacityrequests/status")] == 1
    assert api.counters.total(resource="capacityrequests") == 3
    api.counters.reset()
    assert api.counters.total() == 0


async def test_latency(api: ApiServer, client: httpx.AsyncClient, autojump_clock: Any) -> None:
    api.faults.add_latency(2.5, verb="list")
    t0 = trio.current_time()
    await client.get(CR_PATH)
    assert trio.current_time() - t0 >= 2.5
    api.faults.clear()
    t0 = trio.current_time()
    await client.get(CR_PATH)
    assert trio.current_time() - t0 < 0.1
