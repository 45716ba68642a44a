"""The kube client over real TLS on loopback: kubeconfig CA data and client certificate data
(docs/kube-api.md: CA file/data, client cert/key file/data) end in a verified mutual handshake,
and a server the CA did not sign is refused.

The server is a few lines of Trio: a TLS listener that requires a client certificate signed by
the test CA, reads one HTTP/1.1 request and answers a Namespace object. It records the client
certificate's subject so the test sees that the client really presented the kubeconfig's pair.
"""

from __future__ import annotations

import base64
import json
import ssl
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme
import yaml

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import load_kubeconfig
from bigfleet_trio.kube.errors import KubeTransportError
from bigfleet_trio.kube.resources import NAMESPACES


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _write_kubeconfig(tmp_path: Path, port: int, ca: trustme.CA, leaf: trustme.LeafCert) -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "ctx",
        "clusters": [
            {
                "name": "k",
                "cluster": {
                    "server": f"https://localhost:{port}",
                    "certificate-authority-data": _b64(ca.cert_pem.bytes()),
                },
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate-data": _b64(leaf.cert_chain_pems[0].bytes()),
                    "client-key-data": _b64(leaf.private_key_pem.bytes()),
                },
            }
        ],
        "contexts": [{"name": "ctx", "context": {"cluster": "k", "user": "admin"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


async def _serve_one_namespace(
    server_ctx: ssl.SSLContext, peers: list[Any], task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    async def handle(stream: trio.SSLStream[trio.SocketStream]) -> None:
        try:
            await stream.do_handshake()
        except trio.BrokenResourceError:
            return  # the client refused us (wrong CA): nothing to answer
        peers.append(stream.getpeercert())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            data += chunk
        body = json.dumps(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}
        ).encode()
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        await stream.send_all(head + body)
        await stream.aclose()

    listeners = await trio.open_ssl_over_tcp_listeners(0, server_ctx, host="127.0.0.1")
    await trio.serve_listeners(handle, listeners, task_status=task_status)


def _server_context(server_ca: trustme.CA, client_ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ca.issue_cert("localhost").configure_cert(ctx)
    client_ca.configure_trust(ctx)
    ctx.verify_mode = ssl.CERT_REQUIRED  # mutual TLS, as an apiserver with client-cert auth
    return ctx


async def test_ca_data_and_client_cert_data_make_a_verified_mutual_handshake(
    tmp_path: Path,
) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("kube-admin")
    peers: list[Any] = []
    with trio.fail_after(30):  # real sockets and TLS: a generous wall-clock bound
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(_serve_one_namespace, _server_context(ca, ca), peers)
            port = listeners[0].transport_listener.socket.getsockname()[1]
            cfg = load_kubeconfig(_write_kubeconfig(tmp_path, port, ca, leaf), env={})
            async with KubeClient(cfg) as client:
                ns = await client.get(NAMESPACES, "default")
            nursery.cancel_scope.cancel()
    assert ns["metadata"]["name"] == "default"
    [peer] = peers
    subject = dict(x[0] for x in peer["subject"])
    assert subject.get("commonName") == "kube-admin" or any(
        v == "kube-admin" for _k, v in peer.get("subjectAltName", ())
    )


async def test_server_not_signed_by_the_kubeconfig_ca_is_refused(tmp_path: Path) -> None:
    ca, rogue = trustme.CA(), trustme.CA()
    leaf = ca.issue_cert("kube-admin")
    peers: list[Any] = []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            # the server presents a certificate from another CA
            listeners = await nursery.start(
                _serve_one_namespace, _server_context(rogue, ca), peers
            )
            port = listeners[0].transport_listener.socket.getsockname()[1]
            cfg = load_kubeconfig(_write_kubeconfig(tmp_path, port, ca, leaf), env={})
            async with KubeClient(cfg, max_attempts=1) as client:
                with pytest.raises(KubeTransportError, match="CERTIFICATE_VERIFY_FAILED"):
                    await client.get(NAMESPACES, "default")
            nursery.cancel_scope.cancel()
    assert peers == []  # no request ever reached the server
