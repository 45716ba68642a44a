"""A free loopback TCP port for a server a test starts in another process."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (the OS picks it; another process may
    still take it before the test's server binds, which the OS makes unlikely)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
