"""Apiserver faults, through the embedded apiserver's fault hooks
(``server.faults``: fail_next / add_latency / drop_watches / compact) and a transport switch for
"apiserver down for 60 s". Only the operator's client sees the faults (the simulated shard
writes its Nodes through its own client).

Each case ends converged (worked out by hand from ``docs/rules.md#roll-up`` and
``docs/rules.md#upcomingnode-phases``):

* every informer cache equals the server (same keys, same resourceVersions);
* CRs a and b (priority 100, cpu 3 each: one need, aggregate cpu 6, min_unit 3) are both
  Acknowledged, and the shard's last roll-up is exactly that need -- plus, for CR c (priority
  10, cpu 1, created while the fault is active) a second need cpu 1 / 1;
* every machine bound to the cluster is CONFIGURED in the shard and is an UpcomingNode
  ``un-<machine_id>`` in phase Ready, and there is no other UpcomingNode.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, NODES, UPCOMING_NODES
from bigfleet_trio.proto import pb
from tests.support.capacity import cr

from ._harness import Harness, harness, needs_of

AB = (100, {"cpu": "6"}, {"cpu": "3"})
C = (10, {"cpu": "1"}, {"cpu": "1"})

async def _converged(h: Harness) -> tuple[bool, str]:
    # 1. caches equal the server
    rt = h.operator.parts
    assert rt is not None
    for inf in rt.informers:
        server = {}
        for obj in (await h.client.list(inf.res)).items:
            md = obj["metadata"]
            key = f"{md['namespace']}/{md['name']}" if md.get("namespace") else md["name"]
            server[key] = md.get("resourceVersion")
        cache = {k: (v.get("metadata") or {}).get("resourceVersion") for k, v in inf.store.items()}
        if cache != server:
            return False, f"{inf.res.plural} cache {cache} != server {server}"
    # 2. every CR acknowledged, roll-up current
    for name in ("a", "b", "c"):
        if await h.phase(name) != "Acknowledged":
            return False, f"CR {name} is {await h.phase(name)}"
    if needs_of(h.shard.last_rollup) != sorted([AB, C], key=repr):
        return False, f"roll-up {needs_of(h.shard.last_rollup)}"
    # 3. UpcomingNodes at the shard's last state
    uns = await h.upcoming()
    bound = [m for m in h.shard.engine.machines if m.bound]
    if not bound or any(m.state != pb.MachineState.CONFIGURED for m in bound):
        return False, f"shard not settled: {h.shard.machines_by_state()}"
    want = {f"un-{m.machine_id}": "Ready" for m in bound}  # CONFIGURED -> Ready
    got = {n: (u.get("status") or {}).get("phase") for n, u in uns.items()}
    if got != want:
        return False, f"UpcomingNodes {got} != shard {want}"
    return True, ""


Fault = Callable[[Harness], Awaitable[None]]


async def _fail(h: Harness, n: int, code: int, verb: str | None, resource: str | None) -> None:
    h.server.faults.fail_next(n, code=code, verb=verb, resource=resource)


async def _down_60s(h: Harness) -> None:
    h.transport.down = True
    await trio.sleep(60)
    h.transport.down = False


async def _drop_watches_repeatedly(h: Harness) -> None:
    for _ in range(5):
        h.server.faults.drop_watches()
        await trio.sleep(3)


async def _compact_then_drop(h: Harness) -> None:
    h.server.faults.compact()
    h.server.faults.drop_watches()


async def _watch_500(h: Harness) -> None:
    h.server.faults.fail_next(3, code=500, verb="watch")
    h.server.faults.drop_watches()


async def _slow(h: Harness) -> None:
    h.server.faults.add_latency(2.0)
    await trio.sleep(30)
    h.server.faults.clear()


CASES: list[Any] = [
    pytest.param(lambda h: _fail(h, 3, 500, "list", "capacityrequests"), id="500-on-list"),
    pytest.param(lambda h: _fail(h, 4, 500, None, "upcomingnodes"), id="500-on-upcomingnodes"),
    pytest.param(lambda h: _fail(h, 4, 500, "patch", "upcomingnodes/status"),
                 id="500-on-upcomingnode-status"),
    pytest.param(lambda h: _fail(h, 3, 429, "patch", "capacityrequests/status"),
                 id="429-retry-after-on-ack"),
    pytest.param(lambda h: _fail(h, 3, 429, "create", "upcomingnodes"), id="429-on-create"),
    pytest.param(lambda h: _fail(h, 3, 409, "patch", "capacityrequests/status"),
                 id="409-on-ack"),
    pytest.param(lambda h: _fail(h, 3, 409, "patch", "upcomingnodes/status"),
                 id="409-on-upcomingnode-status"),
    pytest.param(_watch_500, id="500-on-rewatch"),
    pytest.param(_slow, id="slow-responses-2s"),
    pytest.param(_drop_watches_repeatedly, id="dropped-watches"),
    pytest.param(_compact_then_drop, id="410-after-compaction"),
    pytest.param(_down_60s, id="apiserver-down-60s"),
]


@pytest.mark.parametrize("fault", CASES)
@pytest.mark.parametrize("when", ["at-start", "mid-run"])
async def test_apiserver_fault_ends_converged(
    fault: Fault, when: str, autojump_clock: trio.testing.MockClock,
) -> None:
    async with harness() as h:
        await h.client.create(CAPACITY_REQUESTS, cr("a", 100, {"cpu": "3"}), "default")
        await h.client.create(CAPACITY_REQUESTS, cr("b", 100, {"cpu": "3"}), "default")
        done = trio.Event()

        async def inject(h: Harness) -> None:
            await fault(h)
            done.set()

        async with trio.open_nursery() as run:
            if when == "at-start":
                run.start_soon(inject, h)
                await trio.sleep(0.01)
                await run.start(h.operator.run)
            else:
                await run.start(h.operator.run)
                await h.wait(lambda: h.shard.machines_by_state().get("CONFIGURED") == 2)
                run.start_soon(inject, h)
                await trio.sleep(0.01)
            # demand that arrives during the fault is not lost; the test's own client is the
            # operator's, so write it once the apiserver answers again
            with trio.fail_after(120):
                while True:
                    try:
                        await h.client.create(CAPACITY_REQUESTS, cr("c", 10, {"cpu": "1"}),
                                              "default")
                        break
                    except Exception:  # noqa: BLE001 - the injected fault itself
                        await trio.sleep(1)
            with trio.fail_after(120):
                await done.wait()
            reason = ""

            async def converged() -> bool:
                nonlocal reason
                try:
                    ok, reason = await _converged(h)
                except Exception as exc:  # noqa: BLE001 - still faulty: poll again
                    ok, reason = False, repr(exc)
                return ok

            try:
                await h.wait_async(converged, limit=240)
            except trio.TooSlowError:
                pytest.fail(f"not converged: {reason}")
            # the fault really happened: its task ended and every injected failure was consumed
            assert done.is_set()
            assert not h.server.faults._rules, "an injected failure was never hit"
            stats = h.operator.statistics()
            assert stats.running and stats.session_up
            assert all((await h.client.list(NODES)).items)
            assert len((await h.client.list(UPCOMING_NODES)).items) >= 2
            run.cancel_scope.cancel()


OUTAGE = 75.0
VERBS = ("get", "list", "create", "update", "patch", "delete", "deletecollection")


async def test_frames_during_a_75s_outage_converge_within_30s_on_the_same_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Every non-watch request of the operator answered 503 for 75 s while the shard's stream
    stays up: the machines for CRs a and b walk their lifecycle meanwhile (several
    NodeStateUpdates per machine) and the pool's hints change (AvailableCapacityUpdates). Within
    30 s after the outage every UpcomingNode is in its machine's latest state and every
    AvailableCapacity holds the count the shard last sent, on the session that was up all
    along (docs/rules.md#level-triggered-operator). Before, each frame's retry budget (about
    35 s) ran out inside the outage and the frame's effect was gone until a new session."""
    from bigfleet_trio.kube.resources import AVAILABLE_CAPACITIES
    from bigfleet_trio.operator.available import available_capacity_name

    async with harness() as h:
        await h.client.create(CAPACITY_REQUESTS, cr("a", 100, {"cpu": "3"}), "default")
        await h.client.create(CAPACITY_REQUESTS, cr("b", 100, {"cpu": "3"}), "default")
        async with trio.open_nursery() as run:
            await run.start(h.operator.run)
            await h.wait(lambda: h.operator.statistics().session_up)
            sessions = h.operator.statistics().sessions
            for verb in VERBS:  # the roll-up already went out: the shard now provisions
                h.server.faults.fail_next(10**9, code=503, verb=verb)
            frames_before = h.operator.statistics().frames_in
            await trio.sleep(OUTAGE)
            h.server.faults.clear()
            assert h.operator.statistics().frames_in > frames_before + 4  # frames came meanwhile
            engine = h.shard.engine
            reason = ""

            async def converged() -> bool:
                nonlocal reason
                want = {f"un-{m.machine_id}": "Ready" for m in engine.machines
                        if m.bound and m.state == pb.MachineState.CONFIGURED}
                got = {n: (u.get("status") or {}).get("phase")
                       for n, u in (await h.upcoming()).items()}
                if not want or got != want:
                    reason = f"UpcomingNodes {got} != shard {want}"
                    return False
                for shape in engine.catalog:
                    sent = engine._ac_sent.get(shape.key)
                    if sent is None:
                        continue
                    key = engine.available_update(shape, sent).supersedes_key
                    try:
                        obj = await h.client.get(AVAILABLE_CAPACITIES,
                                                 available_capacity_name(key))
                    except Exception as exc:  # noqa: BLE001 - not there yet
                        reason = f"AvailableCapacity for {shape.key}: {exc!r}"
                        return False
                    if obj["spec"]["availableCount"] != sent[0]:
                        reason = f"{shape.key}: {obj['spec']['availableCount']} != {sent[0]}"
                        return False
                return True

            try:
                await h.wait_async(converged, limit=30)
            except trio.TooSlowError:
                pytest.fail(f"not converged 30 s after the outage: {reason}")
            assert h.operator.statistics().sessions == sessions  # no new session needed
            run.cancel_scope.cancel()



async def test_an_upcoming_node_deleted_by_someone_else_comes_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An UpcomingNode of a live machine deleted by someone else is reconciled again from the
    machine's latest frame (as controller-runtime's ``Owns()``), without a new frame or session
    (docs/rules.md#level-triggered-operator)."""
    async with harness() as h:
        await h.client.create(CAPACITY_REQUESTS, cr("a", 100, {"cpu": "3"}), "default")
        async with trio.open_nursery() as run:
            await run.start(h.operator.run)

            async def ready() -> bool:
                uns = await h.upcoming()
                return bool(uns) and all(
                    (u.get("status") or {}).get("phase") == "Ready" for u in uns.values())

            await h.wait_async(ready, limit=120)
            name = sorted(await h.upcoming())[0]
            sessions = h.operator.statistics().sessions
            frames = h.operator.statistics().frames_in
            await h.client.delete(UPCOMING_NODES, name)
            await h.wait_async(ready, limit=30)
            assert name in await h.upcoming()
            stats = h.operator.statistics()
            assert stats.sessions == sessions
            assert stats.frames_in == frames  # no new frame brought it back
            run.cancel_scope.cancel()
