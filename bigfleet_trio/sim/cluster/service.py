"""Running the simulated cluster services together, and ``bigfleet-trio sim cluster``.

``sim cluster --port P --kubeconfig-out PATH`` serves the embedded apiserver with the workload
controllers and the scheduler beside it (one process); ``sim cluster --kubeconfig PATH`` runs only
the controllers and the scheduler against an apiserver that is already up (any apiserver).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

import trio

from bigfleet_trio.excgroups import find_in_group
from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import load_kubeconfig
from bigfleet_trio.kube.informer import Informer, drop_managed_fields
from bigfleet_trio.kube.resources import PODS

from .controllers import OWNER_INDEX, WorkloadControllers, _owner_index
from .scheduler import PodScheduler

log = logging.getLogger(__name__)

__all__ = ["ClusterServices", "run_cli", "run_cluster_services"]


@dataclass
class ClusterServices:
    """What :func:`run_cluster_services` started (for tests and the demo to inspect)."""

    pods: Informer
    controllers: WorkloadControllers
    scheduler: PodScheduler


async def run_cluster_services(
    client: KubeClient,
    *,
    job_run_seconds: float | None = 30.0,
    scheduler_interval: float = 0.2,
    task_status: trio.TaskStatus[ClusterServices] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the workload controllers and the scheduler over one shared Pod informer until
    cancelled; ``started`` (with a :class:`ClusterServices`) once every cache synced.

    Args:
        client: the :class:`KubeClient` (owned by the caller).
        job_run_seconds: how long a Job's Pod runs once Running (None: never finishes).
        scheduler_interval: minimum seconds between placement passes.
    """
    pods = Informer(client, PODS, transform=drop_managed_fields,
                    indexers={OWNER_INDEX: _owner_index})
    controllers = WorkloadControllers(client, pods=pods)
    scheduler = PodScheduler(client, pods=pods, interval=scheduler_interval,
                             job_run_seconds=job_run_seconds)
    async with trio.open_nursery() as nursery:
        await nursery.start(pods.run)
        await nursery.start(controllers.run)
        await nursery.start(scheduler.run)
        task_status.started(ClusterServices(pods, controllers, scheduler))


def run_cli(
    *,
    kubeconfig: str | None = None,
    port: int = 0,
    kubeconfig_out: str | None = None,
    job_run_seconds: float | None = 30.0,
    engine: str = "hypercorn",
) -> int:
    """``bigfleet-trio sim cluster``: serve until SIGINT/SIGTERM (see the module docstring).

    Returns:
        0 after a signal; 1 with one line ``sim cluster: <what>`` on stderr when the kubeconfig
        cannot be read or written or the port cannot be bound.
    """
    if kubeconfig is None and kubeconfig_out is None:
        print("sim cluster: --kubeconfig-out (serve an apiserver) or --kubeconfig (use a running "
              "one) is required", file=sys.stderr)
        return 1
    if kubeconfig is None and kubeconfig_out is not None:
        parent = os.path.dirname(os.path.abspath(kubeconfig_out))
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            print(f"sim cluster: cannot write kubeconfig {kubeconfig_out}: {parent} is not a "
                  "writable directory", file=sys.stderr)
            return 1

    async def main() -> None:
        from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig

        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                path = kubeconfig
                if path is None:
                    assert kubeconfig_out is not None
                    server = ApiServer()
                    url = await nursery.start(
                        lambda task_status: serve(server, host="127.0.0.1", port=port,
                                                  engine=engine, task_status=task_status))
                    write_kubeconfig(url, kubeconfig_out)
                    path = kubeconfig_out
                    where = f"apiserver listening on {url}; kubeconfig written to {path}"
                else:
                    where = f"using the apiserver of {path}"
                cfg = load_kubeconfig(path, env={})
                async with KubeClient(cfg, qps=0, user_agent="bigfleet-sim-cluster") as client:
                    await nursery.start(lambda task_status: run_cluster_services(
                        client, job_run_seconds=job_run_seconds, task_status=task_status))
                    print(f"{where}; workload controllers (Deployment, ReplicaSet, StatefulSet, "
                          "Job) and scheduler running", flush=True)
                    async for _sig in signals:
                        break
                    nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    except KeyboardInterrupt:
        return 0
    except (OSError, BaseExceptionGroup) as exc:
        from bigfleet_trio.kube.errors import KubeConfigError

        cfg_err: Any = find_in_group(exc, KubeConfigError)
        if cfg_err is not None:
            print(f"sim cluster: {cfg_err}", file=sys.stderr)
            return 1
        err = find_in_group(exc, OSError)
        if err is None:
            raise
        print(f"sim cluster: cannot listen on 127.0.0.1:{port}: {err}", file=sys.stderr)
        return 1
    return 0
