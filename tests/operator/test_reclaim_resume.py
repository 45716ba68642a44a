"""A drain cut off by an operator restart is resumed from the cluster's record
(docs/rules.md#reclaim-resume-after-restart).

Pure planner first (:func:`plan_resume` over hand-built UpcomingNodes), then the real thing on
the in-process apiserver and the mock clock: a reclaim whose drain a PodDisruptionBudget blocks,
the operator "killed" (drains abandoned with no write, as after ``kill -9``), a new
:class:`Operator` started over the same apiserver. The wall clock is ``BASE`` + the Trio clock,
so recorded deadlines and drain deadlines agree.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import trio

from bigfleet_trio.config import OperatorConfig
from bigfleet_trio.kube.errors import NotFound
from bigfleet_trio.kube.resources import NODES, UPCOMING_NODES
from bigfleet_trio.operator.app import Operator
from bigfleet_trio.operator.reclaim.drain import DrainManager
from bigfleet_trio.operator.reclaim.handler import ReclaimHandler
from bigfleet_trio.operator.reclaim.resume import (
    DRAIN_DEADLINE_ANNOTATION,
    DRAIN_NODE_ANNOTATION,
    ResumedDrain,
    drain_annotations,
    expired_drain_message,
    parse_deadline,
    plan_resume,
    resumed_failure_message,
)
from bigfleet_trio.operator.upcoming.plan import DrainMemory
from bigfleet_trio.shard.transport import MemoryConnector

from .test_reclaim import Replies, _pdb_allows, _pod_names, _seed, _server_and_client, instr

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def un(
    name: str,
    phase: str | None = "Draining",
    *,
    deadline: Any = "2026-03-01T12:00:30Z",
    node: Any = None,
    node_ref: str | None = "n-1",
) -> dict[str, Any]:
    annotations: dict[str, Any] = {"other": "x"}
    if deadline is not None:
        annotations[DRAIN_DEADLINE_ANNOTATION] = deadline
    if node is not None:
        annotations[DRAIN_NODE_ANNOTATION] = node
    status: dict[str, Any] = {}
    if phase is not None:
        status["phase"] = phase
    if node_ref is not None:
        status["nodeRef"] = {"kind": "Node", "name": node_ref}
    return {"metadata": {"name": name, "annotations": annotations}, "status": status}


# --------------------------------------------------------------------------- pure


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-03-01T12:00:30Z", datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)),
        ("2026-03-01T13:00:30+01:00", datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)),
        ("2026-03-01T12:00:30.5Z", datetime(2026, 3, 1, 12, 0, 30, 500000, tzinfo=UTC)),
        ("2026-03-01T12:00:30", None),  # no offset: not RFC 3339
        ("2026-03-01", None),  # a date only
        ("soon", None),
        ("", None),
        (1772366430, None),  # a number, not text
        (None, None),
    ],
)
def test_parse_deadline(text: Any, expected: datetime | None) -> None:
    assert parse_deadline(text) == expected


def test_drain_annotations_round_trip() -> None:
    ann = drain_annotations("n-1", datetime(2026, 3, 1, 12, 0, 30, 900000, tzinfo=UTC))
    # second precision, truncated: the recorded deadline is never later than the drain's
    assert ann == {DRAIN_DEADLINE_ANNOTATION: "2026-03-01T12:00:30Z", DRAIN_NODE_ANNOTATION: "n-1"}
    assert parse_deadline(ann[DRAIN_DEADLINE_ANNOTATION]) == datetime(
        2026, 3, 1, 12, 0, 30, tzinfo=UTC
    )


def test_plan_resume_remaining_time_ahead() -> None:
    plan = plan_resume([un("un-a")], NOW)
    assert plan.resume == [ResumedDrain("un-a", "n-1", "2026-03-01T12:00:30Z", 30.0)]
    assert plan.expired == [] and plan.skipped == []


@pytest.mark.parametrize(
    ("deadline", "bucket", "remaining"),
    [
        ("2026-03-01T12:00:01Z", "resume", 1.0),
        ("2026-03-01T12:00:00Z", "expired", 0.0),  # exactly now: nothing left to drain in
        ("2026-03-01T11:59:00Z", "expired", -60.0),
        ("2026-03-01T13:00:05+01:00", "resume", 5.0),
    ],
)
def test_plan_resume_deadline_boundary(deadline: str, bucket: str, remaining: float) -> None:
    plan = plan_resume([un("un-a", deadline=deadline)], NOW)
    items = plan.resume if bucket == "resume" else plan.expired
    other = plan.expired if bucket == "resume" else plan.resume
    assert items == [ResumedDrain("un-a", "n-1", deadline, remaining)]
    assert other == [] and plan.skipped == []


@pytest.mark.parametrize(
    "phase", [None, "Provisioning", "Launched", "Registered", "Ready", "Drained", "Failed", "x"]
)
def test_plan_resume_ignores_other_phases_silently(phase: str | None) -> None:
    plan = plan_resume([un("un-a", phase=phase)], NOW)
    assert (plan.resume, plan.expired, plan.skipped) == ([], [], [])


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (un("un-a", deadline=None), "no drain-deadline annotation"),
        (un("un-a", deadline=""), "no drain-deadline annotation"),
        (un("un-a", deadline=5), "no drain-deadline annotation"),
        (un("un-a", deadline="tomorrow"),
         "drain-deadline 'tomorrow' is not RFC 3339 with an offset"),
        (un("un-a", deadline="2026-03-01T12:00:30"),
         "drain-deadline '2026-03-01T12:00:30' is not RFC 3339 with an offset"),
        (un("un-a", node_ref=None), "no node: neither drain-node annotation nor nodeRef"),
        (un("un-a", node="", node_ref=None), "no node: neither drain-node annotation nor nodeRef"),
    ],
)
def test_plan_resume_skips_with_a_reason(obj: dict[str, Any], reason: str) -> None:
    plan = plan_resume([obj], NOW)
    assert (plan.resume, plan.expired) == ([], [])
    assert plan.skipped == [("un-a", reason)]


def test_plan_resume_node_from_annotation_first_then_node_ref() -> None:
    plan = plan_resume(
        [un("un-a", node="n-9", node_ref="n-1"), un("un-b", node="n-2", node_ref=None),
         un("un-c", node_ref="n-3")],
        NOW,
    )
    assert [(d.un_name, d.node) for d in plan.resume] == [
        ("un-a", "n-9"), ("un-b", "n-2"), ("un-c", "n-3")
    ]


def test_plan_resume_one_drain_per_node_first_by_name() -> None:
    plan = plan_resume(
        [un("un-d", node="n-2"), un("un-c", node_ref="n-3"), un("un-a", node="n-2")], NOW
    )
    assert [(d.un_name, d.node) for d in plan.resume] == [("un-a", "n-2"), ("un-c", "n-3")]
    assert plan.skipped == [("un-d", "node n-2 is already drained for un-a")]


def test_plan_resume_duplicate_node_across_expired_and_ahead() -> None:
    # un-b sorts first and claims n-1 (expired); un-c names the same node and is skipped
    plan = plan_resume([un("un-c"), un("un-b", deadline="2026-03-01T11:00:00Z")], NOW)
    assert [d.un_name for d in plan.expired] == ["un-b"]
    assert plan.resume == []
    assert plan.skipped == [("un-c", "node n-1 is already drained for un-b")]


@pytest.mark.parametrize(
    "obj",
    [
        {},
        {"metadata": None},
        {"metadata": {"name": ""}},
        {"metadata": {"name": 7}, "status": {"phase": "Draining"}},
        {"metadata": {"name": "un-a", "annotations": ["x"]}, "status": {"phase": "Draining"}},
        {"metadata": {"name": "un-a"}, "status": "Draining"},
        {"metadata": {"name": "un-a"}, "status": {"phase": "Draining", "nodeRef": "n-1"}},
    ],
)
def test_plan_resume_total_over_junk(obj: dict[str, Any]) -> None:
    plan = plan_resume([obj], NOW)
    assert plan.resume == [] and plan.expired == []


def test_plan_resume_empty_and_input_not_mutated() -> None:
    assert plan_resume([], NOW).resume == []
    objs = [un("un-a"), un("un-b", node="n-2")]
    before = repr(objs)
    plan_resume(objs, NOW)
    assert repr(objs) == before


def test_messages() -> None:
    assert expired_drain_message("n-1", "2026-03-01T12:00:30Z") == (
        "drain of node n-1 did not finish by its deadline 2026-03-01T12:00:30Z: the deadline "
        "passed while the operator was not running"
    )
    assert resumed_failure_message("n-1", "D", {"b/y": "terminating", "a/x": "blocked"}) == (
        "drain of node n-1 (resumed after an operator restart) did not finish by its deadline "
        "D; pods left: a/x (blocked), b/y (terminating)"
    )
    assert resumed_failure_message("n", "D", {}).endswith("pods left: none listed")
    assert len(resumed_failure_message("n", "D", {f"ns/p{i}": "x" * 50 for i in range(99)})) == 2000


# --------------------------------------------------------------------------- in-process apiserver

BASE = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def wall() -> datetime:
    """The wall clock, driven by the Trio (mock) clock."""
    return BASE + timedelta(seconds=trio.current_time())


async def _first_operator_killed(client: Any, *, grace: int, run_for: float) -> float:
    """Reclaim m-1 (drain PDB-blocked), run ``run_for`` s, then die: the drain is abandoned
    without any write (shutdown_timeout 0, as after SIGKILL). Returns the instruction time."""
    memory = DrainMemory()
    drains = DrainManager(client, memory, rng=random.Random(1), shutdown_timeout=0)
    handler = ReclaimHandler(client, drains, memory, wall_clock=wall)
    async with trio.open_nursery() as first:
        await first.start(drains.run)
        t0 = trio.current_time()
        await handler.on_reclaim_instruction(instr("r-1", "m-1", grace=grace), Replies())
        assert drains.active == frozenset({"n-1"})
        await trio.sleep(run_for)
        first.cancel_scope.cancel()
    assert drains.abandoned_total == 1
    return t0


def _operator(client: Any) -> Operator:
    connector = MemoryConnector()
    connector.fail_next = 10**9  # no shard: nothing re-issues the instruction
    cfg = OperatorConfig(cluster_id="c1", shard_addr="shard:1", drain_shutdown_timeout=0)
    return Operator(cfg, client=client, connector=connector, wall_clock=wall)


async def _wait(predicate: Any, limit: float = 120.0) -> None:
    with trio.fail_after(limit):
        while not await predicate():  # noqa: ASYNC110 - the state is on the apiserver
            await trio.sleep(0.5)


async def _gone(client: Any) -> bool:
    try:
        await client.get(UPCOMING_NODES, "un-m-1")
    except NotFound:
        return True
    return False


async def _cordoned(client: Any) -> bool:
    return bool((await client.get(NODES, "n-1"))["spec"].get("unschedulable"))


async def test_reclaim_records_the_deadline_and_node_with_draining(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    _, client = _server_and_client(nursery)
    await _seed(client)
    t0 = await _first_operator_killed(client, grace=60, run_for=7)
    obj = await client.get(UPCOMING_NODES, "un-m-1")
    assert obj["status"]["phase"] == "Draining"
    ann = obj["metadata"]["annotations"]
    assert ann[DRAIN_NODE_ANNOTATION] == "n-1"
    recorded = parse_deadline(ann[DRAIN_DEADLINE_ANNOTATION])
    assert recorded is not None
    assert BASE + timedelta(seconds=t0 + 59) <= recorded <= BASE + timedelta(seconds=t0 + 60)
    assert await _cordoned(client)


async def test_restarted_operator_resumes_the_drain_until_the_budget_allows(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    server, client = _server_and_client(nursery)
    await _seed(client)
    await _first_operator_killed(client, grace=60, run_for=7)
    op = _operator(client)
    async with trio.open_nursery() as second:
        await second.start(op.run)
        drains = op.drains
        assert drains is not None
        assert drains.active == frozenset({"n-1"})  # resumed at start-up, before any shard
        server.counters.reset()
        await trio.sleep(10)
        assert server.counters[("create", "pods/eviction")] >= 2  # evicting again, blocked
        assert await _pod_names(client) == ["agent", "web"]
        assert await _cordoned(client)
        assert (await client.get(UPCOMING_NODES, "un-m-1"))["status"]["phase"] == "Draining"
        await _pdb_allows(client, 1)
        await _wait(lambda: _gone(client))
        assert await _cordoned(client)  # never uncordoned: the machine leaves
        await drains.wait_idle()
        assert (drains.completed_total, drains.failed_total) == (1, 0)
        assert drains.results["n-1"].outcome == "drained"
        assert drains.memory.get("un-m-1") == "drained"
        assert await _pod_names(client) == ["agent"]
        second.cancel_scope.cancel()


async def test_resumed_drain_fails_at_the_recorded_deadline(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    _, client = _server_and_client(nursery)
    await _seed(client)
    t0 = await _first_operator_killed(client, grace=60, run_for=7)
    deadline = (await client.get(UPCOMING_NODES, "un-m-1"))["metadata"]["annotations"][
        DRAIN_DEADLINE_ANNOTATION
    ]
    op = _operator(client)
    async with trio.open_nursery() as second:
        await second.start(op.run)
        assert op.drains is not None
        await op.drains.wait_idle()
        # the recorded deadline (<= 1 s early: second precision), not 60 s after the restart
        assert 58.9 <= trio.current_time() - t0 <= 60.1
        second.cancel_scope.cancel()
    obj = await client.get(UPCOMING_NODES, "un-m-1")
    assert obj["status"]["phase"] == "Failed"
    assert obj["status"]["lastError"].startswith(
        f"drain of node n-1 (resumed after an operator restart) did not finish by its deadline "
        f"{deadline}; pods left: default/web (eviction blocked by PodDisruptionBudget default/web: "
    )
    assert await _cordoned(client)


async def test_deadline_passed_while_down_fails_at_once_without_evicting(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    server, client = _server_and_client(nursery)
    await _seed(client)
    await _first_operator_killed(client, grace=30, run_for=7)
    await trio.sleep(60)  # the operator is down past the deadline
    deadline = (await client.get(UPCOMING_NODES, "un-m-1"))["metadata"]["annotations"][
        DRAIN_DEADLINE_ANNOTATION
    ]
    await _pdb_allows(client, 1)  # even an eviction that would now succeed is not attempted
    server.counters.reset()
    op = _operator(client)
    async with trio.open_nursery() as second:
        await second.start(op.run)
        assert op.drains is not None
        await op.drains.wait_idle()
        second.cancel_scope.cancel()
    assert server.counters[("create", "pods/eviction")] == 0
    assert op.drains.failed_total == 1
    obj = await client.get(UPCOMING_NODES, "un-m-1")
    assert obj["status"]["phase"] == "Failed"
    assert obj["status"]["lastError"] == expired_drain_message("n-1", deadline)
    assert await _pod_names(client) == ["agent", "web"]


async def test_instruction_after_resume_gets_no_second_drain_and_keeps_the_deadline(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    server, client = _server_and_client(nursery)
    await _seed(client)
    await _first_operator_killed(client, grace=60, run_for=7)
    before = (await client.get(UPCOMING_NODES, "un-m-1"))["metadata"]["annotations"]
    op = _operator(client)
    async with trio.open_nursery() as second:
        await second.start(op.run)
        drains = op.drains
        assert drains is not None and op.parts is not None
        # a re-issued instruction (another id: the shard never saw the first ack) names n-1
        replies = Replies()
        await op.parts.handlers.reclaim.on_reclaim_instruction(
            instr("r-2", "m-1", grace=600), replies
        )
        assert replies.acks == [("r-2", 1)]
        assert drains.active == frozenset({"n-1"})
        after = (await client.get(UPCOMING_NODES, "un-m-1"))["metadata"]["annotations"]
        assert after == before  # the running drain's deadline stays the record
        await _pdb_allows(client, 1)
        await drains.wait_idle()
        second.cancel_scope.cancel()
    assert (drains.completed_total, drains.failed_total) == (1, 0)
    assert len(drains.results) == 1
    assert await _gone(client)


async def test_draining_without_record_is_not_resumed(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    _, client = _server_and_client(nursery)
    await _seed(client)
    await client.patch(UPCOMING_NODES, "un-m-1", {"status": {"phase": "Draining"}},
                       subresource="status")
    op = _operator(client)
    async with trio.open_nursery() as second:
        await second.start(op.run)
        assert op.drains is not None and op.drains.active == frozenset()
        second.cancel_scope.cancel()
    assert (await client.get(UPCOMING_NODES, "un-m-1"))["status"]["phase"] == "Draining"
    assert await _pod_names(client) == ["agent", "web"]
