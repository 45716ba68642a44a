"""Shard-side timestamps for benchmarks: what is recorded per frame, and the /stats endpoint."""

from __future__ import annotations

import json

import trio

from bigfleet_trio.proto import pb
from bigfleet_trio.sim.shard.stats import ShardStats, serve_stats


def test_frames_are_recorded_with_their_ids() -> None:
    st = ShardStats()
    st.sent(pb.ShardMessage(node_state_update=pb.NodeStateUpdate(
        machine_id="m1", state=pb.MachineState.CONFIGURED)))
    st.sent(pb.ShardMessage(node_state_update=pb.NodeStateUpdate(
        machine_id="m2", node_name="n2", state=pb.MachineState.CONFIGURED)))
    st.sent(pb.ShardMessage(bootstrap_request=pb.BootstrapRequest(request_id="b1")))
    st.sent(pb.ShardMessage(reclaim_instruction=pb.ReclaimInstruction(
        instruction_id="r1", nodes=["n1"])))
    st.received(pb.OperatorMessage(bootstrap_response=pb.BootstrapBlobResponse(
        request_id="b1", error="boom")))
    st.received(pb.OperatorMessage(reclaim_ack=pb.ReclaimAck(instruction_id="r1")))
    st.received(pb.OperatorMessage(rollup=pb.ClusterCapacityNeeds(needs=[
        pb.CapacityNeed(aggregate_resources={"cpu": "1500m", "memory": "1Ki"}),
        pb.CapacityNeed(aggregate_resources={"cpu": "2"})])))
    d = st.to_dict({"x": 1})
    assert [r[1:] for r in d["nsu"]] == [["m1", "CONFIGURED"], ["m2", "CONFIGURED"]]
    # which machine a Node is (a reclaim names Nodes, its UpcomingNode is the machine's)
    assert d["machine_of_node"] == {"n2": "m2"}
    (b,) = d["bootstrap"]
    assert b[0] == "b1" and b[2] >= b[1] and b[3] == "boom"
    (r,) = d["reclaim"]
    assert r[0] == "r1" and r[1] == "n1" and r[3] >= r[2]
    (roll,) = d["rollups"]
    assert roll[1:4] == [2, 3500, 1024 * 1000]
    assert d["x"] == 1
    # an answer to an unknown request is not recorded
    st.received(pb.OperatorMessage(bootstrap_response=pb.BootstrapBlobResponse(request_id="zz")))
    assert len(st.to_dict()["bootstrap"]) == 1


async def test_stats_endpoint_serves_json() -> None:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: serve_stats(
            lambda: {"ok": True}, port=0, task_status=task_status))
        for path, code in (("/stats", b"200"), ("/other", b"404")):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(f"GET {path} HTTP/1.0\r\n\r\n".encode())
            data = b""
            while chunk := await stream.receive_some(4096):
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            assert code in head.split(b"\r\n")[0]
            if code == b"200":
                assert json.loads(body) == {"ok": True}
        nursery.cancel_scope.cancel()
