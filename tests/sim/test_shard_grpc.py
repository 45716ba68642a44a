"""The simulated shard over real grpclib on localhost: a grpclib server speaking the real
protocol. Skipped when the grpclib transport modules are not present."""

from __future__ import annotations

import socket
from functools import partial

import betterproto
import pytest
import trio

from bigfleet_trio.proto import pb
from bigfleet_trio.shard import grpc
from bigfleet_trio.sim.shard.catalog import Catalog, MachineShape
from bigfleet_trio.sim.shard.cli import run_cli, serve_sim_shard
from bigfleet_trio.sim.shard.engine import EngineConfig
from bigfleet_trio.sim.shard.session import SimShard


def catalog() -> Catalog:
    return Catalog([MachineShape("small", "z-a", {"cpu": "2"}, 0.10, count=2, warm=1)])


async def test_hello_rollup_bootstrap_over_grpc() -> None:
    shard = SimShard(catalog(), EngineConfig(seed=1, configure_delay=0.0))
    with trio.fail_after(20):
        async with grpc.open_loop(), trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve_sim_shard, shard, host="127.0.0.1", port=0))
            connector = grpc.GrpcConnector("127.0.0.1", port, keepalive_time=None)
            async with connector.connect() as op:
                await op.send(pb.OperatorMessage(hello=pb.Hello("c1", "v1alpha1")))

                async def recv() -> tuple[str, object]:
                    return betterproto.which_one_of(await op.receive(), "payload")

                kind, ack = await recv()
                assert (kind, ack.echo) == ("ack", "hello")
                need = pb.CapacityNeed(aggregate_resources={"cpu": "1"}, min_unit={"cpu": "1"})
                await op.send(pb.OperatorMessage(rollup=pb.ClusterCapacityNeeds("c1", 1, [need])))
                kinds = []
                while True:
                    kind, val = await recv()
                    kinds.append(kind)
                    if kind == "bootstrap_request":
                        break
                assert kinds[kinds.index("ack"):] == ["ack", "node_state_update",
                                                      "bootstrap_request"]
                await op.send(pb.OperatorMessage(bootstrap_response=pb.BootstrapBlobResponse(
                    request_id=val.request_id, user_data=b"x")))
                states = []
                while len(states) < 2:
                    kind, val = await recv()
                    if kind == "node_state_update":
                        states.append(val.state)
                assert states == [pb.MachineState.CONFIGURING, pb.MachineState.CONFIGURED]
            nursery.cancel_scope.cancel()


def test_run_cli_port_in_use_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    from bigfleet_trio.sim.shard import cli

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert cli.run_cli(port, None, host="127.0.0.1") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"sim shard: cannot listen on 127.0.0.1:{port}")


def test_run_cli_bad_kubeconfig_exits_1(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(0, str(tmp_path / "missing.yaml")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sim shard: ")


def test_run_cli_bad_port_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(70000, None) == 1
    assert capsys.readouterr().err.strip() == "sim shard: --port 70000 out of range"


async def test_a_replaced_session_ends_with_aborted_and_why_over_grpc() -> None:
    """Two sessions with one cluster ID over real grpclib: the first ends with ABORTED and a
    message that says why; a session of another cluster ID does not replace it: both are served
    (one pool, one session per cluster)."""
    from bigfleet_trio.shard.transport import StreamClosed

    shard = SimShard(catalog(), EngineConfig(seed=1, configure_delay=0.0))
    with trio.fail_after(20):
        async with grpc.open_loop(), trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve_sim_shard, shard, host="127.0.0.1", port=0))
            connector = grpc.GrpcConnector("127.0.0.1", port, keepalive_time=None)

            async def hello(op: object, cluster: str) -> None:
                await op.send(pb.OperatorMessage(hello=pb.Hello(cluster, "v1alpha1")))  # type: ignore[attr-defined]

            async with connector.connect() as first:
                await hello(first, "c1")
                assert betterproto.which_one_of(await first.receive(), "payload")[0] == "ack"
                async with connector.connect() as other:
                    await hello(other, "c2")
                    assert betterproto.which_one_of(await other.receive(), "payload")[0] == "ack"
                    assert shard.clusters == ["c1", "c2"]
                async with connector.connect() as second:
                    await hello(second, "c1")
                    with pytest.raises(StreamClosed) as ended:
                        while True:
                            await first.receive()
                    assert ended.value.grpc_status == "ABORTED"
                    assert ended.value.reason == (
                        "grpc: ABORTED session replaced: a newer session for cluster 'c1' "
                        "connected (another agent with the same cluster ID?)")
            nursery.cancel_scope.cancel()
