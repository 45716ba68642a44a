"""The Pending stamps a burst leaves behind are bounded: at most ``STAMP_BACKLOG`` wait in the
queue, and the CRs past it are stamped by a sweep of the CR cache once the backlog has room
(docs/rules.md#pod-translation-pending-stamp). Embedded apiserver, ``autojump_clock``."""

from __future__ import annotations

from typing import Any
from unittest import mock

import trio
import trio.testing

from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, PODS
from bigfleet_trio.podcontroller.apply import PlanApplier
from bigfleet_trio.podcontroller.keys import StampKey
from bigfleet_trio.sim.apiserver import ApiServer
from tests.podcontroller.test_controller import (
    _pending_count,
    client_for,
    crs,
    eventually,
    pod,
    running,
)


class _Peak(dict[StampKey, Any]):
    """``stamp_rv`` that remembers its largest size."""

    peak = 0

    def __setitem__(self, key: StampKey, value: Any) -> None:
        super().__setitem__(key, value)
        self.peak = max(self.peak, len(self))


async def test_a_burst_queues_at_most_the_backlog_and_the_sweep_stamps_the_rest(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    server = ApiServer()
    setup = client_for(server, nursery)
    for i in range(12):  # a burst: every Pod's CR is created before the first stamp runs
        await setup.create(PODS, pod(f"p-{i}"))
    peak = _Peak()
    with mock.patch.object(PlanApplier, "__init__", _small_backlog(peak)):
        async with running(server, workers=2) as (ctl, client):
            await eventually(lambda: _pending_count(client, 12))
            assert peak.peak <= 3
            assert ctl.applier.stamps_swept > 0  # the CRs past the backlog came from the sweep


def _small_backlog(peak: _Peak) -> Any:
    init = PlanApplier.__init__

    def patched(self: PlanApplier, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.stamp_backlog = 3
        self.stamp_rv = peak

    return patched


async def test_a_swept_stamp_reads_the_cr_first_and_never_overwrites_a_phase(
        autojump_clock: trio.testing.MockClock) -> None:
    async with running(ApiServer()) as (ctl, client):
        name = await _one_pod_stamped(client)
        await client.patch(CAPACITY_REQUESTS, name, {"status": {"phase": "Acknowledged"}},
                           "default", subresource="status")
        # the cache still shows no phase (a lagging watch); the sweep queued a stamp for it
        ctl.crs.store._set(f"default/{name}", {**ctl.crs.store.get(f"default/{name}"),
                                               "status": {}})
        ctl.applier.stamps_overflowed = True
        assert await ctl.applier.sweep_stamps() == 1
        await eventually(lambda: _stamp_done(ctl))
        got = [cr for cr in await crs(client) if cr["metadata"]["name"] == name]
        assert got[0]["status"]["phase"] == "Acknowledged"


async def _one_pod_stamped(client: Any) -> str:
    """Create Pod ``default/p``; once its CR is stamped Pending, the CR's name."""
    created = await client.create(PODS, pod("p"))
    await eventually(lambda: _pending_count(client, 1))
    return "cr-" + str(created["metadata"]["uid"])


async def _stamp_done(ctl: Any) -> bool:
    return not ctl.applier.stamp_rv and len(ctl.queue) == 0


async def test_a_stamp_queued_for_a_cr_since_deleted_sends_nothing(
        autojump_clock: trio.testing.MockClock) -> None:
    # A burst's stamps run behind all Pod work, so many of their CRs are gone by then (the Job
    # finished, the churn replaced the Pod): a PATCH for each would be a wasted write (404).
    async with running(ApiServer()) as (ctl, client):
        name = await _one_pod_stamped(client)
        key = StampKey("default", name)
        ctl.applier.stamp_rv[key] = "1"  # a stamp still waiting in the queue
        await client.delete(PODS, "p", "default")
        await eventually(lambda: _cr_gone(ctl, f"default/{name}"))
        with mock.patch.object(ctl.client, "patch", wraps=ctl.client.patch) as patch:
            await ctl.reconciler.reconcile(key)
        assert patch.call_count == 0
        assert key not in ctl.applier.stamp_rv


async def _cr_gone(ctl: Any, key: str) -> bool:
    return ctl.crs.store.get(key) is None
