"""A CR whose Pod the Pod watch reported deleted is deleted without a GET of the Pod first: a
uid never comes back, so the watch's word is final (docs/rules.md#pod-translation-orphans).
Embedded apiserver, ``autojump_clock``."""

from __future__ import annotations

from unittest import mock

import trio
import trio.testing

from bigfleet_trio.kube.resources import PODS
from bigfleet_trio.podcontroller.reconciler import GoneUids
from bigfleet_trio.sim.apiserver import ApiServer
from tests.podcontroller.test_controller import _pending_count, crs, eventually, pod, running


async def test_a_cr_left_by_a_deleted_pod_goes_without_a_pod_get(
        autojump_clock: trio.testing.MockClock) -> None:
    server = _slow_gc(ApiServer())
    async with running(server) as (ctl, client):
        await client.create(PODS, pod("p"))
        await eventually(lambda: _pending_count(client, 1))
        with mock.patch.object(ctl.client, "get", wraps=ctl.client.get) as get:
            await client.delete(PODS, "p", "default")
            await eventually(lambda: ctl.outcomes["orphan_deleted"] == 1, limit=90)
        assert [c for c in get.call_args_list if c.args[0] is PODS] == []
        assert await crs(client) == []


async def test_an_orphan_check_for_a_uid_never_seen_deleted_still_asks_the_apiserver(
        autojump_clock: trio.testing.MockClock) -> None:
    server = _slow_gc(ApiServer())
    async with running(server) as (ctl, client):
        created = await client.create(PODS, pod("p"))
        await eventually(lambda: _pending_count(client, 1))
        ctl.reconciler.gone_uids.clear()
        uid = created["metadata"]["uid"]
        with mock.patch.object(ctl.client, "get", wraps=ctl.client.get) as get:
            await client.delete(PODS, "p", "default")
            await eventually(lambda: ctl.outcomes["pod_gone"] >= 1)
            ctl.reconciler.gone_uids.clear()  # as if the deletion was seen only as a relist gap
            await eventually(lambda: ctl.outcomes["orphan_deleted"] == 1, limit=90)
        assert any(c.args[0] is PODS for c in get.call_args_list)
        assert [cr for cr in await crs(client) if cr["metadata"]["name"] == f"cr-{uid}"] == []


def _slow_gc(server: ApiServer) -> ApiServer:
    """The CR outlives its Pod: the ownerReference GC lags on a busy cluster (here it never
    runs)."""
    server.gc.owner_deleted = lambda owner_uid, policy: None  # type: ignore[method-assign]
    return server


def test_gone_uids_keep_the_newest_up_to_their_bound() -> None:
    gone = GoneUids(limit=3)
    for uid in "abcd":
        gone.add(uid)
    assert "a" not in gone and all(u in gone for u in "bcd")
    gone.add("b")  # again: now the newest
    gone.add("e")
    assert "c" not in gone and all(u in gone for u in "bde")
    assert len(gone) == 3
