"""Leader election under faults: two operators, one Lease, one shard.

Timings worked out from the client-go rules in :mod:`bigfleet_trio.kube.leader` (lease 15 s,
renew deadline 10 s, retry 2 s; followers poll every 2-3 s and wake at the observed expiry):

* a leader that dies without releasing (process gone: its requests never reach the apiserver)
  is replaced once the follower has seen the record unchanged for 15 s, counted from when the
  follower *observed* the last renewal (up to one poll, 3 s, after the death when the leader
  renewed just before it); the follower wakes right at that expiry, then needs its own
  sync/connect (< 1 s) -> the follower holds the shard session 15 to 19 s after the death,
  within the 20 s takeover budget. The jitter is seeded per candidate, so CI replays one schedule;
* a leader cut off from the apiserver (but alive, and still connected to the shard) stops
  acting within retry + renew deadline (2 + 10 s after its last successful renewal) -- before
  the follower may take over (15 s after that renewal) -- so there is never a moment with two
  shard sessions.
"""

from __future__ import annotations

import random

import trio
import trio.testing

from bigfleet_trio.config import OperatorConfig
from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.leader import LeaderElector
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS
from bigfleet_trio.observability.events import EventFeed
from bigfleet_trio.operator.app import Operator
from tests.support.capacity import cr

from ._harness import Harness, SwitchableTransport, harness


class Candidate:
    def __init__(self, h: Harness, name: str, transport: SwitchableTransport,
                 client: KubeClient, op: Operator) -> None:
        self.name = name
        self.transport = transport
        self.client = client
        self.op = op
        self.elector = LeaderElector(client, name="bigfleet-operator", namespace="default",
                                     identity=name, rng=random.Random(name).random)
        self.scope = trio.CancelScope()

    def session_up(self) -> bool:
        return self.op.statistics().session_up

    async def run(self) -> None:
        with self.scope:
            await self.elector.run(self.op.run)


def _second(h: Harness, name: str) -> Candidate:
    transport = SwitchableTransport(h.server.app, h.nursery)
    client = KubeClient(KubeConfig(server="http://apiserver"), transport=transport)
    op = Operator(OperatorConfig(cluster_id="c1", shard_addr="shard:1", rollup_interval=1.0,
                                 reconnect_initial_backoff=0.5, reconnect_max_backoff=4.0),
                  client=client, connector=h.connector, feed=EventFeed())
    return Candidate(h, name, transport, client, op)


async def _watch_overlap(cands: list[Candidate], samples: list[int]) -> None:
    """Sample on the mock clock how many candidates hold a shard session (never 2)."""
    while True:
        samples.append(sum(c.session_up() for c in cands))
        await trio.sleep(0.01)


async def _setup(h: Harness) -> list[Candidate]:
    first = Candidate(h, "op-a", h.transport, h.client, h.operator)
    await h.client.create(CAPACITY_REQUESTS, cr("w", 100, {"cpu": "3"}), "default")
    return [first, _second(h, "op-b")]


async def test_leader_killed_without_release_follower_leads_within_20s(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with harness() as h:
        cands = await _setup(h)
        samples: list[int] = []
        async with trio.open_nursery() as run:
            run.start_soon(_watch_overlap, cands, samples)
            run.start_soon(cands[0].run)
            await h.wait(cands[0].session_up)
            run.start_soon(cands[1].run)
            await trio.sleep(30)  # the follower keeps campaigning, never leads
            assert cands[0].session_up() and not cands[1].session_up()
            assert cands[1].elector.leader == "op-a"
            # kill: the process vanishes -- no release reaches the apiserver
            cands[0].transport.down = True
            cands[0].scope.cancel()
            killed_at = trio.current_time()
            await h.wait(cands[1].session_up, limit=30)
            took = trio.current_time() - killed_at
            assert took <= 15.0 + 3.0 + 1.0 < 20.0, took
            assert took >= 15.0 - 0.1, took  # not before the lease expired (no early steal)
            assert cands[1].elector.is_leader
            await h.wait(lambda: h.shard.last_rollup is not None and h.shard.connected)
            run.cancel_scope.cancel()
        assert max(samples) == 1


async def test_partitioned_leader_steps_down_before_follower_takes_over(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with harness() as h:
        cands = await _setup(h)
        samples: list[int] = []
        transitions: list[tuple[float, str, bool]] = []

        async def trace() -> None:
            last = [False, False]
            while True:
                for i, c in enumerate(cands):
                    up = c.session_up()
                    if up != last[i]:
                        transitions.append((trio.current_time(), c.name, up))
                        last[i] = up
                await trio.sleep(0.01)

        async with trio.open_nursery() as run:
            run.start_soon(_watch_overlap, cands, samples)
            run.start_soon(trace)
            run.start_soon(cands[0].run)
            await h.wait(cands[0].session_up)
            run.start_soon(cands[1].run)
            await trio.sleep(10)
            cut_at = trio.current_time()
            cands[0].transport.down = True  # partition from the apiserver only
            await h.wait(cands[1].session_up, limit=40)
            await trio.sleep(0.05)  # let the tracer sample the new state
            down = [t for t, n, up in transitions if n == "op-a" and not up]
            up_b = [t for t, n, up in transitions if n == "op-b" and up]
            assert down and up_b
            # the loss is declared once the renewals that began after the last success have
            # failed for the renew deadline: at most retry (2 s) + renew deadline (10 s) after
            # the cut, hence before the 15 s the follower must wait
            assert down[-1] - cut_at <= 2.0 + 10.0 + 0.1
            assert up_b[0] > down[-1]  # handover, never overlap
            # the partition heals: the old leader stays a follower
            cands[0].transport.down = False
            await trio.sleep(30)
            assert cands[1].session_up() and not cands[0].session_up()
            assert cands[0].elector.leader == "op-b"
            run.cancel_scope.cancel()
        assert max(samples) == 1
