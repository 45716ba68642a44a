"""The session logs each shard Acknowledgement (echo, term, epoch) and otherwise ignores it.

Acknowledgement = 1 echo, 2 coordinator_term (int64), 3 shard_epoch (int64); it is informational,
logged and never acted on (docs/wire.md#shardsession-and-its-messages). The session logs the
hello ack at INFO (once per session) and the per-roll-up acks at DEBUG, one line each:
``shard ack echo=<echo> term=<term> epoch=<epoch> cluster=<cluster_id>``.
"""

from __future__ import annotations

import logging
from typing import Any

import betterproto
import pytest
import trio
import trio.testing

from bigfleet_trio.operator.session.core import Session
from bigfleet_trio.operator.session.types import Reply, SessionConfig
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.transport import memory_stream_pair

LOGGER = "bigfleet_trio.operator.session"


class Source:
    def __init__(self) -> None:
        self.built = 0

    async def build(self) -> pb.ClusterCapacityNeeds:
        self.built += 1
        return pb.ClusterCapacityNeeds(timestamp_unix_nanos=self.built)

    async def after_enqueue(self) -> None:
        pass


class Handlers:
    """Any call here would mean the session acted on an Ack: fail loudly."""

    async def on_bootstrap_request(self, req: pb.BootstrapRequest) -> pb.BootstrapBlobResponse:
        raise AssertionError("unexpected bootstrap request")

    async def on_reclaim_instruction(self, instr: pb.ReclaimInstruction, reply: Reply) -> None:
        raise AssertionError("unexpected reclaim instruction")

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> None:
        raise AssertionError("unexpected node state")

    async def on_available_capacity(self, u: pb.AvailableCapacityUpdate) -> None:
        raise AssertionError("unexpected available capacity")


def _ack_records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name.startswith(LOGGER) and r.getMessage().startswith("shard ack")
    ]


async def test_acks_are_logged_with_echo_term_epoch_and_cluster(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    op, shard = memory_stream_pair()
    session = Session(
        op, SessionConfig(cluster_id="c1", rollup_interval=10.0), Source(), Handlers()
    )
    async with trio.open_nursery() as n:
        n.start_soon(session.run)
        kind, _ = betterproto.which_one_of(await shard.receive(), "payload")
        assert kind == "hello"
        await shard.send(
            pb.ShardMessage(ack=pb.Acknowledgement(echo="hello", coordinator_term=7, shard_epoch=3))
        )
        kind, _ = betterproto.which_one_of(await shard.receive(), "payload")
        assert kind == "rollup"
        await shard.send(
            pb.ShardMessage(
                ack=pb.Acknowledgement(
                    echo="rollup", coordinator_term=8, shard_epoch=1_099_511_627_776
                )
            )
        )
        await shard.send(pb.ShardMessage(ack=pb.Acknowledgement()))  # all fields at defaults
        await trio.testing.wait_all_tasks_blocked()
        assert _ack_records(caplog) == [
            (logging.INFO, "shard ack echo=hello term=7 epoch=3 cluster=c1"),
            (logging.DEBUG, "shard ack echo=rollup term=8 epoch=1099511627776 cluster=c1"),
            (logging.DEBUG, "shard ack echo= term=0 epoch=0 cluster=c1"),
        ]
        # Informational only: the session goes on and the next roll-up comes at t=10.
        t0 = trio.current_time()
        msg = await shard.receive()
        assert betterproto.which_one_of(msg, "payload")[0] == "rollup"
        assert msg.rollup.timestamp_unix_nanos == 2
        assert trio.current_time() - t0 == 10.0
        n.cancel_scope.cancel()


async def test_only_the_hello_ack_is_visible_at_info(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    op, shard = memory_stream_pair()
    session = Session(op, SessionConfig(cluster_id="east-1"), Source(), Handlers())
    async with trio.open_nursery() as n:
        n.start_soon(session.run)
        await shard.receive()  # hello
        for echo in ("rollup", "hello", "rollup"):
            await shard.send(
                pb.ShardMessage(
                    ack=pb.Acknowledgement(echo=echo, coordinator_term=2, shard_epoch=5)
                )
            )
        await trio.testing.wait_all_tasks_blocked()
        assert _ack_records(caplog) == [
            (logging.INFO, "shard ack echo=hello term=2 epoch=5 cluster=east-1"),
        ]
        n.cancel_scope.cancel()
