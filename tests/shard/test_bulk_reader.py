"""The agent's bulk downlink reader: gRPC messages split correctly whatever the chunking.

Real loopback gRPC (no autojump clock), bounded by a generous ``fail_after``; plus the fallback
path for a grpclib stream without the buffer the reader expects.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import pytest
import trio

from bigfleet_trio.proto import pb
from bigfleet_trio.shard.bridge import open_loop
from bigfleet_trio.shard.downlink import _BulkReader
from bigfleet_trio.shard.grpc import GrpcConnector
from bigfleet_trio.shard.server import serve_shard
from bigfleet_trio.shard.transport import ShardStream, StreamClosed

DEADLINE = 30.0


async def test_large_and_small_messages_across_data_frames_arrive_whole_and_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 1 MiB of labels spans many 16 KiB HTTP/2 DATA frames; small ones share frames.
    big = pb.ShardMessage(node_state_update=pb.NodeStateUpdate(
        machine_id="big", labels={f"k{i}": "v" * 1000 for i in range(1000)}))
    frames = [pb.ShardMessage(ack=pb.Acknowledgement(echo=str(i))) for i in range(50)]
    frames[25:25] = [big]
    frames.append(pb.ShardMessage(ack=pb.Acknowledgement(echo="")))  # an empty-body message

    async def shard(end: ShardStream) -> None:
        await end.receive()
        for f in frames:
            await end.send(f)

    readers: list[_BulkReader] = []
    init = _BulkReader.__init__

    def record(self: _BulkReader, *args: Any) -> None:
        init(self, *args)
        readers.append(self)

    monkeypatch.setattr(_BulkReader, "__init__", record)
    got = []
    with trio.fail_after(DEADLINE):
        async with open_loop(), trio.open_nursery() as n:
            port = await n.start(partial(serve_shard, shard, port=0))
            async with GrpcConnector("127.0.0.1", port).connect() as s:
                await s.send(pb.OperatorMessage(hello=pb.Hello(cluster_id="c1")))
                try:
                    while True:
                        got.append(await s.receive())
                except StreamClosed as exc:
                    assert exc.reason == "peer closed"
            n.cancel_scope.cancel()
    assert got == frames
    # the bulk path ran, not the fallback: grpclib's buffer is still what the reader expects
    assert [r._buf is not None for r in readers] == [True]


def test_falls_back_to_recv_message_without_grpclibs_buffer() -> None:
    class Plain:
        def __init__(self) -> None:
            self.items: list[bytes | None] = [b"\x0a\x00", None]

        async def recv_message(self) -> bytes | None:
            return self.items.pop(0)

    async def main() -> list[Any]:
        reader = _BulkReader(Plain(), 1024)
        return [await reader.next(), await reader.next()]

    assert asyncio.run(main()) == [b"\x0a\x00", None]
