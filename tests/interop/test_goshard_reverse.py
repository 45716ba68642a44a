"""The reverse direction: a grpc-go client (the Go peer's client mode, protobuf-go codec)
against ``bigfleet-trio sim shard``, our grpclib server (docs/wire.md#go-interop)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import trio

from bigfleet_trio.proto import pb
from tests.interop._peer import BIN, Procs, until
from tests.support.simproc import SHARD_LISTENING

pytestmark = [pytest.mark.interop, pytest.mark.slow]

NEED = {"priority": 10, "aggregate_resources": {"cpu": "1", "memory": "1Gi"},
        "min_unit": {"cpu": "1", "memory": "1Gi"}}
SCRIPT = {"sessions": [[
    {"send": {"hello": {"cluster_id": "c1", "protocol_version": "v1alpha1"}}},
    {"await": "ack"},
    {"send": {"rollup": {"cluster_id": "c1", "needs": [NEED]}}},
    # The shard provisions: NodeStateUpdates, a BootstrapRequest (answered by the client),
    # AvailableCapacityUpdates as its free pool changes.
    {"await": "bootstrap_request"},
    {"await": "available_capacity"},
    # CONFIGURED: the shard decoded our BootstrapBlobResponse.
    {"await": "node_state_update:MACHINE_STATE_CONFIGURED"},
    # No demand any more: the shard reclaims the machine (the client acks).
    {"send": {"rollup": {"cluster_id": "c1"}}},
    {"await": "reclaim_instruction"},
    # DRAINING follows only our ReclaimAck.
    {"await": "node_state_update:MACHINE_STATE_DRAINING"},
    {"close_send": True},
]]}


async def test_go_client_against_sim_shard_downlink_ack_node_state_update_bootstrap_request_available_capacity_reclaim_instruction_uplink_hello_rollup_bootstrap_response_reclaim_ack(  # noqa: E501 - the name lists the kinds
    tmp_path: Path, goshard: str
) -> None:
    record = tmp_path / "goclient.jsonl"
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    async with trio.open_nursery() as nursery:
        procs = Procs(tmp_path, nursery)
        try:
            # --port 0: the shard binds a free port itself (no race with another process
            # between choosing a port and binding it) and logs it
            await procs.start("shard", BIN, "sim", "shard", "--port", "0")
            await until(procs, "the sim shard listening",
                        lambda: SHARD_LISTENING.search(procs.log("shard")), 60)
            found = SHARD_LISTENING.search(procs.log("shard"))
            assert found is not None
            port = int(found.group(1))
            client = await procs.start("goclient", goshard, "-dial", f"127.0.0.1:{port}",
                                       "-script", str(tmp_path / "script.json"),
                                       "-record", str(record))
            with trio.fail_after(120):
                await client.wait()
        finally:
            await procs.stop()
            nursery.cancel_scope.cancel()
    recs = [json.loads(line) for line in record.read_text().splitlines()]
    assert client.returncode == 0, procs.logs()
    down = [r for r in recs if r["t"] == "down"]
    kinds = {r["kind"] for r in down}
    assert kinds == {"ack", "node_state_update", "bootstrap_request", "available_capacity",
                     "reclaim_instruction"}, procs.logs()
    # protobuf-go decodes every frame our server wrote. Re-encoded deterministically, the
    # bytes are the same except for the order of map entries (labels, resources): the sim
    # shard writes them in insertion order, protobuf-go sorts them; the decoded messages are
    # equal (docs/wire.md#go-interop).
    for r in down:
        ours = pb.ShardMessage().parse(base64.b64decode(r["raw_b64"]))
        if not r["reencoded_identical"]:
            assert r["kind"] in ("node_state_update", "available_capacity"), r
            assert pb.ShardMessage().parse(base64.b64decode(r["reencoded_b64"])) == ours
    assert all(r["reencoded_identical"] for r in down
               if r["kind"] in ("ack", "bootstrap_request", "reclaim_instruction"))
    (end,) = [r for r in recs if r["t"] == "end"]
    assert end["code"] == 0, end  # the shard ended the call with OK after our half-close
    assert [r for r in recs if r["t"] == "await_failed"] == []
