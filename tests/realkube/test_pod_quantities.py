"""The embedded apiserver refuses and accepts the Pod quantity corpus (tests/support/
podquantities.py) as kube-apiserver does: the same code, reason, message and causes for every
manifest, and the answer the fast tier expects of the sim (docs/deviations.md#pod-quantities).
Both get ``dryRun=All``: nothing is stored, nothing to clean up."""

from __future__ import annotations

import pytest
import trio

from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.testing import open_client
from tests.support.podquantities import CASES, QuantityCase, answer
from tests.support.realkube import RealKube


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
async def test_the_sim_answers_each_quantity_case_as_kube_apiserver(
        realkube: RealKube, case: QuantityCase) -> None:
    real = await trio.to_thread.run_sync(
        lambda: realkube.cp.request("POST", f"{case.path}?dryRun=All", case.body))
    async with open_client(ApiServer()) as client:
        sim = await client.post(case.path, params={"dryRun": "All"}, json=case.body)
    assert answer(sim) == answer(real), f"sim: {sim.text}\nkube-apiserver: {real.text}"
    code, _, _, causes = answer(real)
    assert (code, tuple(f for f, _, _ in causes)) == (case.code, case.fields)
