"""Pure plans of the simulated workload controllers, expected values worked out by hand."""

from __future__ import annotations

from typing import Any

from bigfleet_trio.sim.cluster.controllers import admit, status_patch
from bigfleet_trio.sim.cluster.workloads import (
    COMPLETION_INDEX,
    deployment_replicasets,
    deployment_status,
    job_plan,
    ordinal_of,
    replicaset_diff,
    replicaset_status,
    statefulset_plan,
    template_hash,
)

NOW = "2026-01-01T00:00:00Z"


def pod(name: str, *, phase: str = "Running", ready: bool = True, node: str | None = "n1",
        created: str = "2026-01-01T00:00:00Z", deleting: bool = False,
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = created
    if annotations:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {"nodeName": node} if node else {}
    conds = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"metadata": meta, "spec": spec, "status": {"phase": phase, "conditions": conds}}


def test_template_hash_is_stable_and_changes_with_the_template() -> None:
    a = {"spec": {"containers": [{"name": "c", "image": "x"}]}}
    assert template_hash(a) == template_hash({"spec": {"containers": [{"image": "x",
                                                                        "name": "c"}]}})
    assert len(template_hash(a)) == 10
    assert template_hash(a) != template_hash({"spec": {"containers": [{"name": "c",
                                                                        "image": "y"}]}})


def test_replicaset_creates_the_missing_and_ignores_terminal_and_deleting() -> None:
    rs = {"metadata": {"generation": 2}, "spec": {"replicas": 3}}
    pods = [pod("a"), pod("b", phase="Succeeded"), pod("c", deleting=True)]
    assert replicaset_diff(rs, pods).create == 2
    assert replicaset_status(rs, pods) == {"replicas": 1, "fullyLabeledReplicas": 1,
                                           "readyReplicas": 1, "availableReplicas": 1,
                                           "observedGeneration": 2}


def test_replicaset_deletes_unscheduled_then_pending_then_unready_then_newest() -> None:
    rs = {"spec": {"replicas": 1}}
    pods = [
        pod("old-ready", created="2026-01-01T00:00:00Z"),
        pod("new-ready", created="2026-01-01T00:05:00Z"),
        pod("unready", ready=False),
        pod("pending", phase="Pending", ready=False),
        pod("unscheduled", phase="Pending", ready=False, node=None),
    ]
    assert replicaset_diff(rs, pods).delete == ["unscheduled", "pending", "unready", "new-ready"]


def test_deployment_creates_its_replicaset_then_scales_old_ones_to_zero() -> None:
    tpl = {"metadata": {"labels": {"app": "w"}}, "spec": {"containers": [{"name": "c"}]}}
    deploy = {"metadata": {"name": "w", "namespace": "ns", "uid": "u1", "generation": 1},
              "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "w"}},
                       "template": tpl}}
    new_rs, scales = deployment_replicasets(deploy, [])
    h = template_hash(tpl)
    assert new_rs is not None and scales == {}
    assert new_rs["metadata"]["name"] == f"w-{h}"
    assert new_rs["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert new_rs["spec"]["selector"]["matchLabels"] == {"app": "w", "pod-template-hash": h}
    assert new_rs["spec"]["template"]["metadata"]["labels"] == {"app": "w",
                                                                 "pod-template-hash": h}
    assert new_rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "1"
    current = {**new_rs, "spec": {**new_rs["spec"], "replicas": 2}}
    old = {"metadata": {"name": "w-old", "labels": {"pod-template-hash": "zzz"}},
           "spec": {"replicas": 3}}
    assert deployment_replicasets(deploy, [current, old]) == (None, {f"w-{h}": 4, "w-old": 0})


def test_deployment_status_complete_only_without_old_replicas() -> None:
    tpl = {"spec": {"containers": [{"name": "c"}]}}
    h = template_hash(tpl)
    deploy = {"metadata": {"name": "w", "generation": 3}, "spec": {"replicas": 2, "template": tpl}}
    cur = {"metadata": {"labels": {"pod-template-hash": h}},
           "status": {"replicas": 2, "readyReplicas": 2, "availableReplicas": 2}}
    old = {"metadata": {"labels": {"pod-template-hash": "x"}},
           "status": {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1}}
    st = deployment_status(deploy, [cur, old], now=NOW)
    assert (st["replicas"], st["updatedReplicas"], st["availableReplicas"]) == (3, 2, 3)
    assert st["observedGeneration"] == 3
    assert st["conditions"][1]["reason"] == "ReplicaSetUpdated"
    st = deployment_status(deploy, [cur], now=NOW)
    assert st["conditions"][1]["reason"] == "NewReplicaSetAvailable"
    assert "unavailableReplicas" not in st


def test_statefulset_ordered_ready_one_at_a_time() -> None:
    sts = {"metadata": {"name": "db"}, "spec": {"replicas": 3}}
    assert statefulset_plan(sts, []).create == [0]
    assert statefulset_plan(sts, [pod("db-0", ready=False)]).create == []
    assert statefulset_plan(sts, [pod("db-0")]).create == [1]
    # scale down: highest ordinal first, one at a time
    sts1 = {"metadata": {"name": "db"}, "spec": {"replicas": 1}}
    plan = statefulset_plan(sts1, [pod("db-0"), pod("db-1"), pod("db-2")])
    assert (plan.create, plan.delete) == ([], ["db-2"])
    # terminal Pods are deleted to be recreated; foreign names are ignored
    plan = statefulset_plan(sts, [pod("db-0", phase="Failed"), pod("dbx-1"), pod("db-01")])
    assert (plan.create, plan.delete) == ([0], ["db-0"])


def test_statefulset_parallel_all_at_once() -> None:
    sts = {"metadata": {"name": "db"}, "spec": {"replicas": 3, "podManagementPolicy": "Parallel"}}
    assert statefulset_plan(sts, []).create == [0, 1, 2]
    sts1 = {"metadata": {"name": "db"}, "spec": {"replicas": 0, "podManagementPolicy": "Parallel"}}
    assert statefulset_plan(sts1, [pod("db-0"), pod("db-1")]).delete == ["db-1", "db-0"]
    assert ordinal_of("db", "db-10") == 10 and ordinal_of("db", "db-x") is None


def test_job_keeps_parallelism_until_completions_then_completes() -> None:
    job = {"metadata": {"name": "j"}, "spec": {"completions": 5, "parallelism": 2}}
    plan = job_plan(job, [], now=NOW)
    assert plan.count == 2
    assert plan.status == {"startTime": NOW, "ready": 0, "terminating": 0}
    # 4 succeeded, 1 running: the last one needs no more Pods
    pods = [pod(f"p{i}", phase="Succeeded", ready=False) for i in range(4)] + [pod("p4")]
    plan = job_plan(job, pods, now=NOW)
    assert plan.count == 0
    assert plan.status["active"] == 1 and plan.status["succeeded"] == 4
    pods[-1] = pod("p4", phase="Succeeded", ready=False)
    plan = job_plan(job, pods, now=NOW)
    assert plan.count == 0 and "active" not in plan.status
    assert plan.status["completionTime"] == NOW
    assert [c["type"] for c in plan.status["conditions"]] == ["SuccessCriteriaMet", "Complete"]


def test_job_work_queue_and_indexed_and_suspended() -> None:
    queue = {"metadata": {"name": "q"}, "spec": {"parallelism": 3}}
    assert job_plan(queue, [], now=NOW).count == 3
    done = job_plan(queue, [pod("a", phase="Succeeded", ready=False)], now=NOW)
    assert done.count == 0 and done.status["conditions"][-1]["type"] == "Complete"
    indexed = {"metadata": {"name": "i"},
               "spec": {"completions": 4, "parallelism": 2, "completionMode": "Indexed"}}
    running = [pod("i-0-x", annotations={COMPLETION_INDEX: "0"})]
    assert job_plan(indexed, running, now=NOW).indexes == [1]
    suspended = {"metadata": {"name": "s"}, "spec": {"suspend": True, "parallelism": 2}}
    plan = job_plan(suspended, [pod("s-a")], now=NOW)
    assert (plan.count, plan.delete) == (0, ["s-a"])


def test_status_patch_nulls_removed_keys() -> None:
    assert status_patch({"a": 1, "b": 2}, {"a": 1}) == {"b": None}
    assert status_patch({"a": 1}, {"a": 1}) is None
    assert status_patch(None, {"a": 1}) == {"a": 1}


def test_admit_resolves_priority_defaults_requests_and_tolerates_gpu() -> None:
    body = {"metadata": {"name": "p", "namespace": "default"},
            "spec": {"priorityClassName": "high",
                     "containers": [{"name": "c",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    admit(body, [{"kind": "PriorityClass", "metadata": {"name": "high"}, "value": 7}], [])
    spec = body["spec"]
    assert spec["priority"] == 7
    assert spec["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "1"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists",
                                    "effect": "NoSchedule"}]
