"""``bigfleet-trio pod-controller``: the process around :class:`~.controller.PodController`.

The Kubernetes client, the PriorityClass defaults file (parsed at start: a problem is one line
``pod-controller: <reason>`` and exit 1), optional Lease leader election (informers stay warm on
standbys, only the leader writes), the diagnostics listener (``/metrics`` with this binary's
families, ``/healthz``, ``/readyz`` = caches synced) and SIGINT/SIGTERM (exit 0).
:func:`run_pod_controller` is the CLI entry; :func:`serve_pod_controller` the same as a Trio task.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import uuid
from functools import partial
from typing import TYPE_CHECKING

import trio
import yaml

from bigfleet_trio.knobs import ConfigFileError, yaml_error_line
from bigfleet_trio.kube.authz import KubeAuthorizer, review_client
from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig, load_kubeconfig
from bigfleet_trio.kube.leader import LeaderElector, lease_client, lease_namespace
from bigfleet_trio.kube.startup import REACH_BUDGET, check_reachable
from bigfleet_trio.observability import stdmetrics
from bigfleet_trio.observability.http import separate_probe_listener, serve_observability
from bigfleet_trio.observability.looplag import watch_loop_lag
from bigfleet_trio.observability.metrics import BinaryRegistry
from bigfleet_trio.observability.tls import serving_certificate

from .controller import CONTROLLER_NAME, PodController
from .defaults import (
    PriorityClassDefaults,
    PriorityClassDefaultsError,
    load_priority_class_defaults,
)

__all__ = [
    "run_pod_controller",
    "serve_pod_controller",
    "leader_identity",
    "pod_controller_readiness",
]

if TYPE_CHECKING:  # the binary's settings compose this package's own: no runtime import
    from bigfleet_trio.config import PodControllerConfig

log = logging.getLogger(__name__)

COMMAND = "pod-controller"


def leader_identity() -> str:
    """Lease holder identity: ``$POD_NAME`` (downward API) or hostname, plus a random suffix.

    client-go's convention (``hostname_<uuid>``) so two processes on one host never collide.
    """
    base = os.environ.get("POD_NAME") or socket.gethostname() or "pod-controller"
    return f"{base}_{uuid.uuid4()}"


def pod_controller_readiness(
    ctl: PodController, *, leader_elect: bool, elector: LeaderElector | None = None
) -> tuple[bool, str | list[str]]:
    """``/readyz`` of a pod controller: the controller's own answer, except that without leader
    election there is no lease to lead, so a running controller is "synced, workers running"
    rather than "leader"; a standby whose Lease is refused (403, missing namespace) is not
    ready, with that reason (it could never take over)."""
    if elector is not None and not elector.is_leader and elector.last_error:
        return False, [f"not the leader ({elector.last_error})"]
    ok, detail = ctl.readiness()
    if ok and not leader_elect:
        return True, "synced, workers running"
    return ok, detail


async def serve_pod_controller(
    cfg: PodControllerConfig,
    kube_config: KubeConfig,
    defaults: PriorityClassDefaults | None,
    *,
    freeze_heap: bool = False,
    task_status: trio.TaskStatus[PodController] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the pod controller until cancelled.

    ``freeze_heap``: keep the caches out of the garbage collector's full passes (the process
    entry point sets it; docs/kube-api.md#garbage-collector).

    Opens the KubeClient (``cfg.qps``/``cfg.burst``), the diagnostics listener(s)
    (``cfg.metrics_addr``; ``cfg.health_probe_addr`` as a second listener when set), and the
    controller (optionally under leader election).

    Raises:
        SyncTimeout: the caches did not sync within ``cfg.sync_timeout``.
        OSError: a listener address cannot be bound.
    """
    agent = f"bigfleet-trio/{CONTROLLER_NAME}"
    async with contextlib.AsyncExitStack() as clients:
        client = await clients.enter_async_context(
            KubeClient(kube_config, qps=cfg.qps, burst=cfg.burst, user_agent=agent,
                       protobuf=cfg.kube_protobuf))
        ctl = PodController(client, defaults, workers=cfg.workers, sync_timeout=cfg.sync_timeout,
                            watch_list=cfg.watch_list, freeze_heap=freeze_heap,
                            scope=cfg.pod_scope())
        elector = None
        if cfg.leader_elect:
            lease_ns, source = lease_namespace(cfg.leader_election_namespace)
            # Renewals on a client of their own (docs/rules.md#leadership-loss).
            elector = LeaderElector(
                await clients.enter_async_context(lease_client(kube_config, agent)),
                name=cfg.leader_election_id, namespace=lease_ns, identity=leader_identity(),
                lease_duration=cfg.leader_elect_lease_duration,
                renew_deadline=cfg.leader_elect_renew_deadline,
                retry_period=cfg.leader_elect_retry_period)
            log.info("pod controller leader election",
                     extra={"lease": f"{lease_ns}/{cfg.leader_election_id}",
                            "lease_namespace_from": source})
        if elector is None:
            stdmetrics.acting_alone(cfg.leader_election_id)  # docs/operate.md#bigfleetnoleader
        readiness = partial(pod_controller_readiness, ctl, leader_elect=elector is not None,
                            elector=elector)
        async with trio.open_nursery() as nursery:
            # Runs until the nursery is cancelled, like the diagnostics listeners.
            await nursery.start(watch_loop_lag)
            auth = (KubeAuthorizer(await clients.enter_async_context(
                review_client(kube_config, agent))) if cfg.metrics_auth else None)
            tls = serving_certificate(cfg.metrics_tls(), cfg.metrics_addr)
            listeners = [partial(serve_observability, cfg.metrics_addr, readiness=readiness,
                                 registry=BinaryRegistry(COMMAND), auth=auth, tls=tls,
                                 profiling=cfg.enable_profiling)]
            if cfg.health_probe_addr and separate_probe_listener(cfg.health_probe_addr,
                                                                 cfg.metrics_addr):
                listeners.append(partial(serve_observability, cfg.health_probe_addr,
                                         readiness=readiness, probes_only=True))
            for listener in listeners:
                bound = await nursery.start(listener)
                if bound:
                    log.info("pod controller diagnostics listening", extra={"addr": bound})
            log.info("pod controller starting",
                     extra={"server": kube_config.server, "workers": cfg.workers, "qps": cfg.qps,
                            "burst": cfg.burst, "leader_elect": cfg.leader_elect,
                            "defaults_classes": len(defaults) if defaults else 0,
                            "unmanaged_node_selectors": list(cfg.unmanaged_node_selector),
                            "exclude_namespaces": list(cfg.exclude_namespace),
                            "exclude_pod_selector": cfg.exclude_pod_selector})
            await nursery.start(partial(ctl.run, elector=elector))
            task_status.started(ctl)


def run_pod_controller(cfg: PodControllerConfig) -> int:
    """The ``bigfleet-trio pod-controller`` process. Blocks until SIGINT/SIGTERM.

    Args:
        cfg: the settings (validated here again: callers other than the CLI may skip it).

    Returns:
        0 after a signal.

    Raises:
        ConfigError / PriorityClassDefaultsError / KubeConfigError / SyncTimeout / OSError:
            start-up problems (bad settings or defaults file, no kubeconfig, caches not synced
            in time, an apiserver that takes no connection within about 30 s, a listener that
            cannot bind), unwrapped from Trio's exception groups; the
            CLI prints ``pod-controller: <reason>`` and exits 1, as for the operator.
    """
    from bigfleet_trio.observability.logs import setup_logging
    from bigfleet_trio.process import announce, run_trio

    cfg.validate()
    setup_logging(cfg.log_format, cfg.log_level)
    try:
        defaults = load_priority_class_defaults(cfg.priority_class_defaults)
    except PriorityClassDefaultsError as exc:
        if isinstance(exc.__cause__, yaml.YAMLError) and cfg.priority_class_defaults:
            where = yaml_error_line(cfg.priority_class_defaults, exc.__cause__)
            raise ConfigFileError(f"priority-class-defaults: {where}") from exc
        raise ConfigFileError(str(exc)) from exc
    kube_config = load_kubeconfig(cfg.kubeconfig)

    async def main() -> None:
        # a dead apiserver ends the start in ~30 s, not --sync-timeout (docs/operate.md)
        await check_reachable(kube_config, budget=min(REACH_BUDGET, cfg.sync_timeout))
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(serve_pod_controller, cfg, kube_config, defaults,
                                           freeze_heap=True))
                async for signum in signals:
                    log.info("pod controller stopping",
                             extra={"signal": signal.Signals(signum).name})
                    break
                nursery.cancel_scope.cancel()

    announce(COMMAND)  # after the start-up checks: a failed one stays a single line
    run_trio(main)
    return 0
