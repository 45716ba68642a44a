"""plan_pod / plan_rejected: every branch of the pod controller's decision, without I/O."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bigfleet_trio.podcontroller.defaults import parse_priority_class_defaults
from bigfleet_trio.podcontroller.keys import OrphanKey, PodKey, StampKey, split_key
from bigfleet_trio.podcontroller.plan import (
    REASON_FAILED,
    REASON_REJECTED,
    REASON_UNSUPPORTED,
    REASON_WARNING,
    EventReport,
    PodPlan,
    plan_pod,
    plan_rejected,
)
from tests.support import capacity

UID = "0b0e2f3c-1111-4222-8333-944455556666"
CR_NAME = f"cr-{UID}"
LABEL = "bigfleet.lucy.sh/owned-by-pod"
REQ = "requiredDuringSchedulingIgnoredDuringExecution"


def pod(*, phase: str = "Pending", uid: str | None = UID, cpu: str = "1",
        exprs: list[dict[str, Any]] | None = None, **meta: Any) -> dict[str, Any]:
    m: dict[str, Any] = {"name": "p", "namespace": "ns", **meta}
    if uid is not None:
        m["uid"] = uid
    spec: dict[str, Any] = {
        "containers": [{"resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}],
        "priority": 7,
    }
    if exprs is not None:
        spec["affinity"] = {"nodeAffinity": {REQ: {"nodeSelectorTerms": [
            {"matchExpressions": exprs}]}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": m, "spec": spec,
            "status": {"phase": phase}}


def want_spec(cpu: str = "1") -> dict[str, Any]:
    return {
        "priority": 7,
        "resources": {"cpu": cpu, "memory": "1Gi"},
        "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "Exists"}],
    }


def cr(name: str = CR_NAME, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    obj = capacity.cr(name, namespace="ns", **(want_spec() if spec is None else spec))
    obj["metadata"].update(uid=f"uid-{name}", labels={LABEL: UID})
    return obj


def test_pod_without_uid_is_invalid_and_nothing_is_done() -> None:
    assert plan_pod(pod(uid=None), [], None) == PodPlan("nothing", "invalid_pod")
    assert plan_pod(pod(uid=""), [cr()], None) == PodPlan("nothing", "invalid_pod")


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_terminal_pod_deletes_its_crs_by_name_never_creates(phase: str) -> None:
    # by name, each CR it owns: a deletecollection by label costs the apiserver a scan of the
    # namespace's CRs per finished Pod (docs/deviations.md, pod controller: terminal Pods)
    assert plan_pod(pod(phase=phase), [cr()], None) == PodPlan(
        "delete", "pod_terminal", UID, delete=(cr(),), delete_reason="pod_terminal",
        phase=phase)
    assert plan_pod(pod(phase=phase), [], None) == PodPlan("nothing", "pod_terminal", UID)


def test_untranslatable_pod_is_reported_and_its_crs_left_alone() -> None:
    bad = pod(cpu="lots")
    plan = plan_pod(bad, [cr()], None)
    assert (plan.action, plan.outcome, plan.uid) == ("report", "invalid_pod", UID)
    assert plan.report is not None and plan.report.reason == REASON_FAILED
    assert len(plan.report.messages) == 1 and "lots" in plan.report.messages[0]
    assert plan.detail == plan.report.messages[0]
    assert plan.delete == () and plan.body is None and plan.clear == ()


def test_new_pod_creates_its_cr() -> None:
    plan = plan_pod(pod(), [], None)
    assert (plan.action, plan.outcome, plan.uid) == ("create", "cr_created", UID)
    assert plan.body is not None
    assert plan.body["metadata"]["name"] == CR_NAME
    assert plan.body["metadata"]["namespace"] == "ns"
    assert plan.body["metadata"]["labels"] == {LABEL: UID}
    assert plan.body["spec"] == want_spec()
    assert plan.delete == () and plan.report is None and plan.warnings is None
    assert plan.clear == (REASON_FAILED, REASON_WARNING, REASON_UNSUPPORTED)


def test_matching_cr_means_nothing_to_do() -> None:
    kept = cr()
    plan = plan_pod(pod(), [kept], None)
    assert (plan.action, plan.outcome) == ("nothing", "cr_exists")
    assert plan.target is kept and plan.delete == () and plan.patch is None


def test_changed_pod_updates_the_cr_with_a_merge_patch() -> None:
    old = cr(spec={**want_spec(cpu="2"), "interruptionPenalty": "5"})
    plan = plan_pod(pod(), [old], None)
    assert (plan.action, plan.outcome) == ("update", "cr_updated")
    assert plan.target is old
    assert plan.patch == {"spec": {"resources": {"cpu": "1"}, "interruptionPenalty": None}}
    assert plan.delete == ()


def test_extra_crs_are_deleted_and_the_deterministic_one_kept() -> None:
    extra1, kept, extra2 = cr("gen-abc"), cr(), cr("gen-def", spec=want_spec(cpu="9"))
    plan = plan_pod(pod(), [extra1, kept, extra2], None)
    assert (plan.action, plan.outcome) == ("delete", "cr_exists")
    assert plan.target is kept
    assert plan.delete == (extra1, extra2) and plan.delete_reason == "duplicate"


def test_without_the_deterministic_name_the_first_cr_is_kept_and_updated() -> None:
    first, second = cr("gen-abc", spec=want_spec(cpu="2")), cr("gen-def")
    plan = plan_pod(pod(), [first, second], None)
    assert (plan.action, plan.outcome) == ("update", "cr_updated")
    assert plan.target is first and plan.delete == (second,)
    assert plan.patch == {"spec": {"resources": {"cpu": "1"}}}


def test_translation_warnings_ride_along_with_the_write() -> None:
    warned = pod()
    warned["metadata"]["annotations"] = {"bigfleet.lucy.sh/interruption-penalty": "cheap"}
    plan = plan_pod(warned, [], None)
    assert plan.action == "create"
    assert plan.warnings is not None and plan.warnings.reason == REASON_WARNING
    assert len(plan.warnings.messages) == 1 and "cheap" in plan.warnings.messages[0]
    assert plan.clear == (REASON_FAILED, REASON_UNSUPPORTED)  # the warning is not cleared


def test_operator_the_crd_refuses_reports_and_deletes_every_cr() -> None:
    odd = {"key": "example.com/gen", "operator": "Near", "values": ["3"]}
    owned = [cr(), cr("gen-abc")]
    plan = plan_pod(pod(exprs=[odd]), owned, None)
    assert (plan.action, plan.outcome) == ("report", "unsupported_requirement")
    assert plan.delete == tuple(owned) and plan.delete_reason == "unsupported_requirement"
    assert plan.detail == "'example.com/gen' Near"
    assert plan.report is not None and plan.report.reason == REASON_UNSUPPORTED
    (message,) = plan.report.messages
    assert "'example.com/gen' Near" in message and "not sent to BigFleet" in message
    assert plan.clear == (REASON_FAILED, REASON_WARNING, REASON_REJECTED)


def test_defaults_fill_penalties() -> None:
    defaults = parse_priority_class_defaults('gold: {interruptionPenalty: "8"}')
    gold = pod()
    gold["spec"]["priorityClassName"] = "gold"
    plan = plan_pod(gold, [], defaults)
    assert plan.body is not None and plan.body["spec"]["interruptionPenalty"] == "8"
    assert plan_pod(gold, [], None).body["spec"].get("interruptionPenalty") is None  # type: ignore[index]


def test_plan_does_not_touch_its_inputs() -> None:
    p, owned = pod(cpu="3"), [cr(), cr("gen-x")]
    p0, owned0 = copy.deepcopy(p), copy.deepcopy(owned)
    plan_pod(p, owned, None)
    assert (p, owned) == (p0, owned0)


def test_rejected_write_reports_once_per_spec_version_and_deletes_crs() -> None:
    plan = plan_pod(pod(), [], None)
    owned = [cr()]
    out = plan_rejected(plan, owned, "spec.priority: Invalid value")
    assert (out.action, out.outcome, out.uid) == ("report", "cr_rejected", UID)
    assert out.delete == tuple(owned) and out.delete_reason == "rejected_update"
    assert out.report == EventReport(
        REASON_REJECTED,
        ("CapacityRequest rejected by the apiserver: spec.priority: Invalid value; this Pod's "
         "demand is not sent to BigFleet",),
        '{"priority":7,"requirements":[{"key":"node.kubernetes.io/instance-type",'
        '"operator":"Exists"}],"resources":{"cpu":"1","memory":"1Gi"}}',
    )
    other = plan_rejected(plan_pod(pod(cpu="2"), [], None), owned, "x")
    assert other.report is not None and other.report.version != out.report.version


def test_queue_keys_are_typed_and_print_as_ns_name() -> None:
    assert PodKey.parse("ns/p") == PodKey("ns", "p")
    assert PodKey("ns", "p") != OrphanKey("ns", "p") != StampKey("ns", "p")
    assert len({PodKey("ns", "p"), OrphanKey("ns", "p"), StampKey("ns", "p")}) == 3
    assert str(StampKey("ns", "cr-1")) == "ns/cr-1"
    assert (PodKey.kind, OrphanKey.kind, StampKey.kind) == ("pod", "orphan", "stamp")
    assert split_key("cluster-scoped") == ("", "cluster-scoped")
    assert split_key("a/b/c") == ("a", "b/c")
