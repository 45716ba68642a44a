"""Retention of Failed UpcomingNodes (docs/rules.md#upcomingnode-retention): the pure plan
branch by branch, then the sweep task against the in-process apiserver on the mock clock."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.resources import UPCOMING_NODES
from bigfleet_trio.operator.retention import (
    FailedRecord,
    FailedRetention,
    failed_records,
    plan_retention,
)
from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.testing import InProcessTransport


def un(name: str, phase: str | None, uid: str = "u", rv: str = "1") -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": name, "uid": uid, "resourceVersion": rv}}
    if phase is not None:
        obj["status"] = {"phase": phase}
    return obj


def test_failed_records_keeps_only_named_failed_objects() -> None:
    objs = [
        un("a", "Failed", "ua", "7"),
        un("b", "Ready"),
        un("c", None),
        {"status": {"phase": "Failed"}},  # no metadata
        {"metadata": {}, "status": {"phase": "Failed"}},  # no name
        {"metadata": {"name": "d"}, "status": "Failed"},  # status not an object
    ]
    assert failed_records(objs) == [FailedRecord("a", "ua", "7")]


A = FailedRecord("a", "ua", "1")
B = FailedRecord("b", "ub", "1")


def test_first_sight_starts_the_clock_and_deletes_nothing() -> None:
    plan = plan_retention({}, [A, B], now=100.0, retention=600.0)
    assert plan.delete == []
    assert plan.first_seen == {"a": ("ua", 100.0), "b": ("ub", 100.0)}


def test_due_exactly_at_the_retention_period_oldest_first() -> None:
    seen = {"a": ("ua", 50.0), "b": ("ub", 10.0)}
    plan = plan_retention(seen, [A, B], now=610.0, retention=600.0)
    assert plan.delete == [B]  # a has been Failed 560 s
    plan = plan_retention(seen, [A, B], now=650.0, retention=600.0)
    assert plan.delete == [B, A]
    # Due records stay remembered: a delete that fails is due again on the next sweep.
    assert plan.first_seen == seen


def test_ties_are_broken_by_name() -> None:
    seen = {"a": ("ua", 0.0), "b": ("ub", 0.0)}
    assert plan_retention(seen, [B, A], now=600.0, retention=600.0).delete == [A, B]


def test_a_record_that_left_failed_forgets_its_start() -> None:
    seen = {"a": ("ua", 0.0), "b": ("ub", 0.0)}
    plan = plan_retention(seen, [B], now=700.0, retention=600.0)
    assert plan.delete == [B]
    assert "a" not in plan.first_seen
    # a comes back Failed later: a fresh period.
    assert plan_retention(plan.first_seen, [A], now=800.0, retention=600.0).delete == []


def test_a_new_object_under_the_same_name_restarts_the_clock() -> None:
    seen = {"a": ("old-uid", 0.0)}
    plan = plan_retention(seen, [A], now=900.0, retention=600.0)
    assert plan.delete == []
    assert plan.first_seen == {"a": ("ua", 900.0)}


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="retention must be >= 0"):
        FailedRetention(object(), list, retention=-1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="interval must be > 0"):
        FailedRetention(object(), list, interval=0)  # type: ignore[arg-type]


async def _failed_un(client: KubeClient, name: str) -> dict[str, Any]:
    await client.create(UPCOMING_NODES, {"metadata": {"name": name}, "spec": {"resources": {}}})
    return await client.patch(
        UPCOMING_NODES,
        name,
        {"status": {"phase": "Failed", "lastError": "boom"}},
        subresource="status",
    )


async def test_sweep_deletes_failed_records_after_the_period_and_keeps_the_rest(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    server = ApiServer()
    client = KubeClient(
        KubeConfig(server="http://apiserver"), transport=InProcessTransport(server.app, nursery)
    )
    await _failed_un(client, "un-old")
    await client.create(
        UPCOMING_NODES, {"metadata": {"name": "un-ready"}, "spec": {"resources": {}}}
    )

    async def cached() -> list[dict[str, Any]]:
        return (await client.list(UPCOMING_NODES)).items

    snapshot: list[dict[str, Any]] = []
    task = FailedRetention(client, lambda: snapshot, retention=600.0, interval=30.0)
    snapshot[:] = await cached()
    await nursery.start(task.run)
    await trio.sleep(300)
    await _failed_un(client, "un-young")  # Failed 300 s after the first
    snapshot[:] = await cached()
    await trio.sleep(330)  # 630 s: un-old was due at 600 s, un-young is not
    names = sorted(o["metadata"]["name"] for o in await cached())
    assert names == ["un-ready", "un-young"]
    assert task.deleted == 1
    snapshot[:] = await cached()
    await trio.sleep(330)  # 960 s: un-young, first seen by the 330 s sweep, was due at 930 s
    assert sorted(o["metadata"]["name"] for o in await cached()) == ["un-ready"]
    assert task.deleted == 2


async def test_a_record_changed_since_the_cache_saw_it_is_not_deleted(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    server = ApiServer()
    client = KubeClient(
        KubeConfig(server="http://apiserver"), transport=InProcessTransport(server.app, nursery)
    )
    stale = await _failed_un(client, "un-a")
    task = FailedRetention(client, lambda: [stale], retention=60.0, interval=30.0)
    await task.sweep_once()
    # The machine came back: a new state written after the cache's copy.
    await client.patch(
        UPCOMING_NODES, "un-a", {"status": {"phase": "Provisioning"}}, subresource="status"
    )
    await trio.sleep(61)
    await task.sweep_once()  # the precondition (resourceVersion) refuses; no error escapes
    assert (await client.get(UPCOMING_NODES, "un-a"))["status"]["phase"] == "Provisioning"
    assert task.deleted == 0


async def test_retention_zero_disables_the_task(autojump_clock: trio.abc.Clock) -> None:
    calls: list[object] = []
    task = FailedRetention(object(), lambda: calls.append(1) or [], retention=0)  # type: ignore[arg-type]
    async with trio.open_nursery() as n:
        await n.start(task.run)
    assert calls == []
