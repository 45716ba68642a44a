"""``bigfleet-trio sim shard --port PORT [--kubeconfig PATH] [--catalog FILE] [--seed N]``.

The simulated shard as a process.

Serves the real ``Shard.Session`` protocol over
grpclib via :func:`bigfleet_trio.shard.server.serve_shard`, each session handled by
:meth:`SimShard.serve_session`. With ``--kubeconfig`` (or a resolvable default kubeconfig when the
flag is given) Configured machines register Nodes through the Kubernetes API. ``--catalog`` reads
the inventory from a YAML file (:func:`~.catalog.load_catalog`; default
:func:`~.catalog.default_catalog`), ``--seed`` seeds the engine (:attr:`EngineConfig.seed`).
"""

from __future__ import annotations

import logging
import secrets
import signal
import sys
from contextlib import AsyncExitStack
from dataclasses import replace
from functools import partial
from typing import Any

import trio

from .catalog import Catalog, CatalogError, default_catalog, load_catalog
from .engine import EngineConfig
from .heartbeat import DEFAULT_TIMING, HeartbeatTiming
from .nodes import KubeNodeHooks
from .session import NodeHooks, SimShard
from .stats import ShardStats, serve_stats

log = logging.getLogger(__name__)


def with_process_prefix(config: EngineConfig | None, token: str | None = None) -> EngineConfig:
    """``config`` with ReclaimInstruction ids unique to this process (``reclaim-<6 hex>-...``;
    ``token`` random unless given): a restarted shard never re-uses an id for another reclaim
    (docs/rules.md#reclaim-instruction-ids)."""
    return replace(config or EngineConfig(),
                   instruction_prefix=f"reclaim-{token or secrets.token_hex(3)}")


def run_cli(
    port: int,
    kubeconfig: str | None,
    *,
    host: str = "127.0.0.1",
    catalog: Catalog | None = None,
    config: EngineConfig | None = None,
    catalog_file: str | None = None,
    seed: int | None = None,
    stats_addr: str | None = None,
    reclaim_grace: int | None = None,
    node_lease_duration: int | None = None,
) -> int:
    """Run the simulated shard until SIGINT/SIGTERM. Returns the process exit code.

    Args:
        port: TCP port to listen on (0 picks a free one; the bound port is logged).
        kubeconfig: register Nodes through this cluster; None = no Node registration.
        host: listen address.
        catalog, config: engine setup (defaults: :func:`default_catalog`, :class:`EngineConfig`).
        catalog_file: ``--catalog``: read the catalog from this YAML file (instead of
            ``catalog``), before anything starts.
        seed: ``--seed``: overrides ``config.seed`` (None keeps it; the default config's is 0).
        stats_addr: ``--stats-addr HOST:PORT``: serve shard-side timestamps as JSON at
            ``/stats`` (:mod:`.stats`; port 0 picks one, logged).
        reclaim_grace: ``--reclaim-grace``: seconds of grace in every ReclaimInstruction
            (overrides ``config.reclaim_grace_seconds``; must be >= 0).
        node_lease_duration: ``--node-lease-duration``: the simulated kubelets' Lease duration
            in seconds, renewed at a quarter of it (default 40, kubelet's; must be >= 4).

    Returns:
        0 after a signal, 1 on a startup error (one line ``sim shard: <what>`` on stderr, e.g.
        ``sim shard: cat.yaml: shapes[0].pricePerHour: -1 is less than the minimum of 0``).
    """
    if catalog_file is not None:
        try:
            catalog = load_catalog(catalog_file)
        except CatalogError as exc:
            print(f"sim shard: {exc}", file=sys.stderr)
            return 1
    if seed is not None:
        config = replace(config or EngineConfig(), seed=seed)
    config = with_process_prefix(config)
    if reclaim_grace is not None:
        if reclaim_grace < 0:
            print(f"sim shard: --reclaim-grace {reclaim_grace} must be >= 0", file=sys.stderr)
            return 1
        config = replace(config or EngineConfig(), reclaim_grace_seconds=reclaim_grace)
    timing = DEFAULT_TIMING
    if node_lease_duration is not None:
        try:
            timing = HeartbeatTiming(lease_duration=node_lease_duration)
        except ValueError:
            print(f"sim shard: --node-lease-duration {node_lease_duration} must be >= 4",
                  file=sys.stderr)
            return 1
    if catalog is None:
        catalog, source = default_catalog(), "default catalog"
    else:
        source = catalog_file or "catalog given in code"
    log.info("sim shard inventory: %d machines in %d shapes (%s), seed %d",
             sum(s.count for s in catalog), len(catalog), source, (config or EngineConfig()).seed)
    stats_at: tuple[str, int] | None = None
    if stats_addr is not None:
        shost, _, sport = stats_addr.rpartition(":")
        if not shost or not sport.isdigit() or int(sport) > 65535:
            print(f"sim shard: --stats-addr {stats_addr!r} is not HOST:PORT", file=sys.stderr)
            return 1
        stats_at = (shost, int(sport))
    try:
        extra: dict[str, Any] = {"stats_at": stats_at} if stats_at is not None else {}
        if timing is not DEFAULT_TIMING:
            extra["timing"] = timing
        return trio.run(partial(_main, port, kubeconfig, host, catalog, config, **extra))
    except KeyboardInterrupt:
        return 0
    except BaseException as exc:  # noqa: BLE001 - turned into one line and exit code 1
        leaf = _first_leaf(exc)
        if isinstance(leaf, _StartupError):
            print(f"sim shard: {leaf}", file=sys.stderr)
            return 1
        if isinstance(leaf, OSError):
            print(f"sim shard: cannot listen on {host}:{port}: {leaf}", file=sys.stderr)
            return 1
        raise


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


class _StartupError(Exception):
    pass


async def serve_sim_shard(
    shard: SimShard,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    ssl: Any = None,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``shard`` (engine clock) and serve it over grpclib until cancelled.

    Reports the bound port through ``task_status`` (use ``port = await nursery.start(...)``).

    Raises:
        OSError: the address cannot be bound.
        ImportError: the grpclib server module is unavailable.
    """
    from bigfleet_trio.shard.server import serve_shard

    async with trio.open_nursery() as nursery:
        await nursery.start(shard.run)
        bound = await nursery.start(
            partial(serve_shard, shard.serve_session, host=host, port=port, ssl=ssl)
        )
        task_status.started(bound)


async def _main(port: int, kubeconfig: str | None, host: str, catalog: Catalog | None,
                config: EngineConfig | None, stats_at: tuple[str, int] | None = None,
                timing: HeartbeatTiming = DEFAULT_TIMING) -> int:
    try:
        import bigfleet_trio.shard.server  # noqa: F401
    except ImportError as exc:
        raise _StartupError(f"grpc server unavailable ({exc})") from None
    if not 0 <= port <= 65535:
        raise _StartupError(f"--port {port} out of range")
    async with AsyncExitStack() as stack:
        hooks: NodeHooks | None = None
        if kubeconfig is not None:
            from bigfleet_trio.kube.client import KubeClient
            from bigfleet_trio.kube.config import load_kubeconfig
            from bigfleet_trio.kube.errors import KubeConfigError

            try:
                cfg = load_kubeconfig(kubeconfig)
            except KubeConfigError as exc:
                raise _StartupError(str(exc)) from None
            client = await stack.enter_async_context(KubeClient(cfg))
            hooks = KubeNodeHooks(client, timing)
        stats = ShardStats() if stats_at is not None else None
        shard = SimShard(catalog, config, hooks=hooks, stats=stats)
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(partial(serve_sim_shard, shard, host=host, port=port))
            log.info("sim shard listening on %s:%s", host, bound)
            if stats is not None and stats_at is not None:
                sport = await nursery.start(partial(
                    serve_stats, lambda: stats.to_dict({
                        "snapshot": shard.snapshot(),
                        "bound": [m.machine_id for m in shard.engine.bound_machines()]}),
                    host=stats_at[0], port=stats_at[1]))
                print(f"sim shard: grpc port {bound}, stats http://{stats_at[0]}:{sport}/stats",
                      flush=True)
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    log.info("signal %s: shutting down", signal.Signals(signum).name)
                    break
            nursery.cancel_scope.cancel()
    return 0
