"""mTLS to the shard with a test CA (``docs/architecture.md#processes``: one outbound stream per
cluster): the contexts :mod:`bigfleet_trio.shard.tls` builds, exercised by real TLS 1.3
handshakes over memory BIOs (no sockets, deterministic), plus one loopback gRPC connect.

* the client certificate carries the URI SAN ``bigfleet://cluster/<cluster-id>`` and the shard
  sees exactly that identity after the handshake;
* a shard certificate for another name, or from another CA, is refused by the agent;
* a client without a certificate, or with one from another CA, is refused by an mTLS shard;
* partial TLS flags stop the operator at start (CLI exit 1 with one clear line).
"""

from __future__ import annotations

import datetime as dt
import ssl
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bigfleet_trio import cli
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.bridge import open_loop
from bigfleet_trio.shard.grpc import GrpcConnector
from bigfleet_trio.shard.server import serve_shard
from bigfleet_trio.shard.tls import TLSFiles, client_ssl_context, server_ssl_context
from bigfleet_trio.shard.transport import ShardStream, StreamClosed

SHARD = "shard.bigfleet.test"


def issue_client_cert(ca: trustme.CA, cluster_id: str, tmp: Path, tag: str = "client"
                      ) -> tuple[str, str]:
    """A client certificate signed by ``ca`` whose only SAN is the cluster URI."""
    ca_key = serialization.load_pem_private_key(ca.private_key_pem.bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cluster_id)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.UniformResourceIdentifier(f"bigfleet://cluster/{cluster_id}")]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    cert_path, key_path = tmp / f"{tag}.pem", tmp / f"{tag}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def server_files(ca: trustme.CA, name: str, tmp: Path, tag: str = "server") -> tuple[str, str]:
    c = ca.issue_cert(name)
    cert, key = tmp / f"{tag}.pem", tmp / f"{tag}.key"
    c.cert_chain_pems[0].write_to_path(str(cert))
    c.private_key_pem.write_to_path(str(key))
    return str(cert), str(key)


def ca_file(ca: trustme.CA, tmp: Path, tag: str = "ca") -> str:
    p = tmp / f"{tag}.pem"
    ca.cert_pem.write_to_path(str(p))
    return str(p)


def handshake(client_ctx: ssl.SSLContext, server_ctx: ssl.SSLContext, server_hostname: str
              ) -> tuple[ssl.SSLObject, ssl.SSLObject]:
    """Run a full TLS handshake between the two contexts over memory BIOs."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=server_hostname)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    c_done = s_done = False
    for _ in range(20):
        if not c_done:
            try:
                client.do_handshake()
                c_done = True
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        if not s_done:
            try:
                server.do_handshake()
                s_done = True
            except ssl.SSLWantReadError:
                pass
        c_in.write(s_out.read())
        if c_done and s_done:
            # TLS 1.3: the server verifies the client certificate after the client finished;
            # push one record through so a rejection surfaces on the client too
            client.write(b"ping")
            s_in.write(c_out.read())
            assert server.read(4) == b"ping"
            return client, server
    raise AssertionError("handshake did not finish")


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Any]:
    ca = trustme.CA()
    other = trustme.CA()
    cert, key = issue_client_cert(ca, "c1", tmp_path)
    rogue_cert, rogue_key = issue_client_cert(other, "c1", tmp_path, tag="rogue")
    s_cert, s_key = server_files(ca, SHARD, tmp_path)
    wrong_cert, wrong_key = server_files(ca, "evil.example", tmp_path, tag="wrong")
    foreign_cert, foreign_key = server_files(other, SHARD, tmp_path, tag="foreign")
    return {
        "ca": ca_file(ca, tmp_path), "cert": cert, "key": key,
        "rogue": (rogue_cert, rogue_key),
        "server": (s_cert, s_key), "wrong": (wrong_cert, wrong_key),
        "foreign": (foreign_cert, foreign_key),
    }


def test_mtls_client_identity_is_the_cluster_uri_san(pki: dict[str, Any]) -> None:
    client_ctx = client_ssl_context(TLSFiles(ca=pki["ca"], cert=pki["cert"], key=pki["key"]))
    assert client_ctx is not None
    assert client_ctx.minimum_version == ssl.TLSVersion.TLSv1_3
    assert client_ctx.verify_mode == ssl.CERT_REQUIRED and client_ctx.check_hostname
    server_ctx = server_ssl_context(*pki["server"], client_ca=pki["ca"])
    client, server = handshake(client_ctx, server_ctx, SHARD)
    assert client.version() == "TLSv1.3"
    peer = server.getpeercert()
    assert peer is not None
    assert peer["subjectAltName"] == (("URI", "bigfleet://cluster/c1"),)


@pytest.mark.parametrize("which", ["wrong", "foreign"])
def test_shard_cert_for_wrong_name_or_ca_is_refused(pki: dict[str, Any], which: str) -> None:
    client_ctx = client_ssl_context(TLSFiles(ca=pki["ca"], cert=pki["cert"], key=pki["key"]))
    assert client_ctx is not None
    server_ctx = server_ssl_context(*pki[which], client_ca=pki["ca"])
    with pytest.raises(ssl.SSLCertVerificationError) as err:
        handshake(client_ctx, server_ctx, SHARD)
    expected = "Hostname mismatch" if which == "wrong" else "unable to get local issuer"
    assert expected in str(err.value)


def test_shard_refuses_clients_without_cert_or_from_another_ca(pki: dict[str, Any]) -> None:
    server_ctx = server_ssl_context(*pki["server"], client_ca=pki["ca"])
    no_cert = client_ssl_context(TLSFiles(ca=pki["ca"]))
    assert no_cert is not None
    with pytest.raises(ssl.SSLError):
        handshake(no_cert, server_ctx, SHARD)
    rogue = client_ssl_context(TLSFiles(ca=pki["ca"], cert=pki["rogue"][0], key=pki["rogue"][1]))
    assert rogue is not None
    with pytest.raises(ssl.SSLError):
        handshake(rogue, server_ctx, SHARD)


async def _echo(end: ShardStream) -> None:
    await end.receive()
    await end.send(pb.ShardMessage(ack=pb.Acknowledgement(echo="hello")))
    await trio.sleep_forever()


async def test_grpc_connector_refuses_a_shard_cert_for_another_name(pki: dict[str, Any]) -> None:
    """Over a real loopback socket: the connector pins the shard's name (override = SHARD), and a
    shard presenting a valid-CA certificate for another name never gets a Hello."""
    got_hello = False

    async def handler(end: ShardStream) -> None:
        nonlocal got_hello
        await end.receive()
        got_hello = True

    server_ctx = server_ssl_context(*pki["wrong"], client_ca=pki["ca"])
    files = TLSFiles(ca=pki["ca"], cert=pki["cert"], key=pki["key"], server_name=SHARD)
    with trio.fail_after(10):
        async with open_loop(), trio.open_nursery() as n:
            port = await n.start(partial(serve_shard, handler, port=0, ssl=server_ctx))
            with pytest.raises(StreamClosed):
                async with GrpcConnector("127.0.0.1", port, tls=files).connect() as s:
                    await s.send(pb.OperatorMessage(hello=pb.Hello(cluster_id="c1")))
                    await s.receive()
            n.cancel_scope.cancel()
    assert not got_hello


@pytest.mark.parametrize("flags", [
    ["--tls-cert", "C"], ["--tls-key", "K"], ["--tls-ca", "A"],
    ["--tls-cert", "C", "--tls-key", "K"], ["--tls-cert", "C", "--tls-ca", "A"],
    ["--tls-key", "K", "--tls-ca", "A"],
])
def test_partial_tls_flags_refused_at_start(
    flags: list[str], pki: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    paths = {"C": pki["cert"], "K": pki["key"], "A": pki["ca"]}
    argv = ["operator", "--cluster-id", "c1", "--shard-addr", "shard:1"]
    argv += [paths.get(f, f) for f in flags]
    assert cli.main(argv) == 2  # a usage error: one line on stderr, nothing started
    err = capsys.readouterr().err
    assert "--tls-cert, --tls-key and --tls-ca must be set together (missing" in err
