"""grpclib transport over loopback (real sockets, real time bounded by trio.fail_after).

The agent dials, the shard never does (docs/wire.md#shardsession-and-its-messages); grpclib is
asyncio-only, so it runs through trio-asyncio. These tests cannot use the autojump clock (real
I/O), so each is wrapped in a generous ``fail_after`` and finishes in well under 1 s.
"""

from __future__ import annotations

import random
from functools import partial
from typing import Any

import betterproto
import pytest
import trio
import trio_asyncio
import trustme
from grpclib.exceptions import GRPCError

from bigfleet_trio.operator.agent import Agent, AgentConfig
from bigfleet_trio.operator.session.types import Reply, SessionConfig
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.bridge import open_loop
from bigfleet_trio.shard.grpc import (
    GrpcConnector,
    LimitedProtoCodec,
    MessageTooLarge,
    parse_address,
)
from bigfleet_trio.shard.server import serve_shard
from bigfleet_trio.shard.tls import TLSConfigError, TLSFiles, server_ssl_context
from bigfleet_trio.shard.transport import ShardStream, StreamClosed

DEADLINE = 10.0


def payload(msg: Any) -> tuple[str, Any]:
    return betterproto.which_one_of(msg, "payload")


class Source:
    async def build(self) -> pb.ClusterCapacityNeeds:
        return pb.ClusterCapacityNeeds(
            needs=[pb.CapacityNeed(aggregate_resources={"cpu": "2"}, group="g")]
        )

    async def after_enqueue(self) -> None:
        pass


class Handlers:
    def __init__(self) -> None:
        self.node_states: list[pb.NodeStateUpdate] = []
        self.got_node_state = trio.Event()

    async def on_bootstrap_request(self, req: pb.BootstrapRequest) -> pb.BootstrapBlobResponse:
        return pb.BootstrapBlobResponse(user_data=b"#cloud-config", ttl_seconds=600)

    async def on_reclaim_instruction(self, instr: pb.ReclaimInstruction, reply: Reply) -> None:
        reply(pb.OperatorMessage(reclaim_ack=pb.ReclaimAck(instruction_id=instr.instruction_id)))

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> None:
        self.node_states.append(u)
        self.got_node_state.set()

    async def on_available_capacity(self, u: pb.AvailableCapacityUpdate) -> None:
        pass


async def scripted_shard(log: list[tuple[str, Any]], done: trio.Event, end: ShardStream) -> None:
    """Hello -> Ack(hello); roll-up -> Ack(rollup); BootstrapRequest -> response; NodeState."""
    kind, hello = payload(await end.receive())
    log.append((kind, hello))
    await end.send(
        pb.ShardMessage(ack=pb.Acknowledgement(echo="hello", coordinator_term=7, shard_epoch=3))
    )
    kind, rollup = payload(await end.receive())
    log.append((kind, rollup))
    await end.send(pb.ShardMessage(ack=pb.Acknowledgement(echo="rollup")))
    await end.send(pb.ShardMessage(bootstrap_request=pb.BootstrapRequest(request_id="req-1")))
    kind, resp = payload(await end.receive())
    log.append((kind, resp))
    await end.send(
        pb.ShardMessage(
            node_state_update=pb.NodeStateUpdate(
                machine_id="m-1", state=pb.MachineState.CONFIGURED, labels={"zone": "a"}
            )
        )
    )
    done.set()
    await trio.sleep_forever()


async def test_agent_round_trip_over_grpclib_loopback() -> None:
    log: list[tuple[str, Any]] = []
    done = trio.Event()
    handlers = Handlers()
    with trio.fail_after(DEADLINE):
        async with trio_asyncio.open_loop(), trio.open_nursery() as n:
            port = await n.start(
                partial(serve_shard, partial(scripted_shard, log, done), host="127.0.0.1", port=0)
            )
            agent = Agent(
                GrpcConnector("127.0.0.1", port),
                Source(),
                handlers,
                AgentConfig(session=SessionConfig(cluster_id="c-loop")),
            )
            n.start_soon(agent.run)
            await done.wait()
            await handlers.got_node_state.wait()
            assert agent.session_up
            n.cancel_scope.cancel()
    kinds = [k for k, _ in log]
    assert kinds == ["hello", "rollup", "bootstrap_response"]
    hello, rollup, resp = (v for _, v in log)
    assert (hello.cluster_id, hello.protocol_version) == ("c-loop", "v1alpha1")
    assert rollup.cluster_id == "c-loop"
    assert rollup.needs[0].aggregate_resources == {"cpu": "2"} and rollup.needs[0].group == "g"
    assert (resp.request_id, resp.user_data, resp.ttl_seconds) == ("req-1", b"#cloud-config", 600)
    [u] = handlers.node_states
    assert (u.machine_id, u.state, u.labels) == ("m-1", pb.MachineState.CONFIGURED, {"zone": "a"})
    assert agent.stats.frames_in == 4 and agent.stats.frames_out == 3


async def echo_shard(end: ShardStream) -> None:
    """Answers every frame with an Ack echoing its kind; ends the RPC on 'bye'."""
    while True:
        try:
            msg = await end.receive()
        except StreamClosed:
            return
        kind, value = payload(msg)
        if kind == "hello" and value.cluster_id == "bye":
            return
        await end.send(pb.ShardMessage(ack=pb.Acknowledgement(echo=kind)))


async def test_connector_stream_send_receive_and_server_end() -> None:
    with trio.fail_after(DEADLINE):
        async with open_loop(), trio.open_nursery() as n:
            port = await n.start(partial(serve_shard, echo_shard, port=0))
            conn = GrpcConnector("127.0.0.1", port)
            async with conn.connect() as s:
                await s.send(pb.OperatorMessage(hello=pb.Hello(cluster_id="x")))
                assert payload(await s.receive())[1].echo == "hello"
                await s.send(pb.OperatorMessage(rollup=pb.ClusterCapacityNeeds()))
                assert payload(await s.receive())[1].echo == "rollup"
                await s.send(pb.OperatorMessage(hello=pb.Hello(cluster_id="bye")))
                with pytest.raises(StreamClosed, match="peer closed"):
                    await s.receive()  # the server handler returned: RPC ended with OK
            # a second stream on a fresh connect works too (one Channel per session)
            async with conn.connect() as s:
                await s.send(pb.OperatorMessage(hello=pb.Hello(cluster_id="y")))
                assert payload(await s.receive())[1].echo == "hello"
            n.cancel_scope.cancel()


async def test_client_close_cancels_server_handler() -> None:
    received = trio.Event()
    cancelled = trio.Event()
    ended: list[str] = []

    async def handler(end: ShardStream) -> None:
        await end.receive()
        received.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.set()
            raise
        finally:
            ended.append("cancelled" if cancelled.is_set() else "other")

    with trio.fail_after(DEADLINE):
        async with open_loop(), trio.open_nursery() as n:
            port = await n.start(partial(serve_shard, handler, port=0))
            async with GrpcConnector("127.0.0.1", port).connect() as s:
                await s.send(pb.OperatorMessage(hello=pb.Hello(cluster_id="x")))
                await received.wait()  # the handler is parked in sleep_forever
                assert not cancelled.is_set()
            await cancelled.wait()  # the client's close, not the nursery, cancelled it
            assert ended == ["cancelled"]
            n.cancel_scope.cancel()


async def test_connect_refused_raises_stream_closed() -> None:
    with trio.socket.socket() as sock:  # find a port nobody listens on
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with trio.fail_after(DEADLINE):
        # no loop opened by the caller: connect() opens one for the stream's lifetime
        with pytest.raises(StreamClosed, match="connection error"):
            async with GrpcConnector("127.0.0.1", port).connect():
                pytest.fail("should not connect")


async def test_agent_over_grpc_reconnects_after_refused() -> None:
    """Server appears after the first attempt failed; the agent's backoff then connects."""
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    established = trio.Event()

    async def handler(end: ShardStream) -> None:
        await end.receive()
        established.set()
        await trio.sleep_forever()

    with trio.fail_after(DEADLINE):
        async with open_loop(), trio.open_nursery() as n:
            agent = Agent(
                GrpcConnector("127.0.0.1", port),
                Source(),
                Handlers(),
                AgentConfig(session=SessionConfig(cluster_id="c"), initial_backoff=0.05),
                rng=random.Random(0),
            )
            n.start_soon(agent.run)
            while agent.stats.reconnects == 0:  # noqa: ASYNC110 - real time, no hook to await
                await trio.sleep(0.01)
            assert "connection error" in agent.last_error
            await n.start(partial(serve_shard, handler, port=port))
            await established.wait()
            n.cancel_scope.cancel()


def _tls_files(tmp_path: Any, ca: trustme.CA, name: str, client: bool) -> TLSFiles:
    ca_path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    if not client:
        return TLSFiles(ca=str(ca_path), server_name=name)
    cc = ca.issue_cert("c1.clusters.bigfleet.test")  # trustme cannot issue URI SANs
    cert_path, key_path = tmp_path / "client.pem", tmp_path / "client.key"
    cc.cert_chain_pems[0].write_to_path(str(cert_path))
    cc.private_key_pem.write_to_path(str(key_path))
    return TLSFiles(ca=str(ca_path), cert=str(cert_path), key=str(key_path), server_name=name)


@pytest.mark.parametrize("mutual", [False, True])
async def test_tls_and_mtls_round_trip_with_server_name_override(
    tmp_path: Any, mutual: bool
) -> None:
    ca = trustme.CA()
    server_cert = ca.issue_cert("shard.bigfleet.test")
    cert_path, key_path = tmp_path / "server.pem", tmp_path / "server.key"
    server_cert.private_key_and_cert_chain_pem.write_to_path(str(cert_path))
    server_cert.private_key_pem.write_to_path(str(key_path))
    ca_path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    server_ctx = server_ssl_context(
        str(cert_path), str(key_path), client_ca=str(ca_path) if mutual else None
    )
    files = _tls_files(tmp_path, ca, "shard.bigfleet.test", client=mutual)
    with trio.fail_after(DEADLINE):
        async with open_loop(), trio.open_nursery() as n:
            port = await n.start(partial(serve_shard, echo_shard, port=0, ssl=server_ctx))
            # dial by IP; the certificate is for the DNS name -> the override makes it match
            async with GrpcConnector("127.0.0.1", port, tls=files).connect() as s:
                await s.send(pb.OperatorMessage(hello=pb.Hello(cluster_id="x")))
                assert payload(await s.receive())[1].echo == "hello"
            # without the override the hostname check fails and the connect is refused
            bad = TLSFiles(ca=files.ca, cert=files.cert, key=files.key)
            with pytest.raises(StreamClosed):
                async with GrpcConnector("127.0.0.1", port, tls=bad).connect() as s:
                    await s.send(pb.OperatorMessage(hello=pb.Hello(cluster_id="x")))
                    await s.receive()
            n.cancel_scope.cancel()


def test_tls_files_validation() -> None:
    TLSFiles().validate()
    TLSFiles(ca="ca").validate()
    TLSFiles(ca="ca", cert="c", key="k").validate()
    with pytest.raises(TLSConfigError, match="together"):
        TLSFiles(ca="ca", cert="c").validate()
    with pytest.raises(TLSConfigError, match="together"):
        TLSFiles(key="k").validate()
    with pytest.raises(TLSConfigError, match="tls-ca"):
        TLSFiles(cert="c", key="k").validate()
    with pytest.raises(TLSConfigError):
        GrpcConnector("h", 1, tls=TLSFiles(cert="c"))


def test_codec_enforces_message_limit() -> None:
    codec = LimitedProtoCodec(max_message_bytes=16)
    small = pb.OperatorMessage(hello=pb.Hello(cluster_id="c"))
    data = codec.encode(small, pb.OperatorMessage)
    assert codec.decode(data, pb.OperatorMessage) == small
    big = pb.OperatorMessage(hello=pb.Hello(cluster_id="x" * 32))
    with pytest.raises(MessageTooLarge):
        codec.encode(big, pb.OperatorMessage)
    with pytest.raises(GRPCError):
        codec.decode(bytes(big), pb.OperatorMessage)


def test_parse_address() -> None:
    assert parse_address("shard.example:7443") == ("shard.example", 7443)
    assert parse_address("[::1]:50051") == ("::1", 50051)
    for bad in ("noport", ":80", "h:x", "h:0", "h:70000"):
        with pytest.raises(ValueError):
            parse_address(bad)
