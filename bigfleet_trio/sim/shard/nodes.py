"""Kubernetes Node registration for simulated machines: a Node for each Configured machine,
through the Kubernetes API.

:class:`KubeNodeHooks` implements :class:`~bigfleet_trio.sim.shard.session.NodeHooks` with the
project's raw-httpx client: a Configured machine becomes a Ready Node named after its
``node_name`` (labels, providerID, taints, capacity = allocatable), kept alive as a kubelet
keeps it (:mod:`.heartbeat`); a released machine's Node is deleted. :func:`node_manifest` is the
pure part and is what tests check.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import trio

from .engine import MachineInfo
from .heartbeat import (
    DEFAULT_TIMING,
    NODE_LEASE_NAMESPACE,
    HeartbeatTiming,
    NodeHeartbeats,
    lease_manifest,
)

log = logging.getLogger(__name__)

ANNOTATION_MACHINE_ID = "bigfleet.lucy.sh/machine-id"


def node_manifest(machine: MachineInfo, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """The core/v1 Node a simulated kubelet would register for this machine (status Ready).

    Returns a JSON-ready dict with ``metadata.name = machine.node_name``, the machine's labels, an
    annotation carrying the machine id, ``spec.providerID``, ``spec.taints``, and
    ``status.capacity``/``allocatable`` = the machine's allocatable, condition Ready=True.
    """
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": machine.node_name,
            "labels": dict(machine.labels),
            "annotations": {ANNOTATION_MACHINE_ID: machine.machine_id},
        },
        "spec": {"providerID": machine.provider_id},
        "status": node_status(machine, stamp),
    }
    if machine.taints:
        node["spec"]["taints"] = [
            {"key": t.key, "value": t.value, "effect": t.effect} if t.value
            else {"key": t.key, "effect": t.effect}
            for t in machine.taints
        ]
    return node


def node_status(machine: MachineInfo, stamp: str) -> dict[str, Any]:
    """``status`` of a Ready simulated Node (capacity = allocatable)."""
    return {
        "capacity": dict(machine.allocatable),
        "allocatable": dict(machine.allocatable),
        "conditions": [{
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "simulated kubelet is posting ready status",
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }],
        "nodeInfo": {
            "architecture": machine.labels.get("kubernetes.io/arch", "amd64"),
            "operatingSystem": machine.labels.get("kubernetes.io/os", "linux"),
            "kubeletVersion": "v1.31.0-sim",
            "containerRuntimeVersion": "sim://1.0",
            "kernelVersion": "",
            "osImage": "bigfleet-trio simulated node",
            "kubeProxyVersion": "",
            "machineID": machine.machine_id,
            "systemUUID": machine.machine_id,
            "bootID": machine.machine_id,
        },
    }


class KubeNodeHooks:
    """Create/delete Nodes through a :class:`bigfleet_trio.kube.KubeClient` (owned by the caller),
    and keep the registered ones' heartbeats (:mod:`.heartbeat`) while :meth:`run` runs
    (:meth:`SimShard.run <bigfleet_trio.sim.shard.session.SimShard.run>` runs it).

    Create: POST the Node; on AlreadyExists merge-patch its metadata/spec instead; then
    merge-patch the ``status`` subresource (an apiserver drops status on create), write its
    Lease and start its heartbeats. Delete: stop its heartbeats, DELETE, NotFound ignored. Both
    are idempotent; errors propagate (the shard retries the call with backoff: :mod:`.noderetry`).
    """

    def __init__(self, client: Any, timing: HeartbeatTiming = DEFAULT_TIMING) -> None:
        self.client = client
        self.heartbeats = NodeHeartbeats(client, timing=timing)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Renew the registered Nodes' Leases and status until cancelled."""
        await self.heartbeats.run(task_status=task_status)

    async def on_machine_configured(self, machine: MachineInfo) -> None:
        """Register the machine's Node, mark it Ready and start its heartbeats."""
        from bigfleet_trio.kube.errors import AlreadyExists
        from bigfleet_trio.kube.resources import NODES

        body = node_manifest(machine)
        try:
            node = await self.client.create(NODES, body)
        except AlreadyExists:
            node = await self.client.patch(
                NODES, machine.node_name,
                {"metadata": {"labels": body["metadata"]["labels"],
                              "annotations": body["metadata"]["annotations"]},
                 "spec": {**body["spec"], "unschedulable": None}},
            )
        await self.client.patch(NODES, machine.node_name, {"status": body["status"]},
                                subresource="status")
        await self._node_lease(node)
        self.heartbeats.add(machine.node_name, node["metadata"].get("uid", ""))
        log.info("node registered node=%s machine=%s", machine.node_name, machine.machine_id)

    async def _node_lease(self, node: dict[str, Any]) -> None:
        """The kubelet's heartbeat Lease (``kube-node-lease/<node>``, owned by the Node so it
        goes with it), which ``kubectl describe node`` shows and the node lifecycle controller
        reads; renewed from then on by :class:`~.heartbeat.NodeHeartbeats`."""
        from bigfleet_trio.kube.client import rfc3339_micro
        from bigfleet_trio.kube.errors import AlreadyExists
        from bigfleet_trio.kube.resources import LEASES

        meta = node["metadata"]
        lease = lease_manifest(meta["name"], meta.get("uid", ""),
                               rfc3339_micro(dt.datetime.now(dt.UTC)), self.heartbeats.timing)
        try:
            await self.client.create(LEASES, lease, NODE_LEASE_NAMESPACE)
        except AlreadyExists:
            await self.client.patch(LEASES, meta["name"], {"spec": lease["spec"]},
                                    NODE_LEASE_NAMESPACE)

    async def existing_nodes(self, cluster_id: str) -> list[tuple[str, str]]:
        """``(name, providerID)`` of the cluster's Nodes with a ``sim://`` provider ID (a
        restarted shard's machines), their heartbeats resumed: they are this shard's Nodes.
        ``cluster_id`` is the client's cluster (one client, one cluster)."""
        from bigfleet_trio.kube.resources import NODES

        listing = await self.client.list(NODES)
        out: list[tuple[str, str]] = []
        for node in listing.items:
            meta, spec = node.get("metadata") or {}, node.get("spec") or {}
            provider = spec.get("providerID") or ""
            if isinstance(provider, str) and provider.startswith("sim://") and meta.get("name"):
                out.append((meta["name"], provider))
                self.heartbeats.add(meta["name"], meta.get("uid", ""))
        return out

    async def on_machine_released(self, machine: MachineInfo) -> None:
        """Stop the machine's Node heartbeats and delete the Node."""
        from bigfleet_trio.kube.errors import NotFound
        from bigfleet_trio.kube.resources import NODES

        self.heartbeats.remove(machine.node_name)
        try:
            await self.client.delete(NODES, machine.node_name)
        except NotFound:
            pass
        log.info("node deleted node=%s machine=%s", machine.node_name, machine.machine_id)


class ClusterNodeHooks:
    """:class:`KubeNodeHooks` per cluster, behind one hooks object for a fleet shard: each call
    goes to the hooks of ``machine.cluster_id`` (a machine's Node lives in the cluster it is
    bound to). :meth:`run` owns every cluster's heartbeats, also of clusters added later.

    Raises (from the hook calls): KeyError for a cluster never :meth:`add` ed, so the shard
    retries until the cluster is added (docs/deviations.md, "Node registration retried").
    """

    def __init__(self) -> None:
        self.hooks: dict[str, KubeNodeHooks] = {}
        self._nursery: trio.Nursery | None = None

    def add(self, cluster_id: str, hooks: KubeNodeHooks) -> None:
        """Route ``cluster_id``'s Nodes to ``hooks`` (its heartbeats start if :meth:`run` runs)."""
        self.hooks[cluster_id] = hooks
        if self._nursery is not None:
            self._nursery.start_soon(hooks.run)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Keep every cluster's Nodes alive until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                for hooks in self.hooks.values():
                    nursery.start_soon(hooks.run)
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    async def on_machine_configured(self, machine: MachineInfo) -> None:
        """Register the Node in the machine's cluster."""
        await self.hooks[machine.cluster_id].on_machine_configured(machine)

    async def on_machine_released(self, machine: MachineInfo) -> None:
        """Delete the Node from the machine's cluster."""
        await self.hooks[machine.cluster_id].on_machine_released(machine)

    async def existing_nodes(self, cluster_id: str) -> list[tuple[str, str]]:
        """The cluster's Nodes of this shard (none for a cluster never added)."""
        hooks = self.hooks.get(cluster_id)
        return [] if hooks is None else await hooks.existing_nodes(cluster_id)
