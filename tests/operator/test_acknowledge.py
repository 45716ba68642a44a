"""CapacityRequest acknowledgement (docs/rules.md#acknowledgement)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import trio
from prometheus_client import REGISTRY

from bigfleet_trio.kube.errors import ServerError
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS
from bigfleet_trio.operator.acknowledge import (
    Acknowledger,
    acknowledge_patch,
    format_acknowledged_at,
    needs_acknowledgement,
)
from tests.support import capacity
from tests.support.kube import Record, RecordingKube, sim_kube

T0 = datetime(2026, 3, 1, 12, 0, 5, 987654, tzinfo=UTC)


def _cr(ns: str, name: str, phase: str | None = "Pending") -> dict[str, Any]:
    return capacity.cr(name, namespace=ns, phase=phase)


def ack_kube(nursery: trio.Nursery, *crs: dict[str, Any]) -> RecordingKube:
    """The sim apiserver holding ``crs`` (``_cr`` shapes; a valid spec filled in), every PATCH
    taking 0.01 s (the sim's latency rule)."""
    kube = RecordingKube.over_sim(nursery)
    kube.server.faults.add_latency(0.01, verb="patch")
    for cr in crs:
        body = {"metadata": dict(cr["metadata"]), "spec": {"priority": 1, "resources": {}}}
        if cr.get("status"):
            body["status"] = cr["status"]
        kube.seed(CAPACITY_REQUESTS, body)
    return kube


def _patches(kube: RecordingKube) -> list[Record]:
    return kube.of("patch/status", "capacityrequests")


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


async def test_submit_patches_pending_only(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    crs = [_cr("ns1", "a"), _cr("ns1", "b", "Acknowledged"), _cr("ns2", "c", None)]
    kube = ack_kube(nursery, *crs)
    ack = Acknowledger(kube, now=lambda: T0)
    async with trio.open_nursery() as inner:
        await inner.start(ack.run)
        n = ack.submit(crs)
        assert n == 2
        await trio.sleep(1)
        inner.cancel_scope.cancel()
    body = {"status": {"acknowledgedAt": "2026-03-01T12:00:05Z", "phase": "Acknowledged"}}
    seen = [(r.plural, r.name, r.body, r.namespace, r.patch_type) for r in _patches(kube)]
    assert sorted(seen) == [
        (CAPACITY_REQUESTS.plural, "a", body, "ns1", "merge"),
        (CAPACITY_REQUESTS.plural, "c", body, "ns2", "merge"),
    ]
    for ns, name in (("ns1", "a"), ("ns2", "c")):
        assert kube.objects(CAPACITY_REQUESTS, ns)[name]["status"] == body["status"]
    assert ack.acknowledged_total == 2
    assert ack.in_flight == frozenset()


async def test_at_most_16_in_flight_and_submit_does_not_block(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    crs = [_cr("ns", f"cr{i}") for i in range(40)]
    client = ack_kube(nursery, *crs)
    client.gate = trio.Event()
    ack = Acknowledger(client, now=lambda: T0)
    async with trio.open_nursery() as inner:
        await inner.start(ack.run)
        before = trio.current_time()
        assert ack.submit(crs) == 40
        assert trio.current_time() == before  # submit returned without waiting
        await trio.sleep(1)
        assert client.active == 16
        assert len(ack.in_flight) == 40
        client.gate.set()
        await trio.sleep(1)
        inner.cancel_scope.cancel()
    assert client.max_active == 16
    assert len(_patches(client)) == 40
    assert ack.in_flight == frozenset()


async def test_never_in_two_batches_at_once(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    client = ack_kube(nursery, _cr("ns", "a"), _cr("ns", "b"), _cr("ns", "c"))
    client.gate = trio.Event()
    ack = Acknowledger(client, now=lambda: T0)
    async with trio.open_nursery() as inner:
        await inner.start(ack.run)
        assert ack.submit([_cr("ns", "a"), _cr("ns", "b")]) == 2
        await trio.sleep(1)
        # next roll-up tick still sees them Pending: not scheduled again while in flight
        assert ack.submit([_cr("ns", "a"), _cr("ns", "b"), _cr("ns", "c")]) == 1
        client.gate.set()
        await trio.sleep(1)
        # finished: a later cycle may submit again (e.g. informer still stale)
        assert ack.submit([_cr("ns", "a")]) == 1
        await trio.sleep(1)
        inner.cancel_scope.cancel()
    assert [r.name for r in _patches(client)].count("a") == 2
    assert len(_patches(client)) == 4


async def test_notfound_ignored_other_errors_retried_next_cycle(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    client = ack_kube(nursery, _cr("ns", "flaky"), _cr("ns", "ok"))  # "gone": a real 404
    # a 500 for that one CR: the sim's fault rules match verb/resource, not a name
    client.fail = {("patch", "flaky"): [ServerError(500, "InternalError", "boom")]}
    ack = Acknowledger(client, now=lambda: T0)
    async with trio.open_nursery() as inner:
        await inner.start(ack.run)
        ack.submit([_cr("ns", "gone"), _cr("ns", "flaky"), _cr("ns", "ok")])
        await trio.sleep(1)
        assert ack.acknowledged_total == 1
        assert ack.failed_total == 1
        assert ack.in_flight == frozenset()
        assert client.objects(CAPACITY_REQUESTS, "ns")["flaky"]["status"]["phase"] == "Pending"
        assert ack.submit([_cr("ns", "flaky")]) == 1
        await trio.sleep(1)
        inner.cancel_scope.cancel()
    assert ack.acknowledged_total == 2
    assert client.objects(CAPACITY_REQUESTS, "ns")["flaky"]["status"]["phase"] == "Acknowledged"


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_metrics_acknowledged_total_and_batch_duration(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    # docs/reference.md#metric-names: acknowledged_total counts successful patches;
    # acknowledge_duration_seconds observes one Pending->Acknowledged batch (one submit), here
    # 3 patches of 0.01 s each in parallel -> one observation of 0.01 s.
    client = ack_kube(nursery, _cr("ns", "a"), _cr("ns", "b"))  # "gone": a real 404
    ack = Acknowledger(client, now=lambda: T0)
    acked = _sample("bigfleet_operator_acknowledged_total")
    count = _sample("bigfleet_operator_acknowledge_duration_seconds_count")
    total = _sample("bigfleet_operator_acknowledge_duration_seconds_sum")
    async with trio.open_nursery() as inner:
        await inner.start(ack.run)
        ack.submit([_cr("ns", "a"), _cr("ns", "b"), _cr("ns", "gone")])
        await trio.sleep(1)
        inner.cancel_scope.cancel()
    assert _sample("bigfleet_operator_acknowledged_total") - acked == 2
    assert _sample("bigfleet_operator_acknowledge_duration_seconds_count") - count == 1
    assert _sample("bigfleet_operator_acknowledge_duration_seconds_sum") - total == pytest.approx(
        0.01
    )


async def test_submit_without_run_is_an_error(nursery: trio.Nursery) -> None:
    ack = Acknowledger(sim_kube(nursery)[1])
    with pytest.raises(RuntimeError):
        ack.submit([_cr("a", "b")])


async def test_concurrency_must_be_positive(nursery: trio.Nursery) -> None:
    with pytest.raises(ValueError):
        Acknowledger(sim_kube(nursery)[1], concurrency=0)


async def test_apiserver_acknowledges_pending(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    from bigfleet_trio.kube.client import KubeClient
    from bigfleet_trio.kube.config import KubeConfig
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
