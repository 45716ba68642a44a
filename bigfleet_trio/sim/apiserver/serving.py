"""Serving the ASGI app with hypercorn's Trio worker, the kubeconfig writer and the
``bigfleet-trio sim apiserver`` entry point.
"""

from __future__ import annotations

import base64
import logging
import os
import signal
import sys
import tempfile
from typing import TYPE_CHECKING, Any

import trio
import yaml

from bigfleet_trio.excgroups import find_in_group

if TYPE_CHECKING:
    from .server import ApiServer

log = logging.getLogger(__name__)


async def serve(
    server: ApiServer,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    engine: str = "hypercorn",
    tls: bool | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``server.app`` over HTTP(S) until cancelled.

    Use as ``url = await nursery.start(serve, server)``; the started value is the base URL
    ``http(s)://HOST:PORT`` with the real (bound) port.

    Args:
        engine: ``"hypercorn"`` (hypercorn's Trio worker) or ``"fast"`` (the minimal HTTP/1.1
            server in :mod:`.fasthttp`, several times cheaper per request; for benchmarks).
        tls: serve HTTPS with a throw-away CA (``server.tls_ca_pem``, for kubeconfigs); None =
            when the server enforces RBAC, because kubectl sends bearer tokens only over TLS.

    Raises:
        ValueError: unknown engine, or TLS with the fast engine.
    """
    if tls is None:
        tls = server.access.enforcing
    if tls and engine != "hypercorn":
        raise ValueError("TLS is served by the hypercorn engine only")
    if engine == "fast":
        from .fasthttp import serve_fast

        async with trio.open_nursery() as nursery:
            url = await nursery.start(
                lambda task_status: serve_fast(
                    server.app, host=host, port=port, task_status=task_status
                )
            )
            log.info("apiserver (fast engine) serving at %s", url)
            task_status.started(url)
        return
    if engine != "hypercorn":
        raise ValueError(f"unknown engine {engine!r}")
    from hypercorn.config import Config
    from hypercorn.trio import serve as hserve

    cfg = Config()
    cfg.bind = [f"{host}:{port}"]
    cfg.graceful_timeout = 0.2
    cfg.keep_alive_timeout = 75
    cfg.keep_alive_max_requests = 10**9
    cfg.accesslog = None
    cfg.errorlog = logging.getLogger("hypercorn.error")
    cfg.loglevel = "WARNING"
    shutdown = trio.Event()
    tmpdir = None
    if tls:
        tmpdir = tempfile.TemporaryDirectory(prefix="bigfleet-sim-tls-")
        cfg.certfile = cfg.keyfile = _issue_serving_cert(server, host, tmpdir.name)

    async def run(task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        app: Any = server.app
        await hserve(app, cfg, shutdown_trigger=shutdown.wait, mode="asgi", task_status=task_status)

    try:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(run)
            url = str(binds[0]).replace("0.0.0.0", "127.0.0.1")
            if tls:
                url = url.replace("http://", "https://", 1)
            log.info("apiserver serving at %s", url)
            task_status.started(url)
    finally:
        if tmpdir is not None:
            tmpdir.cleanup()


def _issue_serving_cert(server: ApiServer, host: str, directory: str) -> str:
    """Create a CA and a certificate for ``host``/127.0.0.1/localhost; returns the path of
    the key + chain PEM file and stores the CA on ``server.tls_ca_pem``.

    Raises:
        RuntimeError: trustme (the ``test`` extra) is not installed.
    """
    try:
        import trustme
    except ImportError:
        raise RuntimeError(
            "serving TLS (--authorization-mode RBAC) needs trustme: pip install "
            "'bigfleet-trio[test]'"
        ) from None
    ca = trustme.CA(organization_name="bigfleet-sim")
    names = sorted({host, "127.0.0.1", "localhost"} - {"0.0.0.0"})
    cert = ca.issue_cert(*names)
    path = os.path.join(directory, "serving.pem")
    cert.private_key_and_cert_chain_pem.write_to_path(path)
    server.tls_ca_pem = ca.cert_pem.bytes()
    return path


def write_kubeconfig(
    url: str, path: str, *, token: str | None = None, ca_pem: bytes | None = None
) -> None:
    """Write a kubeconfig pointing at ``url`` (names ``bigfleet-sim``); ``ca_pem`` becomes
    ``certificate-authority-data`` for an https URL."""
    user: dict[str, Any] = {"token": token} if token else {}
    cluster: dict[str, Any] = {"server": url}
    if ca_pem:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "bigfleet-sim", "cluster": cluster}],
        "users": [{"name": "bigfleet-sim", "user": user}],
        "contexts": [
            {
                "name": "bigfleet-sim",
                "context": {
                    "cluster": "bigfleet-sim",
                    "user": "bigfleet-sim",
                    "namespace": "default",
                },
            }
        ],
        "current-context": "bigfleet-sim",
        "preferences": {},
    }
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(cfg, fh, sort_keys=False)


def run_cli(
    port: int,
    kubeconfig_out: str,
    *,
    engine: str = "hypercorn",
    authorization_mode: str = "AlwaysAllow",
) -> int:
    """``bigfleet-trio sim apiserver --port PORT --kubeconfig-out PATH
    [--authorization-mode RBAC]``.

    Serves until SIGINT/SIGTERM; prints one line with the URL and kubeconfig path. With
    ``RBAC`` the kubeconfig carries the admin token (group system:masters). Returns 0 (1 with
    a one-line message on stderr when the port cannot be bound or the mode is unknown).
    """
    from .access import MODES
    from .server import ApiServer

    if authorization_mode not in MODES:
        print(f"sim apiserver: --authorization-mode must be one of {', '.join(MODES)}",
              file=sys.stderr)
        return 1

    async def main() -> None:
        server = ApiServer(authorization_mode=authorization_mode)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                url = await nursery.start(
                    lambda task_status: serve(
                        server, port=port, engine=engine, task_status=task_status
                    )
                )
                token = server.access.admin_token if server.access.enforcing else None
                write_kubeconfig(url, kubeconfig_out, token=token, ca_pem=server.tls_ca_pem)
                print(
                    f"apiserver listening on {url}; kubeconfig written to {kubeconfig_out}"
                    + (" (authorization mode RBAC, admin token)" if token else ""),
                    flush=True,
                )
                async for _sig in signals:
                    break
                nursery.cancel_scope.cancel()

    parent = os.path.dirname(os.path.abspath(kubeconfig_out))
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        print(f"sim apiserver: cannot write kubeconfig {kubeconfig_out}: "
              f"{parent} is not a writable directory", file=sys.stderr)
        return 1
    try:
        trio.run(main)
    except (OSError, RuntimeError, BaseExceptionGroup) as exc:
        # a port in use (OSError) or TLS without trustme (RuntimeError): one line, exit 1
        os_err = find_in_group(exc, OSError)
        if os_err is not None:  # worded as every other command words it
            print(f"sim apiserver: cannot listen on 127.0.0.1:{port}: "
                  f"{getattr(os_err, 'strerror', None) or os_err}", file=sys.stderr)
            return 1
        err = find_in_group(exc, RuntimeError)
        if err is None:
            raise
        print(f"sim apiserver: {err}", file=sys.stderr)
        return 1
    return 0

