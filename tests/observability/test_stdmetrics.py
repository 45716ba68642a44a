"""The ecosystem's standard metric names move with our bigfleet_* series (same feeding point)."""

from __future__ import annotations

import trio
import trio.testing
from prometheus_client import REGISTRY

from bigfleet_trio.kube.leader import LeaderElector
from bigfleet_trio.kube.resources import PODS
from bigfleet_trio.kube.workqueue import WorkQueue
from bigfleet_trio.observability import stdmetrics

from ..support.kube import sim_kube


def _v(family: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(family, labels) or 0.0


async def test_rest_client_counts_each_request_beside_ours(autojump_clock: object) -> None:
    async with trio.open_nursery() as nursery:
        _, client = sim_kube(nursery)
        before = _v("rest_client_requests_total", code="200", method="GET", host="apiserver")
        ours = _v("bigfleet_kube_client_request_duration_seconds_count", verb="GET", code="2xx")
        dur = _v("rest_client_request_duration_seconds_count", verb="GET", host="apiserver")
        await client.list(PODS, "default")
        await client.list(PODS, "default")
        assert _v("rest_client_requests_total", code="200", method="GET",
                  host="apiserver") == before + 2
        assert _v("bigfleet_kube_client_request_duration_seconds_count", verb="GET",
                  code="2xx") == ours + 2
        assert _v("rest_client_request_duration_seconds_count", verb="GET",
                  host="apiserver") == dur + 2
        nursery.cancel_scope.cancel()


async def test_leader_master_status_follows_is_leader(autojump_clock: object) -> None:
    async with trio.open_nursery() as nursery:
        _, client = sim_kube(nursery)
        elector = LeaderElector(client, name="std-lock", namespace="sys", identity="me",
                                rng=lambda: 0.0)
        elector.is_leader = True
        assert _v("leader_election_master_status", name="std-lock") == 1.0
        assert _v("bigfleet_leader_election_is_leader") == 1.0
        elector.is_leader = False
        assert _v("leader_election_master_status", name="std-lock") == 0.0
        assert _v("bigfleet_leader_election_is_leader") == 0.0
        nursery.cancel_scope.cancel()


async def test_queue_metrics_plug_in_with_the_queue_name(autojump_clock: object) -> None:
    queue: WorkQueue[str] = WorkQueue(metrics=stdmetrics.StandardQueueMetrics("std-q"))
    queue.add("a")
    queue.add("a")  # de-duplicated: one add
    queue.add("b")
    assert _v("workqueue_adds_total", name="std-q") == 2
    assert _v("workqueue_depth", name="std-q") == 2
    await trio.sleep(1.5)  # autojump clock
    key = await queue.get()
    assert _v("workqueue_queue_duration_seconds_count", name="std-q") == 1
    assert _v("workqueue_queue_duration_seconds_sum", name="std-q") == 1.5
    queue.done(key)
    assert _v("workqueue_work_duration_seconds_count", name="std-q") == 1


async def test_queue_work_in_progress_is_read_at_scrape_time(autojump_clock: object) -> None:
    """client-go's workqueue_unfinished_work_seconds (the seconds of every key a worker holds,
    summed) and workqueue_longest_running_processor_seconds (the oldest one's), computed when
    the registry is read (docs/operate.md#standard-metric-names)."""
    def scrape() -> tuple[float, float]:
        return (_v("workqueue_unfinished_work_seconds", name="std-flight"),
                _v("workqueue_longest_running_processor_seconds", name="std-flight"))

    queue: WorkQueue[str] = WorkQueue(metrics=stdmetrics.StandardQueueMetrics("std-flight"))
    queue.add("a")
    queue.add("b")
    await trio.sleep(5)
    assert scrape() == (0.0, 0.0)  # waiting keys are not work in progress
    a = await queue.get()
    await trio.sleep(2)
    assert scrape() == (2.0, 2.0)  # no event since the get: the scrape computes it
    b = await queue.get()
    await trio.sleep(0.5)
    assert scrape() == (2.5 + 0.5, 2.5)
    queue.done(a)
    assert scrape() == (0.5, 0.5)
    queue.done(b)
    assert scrape() == (0.0, 0.0)

    queue.add("c")
    c = await queue.get()
    await trio.sleep(1)
    assert scrape() == (1.0, 1.0)
    del queue, c  # a queue gone (reference counting) reports nothing and is not kept alive
    assert scrape() == (0.0, 0.0)


def test_queue_work_in_progress_reads_zero_outside_a_trio_run() -> None:
    """Trio's clock is readable only inside a run (a scrape from another thread, or after the
    run ended): no worker runs there, and the scrape must not fail."""
    queue: WorkQueue[str] = WorkQueue(metrics=stdmetrics.StandardQueueMetrics("std-outside"))

    async def take() -> None:
        queue.add("a")
        assert await queue.get() == "a"
        assert queue.in_flight(trio.current_time()) == (0.0, 0.0)

    trio.run(take, clock=trio.testing.MockClock())
    assert queue.processing == 1  # never done
    assert _v("workqueue_unfinished_work_seconds", name="std-outside") == 0.0
    assert _v("workqueue_longest_running_processor_seconds", name="std-outside") == 0.0


def test_reconcile_results_and_errors() -> None:
    stdmetrics.observe_reconcile("std-c", "success", 0.25)
    stdmetrics.observe_reconcile("std-c", "error", 0.5)
    assert _v("controller_runtime_reconcile_total", controller="std-c", result="success") == 1
    assert _v("controller_runtime_reconcile_total", controller="std-c", result="error") == 1
    assert _v("controller_runtime_reconcile_errors_total", controller="std-c") == 1
    assert _v("controller_runtime_reconcile_time_seconds_count", controller="std-c") == 2
    assert _v("controller_runtime_reconcile_time_seconds_sum", controller="std-c") == 0.75
