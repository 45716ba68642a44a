"""Workload manifests -> Pods (controllers, defaulting, admission), as kube-scheduler sees them."""

from __future__ import annotations

import copy
import random
import re
from pathlib import Path
from typing import Any

import pytest

from bigfleet_trio.sim.expand import (
    BUILTIN_PRIORITY_CLASSES,
    ExpandError,
    admit_pod,
    apply_pod_defaults,
    expand_manifests,
    expand_object,
    load_manifests,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "real-workloads"
SUFFIX = "[bcdfghjklmnpqrstvwxz2456789]"
REQ = "requiredDuringSchedulingIgnoredDuringExecution"


def template(**spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    s.update(spec)
    return {"metadata": {"labels": {"app": "a"}, "annotations": {"k": "v"}}, "spec": s}


def workload(kind: str, name: str = "w", api: str = "apps/v1", **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"template": template()}
    s.update(spec)
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name}, "spec": s}


def fixture(name: str, **kw: Any) -> list[dict[str, Any]]:
    return expand_manifests(load_manifests([FIXTURES / name]), **kw)


# ---------------------------------------------------------------------------------------------
# controllers


def test_deployment() -> None:
    pods = expand_manifests([workload("Deployment", "web", replicas=3)], namespace="shop")
    assert len(pods) == 3
    hashes = {p["metadata"]["labels"]["pod-template-hash"] for p in pods}
    assert len(hashes) == 1
    (h,) = hashes
    owners = {p["metadata"]["ownerReferences"][0]["uid"] for p in pods}
    assert len(owners) == 1  # one ReplicaSet
    for p in pods:
        m = p["metadata"]
        assert re.fullmatch(rf"web-{h}-{SUFFIX}{{5}}", m["name"])
        assert m["namespace"] == "shop"
        assert m["labels"] == {"app": "a", "pod-template-hash": h}
        assert m["annotations"] == {"k": "v"}
        (owner,) = m["ownerReferences"]
        assert owner["kind"] == "ReplicaSet" and owner["apiVersion"] == "apps/v1"
        assert owner["name"] == f"web-{h}"
        assert owner["controller"] is True and owner["blockOwnerDeletion"] is True
        assert p["status"] == {"phase": "Pending"}
        assert p["spec"]["priority"] == 0
    assert len({p["metadata"]["uid"] for p in pods}) == 3
    assert len({p["metadata"]["name"] for p in pods}) == 3


def test_deployment_replicas_default_and_zero() -> None:
    assert len(expand_manifests([workload("Deployment")])) == 1
    assert expand_manifests([workload("Deployment", replicas=0)]) == []


def test_replicaset_owned_by_itself() -> None:
    rs = workload("ReplicaSet", "front", replicas=2)
    rs["metadata"]["uid"] = "rs-uid"
    rs["metadata"]["namespace"] = "web"
    pods = expand_manifests([rs])
    assert len(pods) == 2
    for p in pods:
        assert re.fullmatch(rf"front-{SUFFIX}{{5}}", p["metadata"]["name"])
        assert p["metadata"]["namespace"] == "web"
        assert p["metadata"]["ownerReferences"][0]["uid"] == "rs-uid"
        assert p["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"


def test_statefulset() -> None:
    pods = expand_manifests([workload("StatefulSet", "db", replicas=3, serviceName="db-hs")])
    assert [p["metadata"]["name"] for p in pods] == ["db-0", "db-1", "db-2"]
    for i, p in enumerate(pods):
        labels = p["metadata"]["labels"]
        assert labels["statefulset.kubernetes.io/pod-name"] == f"db-{i}"
        assert labels["apps.kubernetes.io/pod-index"] == str(i)
        assert labels["controller-revision-hash"].startswith("db-")
        assert p["spec"]["hostname"] == f"db-{i}" and p["spec"]["subdomain"] == "db-hs"
        assert p["metadata"]["ownerReferences"][0]["kind"] == "StatefulSet"


@pytest.mark.parametrize(
    ("spec", "count"),
    [
        pytest.param({}, 1, id="defaults-one"),
        pytest.param({"parallelism": 3, "completions": 3}, 3, id="parallel"),
        pytest.param({"parallelism": 5, "completions": 2}, 2, id="capped-by-completions"),
        pytest.param({"parallelism": 2, "completions": 10}, 2, id="capped-by-parallelism"),
        pytest.param({"parallelism": 0}, 0, id="zero-parallelism"),
        pytest.param({"parallelism": 2, "suspend": True}, 0, id="suspended"),
        pytest.param({"parallelism": 2, "suspend": False}, 2, id="not-suspended"),
    ],
)
def test_job_pod_count(spec: dict[str, Any], count: int) -> None:
    pods = expand_manifests([workload("Job", "j", api="batch/v1", **spec)])
    assert len(pods) == count
    for p in pods:
        labels = p["metadata"]["labels"]
        assert labels["job-name"] == "j" and labels["batch.kubernetes.io/job-name"] == "j"
        owner = p["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "Job" and owner["apiVersion"] == "batch/v1"
        assert labels["controller-uid"] == owner["uid"]


def test_suspended_fixture_job() -> None:
    objs = load_manifests(
        [
            FIXTURES / "gke-samples__fine-tune-l4-gpu-job.yaml",
            FIXTURES / "gke-samples__low-priorityclass.yaml",
        ]
    )
    assert expand_manifests(objs) == []
    pods = expand_manifests(objs, include_suspended=True)
    assert len(pods) == 2
    for i, p in enumerate(pods):
        assert re.fullmatch(rf"finetune-gemma-l4-{i}-{SUFFIX}{{5}}", p["metadata"]["name"])
        assert p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == str(i)
        assert p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == str(i)
        # template annotations kept alongside
        assert p["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
        assert p["spec"]["priority"] == 20


def test_job_generate_name() -> None:
    pods = fixture("kueue__provisioning-gpu-job.yaml")
    assert len(pods) == 3
    job_names = {p["metadata"]["labels"]["job-name"] for p in pods}
    (job_name,) = job_names
    assert re.fullmatch(rf"sample-job-{SUFFIX}{{5}}", job_name)
    for p in pods:
        assert re.fullmatch(rf"{job_name}-{SUFFIX}{{5}}", p["metadata"]["name"])


def test_daemonset_one_pod_per_node_with_node_name_affinity() -> None:
    objs = load_manifests([FIXTURES / "gke-samples__nccl-installer-daemonset.yaml"])
    pods = expand_manifests(objs, daemonset_nodes=["n1", "n2"])
    assert len(pods) == 2
    for node, p in zip(["n1", "n2"], pods, strict=True):
        # The controller REPLACES the required terms (the accelerator In expression is gone).
        assert p["spec"]["affinity"]["nodeAffinity"][REQ] == {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        }
        assert p["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
        assert p["metadata"]["labels"]["pod-template-generation"] == "1"
        assert p["spec"]["priority"] == 2000001000


def test_daemonset_keeps_node_selector_and_preferred_affinity() -> None:
    ds = workload("DaemonSet", "d")
    ds["spec"]["template"]["spec"]["nodeSelector"] = {"os": "linux"}
    ds["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}]},
        "podAffinity": {"x": 1},
    }
    (p,) = expand_manifests([ds])
    assert p["spec"]["nodeSelector"] == {"os": "linux"}
    na = p["spec"]["affinity"]["nodeAffinity"]
    assert na["preferredDuringSchedulingIgnoredDuringExecution"] == [{"weight": 1}]
    assert na[REQ]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-0"]
    assert p["spec"]["affinity"]["podAffinity"] == {"x": 1}


def test_daemonset_no_nodes_no_pods() -> None:
    assert expand_manifests([workload("DaemonSet")], daemonset_nodes=()) == []


def test_bare_pod() -> None:
    objs = load_manifests(
        [FIXTURES / "kata__pod-guaranteed.yaml", FIXTURES / "kata__kata-runtimeclass.yaml"]
    )
    (p,) = expand_manifests(objs)
    assert p["metadata"]["name"] == "qos-test"
    assert p["metadata"]["namespace"] == "default"
    assert p["metadata"]["uid"]
    assert p["status"] == {"phase": "Pending"}


def test_bare_pod_keeps_uid_and_generate_name() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "x-", "uid": "u1"},
        "spec": {"containers": []},
    }
    (p,) = expand_manifests([pod])
    assert re.fullmatch(rf"x-{SUFFIX}{{5}}", p["metadata"]["name"])
    assert "generateName" not in p["metadata"]
    assert p["metadata"]["uid"] == "u1"


@pytest.mark.parametrize(
    "kind",
    ["PodDisruptionBudget", "Service", "ConfigMap", "PriorityClass", "RuntimeClass", "CronJob"],
)
def test_other_kinds_make_no_pods(kind: str) -> None:
    assert expand_object({"kind": kind, "metadata": {"name": "x"}, "spec": {}}) == []


def test_deterministic_and_rng_controls_names() -> None:
    objs = [workload("Deployment", replicas=2), workload("Job", api="batch/v1")]
    a = expand_manifests(objs)
    b = expand_manifests(objs)
    assert a == b
    c = expand_manifests(objs, rng=random.Random(42))
    assert [p["metadata"]["name"] for p in a] != [p["metadata"]["name"] for p in c]


def test_uid_factory() -> None:
    n = iter(range(100))
    pods = expand_manifests(
        [workload("ReplicaSet", replicas=2)], uid_factory=lambda: f"uid-{next(n)}"
    )
    assert [p["metadata"]["uid"] for p in pods] == ["uid-1", "uid-2"]
    assert pods[0]["metadata"]["ownerReferences"][0]["uid"] == "uid-0"


def test_inputs_not_mutated() -> None:
    objs = load_manifests(sorted(FIXTURES.glob("*.yaml")))
    before = copy.deepcopy(objs)
    expand_manifests(objs, include_suspended=True)
    assert objs == before


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param({"kind": "Deployment", "metadata": {}, "spec": {}}, id="no-name"),
        pytest.param(workload("Deployment", replicas=-1), id="negative-replicas"),
        pytest.param(workload("Deployment", replicas="3"), id="string-replicas"),
        pytest.param(
            {"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": []}},
            id="template-not-object",
        ),
        pytest.param({"kind": "Pod", "metadata": {}, "spec": {}}, id="pod-no-name"),
    ],
)
def test_malformed_workloads(obj: dict[str, Any]) -> None:
    with pytest.raises(ExpandError):
        expand_manifests([obj])


# ---------------------------------------------------------------------------------------------
# defaulting


def test_requests_default_to_limits_per_resource() -> None:
    pod = {
        "spec": {
            "containers": [
                {"resources": {"limits": {"cpu": "700m", "memory": "600Mi"}}},
                {"resources": {"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "1"}}},
                {"resources": {}},
                {},
            ],
            "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        }
    }
    apply_pod_defaults(pod)
    c = pod["spec"]["containers"]
    assert c[0]["resources"]["requests"] == {"cpu": "700m", "memory": "600Mi"}
    assert c[1]["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}
    assert c[2]["resources"] == {}
    assert c[3] == {}
    assert pod["spec"]["initContainers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "1"}


# ---------------------------------------------------------------------------------------------
# admission


PCS = {
    **{k: {"value": v} for k, v in BUILTIN_PRIORITY_CLASSES.items()},
    "gold": {"value": 1000, "preemptionPolicy": "Never"},
}
KATA = {
    "kind": "RuntimeClass",
    "metadata": {"name": "kata"},
    "handler": "kata",
    "overhead": {"podFixed": {"cpu": "250m", "memory": "160Mi"}},
    "scheduling": {
        "nodeSelector": {"rt": "kata"},
        "tolerations": [{"key": "kata", "operator": "Exists"}],
    },
}
PLAIN = {"kind": "RuntimeClass", "metadata": {"name": "plain"}, "handler": "runc"}
RCS = {"kata": KATA, "plain": PLAIN}


def bare(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "n"}, "spec": {"containers": [], **spec}}


@pytest.mark.parametrize(
    ("spec", "global_default", "priority", "class_name"),
    [
        pytest.param({}, None, 0, None, id="no-class-zero"),
        pytest.param({"priorityClassName": "gold"}, None, 1000, "gold", id="class"),
        pytest.param(
            {"priorityClassName": "system-node-critical"},
            None,
            2000001000,
            "system-node-critical",
            id="builtin",
        ),
        pytest.param({}, "gold", 1000, "gold", id="global-default"),
        pytest.param(
            {"priorityClassName": "system-cluster-critical"},
            "gold",
            2000000000,
            "system-cluster-critical",
            id="explicit-beats-global-default",
        ),
        pytest.param(
            {"priorityClassName": "gold", "priority": 1000},
            None,
            1000,
            "gold",
            id="matching-preset-priority",
        ),
    ],
)
def test_priority_admission(
    spec: dict[str, Any], global_default: str | None, priority: int, class_name: str | None
) -> None:
    p = admit_pod(bare(**spec), PCS, RCS, global_default)
    assert p["spec"]["priority"] == priority
    assert p["spec"].get("priorityClassName") == class_name


def test_priority_admission_sets_preemption_policy() -> None:
    assert (
        admit_pod(bare(priorityClassName="gold"), PCS, RCS)["spec"]["preemptionPolicy"] == "Never"
    )


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"priorityClassName": "nope"}, id="unknown-class"),
        pytest.param({"priorityClassName": "gold", "priority": 5}, id="conflicting-priority"),
        pytest.param({"runtimeClassName": "nope"}, id="unknown-runtime-class"),
        pytest.param(
            {"runtimeClassName": "kata", "nodeSelector": {"rt": "runc"}},
            id="node-selector-conflict",
        ),
        pytest.param({"runtimeClassName": "kata", "overhead": {"cpu": "1"}}, id="overhead-differs"),
        pytest.param(
            {"runtimeClassName": "plain", "overhead": {"cpu": "1"}},
            id="overhead-without-class-overhead",
        ),
    ],
)
def test_admission_rejects(spec: dict[str, Any]) -> None:
    with pytest.raises(ExpandError):
        admit_pod(bare(**spec), PCS, RCS)


def test_runtime_class_admission() -> None:
    p = admit_pod(
        bare(
            runtimeClassName="kata",
            nodeSelector={"zone": "a", "rt": "kata"},
            tolerations=[{"key": "x", "operator": "Exists"}],
        ),
        PCS,
        RCS,
    )
    assert p["spec"]["overhead"] == {"cpu": "250m", "memory": "160Mi"}
    assert p["spec"]["nodeSelector"] == {"zone": "a", "rt": "kata"}
    assert p["spec"]["tolerations"] == [
        {"key": "x", "operator": "Exists"},
        {"key": "kata", "operator": "Exists"},
    ]


def test_runtime_class_without_overhead_or_scheduling() -> None:
    p = admit_pod(bare(runtimeClassName="plain"), PCS, RCS)
    assert "overhead" not in p["spec"] and "nodeSelector" not in p["spec"]


def test_fixture_runtime_class_merge() -> None:
    objs = load_manifests(
        [
            FIXTURES / "kata__test-deploy-kata-qemu.yaml",
            FIXTURES / "kata__runtimeclass-kata-qemu.yaml",
        ]
    )
    (p,) = expand_manifests(objs)
    assert p["spec"]["overhead"] == {"memory": "160Mi", "cpu": "250m"}
    assert p["spec"]["nodeSelector"] == {"katacontainers.io/kata-runtime": "true"}
    assert p["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "200m"}


def test_fixture_missing_runtime_class_rejected() -> None:
    with pytest.raises(ExpandError, match="kata-qemu"):
        fixture("kata__test-deploy-kata-qemu.yaml")


def test_priority_class_from_same_file() -> None:
    (p,) = fixture("gke-samples__max-map-count-setter-ds.yaml")
    assert p["spec"]["priority"] == 999999999


def test_bad_priority_class_object() -> None:
    with pytest.raises(ExpandError):
        expand_manifests([{"kind": "PriorityClass", "metadata": {"name": "x"}, "value": "high"}])


# ---------------------------------------------------------------------------------------------
# loading


def test_load_manifests_multi_doc_and_kyaml(tmp_path: Path) -> None:
    f = tmp_path / "m.yaml"
    f.write_text('---\n---\nkind: A\n---\n{kind: "B", n: 3}\n')
    assert load_manifests([f]) == [{"kind": "A"}, {"kind": "B", "n": 3}]


@pytest.mark.parametrize("text", ["- a\n", "kind: [\n"])
def test_load_manifests_bad(tmp_path: Path, text: str) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(text)
    with pytest.raises(ExpandError):
        load_manifests([f])


def test_load_manifests_missing(tmp_path: Path) -> None:
    with pytest.raises(ExpandError):
        load_manifests([tmp_path / "nope.yaml"])
