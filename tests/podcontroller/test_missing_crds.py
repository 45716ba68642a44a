"""The pod controller while the CapacityRequest CRD is gone (docs/crds.md#missing-crds): one
log line per cause, rate-limited, with no escaped newline in it, instead of a WARNING per Pod
per retry; and back to work within a few seconds of the CRD's return."""

from __future__ import annotations

import logging

import pytest
import trio

from bigfleet_trio.kube.resources import CRDS, PODS
from bigfleet_trio.sim.apiserver import ApiServer

from .test_controller import crs, eventually, pod, running

CR_CRD = "capacityrequests.bigfleet.lucy.sh"


async def test_crd_gone_is_one_line_per_cause_and_back_within_seconds(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
) -> None:
    server = ApiServer()
    async with running(server) as (ctl, client):
        for i in range(5):
            await client.create(PODS, pod(f"p{i}"))
        await eventually(lambda: len(ctl.crs.store) == 5)
        crd = await client.get(CRDS, CR_CRD)
        caplog.clear()
        caplog.set_level(logging.INFO)
        await client.delete(CRDS, CR_CRD)
        await trio.sleep(1)
        for i in range(5, 10):  # new Pods while it is gone: their creates get 404
            await client.create(PODS, pod(f"p{i}"))
        await trio.sleep(20)
        loud = [r for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.startswith("bigfleet_trio")]
        assert 1 <= len(loud) <= 3, [r.getMessage() for r in loud]
        assert not [r.getMessage() for r in caplog.records if "\n" in r.getMessage()
                    or "\\n" in r.getMessage()]
        assert not ctl.readiness()[0]
        for key in ("uid", "resourceVersion", "creationTimestamp"):
            crd["metadata"].pop(key, None)
        crd.pop("status", None)
        await client.create(CRDS, crd)
        back = trio.current_time()
        await eventually(lambda: ctl.readiness()[0])
        await eventually(lambda: crs(client), limit=30)
        await eventually(lambda: _all_crs(client, 10))
        assert trio.current_time() - back <= 5.0


async def _all_crs(client: object, n: int) -> bool:
    return len(await crs(client)) == n  # type: ignore[arg-type]
