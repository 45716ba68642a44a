"""A scripted shard process for tests/faults/test_drain_resume_process.py.

``python tests/faults/_reclaim_shard.py PORT MACHINE GRACE``: serves ``Shard.Session`` over
gRPC on 127.0.0.1:PORT. Like the real shard it sends one ReclaimInstruction (``r-1`` for MACHINE,
GRACE seconds) and re-issues it on a later session only while its ack has not arrived; nothing
else. Prints ``listening PORT``, ``session <cluster>``, ``sent r-1`` and ``ack r-1 <nodes_started>``
lines (flushed) for the test to read.
"""

from __future__ import annotations

import sys
from functools import partial

import betterproto
import trio

from bigfleet_trio.proto import pb
from bigfleet_trio.shard.server import serve_shard
from bigfleet_trio.shard.transport import ShardStream, StreamClosed


def say(line: str) -> None:
    print(line, flush=True)


async def main(port: int, machine: str, grace: int) -> None:
    acked = False

    async def session(stream: ShardStream) -> None:
        nonlocal acked
        try:
            hello = await stream.receive()
            say(f"session {hello.hello.cluster_id}")
            if not acked:
                await stream.send(pb.ShardMessage(reclaim_instruction=pb.ReclaimInstruction(
                    instruction_id="r-1", nodes=[machine], grace_period_seconds=grace,
                    preemptor_priority=100)))
                say("sent r-1")
            while True:
                msg = await stream.receive()
                kind, body = betterproto.which_one_of(msg, "payload")
                if kind == "reclaim_ack":
                    acked = True
                    say(f"ack {body.instruction_id} {body.nodes_started}")
        except StreamClosed:
            say("session ended")

    async with trio.open_nursery() as nursery:
        bound = await nursery.start(partial(serve_shard, session, host="127.0.0.1", port=port))
        say(f"listening {bound}")


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
