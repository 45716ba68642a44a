"""WatchStream: events from a watch body however the server's chunks cut its lines."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator

import httpx
import pytest
import trio
import trio.testing

from bigfleet_trio.kube.errors import KubeTransportError, WatchInactivityTimeout
from bigfleet_trio.kube.watchstream import WatchStream


class _Body(httpx.AsyncByteStream):
    """Chunks from a channel; an exception in the channel is raised by the body."""

    def __init__(self, recv: trio.MemoryReceiveChannel[bytes | Exception]):
        self._recv = recv

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for item in self._recv:
            if isinstance(item, Exception):
                raise item
            yield item


def _stream(*chunks: bytes | Exception, timeout: float | None = 90.0,
            headers: dict[str, str] | None = None,
            ) -> tuple[WatchStream, trio.MemorySendChannel[bytes | Exception]]:
    send, recv = trio.open_memory_channel[bytes | Exception](1000)
    for chunk in chunks:
        send.send_nowait(chunk)
    return WatchStream(httpx.Response(200, headers=headers, stream=_Body(recv)), timeout), send


def _line(name: str, etype: str = "ADDED") -> bytes:
    return b'{"type":"%s","object":{"metadata":{"name":"%s"}}}\n' % (etype.encode(), name.encode())


async def _names(stream: WatchStream) -> list[tuple[str, str]]:
    return [(e.type, e.object["metadata"]["name"]) async for e in stream]


async def test_lines_cut_anywhere_by_chunks_give_the_same_events() -> None:
    body = _line("a") + b"\n" + _line("b", "MODIFIED") + b"  \r\n" + _line("c", "DELETED")
    want = [("ADDED", "a"), ("MODIFIED", "b"), ("DELETED", "c")]
    for size in (1, 2, 7, 30, len(body)):
        stream, send = _stream(*(body[i:i + size] for i in range(0, len(body), size)))
        send.close()
        assert await _names(stream) == want, size


async def test_a_last_line_without_newline_counts_at_the_end_of_the_body() -> None:
    stream, send = _stream(_line("a") + _line("b").rstrip(b"\n"))
    send.close()
    assert await _names(stream) == [("ADDED", "a"), ("ADDED", "b")]


async def test_a_gzip_body_is_decoded() -> None:
    stream, send = _stream(gzip.compress(_line("a") + _line("b")),
                           headers={"Content-Encoding": "gzip"})
    send.close()
    assert await _names(stream) == [("ADDED", "a"), ("ADDED", "b")]


@pytest.mark.parametrize("bad", [b"\xff\xfe\n", b"{not json\n", b'{"type":"WHAT","object":{}}\n'])
async def test_an_undecodable_line_ends_the_stream_with_a_transport_error(bad: bytes) -> None:
    stream, send = _stream(_line("a") + bad + _line("b"))
    send.close()
    assert (await stream.__anext__()).object["metadata"]["name"] == "a"
    with pytest.raises(KubeTransportError):
        await stream.__anext__()
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()


async def test_a_broken_body_is_a_transport_error_after_the_lines_before_it() -> None:
    stream, send = _stream(_line("a") + b'{"type":"ADD', httpx.ReadError("reset"))
    assert (await stream.__anext__()).object["metadata"]["name"] == "a"
    with pytest.raises(KubeTransportError, match="watch stream broke"):
        await stream.__anext__()


async def test_no_complete_line_within_the_timeout_is_inactivity(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The timeout is per line: bytes that never finish a line do not keep the stream alive."""
    stream, send = _stream(_line("a"), timeout=90.0)

    async def dribble() -> None:
        for _ in range(10):
            await trio.sleep(30)
            await send.send(b" ")

    async with trio.open_nursery() as nursery:
        assert (await stream.__anext__()).object["metadata"]["name"] == "a"
        nursery.start_soon(dribble)
        t0 = trio.current_time()
        with pytest.raises(WatchInactivityTimeout):
            await stream.__anext__()
        assert trio.current_time() - t0 == pytest.approx(90.0)
        nursery.cancel_scope.cancel()
