"""End to end through the operator: after the apiserver restarts with empty state on the same
address, the roll-up stops counting CapacityRequests that no longer exist
(docs/kube-api.md#relist-from-scratch)."""

from __future__ import annotations

import trio
import trio.testing
from prometheus_client import REGISTRY

from bigfleet_trio.kube.resources import CAPACITY_REQUESTS
from bigfleet_trio.sim.apiserver import ApiServer
from tests.faults._harness import harness
from tests.support.capacity import cr


def _rollup_crs() -> float | None:
    return REGISTRY.get_sample_value("bigfleet_operator_rollup_capacityrequests")


async def test_operator_rollup_forgets_crs_after_apiserver_restore_with_empty_state(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with harness() as h:
        for n in "abcd":
            await h.client.create(CAPACITY_REQUESTS, cr(n, 100, {"cpu": "1"}), "default")
        async with trio.open_nursery() as run:
            await run.start(h.operator.run)
            await h.wait(lambda: _rollup_crs() == 4)
            h.transport.app = ApiServer().app  # restarted, same address, empty state
            h.server.faults.drop_watches()
            await h.wait(lambda: _rollup_crs() == 0, limit=40)
            assert _rollup_crs() == 0
            run.cancel_scope.cancel()
