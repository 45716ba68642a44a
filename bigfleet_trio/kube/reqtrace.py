"""An opt-in trace of every apiserver request as the client saw it (docs/kube-api.md#request-trace).

``BIGFLEET_KUBE_REQUEST_TRACE=PATH`` makes every :class:`~.client.KubeClient` of the process
append one JSON line per request to ``PATH``: ``[start, end, method, path, name, status]``, wall
clock seconds (``time.time()``, so lines of several processes on one host line up), ``name`` the
object the request is about (the last path segment of an item path, ``metadata.name`` of a
create's body; "" otherwise) and ``status`` the HTTP status (0: no answer). The fleet bench uses it
to split an end-to-end latency into the apiserver's share and the agent's own.

``BIGFLEET_SHARD_FRAME_TRACE=PATH`` likewise makes the operator's shard session append one line
per NodeStateUpdate and ReclaimInstruction its receive pump hands on: ``[read, kind, key]``
(wall seconds; ``key`` the machine ID or instruction ID), so the bench can tell the time before
the operator had a frame from the time after.
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Mapping
from typing import IO, Any

import orjson

__all__ = ["ENV", "FRAME_ENV", "FrameTrace", "RequestTrace", "frames", "object_name", "trace"]

ENV = "BIGFLEET_KUBE_REQUEST_TRACE"
FRAME_ENV = "BIGFLEET_SHARD_FRAME_TRACE"

_COLLECTIONS_BEFORE_NAME = 2  # ".../<resource>/<name>"; subresources are one segment more


class RequestTrace:
    """Appends request lines to a file (buffered: a line costs a few microseconds, no syscall).

    Args:
        path: the file to append to (created if missing).
    """

    def __init__(self, path: str) -> None:
        self._file: IO[bytes] = open(path, "ab", buffering=1 << 16)  # noqa: SIM115 - process-long
        atexit.register(self.close)

    def record(self, start: float, method: str, path: str, name: str, status: int) -> None:
        """One finished (or failed: ``status`` 0) request that began at ``start`` (wall s)."""
        self._file.write(orjson.dumps([round(start, 6), round(time.time(), 6), method, path,
                                       name, status]) + b"\n")

    def close(self) -> None:
        """Flush and close (idempotent); registered with :mod:`atexit`."""
        if not self._file.closed:
            self._file.close()


class FrameTrace(RequestTrace):
    """Appends shard-frame lines to a file, as :class:`RequestTrace` does requests."""

    def read(self, kind: str, key: str) -> None:
        """One frame of ``kind`` (``key``: its machine or instruction ID) read just now."""
        self._file.write(orjson.dumps([round(time.time(), 6), kind, key]) + b"\n")


def object_name(method: str, path: str, body: Any) -> str:
    """The object a request is about: a create's ``metadata.name``, else the name segment of an
    item path (``/api/v1/nodes/n1`` and ``.../pods/p/eviction`` give ``n1`` and ``p``); "" for a
    collection."""
    if method == "POST" and isinstance(body, Mapping):
        meta = body.get("metadata")
        if isinstance(meta, Mapping) and isinstance(meta.get("name"), str):
            return str(meta["name"])
    parts = path.strip("/").split("/")
    # /api/v1/<res>/<name>, /apis/<g>/<v>/<res>/<name>, with namespaces/<ns>/ between
    start = 2 if parts[:1] == ["api"] else 3
    rest = parts[start:]
    if rest[:1] == ["namespaces"] and len(rest) > _COLLECTIONS_BEFORE_NAME:
        rest = rest[2:]
    return rest[1] if len(rest) >= _COLLECTIONS_BEFORE_NAME else ""


def _from_env() -> RequestTrace | None:
    path = os.environ.get(ENV)
    return RequestTrace(path) if path else None


trace: RequestTrace | None = _from_env()
"""The process's trace, or None (the default: nothing recorded)."""

frames: FrameTrace | None = FrameTrace(os.environ[FRAME_ENV]) if os.environ.get(FRAME_ENV) else None
"""The process's shard-frame trace, or None (the default)."""
