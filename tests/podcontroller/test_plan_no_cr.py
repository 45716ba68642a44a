"""plan_pod for Pods that get no CR on purpose: on an unmanaged Node, or opted out
(docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out). Pure, every branch."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from bigfleet_trio.podcontroller.plan import REASONS, PodPlan, plan_pod
from tests.support import capacity

UID = "0b0e2f3c-1111-4222-8333-944455556666"
LABEL = "bigfleet.lucy.sh/owned-by-pod"


def pod(*, phase: str = "Pending", uid: str | None = UID, cpu: str = "1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if uid is not None:
        meta["uid"] = uid
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": phase}}


def cr(name: str = f"cr-{UID}") -> dict[str, Any]:
    obj = capacity.cr(name, namespace="ns", resources={"cpu": "1"})
    obj["metadata"].update(uid=f"uid-{name}", labels={LABEL: UID})
    return obj


@pytest.mark.parametrize("kwargs, outcome", [
    ({"node_unmanaged": True}, "unmanaged_node"),
    ({"excluded": True}, "excluded"),
    ({"excluded": True, "node_unmanaged": True}, "excluded"),
])
def test_no_cr_wanted_and_none_owned_is_nothing(kwargs: dict[str, bool], outcome: str) -> None:
    assert plan_pod(pod(), [], None, **kwargs) == PodPlan(
        "nothing", outcome, UID, delete_reason=outcome, clear=REASONS)


@pytest.mark.parametrize("kwargs, outcome", [
    ({"node_unmanaged": True}, "unmanaged_node"),
    ({"excluded": True}, "excluded"),
])
def test_no_cr_wanted_deletes_every_owned_cr_by_name(kwargs: dict[str, bool],
                                                     outcome: str) -> None:
    owned = [cr(), cr("extra")]
    plan = plan_pod(pod(), owned, None, **kwargs)
    assert plan == PodPlan("delete", outcome, UID, delete=tuple(owned), delete_reason=outcome,
                           clear=REASONS)
    assert plan.body is None and plan.report is None  # no write, no Event


def test_untranslatable_pod_that_wants_no_cr_gets_no_event() -> None:
    bad = pod(cpu="lots")
    assert plan_pod(bad, [], None).outcome == "invalid_pod"
    assert plan_pod(bad, [], None, excluded=True).report is None
    assert plan_pod(bad, [], None, node_unmanaged=True).outcome == "unmanaged_node"


def test_terminal_and_uidless_pods_keep_their_rules() -> None:
    for excluded, unmanaged in itertools.product((False, True), repeat=2):
        assert plan_pod(pod(phase="Succeeded"), [cr()], None, excluded=excluded,
                        node_unmanaged=unmanaged).outcome == "pod_terminal"
        assert plan_pod(pod(uid=None), [], None, excluded=excluded,
                        node_unmanaged=unmanaged) == PodPlan("nothing", "invalid_pod")


def test_managed_and_not_excluded_is_the_usual_plan() -> None:
    assert plan_pod(pod(), [], None, excluded=False, node_unmanaged=False).action == "create"
    assert plan_pod(pod(), [], None) == plan_pod(pod(), [], None, excluded=False,
                                                 node_unmanaged=False)
