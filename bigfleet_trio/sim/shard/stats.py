"""Shard-side timestamps of the simulated shard, for benchmarks: when each NodeStateUpdate,
BootstrapRequest and ReclaimInstruction was sent, when responses, acks and roll-ups arrived
(wall clock, ``time.time()``, so another process on the machine can line them up with its own
observations), served as JSON by ``sim shard --stats-addr HOST:PORT`` (``GET /stats``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import betterproto
import orjson
import trio

from bigfleet_trio.proto import pb

log = logging.getLogger(__name__)

__all__ = ["ShardStats", "serve_stats"]

_MAX = 500_000


def _milli(text: str) -> int:
    from ._quantity import parse_resources

    try:
        return int(parse_resources({"x": text})["x"] * 1000)
    except (ValueError, KeyError):
        return 0


class ShardStats:
    """Bounded logs of shard-side events (see the module docstring).

    Attributes:
        nsu: ``[wall, machine_id, state_name]`` per NodeStateUpdate sent.
        bootstrap: ``[request_id, sent_wall, answered_wall | None, error]`` per BootstrapRequest
            (a re-sent request keeps its first send time).
        reclaim: ``[instruction_id, node, issued_wall, acked_wall | None, sends]`` (``issued``
            is the first send; ``sends`` counts re-sends of the unacknowledged instruction too).
        rollups: ``[wall, needs, cpu_milli, memory_milli, bytes]`` per roll-up received, the
            totals summed over every need's ``aggregate_resources``.
        machine_of_node: Node name -> machine id, from the NodeStateUpdates that name a Node
            (a reclaim names Nodes; the machine's UpcomingNode is ``un-<machine id>``).
    """

    def __init__(self) -> None:
        self.nsu: deque[list[Any]] = deque(maxlen=_MAX)
        self.bootstrap: dict[str, list[Any]] = {}
        self.reclaim: dict[str, list[Any]] = {}
        self.rollups: deque[list[Any]] = deque(maxlen=_MAX)
        self.machine_of_node: dict[str, str] = {}
        self.sessions = 0

    def sent(self, frame: pb.ShardMessage) -> None:
        """Record a frame the shard just sent."""
        now = time.time()
        kind, val_ = betterproto.which_one_of(frame, "payload")
        val: Any = val_
        if kind == "node_state_update":
            self.nsu.append([now, val.machine_id, pb.MachineState(val.state).name])
            if val.node_name:
                self.machine_of_node[val.node_name] = val.machine_id
        elif kind == "bootstrap_request":
            self.bootstrap.setdefault(val.request_id, [val.request_id, now, None, ""])
        elif kind == "reclaim_instruction":
            rec = self.reclaim.get(val.instruction_id)
            if rec is None:
                self.reclaim[val.instruction_id] = [val.instruction_id, ",".join(val.nodes),
                                                    now, None, 1]
            else:
                rec[4] += 1  # re-sent unacknowledged (timeout or reconnect)

    def received(self, msg: Any) -> None:
        """Record a frame the shard just received."""
        now = time.time()
        val: Any
        try:
            kind, val = betterproto.which_one_of(msg, "payload")
        except Exception:  # noqa: BLE001 - the session logs bad frames
            return
        if kind == "bootstrap_response":
            rec = self.bootstrap.get(val.request_id)
            if rec is not None and rec[2] is None:
                rec[2] = now
                rec[3] = val.error
        elif kind == "reclaim_ack":
            rec = self.reclaim.get(val.instruction_id)
            if rec is not None and rec[3] is None:
                rec[3] = now
        elif kind == "rollup":
            cpu = mem = 0
            for need in val.needs:
                cpu += _milli(need.aggregate_resources.get("cpu", "0"))
                mem += _milli(need.aggregate_resources.get("memory", "0"))
            self.rollups.append([now, len(val.needs), cpu, mem, len(bytes(val))])
        if len(self.bootstrap) > _MAX:
            for key in list(self.bootstrap)[: _MAX // 10]:
                del self.bootstrap[key]
        if len(self.reclaim) > _MAX:
            for key in list(self.reclaim)[: _MAX // 10]:
                del self.reclaim[key]

    def to_dict(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """JSON-ready view (``extra`` merged in, e.g. the shard's snapshot)."""
        return {
            "nsu": list(self.nsu),
            "bootstrap": list(self.bootstrap.values()),
            "reclaim": list(self.reclaim.values()),
            "rollups": list(self.rollups),
            "machine_of_node": dict(self.machine_of_node),
            **(extra or {}),
        }


async def serve_stats(
    render: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``GET /stats`` (``render()`` -> dict, as JSON) over plain HTTP/1.0 until cancelled;
    ``started`` with the bound port. Anything else answers 404."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]

    async def handle(stream: trio.SocketStream) -> None:
        try:
            buf = b""
            with trio.move_on_after(10):
                while b"\r\n\r\n" not in buf and len(buf) < 65536:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        break
                    buf += chunk
            line = buf.split(b"\r\n", 1)[0].decode("latin-1")
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "GET" and parts[1].split("?")[0] == "/stats":
                # orjson: at 5,000 machines the logs are 10^5 rows, and the encoding runs on
                # the shard's event loop, between its session's frames
                body = orjson.dumps(render(), option=orjson.OPT_NON_STR_KEYS)
                head = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n"
            else:
                body = b'{"error": "not found"}'
                head = b"HTTP/1.0 404 Not Found\r\nContent-Type: application/json\r\n"
            await stream.send_all(head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await stream.aclose()

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, listeners)
        log.info("sim shard stats at http://%s:%d/stats", host, bound)
        task_status.started(bound)
