"""The demo's live page in headless Chromium (Debian's ``chromium``): the demo runs with
``--keep-running`` semantics (everything still serving after the scenario), Chromium loads the
printed URL, and the DOM it rendered from the ``/fleet`` WebSocket shows every cluster and the
machines that moved between clusters. Skips with one line where Chromium is not installed
(tests/support/tiers.py; ``.ci/run`` installs it)."""

from __future__ import annotations

import io
import re
import shutil
from typing import Any

import pytest
import trio

from bigfleet_trio.sim.demo import run_scenario
from bigfleet_trio.sim.demo_options import DemoOptions
from tests.support.tiers import CHROMIUM_SKIP

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason=CHROMIUM_SKIP)
async def test_the_live_page_shows_every_cluster_and_machines_moving() -> None:
    dom: list[str] = []

    async def look(summary: Any) -> None:
        assert summary.ok, summary.failure
        assert CHROMIUM is not None
        for _ in range(10):  # the page's first state may predate the DOM's first render
            done = await trio.run_process(
                [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                 "--virtual-time-budget=3000", "--dump-dom", summary.page],
                capture_stdout=True, capture_stderr=True)
            dom.append(done.stdout.decode())
            if 'class="move"' in dom[-1]:
                return

    opts = DemoOptions(timeout=200.0, seed=1, quiet=True)
    with trio.fail_after(260):
        await run_scenario(opts, out=io.StringIO(), keep_running=look)
    html = dom[-1]
    assert re.findall(r'data-cluster="([^"]+)"', html) == [
        "demo-cluster", "demo-cluster-2", "demo-cluster-3"]
    moves = re.findall(r'class="move" data-from="([^"]+)" data-to="([^"]+)"', html)
    assert moves and all(a != b for a, b in moves)
    assert ("demo-cluster-2", "demo-cluster-3") in moves
