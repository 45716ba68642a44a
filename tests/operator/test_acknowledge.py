"""CapacityRequest acknowledgement (docs/rules.md#acknowledgement)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import trio
from prometheus_client import REGISTRY

from bigfleet_trio.kube.errors import NotFound, ServerError
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, Resource
from bigfleet_trio.operator.acknowledge import (
    Acknowledger,
    acknowledge_patch,
    format_acknowledged_at,
    needs_acknowledgement,
)

T0 = datetime(2026, 3, 1, 12, 0, 5, 987654, tzinfo=UTC)


def _cr(ns: str, name: str, phase: str | None = "Pending") -> dict[str, Any]:
    cr: dict[str, Any] = {"metadata": {"namespace": ns, "name": name}, "spec": {}}
    if phase is not None:
        cr["status"] = {"phase": phase}
    return cr


class FakeClient:
    def __init__(self) -> None:
        self.calls: list[tuple[Resource, str, Any, str | None, str, str | None]] = []
        self.gate: trio.Event | None = None
        self.errors: dict[str, Exception] = {}
        self.active = 0
        self.max_active = 0

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: str = "merge",
        subresource: str | None = None,
    ) -> dict[str, Any]:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            self.calls.append((res, name, patch, namespace, patch_type, subresource))
            if self.gate is not None:
                await self.gate.wait()
            else:
                await trio.sleep(0.01)
            if name in self.errors:
                raise self.errors[name]
            return {}
        finally:
            self.active -= 1


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        (T0, "2026-03-01T12:00:05Z"),
        (
            datetime(2026, 3, 1, 13, 0, 5, tzinfo=timezone(timedelta(hours=1))),
            "2026-03-01T12:00:05Z",
        ),
        (datetime(2025, 12, 31, 23, 59, 59, 999999), "2025-12-31T23:59:59Z"),
    ],
)
def test_format_acknowledged_at(when: datetime, expected: str) -> None:
    assert format_acknowledged_at(when) == expected


def test_acknowledge_patch_body() -> None:
    assert acknowledge_patch(T0) == {
        "status": {"acknowledgedAt": "2026-03-01T12:00:05Z", "phase": "Acknowledged"}
    }


@pytest.mark.parametrize(
    ("cr", "expected"),
    [
        (_cr("a", "b", "Pending"), True),
        (_cr("a", "b", ""), True),
        (_cr("a", "b", None), True),
        (_cr("a", "b", "Acknowledged"), False),
        ({"metadata": {"name": "x", "namespace": "y"}, "status": None}, True),
    ],
)
def test_needs_acknowledgement(cr: dict[str, Any], expected: bool) -> None:
    assert needs_acknowledgement(cr) is expected


async def test_submit_patches_pending_only(autojump_clock: trio.abc.Clock) -> None:
    client = FakeClient()
    ack = Acknowledger(client, now=lambda: T0)
    async with trio.open_nursery() as nursery:
        await nursery.start(ack.run)
        n = ack.submit([_cr("ns1", "a"), _cr("ns1", "b", "Acknowledged"), _cr("ns2", "c", None)])
        assert n == 2
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    body = {"status": {"acknowledgedAt": "2026-03-01T12:00:05Z", "phase": "Acknowledged"}}
    assert sorted(client.calls, key=lambda c: c[1]) == [
        (CAPACITY_REQUESTS, "a", body, "ns1", "merge", "status"),
        (CAPACITY_REQUESTS, "c", body, "ns2", "merge", "status"),
    ]
    assert ack.acknowledged_total == 2
    assert ack.in_flight == frozenset()


async def test_at_most_16_in_flight_and_submit_does_not_block(
    autojump_clock: trio.abc.Clock,
) -> None:
    client = FakeClient()
    client.gate = trio.Event()
    ack = Acknowledger(client, now=lambda: T0)
    async with trio.open_nursery() as nursery:
        await nursery.start(ack.run)
        before = trio.current_time()
        assert ack.submit([_cr("ns", f"cr{i}") for i in range(40)]) == 40
        assert trio.current_time() == before  # submit returned without waiting
        await trio.sleep(1)
        assert client.active == 16
        assert len(ack.in_flight) == 40
        client.gate.set()
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert client.max_active == 16
    assert len(client.calls) == 40
    assert ack.in_flight == frozenset()


async def test_never_in_two_batches_at_once(autojump_clock: trio.abc.Clock) -> None:
    client = FakeClient()
    client.gate = trio.Event()
    ack = Acknowledger(client, now=lambda: T0)
    async with trio.open_nursery() as nursery:
        await nursery.start(ack.run)
        assert ack.submit([_cr("ns", "a"), _cr("ns", "b")]) == 2
        await trio.sleep(1)
        # next roll-up tick still sees them Pending: not scheduled again while in flight
        assert ack.submit([_cr("ns", "a"), _cr("ns", "b"), _cr("ns", "c")]) == 1
        client.gate.set()
        await trio.sleep(1)
        # finished: a later cycle may submit again (e.g. informer still stale)
        assert ack.submit([_cr("ns", "a")]) == 1
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert [c[1] for c in client.calls].count("a") == 2
    assert len(client.calls) == 4


async def test_notfound_ignored_other_errors_retried_next_cycle(
    autojump_clock: trio.abc.Clock,
) -> None:
    client = FakeClient()
    client.errors = {
        "gone": NotFound(404, "NotFound", "gone"),
        "flaky": ServerError(500, "InternalError", "boom"),
    }
    ack = Acknowledger(client, now=lambda: T0)
    async with trio.open_nursery() as nursery:
        await nursery.start(ack.run)
        ack.submit([_cr("ns", "gone"), _cr("ns", "flaky"), _cr("ns", "ok")])
        await trio.sleep(1)
        assert ack.acknowledged_total == 1
        assert ack.failed_total == 1
        assert ack.in_flight == frozenset()
        del client.errors["flaky"]
        assert ack.submit([_cr("ns", "flaky")]) == 1
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert ack.acknowledged_total == 2


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_metrics_acknowledged_total_and_batch_duration(
    autojump_clock: trio.abc.Clock,
) -> None:
    # docs/reference.md#metric-names: acknowledged_total counts successful patches;
    # acknowledge_duration_seconds observes one Pending->Acknowledged batch (one submit), here
    # 3 patches of 0.01 s each in parallel -> one observation of 0.01 s.
    client = FakeClient()
    client.errors = {"gone": NotFound(404, "NotFound", "gone")}
    ack = Acknowledger(client, now=lambda: T0)
    acked = _sample("bigfleet_operator_acknowledged_total")
    count = _sample("bigfleet_operator_acknowledge_duration_seconds_count")
    total = _sample("bigfleet_operator_acknowledge_duration_seconds_sum")
    async with trio.open_nursery() as nursery:
        await nursery.start(ack.run)
        ack.submit([_cr("ns", "a"), _cr("ns", "b"), _cr("ns", "gone")])
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert _sample("bigfleet_operator_acknowledged_total") - acked == 2
    assert _sample("bigfleet_operator_acknowledge_duration_seconds_count") - count == 1
    assert _sample("bigfleet_operator_acknowledge_duration_seconds_sum") - total == pytest.approx(
        0.01
    )


def test_submit_without_run_is_an_error() -> None:
    ack = Acknowledger(FakeClient())
    with pytest.raises(RuntimeError):
        ack.submit([_cr("a", "b")])


def test_concurrency_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Acknowledger(FakeClient(), concurrency=0)


async def test_apiserver_acknowledges_pending(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    from bigfleet_trio.kube import KubeClient, KubeConfig
    from bigfleet_trio.sim.apiserver import ApiServer
    from bigfleet_trio.sim.apiserver.testing import InProcessTransport

    server = ApiServer()
    client = KubeClient(
        KubeConfig(server="http://apiserver"), transport=InProcessTransport(server.app, nursery)
    )
    crs = []
    for name in ("a", "b"):
        crs.append(
            await client.create(
                CAPACITY_REQUESTS,
                {
                    "apiVersion": "bigfleet.lucy.sh/v1alpha1",
                    "kind": "CapacityRequest",
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"priority": 1, "resources": {"cpu": "1"}},
                },
                "default",
            )
        )
    crs.append({"metadata": {"namespace": "default", "name": "deleted-meanwhile"}})
    ack = Acknowledger(client, now=lambda: T0)
    await nursery.start(ack.run)
    assert ack.submit(crs) == 3
    await trio.sleep(1)
    for name in ("a", "b"):
        cr = await client.get(CAPACITY_REQUESTS, name, "default")
        assert cr["status"] == {"phase": "Acknowledged", "acknowledgedAt": "2026-03-01T12:00:05Z"}
    assert ack.acknowledged_total == 2
    assert ack.failed_total == 0  # NotFound ignored
