"""``python -m scripts.bench stream``: NodeStateUpdate frames/s through the operator session.

The shard runs in a subprocess (a plain asyncio grpclib server streaming pre-encoded
NodeStateUpdate frames as fast as HTTP/2 allows) so its CPU does not compete with the client
being measured. Measured: the real Agent (GrpcConnector + Session, no-op handlers). Baseline
(same run): a bare grpclib client on the same connector that parses every frame with upb.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from typing import Any

from scripts.bench import _common as C

# ---------------------------------------------------------------------------------------------
# stream: the shard side (runs in a subprocess)
# ---------------------------------------------------------------------------------------------


def _frames(machines: int, payload: str) -> list[bytes]:
    from bigfleet_trio.proto import pb

    out = []
    for i in range(machines):
        if payload == "lean":  # cheap to decode: isolates transport + session overhead
            lean = pb.NodeStateUpdate(machine_id=f"m-{i:05d}", state=pb.MachineState.CONFIGURED)
            out.append(bytes(pb.ShardMessage(node_state_update=lean)))
            continue
        msg = pb.ShardMessage(
            node_state_update=pb.NodeStateUpdate(
                supersedes_key=f"machine/m-{i:05d}",
                machine_id=f"m-{i:05d}",
                cluster_id="bench",
                state=pb.MachineState.CONFIGURED,
                node_name=f"node-{i:05d}",
                provider_id=f"sim://bench/m-{i:05d}",
                labels={
                    "topology.kubernetes.io/zone": "z1",
                    "node.kubernetes.io/instance-type": "m5",
                },
                resources=pb.Resources(resources={"cpu": "4", "memory": "16Gi", "pods": "110"}),
            )
        )
        out.append(bytes(msg))
    return out


def _serve_stream(frames: int, machines: int, payload: str) -> None:
    """Plain asyncio grpclib server: on each session, after Hello, stream ``frames`` frames."""
    import grpclib.const
    import grpclib.server
    from grpclib.encoding.base import CodecBase

    from bigfleet_trio.shard.grpc import SESSION_METHOD

    payloads = _frames(machines, payload)

    class RawCodec(CodecBase):
        __content_subtype__ = "proto"

        def encode(self, message: Any, message_type: Any) -> bytes:
            return message if isinstance(message, bytes) else bytes(message)

        def decode(self, data: bytes, message_type: Any) -> Any:
            return data

    class Service:
        async def session(self, stream: Any) -> None:
            await stream.recv_message()  # Hello
            n = len(payloads)
            for i in range(frames):
                await stream.send_message(payloads[i % n])
            while await stream.recv_message() is not None:  # until the client goes away
                pass

        def __mapping__(self) -> dict[str, Any]:
            return {
                SESSION_METHOD: grpclib.const.Handler(
                    self.session, grpclib.const.Cardinality.STREAM_STREAM, bytes, bytes
                )
            }

    async def main() -> None:
        server = grpclib.server.Server([Service()], codec=RawCodec())
        await server.start("127.0.0.1", 0)
        port = server._server.sockets[0].getsockname()[1]  # noqa: SLF001 - bench only
        print(port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until EOF
        server.close()

    asyncio.run(main())


# ---------------------------------------------------------------------------------------------
# stream: the two clients
# ---------------------------------------------------------------------------------------------


async def _raw_client(port: int, frames: int) -> tuple[float, float]:
    """Seconds for a bare grpclib client (asyncio side of trio-asyncio, the same connector
    set-up) to receive ``frames`` and decode each with protobuf's upb classes: the stack's
    ceiling for this transport."""
    import trio_asyncio
    from grpclib.client import Channel
    from grpclib.const import Cardinality

    from bigfleet_trio.proto import pb
    from bigfleet_trio.shard.codec import upb_class
    from bigfleet_trio.shard.grpc import SESSION_METHOD, OperatorCodec

    upb_shard_message = upb_class("ShardMessage")

    async def call() -> tuple[float, float]:
        channel = Channel("127.0.0.1", port, codec=OperatorCodec())  # raw bytes downlink
        try:
            async with channel.request(
                SESSION_METHOD, Cardinality.STREAM_STREAM, pb.OperatorMessage, pb.ShardMessage
            ) as stream:
                await stream.send_request()
                t0, c0 = time.perf_counter(), time.process_time()
                await stream.send_message(pb.OperatorMessage(hello=pb.Hello(cluster_id="bench")))
                for _ in range(frames):
                    upb_shard_message.FromString(await stream.recv_message())
                elapsed = time.perf_counter() - t0, time.process_time() - c0
                await stream.cancel()
                return elapsed
        finally:
            channel.close()

    wall, cpu = await trio_asyncio.aio_as_trio(call)()
    return float(wall), float(cpu)


async def _session_client(port: int, frames: int) -> tuple[float, float, dict[str, int]]:
    """Seconds for the Agent (GrpcConnector + Session, no-op handlers) to process ``frames``."""
    import trio

    from bigfleet_trio.operator.agent import Agent, AgentConfig
    from bigfleet_trio.operator.session.types import SessionConfig
    from bigfleet_trio.proto import pb
    from bigfleet_trio.shard.grpc import GrpcConnector

    done = trio.Event()
    t0 = c0 = 0.0
    calls = 0
    agent: Agent

    class Source:
        async def build(self) -> pb.ClusterCapacityNeeds:
            # The first roll-up is built right after Hello: start the clock there, as the raw
            # client does (connection set-up is excluded from both).
            nonlocal t0, c0
            if not t0:
                t0, c0 = time.perf_counter(), time.process_time()
            return pb.ClusterCapacityNeeds()

        async def after_enqueue(self) -> None:
            pass

    class Handlers:
        async def on_bootstrap_request(self, req: Any) -> Any:
            return pb.BootstrapBlobResponse()

        async def on_reclaim_instruction(self, instr: Any, reply: Any) -> None:
            pass

        async def on_available_capacity(self, u: Any) -> None:
            pass

        async def on_node_state_update(self, u: Any) -> None:
            nonlocal calls
            calls += 1
            if calls + agent.stats.node_states_coalesced >= frames:
                done.set()

    cfg = AgentConfig(session=SessionConfig(cluster_id="bench", rollup_interval=3600))
    agent = Agent(GrpcConnector("127.0.0.1", port), Source(), Handlers(), cfg)
    async with trio.open_nursery() as n:
        n.start_soon(agent.run)
        await done.wait()
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        n.cancel_scope.cancel()
    stats = {
        "frames_in": agent.stats.frames_in,
        "handler_calls": calls,
        "coalesced": agent.stats.node_states_coalesced,
    }
    return elapsed, cpu, stats


def _measure(args: argparse.Namespace, frames: int, rounds: int, payload: str) -> dict[str, Any]:
    import trio
    import trio_asyncio

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scripts.bench",
            "_stream-server",
            "--frames",
            str(frames),
            "--machines",
            str(args.machines),
            "--payload",
            payload,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=C.ROOT,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        raw_times: list[float] = []
        session_times: list[float] = []
        raw_cpu: list[float] = []
        session_cpu: list[float] = []
        stats: dict[str, int] = {}

        async def main() -> None:
            nonlocal stats
            async with trio_asyncio.open_loop():
                await _raw_client(port, min(frames, 500))  # warm-up
                for _ in range(rounds):
                    wall, cpu = await _raw_client(port, frames)
                    raw_times.append(wall)
                    raw_cpu.append(cpu)
                    wall, cpu, stats = await _session_client(port, frames)
                    session_times.append(wall)
                    session_cpu.append(cpu)

        trio.run(main)
    finally:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=10)
    return {
        "frames": frames,
        "raw_rates": [frames / t for t in raw_times],
        "session_rates": [frames / t for t in session_times],
        # frames per client CPU-second: robust when the machine is shared or noisy
        "raw_cpu_rates": [frames / t for t in raw_cpu],
        "session_cpu_rates": [frames / t for t in session_cpu],
        "session_stats_last_round": stats,
    }


def _run_stream(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 1 if args.quick else args.rounds
    payloads = ["lean", "full"] if args.payload == "both" else [args.payload]
    figs: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    for payload in payloads:
        default = {"lean": 50_000, "full": 30_000}[payload]
        frames = args.frames or (default // 10 if args.quick else default)
        m = _measure(args, frames, rounds, payload)
        figs.append(
            C.figure(
                f"session frames/s ({payload} NodeStateUpdate)",
                "frames/s",
                m["session_rates"],
                baseline=m["raw_rates"],
                baseline_label="raw grpclib client + upb decode (same shard subprocess)",
                target=">= 10,000 frames/s and >= 0.25 (ratio)",
                met=lambda med, r: r is not None and r >= 0.25 and med >= 10_000,
            )
        )
        figs.append(
            C.figure(
                f"session frames per client CPU-s ({payload})",
                "frames/cpu-s",
                m["session_cpu_rates"],
                baseline=m["raw_cpu_rates"],
            )
        )
        extra[payload] = {"frames": frames, "last_round": m["session_stats_last_round"]}
    return C.result(
        "stream",
        {"machines": args.machines, "rounds": rounds, "payloads": payloads},
        figs,
        ["the session decodes every frame with upb and converts it to betterproto "
         "(bigfleet_trio.shard.codec); the raw client only parses with upb; the shard runs "
         "in a subprocess"],
        extra,
    )


def register(sub: Any) -> None:
    common = sub.common
    p = sub.add_parser("stream", parents=[common], help="session vs raw grpclib receive rate")
    p.add_argument("--frames", type=int, default=0, help="frames per measurement")
    p.add_argument("--machines", type=int, default=1000, help="distinct machine ids cycled")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds; best of each")
    p.add_argument(
        "--payload",
        choices=["lean", "full", "both"],
        default="both",
        help="lean: machine_id+state only (transport/session overhead); full: labels, "
        "resources, names (betterproto decode dominates)",
    )
    p.set_defaults(func=_run_stream)
    hidden = sub.add_parser("_stream-server")
    hidden.add_argument("--frames", type=int, required=True)
    hidden.add_argument("--machines", type=int, required=True)
    hidden.add_argument("--payload", default="full")
    hidden.set_defaults(
        func=lambda a: _serve_stream(a.frames, a.machines, a.payload), internal=True
    )
