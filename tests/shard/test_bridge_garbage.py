"""The Trio <-> asyncio bridge leaves no reference cycle behind a frame it hands over."""

from __future__ import annotations

import gc
import weakref

import trio
import trio.testing
import trio_asyncio  # type: ignore[import-untyped]

from bigfleet_trio.shard.bridge import aio_get, aio_put, open_loop


class Frame:
    """Stands for a frame handed over (weak-referenceable)."""


async def test_a_frame_handed_over_through_a_wait_is_freed_without_the_collector() -> None:
    """The asyncio side waits on an empty channel (or a full one) through a Trio call; once the
    frame is through and let go of, nothing keeps it: the binaries freeze the heap, and a wait
    alive at a freeze that needed the cyclic collector kept the next frame for good
    (docs/kube-api.md#garbage-collector)."""
    out_send, out_recv = trio.open_memory_channel[Frame](0)
    got: list[weakref.ref[Frame]] = []
    put: list[weakref.ref[Frame]] = []

    async def aio_side() -> None:
        frame = await aio_get(out_recv)  # empty: waits through a Trio call
        got.append(weakref.ref(frame))
        del frame
        sent = Frame()
        put.append(weakref.ref(sent))
        await aio_put(in_send, sent)  # nobody receiving yet: waits through a Trio call
        del sent

    in_send, in_recv = trio.open_memory_channel[Frame](0)
    gc.collect()
    gc.disable()
    try:
        with trio.fail_after(10):
            async with open_loop(), trio.open_nursery() as nursery:
                nursery.start_soon(trio_asyncio.aio_as_trio(aio_side))
                await trio.testing.wait_all_tasks_blocked()
                await out_send.send(Frame())
                await trio.testing.wait_all_tasks_blocked()
                received = await in_recv.receive()
                del received
                await trio.testing.wait_all_tasks_blocked()
        assert len(got) == 1 and len(put) == 1
        assert got[0]() is None
        assert put[0]() is None
    finally:
        gc.enable()
