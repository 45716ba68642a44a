"""Faults of the real control plane under both binaries (processes, tests/realkube/agent.py):
leader election on a real Lease with the leader killed -9, and an apiserver restart with etcd
compacted meanwhile (watches resumed from a compacted resourceVersion get 410 Gone and relist),
with nothing lost: every CONFIGURED machine's Node included, one of them refused while the
apiserver was down (the sim shard retries registration as a kubelet does)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from bigfleet_trio.kube.resources import (
    CAPACITY_REQUESTS,
    DEPLOYMENTS,
    LEASES,
    NODES,
    PODS,
    UPCOMING_NODES,
)
from bigfleet_trio.sim.shard.catalog import LABEL_INSTANCE_TYPE, Catalog, MachineShape, ShapeTaint
from bigfleet_trio.sim.shard.nodes import KubeNodeHooks
from bigfleet_trio.sim.shard.session import SimShard
from tests.realkube.agent import (
    acknowledged,
    agent_in_namespace,
    container,
    deployment,
    phase,
)
from tests.sim.test_shard_session import CFG, configured_session
from tests.support.realkube import NS, RealKube

LEASE = "bigfleet-operator"
#: What the restart test restarts afterwards (see there), in start order.
RESTARTED_AFTER = ("kube-controller-manager", "kube-scheduler", "kwok")


def bare_pod(name: str) -> dict[str, Any]:
    """A Pod with no controller, labelled ``app=bare``."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "bare"}},
            "spec": {"containers": [container("1")]}}


@asynccontextmanager
async def inprocess_shard(rk: RealKube) -> AsyncIterator[tuple[SimShard, trio.Nursery]]:
    """A second sim shard, in this process, registering Nodes on the control plane with the admin
    identity and a client that makes one attempt per request (so a refusal reaches the shard's
    own retry). One machine, tainted NoSchedule so kube-scheduler puts nothing on its Node; the
    Node is deleted on exit.

    The taint's key is the instance-type label's, which the roll-up of
    :func:`configured_session` selects (Exists): the dedicated-pool pattern, so the shard counts
    the tainted machine as capacity for that need (docs/deviations.md, section 13, item 4). With
    a key no need selects, the shard never bootstraps it."""
    shape = MachineShape("down", "z-a", {"cpu": "2", "memory": "4Gi"}, 0.1, count=1, warm=1,
                         taints=(ShapeTaint(LABEL_INSTANCE_TYPE, "", "NoSchedule"),))
    async with rk.client(max_attempts=1) as client, trio.open_nursery() as nursery:
        shard = SimShard(Catalog([shape]), CFG, hooks=KubeNodeHooks(client))
        await nursery.start(shard.run)
        try:
            yield shard, nursery
        finally:
            nursery.cancel_scope.cancel()
            with trio.CancelScope(shield=True), trio.move_on_after(30):
                async with rk.client() as admin:
                    for m in shard.engine.machines:
                        try:
                            await admin.delete(NODES, m.node_name)
                        except Exception:  # noqa: BLE001 - cleanup: absent is fine
                            pass


async def test_leader_killed_another_replica_takes_over_the_real_lease(
    realkube: RealKube, tmp_path: Path
) -> None:
    async with agent_in_namespace(realkube, tmp_path, "lease", operators=2,
                                  leader_elect=True) as (a, ns):
        kube = a.admin
        leases = await a.record(LEASES, NS)

        async def held() -> bool:
            return bool((await kube.get(LEASES, LEASE, NS))["spec"].get("holderIdentity"))

        await a.until("a leader", held)
        lease = await kube.get(LEASES, LEASE, NS)
        first = lease["spec"]["holderIdentity"].split("_")[0]
        other = next(n for n in ("operator-0", "operator-1") if n != first)
        await a.ready(first)
        await kube.create(DEPLOYMENTS, deployment("web", 1), ns)
        await acknowledged(a, ns, "web", 1)  # the leader acts

        a.kill(first)  # kill -9: no release, the Lease must expire
        duration = int(lease["spec"]["leaseDurationSeconds"])

        async def taken_over() -> bool:
            spec = (await kube.get(LEASES, LEASE, NS))["spec"]
            return str(spec.get("holderIdentity", "")).startswith(f"{other}_")

        # the clause's bound (lease duration + 5 s) as the wait's deadline
        await a.until(f"{other} to take the Lease", taken_over, duration + 5)

        def holders_of(seen: list[dict[str, Any]]) -> list[str]:
            return [(v["spec"].get("holderIdentity") or "").split("_")[0]
                    for v in seen if v["metadata"]["name"] == LEASE]

        # the GET above can see the take-over before the watch delivers it
        await a.until_recorded(f"{other}'s take-over", leases,
                               lambda seen: other in holders_of(seen))
        holders = holders_of(leases)
        # the first leader renewed until killed, then the other held it: never back
        assert holders[-1] == other and first not in holders[holders.index(other):], holders
        after = await kube.get(LEASES, LEASE, NS)
        assert after["spec"]["leaseTransitions"] == lease["spec"].get("leaseTransitions", 0) + 1
        # the new leader acts: a new Pod's CR is acknowledged
        await a.ready(other)
        await kube.patch(DEPLOYMENTS, "web", {"spec": {"replicas": 2}}, ns)
        await acknowledged(a, ns, "web", 2)


async def test_apiserver_restart_and_etcd_compaction_relist_and_lose_nothing(
    realkube: RealKube, tmp_path: Path
) -> None:
    cp = realkube.cp
    try:
        async with (agent_in_namespace(realkube, tmp_path, "restart") as (a, ns),
                    inprocess_shard(realkube) as (down_shard, down_nursery)):
            kube = a.admin
            await kube.create(DEPLOYMENTS, deployment("web", 2), ns)
            await acknowledged(a, ns, "web", 2)
            expired_before = {name: await a.metric(name, "bigfleet_informer_relists_total",
                                                   reason="expired")
                              for name in ("pod-controller", "operator")}

            # Down: the informers' watches break. etcd moves on and is compacted past every
            # resourceVersion they hold, so their resumed watches are refused 410 Gone.
            await trio.to_thread.run_sync(cp.stop_component, "kube-apiserver")
            # Meanwhile a machine of the second sim shard reaches CONFIGURED: its Node
            # registration is refused (connection refused) and must land once the apiserver is
            # back, as a kubelet's would.
            with trio.fail_after(60):  # a shard that never bootstraps fails here, not hangs
                _, down_node = await configured_session(down_shard, down_nursery)
            assert down_shard.hook_errors >= 1, a.logs()
            cp.bump_etcd_revision(20)
            cp.compact_etcd()
            await trio.to_thread.run_sync(cp.start_component, "kube-apiserver")

            # Changes right after the restart are all seen: two new Pods, then one of them deleted.
            # Bare Pods, not a Deployment's: kube-controller-manager's own informers recover from
            # the compaction on their own schedule (its ReplicaSet controller once took more than
            # 90 s to replace a deleted Pod here), and this test is about our informers, not its.
            for i in range(2):
                await kube.create(PODS, bare_pod(f"bare-{i}"), ns)
            await acknowledged(a, ns, "bare", 2, total=4)
            victim = await kube.get(PODS, "bare-0", ns)
            # At once (grace period 0): a graceful deletion of a Pod the scheduler bound would
            # wait for kwok's kubelet to confirm it, and kwok's informers recover from the
            # compaction on their own schedule too. The Pod's DELETED is what ours must see.
            await kube.delete(PODS, "bare-0", ns, grace_period_seconds=0)
            await acknowledged(a, ns, "bare", 1, total=3)  # the victim's CR gone with it
            crs = (await kube.list(CAPACITY_REQUESTS, ns)).items
            assert victim["metadata"]["uid"] not in {
                c["metadata"]["ownerReferences"][0]["uid"] for c in crs}
            await acknowledged(a, ns, "web", 2, total=3)  # the Deployment's CRs untouched
            # the operator's side too: every machine's UpcomingNode reached Ready (a 403 from the
            # restarting apiserver once lost a CONFIGURED update here).
            async def upcoming_ready() -> bool:
                ups = (await kube.list(UPCOMING_NODES)).items
                return bool(ups) and all(phase(u) == "Ready" for u in ups)

            await a.until("every UpcomingNode Ready after the restart", upcoming_ready)

            # ... and every CONFIGURED machine's Node exists: the sim shard, standing in for the
            # cloud and the kubelet, retries a refused registration with backoff as a kubelet
            # does (docs/deviations.md, "Simulated shard: Node registration retried").
            async def nodes_registered() -> bool:
                ups = [u for u in (await kube.list(UPCOMING_NODES)).items if phase(u) == "Ready"]
                nodes = {n["metadata"]["name"] for n in (await kube.list(NODES)).items}
                return bool(ups) and all(
                    (u.get("status", {}).get("nodeRef") or {}).get("name") in nodes for u in ups)

            await a.until("every CONFIGURED machine's Node registered", nodes_registered)

            async def down_node_registered() -> bool:
                names = {n["metadata"]["name"] for n in (await kube.list(NODES)).items}
                return down_node in names and down_shard.snapshot()["node_hooks_pending"] == 0

            await a.until("the Node refused while the apiserver was down registered",
                          down_node_registered)
            assert down_shard.snapshot()["node_hook_retries"] >= 1
            for name, before in expired_before.items():
                after = await a.metric(name, "bigfleet_informer_relists_total", reason="expired")
                assert after > before, (name, before, after, a.logs())
    finally:
        # The control plane is shared by the session: give the later tests controllers, a
        # scheduler and fake kubelets whose informers are fresh (see above), as an operator
        # restarting them after such an outage would. The apiserver first, if the test ended
        # while it was down.
        if "kube-apiserver" not in cp.procs:
            await trio.to_thread.run_sync(cp.start_component, "kube-apiserver")
        for comp in RESTARTED_AFTER:
            if comp != "kwok" or cp.binaries.kwok is not None:
                await trio.to_thread.run_sync(cp.restart, comp)
