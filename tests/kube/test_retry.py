"""kube.retry: the one Backoff, the client's one retry layer, the handlers' conflict re-plan."""

from __future__ import annotations

import random

import pytest
import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.errors import (
    AlreadyExists,
    Conflict,
    KubeError,
    KubeTransportError,
    NotFound,
    ServerError,
    TooManyRequests,
    Unauthorized,
)
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS
from bigfleet_trio.kube.retry import (
    NOT_PROCESSED,
    TRANSIENT,
    Backoff,
    RetryPolicy,
    conflict_retrying,
    write_retry_on,
)

from .fakekube import FakeKube, status

# ---- Backoff (pure) ---------------------------------------------------------------------------


def test_backoff_up_mode_is_the_reflector_backoff() -> None:
    b = Backoff(rng=lambda: 0.0)
    assert [b.next_delay(t) for t in range(8)] == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    assert b.next_delay(7 + 120) == 0.8  # no failure for 2 min: count restarts
    assert Backoff(rng=lambda: 0.5).next_delay(0) == pytest.approx(0.8 * 1.5)
    assert Backoff(initial=20, rng=lambda: 0.9).next_delay(0) == 30.0  # never past the cap


def test_backoff_down_mode_only_shortens() -> None:
    b = Backoff(0.5, cap=30.0, jitter=0.2, jitter_mode="down", rng=lambda: 0.5)
    assert [b.next_delay() for _ in range(8)] == pytest.approx(
        [0.45, 0.9, 1.8, 3.6, 7.2, 14.4, 27.0, 27.0]
    )
    assert Backoff(1, cap=2, jitter=0.2, jitter_mode="down", rng=lambda: 0.0).delay(5) == 2


def test_backoff_replaces_the_reconnect_loops_backoff() -> None:
    """Same sequence as the shard reconnect loop's Backoff (operator/agent.py) given the same
    random numbers: its healthy-session rule is ``reset()`` before ``next_delay()``."""
    from bigfleet_trio.operator.agent import Backoff as AgentBackoff

    theirs = AgentBackoff(0.5, 30.0, jitter=0.2, healthy_after=60.0, rng=random.Random(7))
    ours = Backoff(0.5, cap=30.0, jitter=0.2, jitter_mode="down", reset_after=None,
                   rng=random.Random(7).random)
    uptimes = [None, 1.0, None, 5.0, 70.0, None, None, None, None, None, 61.0, None]
    got = []
    for up in uptimes:
        if up is not None and up >= 60.0:
            ours.reset()
        got.append(ours.next_delay())
    assert got == [theirs.next_delay(up) for up in uptimes]


def test_backoff_nominal_is_the_work_queues_rule_and_overflow_safe() -> None:
    b = Backoff(initial=0.005, cap=300, jitter=0.0)
    assert [b.nominal(n) for n in (0, 1, 3, 16, 10_000, -1)] == [
        0.005, 0.01, 0.04, 300, 300, 0.005]
    assert Backoff(initial=1, factor=1, cap=5, jitter=0).nominal(50) == 1
    assert Backoff(initial=1, factor=1e300, cap=5, jitter=0).nominal(3) == 5


def test_backoff_reset_and_failures() -> None:
    b = Backoff(rng=lambda: 0.0)
    b.next_delay(0)
    b.next_delay(1)
    assert b.failures == 2
    b.reset()
    assert b.failures == 0
    assert b.next_delay(2) == 0.8


@pytest.mark.parametrize(
    "kw",
    [
        {"initial": 0},
        {"initial": 2, "cap": 1},
        {"factor": 0.5},
        {"jitter": -0.1},
        {"jitter": 1.0, "jitter_mode": "down"},
        {"jitter_mode": "sideways"},
    ],
)
def test_backoff_validation(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Backoff(**kw)  # type: ignore[arg-type]


def test_write_retry_classes() -> None:
    assert write_retry_on(idempotent=True) == TRANSIENT
    assert write_retry_on(idempotent=False) == NOT_PROCESSED == (TooManyRequests,)


# ---- RetryPolicy.call ---------------------------------------------------------------------------


def _no_jitter() -> RetryPolicy:
    return RetryPolicy(max_attempts=4, backoff=Backoff(0.2, cap=10, jitter=0, reset_after=None))


async def test_policy_retries_transient_then_succeeds(autojump_clock: object) -> None:
    errors: list[Exception] = [
        ServerError(503, "ServiceUnavailable", "x"),
        KubeTransportError("reset"),
        TooManyRequests(429, "TooManyRequests", "slow", retry_after=3.0),
    ]
    calls = 0

    async def fn() -> str:
        nonlocal calls
        calls += 1
        if errors:
            raise errors.pop(0)
        return "ok"

    t0 = trio.current_time()
    assert await _no_jitter().call(fn, TRANSIENT, "GET /x") == "ok"
    assert calls == 4
    assert trio.current_time() - t0 == pytest.approx(0.2 + 0.4 + 3.0)  # Retry-After wins


async def test_policy_gives_up_and_does_not_retry_other_errors(autojump_clock: object) -> None:
    calls = 0

    async def throttled() -> None:
        nonlocal calls
        calls += 1
        raise TooManyRequests(429, "TooManyRequests", "no", retry_after=100.0)

    policy = RetryPolicy(max_attempts=3, max_retry_after=5.0)
    t0 = trio.current_time()
    with pytest.raises(TooManyRequests):
        await policy.call(throttled, TRANSIENT)
    assert calls == 3
    assert trio.current_time() - t0 == pytest.approx(10.0)  # Retry-After capped at 5 s

    async def conflict() -> None:
        nonlocal calls
        calls += 1
        raise Conflict(409, "Conflict", "stale")

    calls = 0
    with pytest.raises(Conflict):
        await policy.call(conflict, TRANSIENT)
    assert calls == 1


async def test_policy_never_retries_cancellation(autojump_clock: object) -> None:
    calls = 0

    async def slow() -> None:
        nonlocal calls
        calls += 1
        await trio.sleep(10)

    with trio.move_on_after(1):
        await RetryPolicy().call(slow, TRANSIENT)
    assert calls == 1


# ---- the client uses it: one layer, safe writes only ---------------------------------------


def _client(fake: FakeKube, **kw: object) -> KubeClient:
    cfg = KubeConfig(server="https://kube.test", token="tok")
    return KubeClient(cfg, transport=fake.transport(), **kw)  # type: ignore[arg-type]


def _cr(name: str) -> dict[str, object]:
    return {"apiVersion": "bigfleet.lucy.sh/v1alpha1", "kind": "CapacityRequest",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"cpu": "1"}}


async def test_merge_patch_retried_after_5xx_json_patch_not(autojump_clock: object) -> None:
    fake = FakeKube()
    async with _client(fake) as c:
        await c.create(CAPACITY_REQUESTS, _cr("a"))
        fake.inject("PATCH", "/capacityrequests/a", status(503, "ServiceUnavailable", "x"))
        fake.inject("PATCH", "/capacityrequests/a", status(500, "InternalError", "x"))
        out = await c.patch(CAPACITY_REQUESTS, "a", {"spec": {"cpu": "2"}}, "default")
        assert out["spec"] == {"cpu": "2"}
        assert [r.method for r in fake.requests] == ["POST", "PATCH", "PATCH", "PATCH"]
        fake.inject("PATCH", "/capacityrequests/a", status(503, "ServiceUnavailable", "x"))
        with pytest.raises(ServerError):
            await c.patch(CAPACITY_REQUESTS, "a",
                          [{"op": "replace", "path": "/spec/cpu", "value": "3"}],
                          "default", patch_type="json")
        assert len(fake.requests) == 5


async def test_write_429_retried_by_the_client_only_max_attempts_times(
    autojump_clock: object,
) -> None:
    fake = FakeKube()
    fake.inject("POST", "/capacityrequests", status(429, "TooManyRequests", "x"), times=10)
    async with _client(fake, max_attempts=5) as c:
        with pytest.raises(TooManyRequests):
            await c.create(CAPACITY_REQUESTS, _cr("a"))
    assert len(fake.requests) == 5


async def test_client_remembers_the_first_401(autojump_clock: object) -> None:
    fake = FakeKube()
    fake.inject("GET", "/capacityrequests/a", status(401, "Unauthorized", "bad token"), times=2)
    async with _client(fake) as c:
        assert c.unauthorized is None
        got: list[Unauthorized] = []

        async def waiter() -> None:
            got.append(await c.wait_unauthorized())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.sleep(1)
            assert got == []
            with pytest.raises(Unauthorized):
                await c.get(CAPACITY_REQUESTS, "a", "default")
        assert len(fake.requests) == 1  # a 401 is not retried
        assert got == [c.unauthorized]
        assert str(got[0]).startswith("401 Unauthorized")


# ---- conflict_retrying (handlers) ---------------------------------------------------------------


async def test_conflict_retrying_replans_on_409_only(autojump_clock: object) -> None:
    class Replan(Exception):
        pass

    seq: list[Exception] = [Conflict(409, "Conflict", "x"),
                            AlreadyExists(409, "AlreadyExists", "x"), Replan()]
    tries = 0
    async for attempt in conflict_retrying(8, also=(Replan,)):
        with attempt:
            tries += 1
            if seq:
                raise seq.pop(0)
    assert tries == 4

    tries = 0
    with pytest.raises(ServerError):  # transient: the client's business, not re-planned
        async for attempt in conflict_retrying(8):
            with attempt:
                tries += 1
                raise ServerError(500, "InternalError", "x")
    assert tries == 1

    tries = 0
    with pytest.raises(Conflict):
        async for attempt in conflict_retrying(3):
            with attempt:
                tries += 1
                raise Conflict(409, "Conflict", "x")
    assert tries == 3

    with pytest.raises(NotFound):
        async for attempt in conflict_retrying(3):
            with attempt:
                raise NotFound(404, "NotFound", "x")


async def test_conflict_retrying_leaves_no_reference_cycle(autojump_clock: object) -> None:
    """A handler's retry loop is freed by reference counting when it ends, however it ends:
    the binaries freeze the heap, and a loop alive at a freeze that needed the cyclic collector
    was never freed (docs/kube-api.md#garbage-collector)."""
    import gc
    import weakref

    async def run(outcomes: list[Exception | None]) -> weakref.ref[object]:
        retrying = conflict_retrying(3, also=(ServerError,))
        ref = weakref.ref(retrying)
        try:
            async for attempt in retrying:
                with attempt:
                    if outcomes[0] is not None:
                        raise outcomes.pop(0)  # named by no local: no cycle of the test's own
                    outcomes.pop(0)
        except KubeError:
            pass
        return ref

    gc.collect()
    gc.disable()
    try:
        refs = [await run([None]),  # done at once
                await run([Conflict(409, "Conflict", "x"), None]),  # re-planned, then done
                await run([Conflict(409, "Conflict", str(i)) for i in range(3)]),  # no more tries
                await run([NotFound(404, "NotFound", "x")])]  # not re-planned
        assert [ref() for ref in refs] == [None, None, None, None]
        assert gc.collect() == 0  # and nothing else of theirs waits for the collector
    finally:
        gc.enable()


async def test_conflict_retrying_waits_its_backoff_between_attempts(autojump_clock: object) -> None:
    starts: list[float] = []
    t0 = trio.current_time()
    with pytest.raises(Conflict):
        async for attempt in conflict_retrying(
                4, backoff=Backoff(0.1, cap=0.3, jitter=0, reset_after=None)):
            with attempt:
                starts.append(trio.current_time() - t0)
                raise Conflict(409, "Conflict", "x")
    assert starts == pytest.approx([0.0, 0.1, 0.3, 0.6])  # 0.1, 0.2, then capped at 0.3


async def test_conflict_retrying_ends_on_cancellation(autojump_clock: object) -> None:
    tries = 0
    with trio.move_on_after(0.25) as scope:  # inside the second wait (0.1 s, then 0.2 s)
        async for attempt in conflict_retrying(
                8, backoff=Backoff(0.1, cap=5, jitter=0, reset_after=None)):
            with attempt:
                tries += 1
                raise Conflict(409, "Conflict", "x")
    assert scope.cancelled_caught and tries == 2

    tries = 0
    with trio.move_on_after(1) as scope:  # a cancellation inside an attempt is not re-planned
        async for attempt in conflict_retrying(8, also=(Exception,)):
            with attempt:
                tries += 1
                await trio.sleep_forever()
    assert scope.cancelled_caught and tries == 1


def test_conflict_retrying_needs_one_attempt() -> None:
    with pytest.raises(ValueError, match="attempts"):
        conflict_retrying(0)


def test_every_retry_loop_is_our_own() -> None:
    """One retry mechanism (docs/kube-api.md#retries): the loops of kube.retry, no retry
    library beside them, in product code or in the runtime dependencies."""
    import ast
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    root = Path(__file__).resolve().parents[2]
    libraries = {"tenacity", "backoff", "retrying", "stamina"}
    found = []
    for path in sorted((root / "bigfleet_trio").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(root)}: {n}" for n in names
                      if n.split(".")[0] in libraries]
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    found += [f"pyproject.toml: {d}" for d in deps if Requirement(d).name in libraries]
    assert not found
