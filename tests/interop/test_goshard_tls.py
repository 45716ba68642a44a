"""mTLS against grpc-go's TLS 1.3 server: the Go peer requires a client certificate from its CA
with the URI SAN ``bigfleet://cluster/<id>`` for the one cluster it serves
(docs/wire.md#go-interop)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from tests.interop._peer import world
from tests.security.test_tls import ca_file, issue_client_cert, server_files

pytestmark = [pytest.mark.interop, pytest.mark.slow]

SHARD = "shard.bigfleet.test"


def tls_flags(tmp: Path, client_cluster: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    ca = trustme.CA()
    cert, key = server_files(ca, SHARD, tmp)
    client_cert, client_key = issue_client_cert(ca, client_cluster, tmp)
    cafile = ca_file(ca, tmp)
    peer = ("-tls-cert", cert, "-tls-key", key, "-tls-ca", cafile, "-cluster-id", "c1")
    operator = ("--tls-cert", client_cert, "--tls-key", client_key, "--tls-ca", cafile,
                "--tls-server-name", SHARD)
    return peer, operator


async def test_mtls_tls13_with_the_clusters_uri_san_is_accepted_hello_and_rollup(
    tmp_path: Path, goshard: str
) -> None:
    peer_flags, op_flags = tls_flags(tmp_path, "c1")
    async with world(tmp_path, goshard, {"default": [{"await": "rollup"}]},
                     peer_flags=peer_flags, operator_flags=op_flags) as w:
        await w.until("a roll-up over mTLS", lambda: w.peer.uplink("rollup"))
        (opened, *_) = w.peer.records("open")
        assert opened["tls_version"] == "TLS 1.3"
        assert opened["san_cluster_id"] == "c1"
        assert w.peer.uplink("hello")[0]["frame"]["hello"]["cluster_id"] == "c1"
        assert w.peer.records("handshake_refused") == []


async def test_mtls_client_certificate_for_another_cluster_is_refused(
    tmp_path: Path, goshard: str
) -> None:
    peer_flags, op_flags = tls_flags(tmp_path, "c2")
    async with world(tmp_path, goshard, peer_flags=peer_flags, operator_flags=op_flags) as w:
        await w.until("two refused handshakes (a redial too)",
                      lambda: len(w.peer.records("handshake_refused")) >= 2)
        refused = w.peer.records("handshake_refused")[0]
        assert 'client certificate is for cluster "c2", not "c1"' in refused["error"]
        assert w.peer.records("open") == []  # no stream was ever served
        # With TLS 1.3 the client's side of the handshake is done before the shard checks the
        # certificate, so the agent sees the refusal as the connection closing right after
        # the stream opened (grpclib does not report the TLS alert; docs/wire.md#go-interop).
        await w.until("the refusal in the operator's log",
                      lambda: "error=stream closed: stream terminated: Connection lost"
                      in w.operator_log())
