"""A TCP proxy a test controls, for network faults between real processes (tests/realkube):
put it between a binary and kube-apiserver (or the shard) and partition the link.

    proxy = TcpProxy("127.0.0.1", apiserver_port)
    port = await nursery.start(proxy.run)      # point the binary at 127.0.0.1:port
    proxy.blackhole()                           # nothing passes either way; nothing is closed
    proxy.heal()                                # what was held back now flows, in order

A blackhole here is a partition that heals, as TCP sees one: a side's bytes are not read while
it lasts (its kernel buffers fill, its writes then block), new connections are accepted but not
connected onwards, and nothing is lost or closed; the peers see silence, then the data late.
"""

from __future__ import annotations

import trio

__all__ = ["TcpProxy"]


class TcpProxy:
    """Forwards every connection accepted on a loopback port to ``host:port``.

    Attributes:
        connections: connections accepted so far.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._open = trio.Event()
        self._open.set()
        self.connections = 0
        self._scopes: set[trio.CancelScope] = set()

    @property
    def blackholed(self) -> bool:
        return not self._open.is_set()

    def blackhole(self) -> None:
        """Stop moving bytes and connecting onwards, until :meth:`heal`."""
        if not self.blackholed:
            self._open = trio.Event()

    def heal(self) -> None:
        self._open.set()

    def reset(self) -> None:
        """Close every connection now (a peer sees a reset/EOF); new ones are served."""
        for scope in list(self._scopes):
            scope.cancel()

    async def _gate(self) -> None:
        while not self._open.is_set():
            await self._open.wait()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started(port)`` with the bound port."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        self.connections += 1
        with trio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                await self._gate()
                upstream = await trio.open_tcp_stream(self.host, self.port)
                async with client, upstream, trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, client, upstream, nursery.cancel_scope)
                    nursery.start_soon(self._pump, upstream, client, nursery.cancel_scope)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                self._scopes.discard(scope)

    async def _pump(self, src: trio.SocketStream, dst: trio.SocketStream,
                    both: trio.CancelScope) -> None:
        try:
            while True:
                await self._gate()
                data = await src.receive_some(65536)
                if not data:
                    break
                await self._gate()
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        both.cancel()
