"""Workload generation of the ``fleet`` bench: the fleet catalog and the workload clones (pure).

:func:`fleet_catalog` sizes a two-shape catalog to ``--machines``; :func:`fleet_workloads` clones
the bundled real manifests into ~``--pods`` Pods, one Profile per clone. Private to
:mod:`scripts.bench.fleet` (the leading underscore keeps it out of scenario discovery).
"""

from __future__ import annotations

import copy
import json
import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

GPU = "nvidia.com/gpu"


def fleet_catalog(machines: int) -> dict[str, Any]:
    """A catalog of ~``machines`` machines in 3 zones: 8-core general purpose (2% warm) and
    2-GPU L4 machines (2% of the fleet, tainted as on GKE)."""
    gpu = max(3, machines // 50) // 3
    general = max(1, (machines - 3 * gpu) // 3)
    pods = {"pods": "110", "ephemeral-storage": "100Gi"}
    return {
        "zones": ["sim-zone-a", "sim-zone-b", "sim-zone-c"],
        "shapes": [
            {"instanceType": "sim-standard-8", "pricePerHour": 0.38, "count": general,
             "warm": max(1, general // 50),
             "allocatable": {"cpu": "8", "memory": "32Gi", **pods},
             "labels": {"cloud.google.com/compute-class": "Balanced"}},
            {"instanceType": "g2-standard-24", "pricePerHour": 2.0, "count": gpu,
             "allocatable": {"cpu": "24", "memory": "96Gi", GPU: "2", **pods},
             "labels": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
             "taints": [{"key": GPU, "value": "present", "effect": "NoSchedule"}]},
        ],
    }


def _set_requests(spec: dict[str, Any], cpu: str, memory: str) -> None:
    for c in spec.get("containers") or []:
        res = c.setdefault("resources", {})
        gpu = (res.get("limits") or {}).get(GPU) or (res.get("requests") or {}).get(GPU)
        res["requests"] = {"cpu": cpu, "memory": memory, **({GPU: gpu} if gpu else {})}
        res["limits"] = {GPU: gpu} if gpu else {}
    for c in spec.get("initContainers") or []:
        c.pop("resources", None)


def _co_locate_with_itself(spec: dict[str, Any], name: str) -> None:
    """Point each required podAffinity term of a clone at the clone's own Pods (``app: name``).

    The clones are relabelled ``app: <clone>``, so a term kept from the source manifest (the MySQL
    router's ``app In (mysql)`` on the zone) would select no Pod of the fleet. kube-scheduler
    places a Pod with a required podAffinity term only in a topology domain already running a Pod
    the term selects, or -- while no Pod matches -- if the Pod matches its own term; a term that
    selects nothing leaves every Pod of the clone Pending for ever on a real control plane. The
    clone keeps the term's topology key: one co-location group per clone. Anti-affinity and
    spread terms keep the source's selectors (they select nothing, so they never block).
    """
    pod_affinity = (spec.get("affinity") or {}).get("podAffinity") or {}
    for term in pod_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or []:
        term["labelSelector"] = {"matchLabels": {"app": name}}


@dataclass
class Workload:
    """One workload clone: kind, namespace, name, base size, and its body."""

    kind: str
    namespace: str
    name: str
    replicas: int
    body: dict[str, Any]
    gen: int = 0

    @property
    def scalable(self) -> bool:
        return self.kind in ("Deployment", "StatefulSet")


def fleet_workloads(pods: int, per_profile: int, seed: int,
                    job_share: float = 0.2) -> tuple[list[dict[str, Any]], list[Workload]]:
    """PriorityClasses and workload clones of the bundled manifests adding up to ~``pods`` Pods.

    Each clone gets its own cpu/memory requests (one Profile per clone), label ``app: <name>``
    (own selector), ~``per_profile`` replicas (GPU clones: 10); StatefulSets ``Parallel``;
    ``job_share`` of the CPU clones are Jobs, the rest 3:1 Deployments:StatefulSets. A clone's
    required podAffinity terms select the clone's own Pods (:func:`_co_locate_with_itself`).
    """
    from bigfleet_trio.sim.demo_world import bundled_workloads_dir, manifest_paths
    from bigfleet_trio.sim.expand import load_manifests

    objs = load_manifests(manifest_paths(bundled_workloads_dir()))
    classes = [o for o in objs if o.get("kind") == "PriorityClass"]
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for o in objs:
        if o.get("kind") in ("Deployment", "StatefulSet", "Job"):
            spec = ((o.get("spec") or {}).get("template") or {}).get("spec") or {}
            is_gpu = any(GPU in json.dumps(c.get("resources") or {})
                         for c in spec.get("containers") or [])
            by_kind[("gpu-" if is_gpu else "") + o["kind"]].append(o)
    cpu_job = copy.deepcopy(by_kind["Deployment"][0])
    cpu_job["kind"], cpu_job["apiVersion"] = "Job", "batch/v1"
    cpu_job["spec"] = {"template": cpu_job["spec"]["template"]}
    by_kind["Job"].append(cpu_job)
    rng = random.Random(seed)
    jobs = round(20 * job_share)
    mix = ["Job"] * jobs + ["Deployment"] * round((20 - jobs) * 0.75)
    mix += ["StatefulSet"] * (20 - len(mix))
    gpu_mix = ["gpu-Deployment", "gpu-Job"]
    out: list[Workload] = []
    total = 0
    i = 0
    n_gpu = max(1, pods // (per_profile * 50))
    while total < pods:
        gpu = i < n_gpu
        family = gpu_mix[i % len(gpu_mix)] if gpu else mix[i % len(mix)]
        source = rng.choice(by_kind[family] or by_kind[family.removeprefix("gpu-")])
        kind = str(source["kind"])
        replicas = 10 if gpu else min(per_profile, pods - total)
        name = f"{kind.lower()[:3]}-{i:04d}"
        ns = f"fleet-{i % 10}"
        body = copy.deepcopy(source)
        body["metadata"] = {"name": name, "namespace": ns}
        spec = body.setdefault("spec", {})
        tpl = spec.setdefault("template", {})
        tpl.setdefault("metadata", {})["labels"] = {"app": name}
        pspec = tpl.setdefault("spec", {})
        _co_locate_with_itself(pspec, name)
        cpu = f"{250 + (i * 37) % 500}m"
        memory = f"{512 + (i * 53) % 1024}Mi"
        _set_requests(pspec, "2" if gpu else cpu, "8Gi" if gpu else memory)
        pspec.pop("priorityClassName", None) if not gpu else None
        if kind == "Job":
            pspec["restartPolicy"] = "Never"
            spec.update({"completions": replicas, "parallelism": replicas,
                         "ttlSecondsAfterFinished": 5})
            spec.pop("selector", None)
        else:
            spec["replicas"] = replicas
            spec["selector"] = {"matchLabels": {"app": name}}
        if kind == "StatefulSet":
            spec["podManagementPolicy"] = "Parallel"
            # no volume provisioner in the sims or under kwok: each claim becomes an emptyDir
            # of the same name, so the containers' volumeMounts still resolve (a real apiserver
            # validates them)
            for claim in spec.pop("volumeClaimTemplates", None) or ():
                pspec.setdefault("volumes", []).append(
                    {"name": claim["metadata"]["name"], "emptyDir": {}})
        out.append(Workload(kind, ns, name, replicas, body))
        total += replicas
        i += 1
    return classes, out
