"""Serving the ASGI app with hypercorn's Trio worker, the kubeconfig writer and the
``bigfleet-trio sim apiserver`` entry point.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
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
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``server.app`` over HTTP until cancelled.

    Use as ``url = await nursery.start(serve, server)``; the started value is the base URL
    ``http://HOST:PORT`` with the real (bound) port.

    Args:
        engine: ``"hypercorn"`` (hypercorn's Trio worker) or ``"fast"`` (the minimal HTTP/1.1
            server in :mod:`.fasthttp`, several times cheaper per request; for benchmarks).
    """
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

    async def run(task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        app: Any = server.app
        await hserve(app, cfg, shutdown_trigger=shutdown.wait, mode="asgi", task_status=task_status)

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(run)
        url = str(binds[0]).replace("0.0.0.0", "127.0.0.1")
        log.info("apiserver serving at %s", url)
        task_status.started(url)


def write_kubeconfig(url: str, path: str, *, token: str | None = None) -> None:
    """Write a kubeconfig pointing at ``url`` (plain HTTP; names ``bigfleet-sim``)."""
    user: dict[str, Any] = {"token": token} if token else {}
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "bigfleet-sim", "cluster": {"server": url}}],
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


def run_cli(port: int, kubeconfig_out: str, *, engine: str = "hypercorn") -> int:
    """``bigfleet-trio sim apiserver --port PORT --kubeconfig-out PATH``.

    Serves until SIGINT/SIGTERM; prints one line with the URL and kubeconfig path. Returns 0
    (1 with a one-line message on stderr when the port cannot be bound).
    """
    from .server import ApiServer

    async def main() -> None:
        server = ApiServer()
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                url = await nursery.start(
                    lambda task_status: serve(
                        server, port=port, engine=engine, task_status=task_status
                    )
                )
                write_kubeconfig(url, kubeconfig_out)
                print(
                    f"apiserver listening on {url}; kubeconfig written to {kubeconfig_out}",
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
    except (OSError, BaseExceptionGroup) as exc:
        err = find_in_group(exc, OSError)
        if err is None:
            raise
        print(f"sim apiserver: {err}", file=sys.stderr)
        return 1
    return 0

