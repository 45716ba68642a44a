"""A pod-controller leadership flap in the middle of a 20,000-Pod backlog, through real processes
(``bigfleet-trio sim apiserver`` and ``bigfleet-trio pod-controller --leader-elect`` over HTTP):
the Lease is taken by another identity while the controller works through its initial backlog,
the controller stops its workers and campaigns again in the same process, the other identity
releases the Lease, and every Pod ends with its CapacityRequest. A key lost by a worker
cancelled inside the work queue's ``get()`` would leave its Pod without one until a restart
(docs/rules.md#leadership-loss)."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import httpx
import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import load_kubeconfig
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, LEASES, PODS
from scripts.bench._podcontroller_probe import create_pods
from tests.support.ports import free_port
from tests.support.realkube import until
from tests.support.simproc import sim_apiserver_process

BIN = str(Path(sys.executable).parent / "bigfleet-trio")
PODS_IN_BACKLOG = 20_000
LEASE = "bigfleet-unschedulable-pod-controller"  # the pod controller's default Lease
INTRUDER = "another-replica"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def _leading(metrics: str) -> float | None:
    """``leader_election_master_status`` on the controller's /metrics (None: not serving)."""
    try:
        async with httpx.AsyncClient(timeout=5) as c:
            text = (await c.get(f"http://{metrics}/metrics")).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("leader_election_master_status{"):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_a_leadership_flap_in_a_20000_pod_backlog_leaves_every_pod_with_its_cr(
    tmp_path: Path,
) -> None:
    with sim_apiserver_process(tmp_path, authorization_mode="AlwaysAllow") as kubeconfig:
        await create_pods(kubeconfig, PODS_IN_BACKLOG, 32)
        metrics = f"127.0.0.1:{free_port()}"
        log_path = tmp_path / "pod-controller.log"

        def logs() -> str:
            return log_path.read_text(errors="replace")[-4000:]

        async with (KubeClient(load_kubeconfig(kubeconfig, env={})) as admin,
                    trio.open_nursery() as nursery):
            with open(log_path, "ab") as log:  # noqa: ASYNC230 - a local file
                proc = await nursery.start(partial(
                    trio.run_process,
                    [BIN, "pod-controller", "--kubeconfig", kubeconfig, "--leader-elect",
                     "--leader-election-namespace", "default", "--metrics-addr", metrics],
                    stdout=log, stderr=log, check=False,
                    env={**os.environ, "POD_NAME": "pod-controller-0"}))
            try:
                crs_seen = 0

                async def crs() -> int:
                    nonlocal crs_seen
                    await trio.sleep(1.0)  # a LIST of thousands: not at until()'s 0.3 s pace
                    crs_seen = len((await admin.list(CAPACITY_REQUESTS, "default")).items)
                    return crs_seen

                async def under_way() -> bool:
                    return await crs() >= PODS_IN_BACKLOG // 20

                await until("the backlog under way", under_way, 120, logs,
                            lambda: f"{crs_seen} CRs")
                assert crs_seen < PODS_IN_BACKLOG // 2, "the backlog was done before the flap"

                # Another identity takes the Lease (as one whose clock says ours expired would).
                lease = await admin.get(LEASES, LEASE, "default")
                spec = lease["spec"]
                assert spec["holderIdentity"].startswith("pod-controller-0")
                spec.update(holderIdentity=INTRUDER, acquireTime=_now(), renewTime=_now(),
                            leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1)
                await admin.update(LEASES, lease, "default")

                async def lost() -> bool:
                    return await _leading(metrics) == 0.0

                await until("the controller to give up the Lease", lost, 60, logs)
                at_loss = await crs()
                assert at_loss < PODS_IN_BACKLOG, "the backlog was done during the flap"

                # ... and releases it, as client-go's ReleaseOnCancel does.
                lease = await admin.get(LEASES, LEASE, "default")
                lease["spec"].update(holderIdentity="", leaseDurationSeconds=1,
                                     renewTime=_now())
                await admin.update(LEASES, lease, "default")

                async def every_pod_has_its_cr() -> bool:
                    await trio.sleep(2.0)  # two LISTs of 20,000
                    pods = {p["metadata"]["uid"]
                            for p in (await admin.list(PODS, "default")).items}
                    owners = {c["metadata"]["ownerReferences"][0]["uid"]
                              for c in (await admin.list(CAPACITY_REQUESTS, "default")).items}
                    nonlocal crs_seen
                    crs_seen = len(owners)
                    return len(pods) == PODS_IN_BACKLOG and owners == pods

                await until("every Pod with its CR after the flap", every_pod_has_its_cr, 300,
                            logs, lambda: f"{crs_seen} of {PODS_IN_BACKLOG} Pods with a CR")
                assert await _leading(metrics) == 1.0  # leading again, in the same process
                assert proc.returncode is None
            finally:
                proc.terminate()
                with trio.move_on_after(15):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                nursery.cancel_scope.cancel()
