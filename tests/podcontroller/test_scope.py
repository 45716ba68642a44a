"""PodScope: which Nodes are unmanaged and which Pods are opted out, from labels alone
(docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out)."""

from __future__ import annotations

import pytest

from bigfleet_trio.kube.labelselector import LabelSelectorError
from bigfleet_trio.podcontroller.scope import (
    DEFAULT_UNMANAGED_NODE_SELECTORS,
    EXCLUDED_KEY,
    NodeView,
    PodScope,
    cached_node_name,
)

CP = "node-role.kubernetes.io/control-plane"


@pytest.mark.parametrize("labels, unmanaged", [
    ({CP: ""}, True),
    ({"bigfleet.lucy.sh/unmanaged": "true"}, True),
    ({"bigfleet.lucy.sh/unmanaged": "false"}, False),
    ({"node-role.kubernetes.io/worker": ""}, False),
    ({}, False),
])
def test_default_selectors(labels: dict[str, str], unmanaged: bool) -> None:
    scope = PodScope.parse()
    assert scope.watches_nodes
    assert scope.node_unmanaged(labels) is unmanaged
    assert PodScope.parse(DEFAULT_UNMANAGED_NODE_SELECTORS) == scope


def test_selectors_are_ored_and_commas_are_anded() -> None:
    scope = PodScope.parse(["pool=system,tier in (a,b)", "!managed-by-bigfleet"])
    assert scope.node_unmanaged({"pool": "system", "tier": "a", "managed-by-bigfleet": "y"})
    assert not scope.node_unmanaged({"pool": "system", "tier": "c", "managed-by-bigfleet": "y"})
    assert scope.node_unmanaged({"pool": "x"})  # the second selector


def test_an_empty_selector_means_no_node_is_unmanaged() -> None:
    scope = PodScope.parse([""])
    assert not scope.watches_nodes
    assert not scope.node_unmanaged({CP: ""})
    assert not PodScope().node_unmanaged({CP: ""})


def test_a_bad_selector_raises() -> None:
    with pytest.raises(LabelSelectorError):
        PodScope.parse(["k in ()"])
    with pytest.raises(LabelSelectorError):
        PodScope.parse((), (), "a=1,,b")


def test_node_view_keeps_name_and_answer_only() -> None:
    scope = PodScope.parse()
    node = {"metadata": {"name": "n1", "labels": {CP: ""}, "uid": "u"}, "status": {"x": 1}}
    assert scope.node_view(node) == NodeView("n1", True)
    assert scope.node_view({"metadata": {"name": "n2"}}) == NodeView("n2", False)
    assert scope.node_view({"metadata": {"name": "n3", "labels": "junk"}}) == NodeView("n3", False)


def test_pod_exclusion_by_namespace_or_marker() -> None:
    scope = PodScope.parse((), ["team-x", ""], "app=batch")
    assert scope.exclude_namespaces == frozenset({"team-x"})
    assert scope.pod_excluded({"metadata": {"namespace": "team-x"}})
    assert not scope.pod_excluded({"metadata": {"namespace": "kube-system"}})
    assert scope.pod_excluded({"metadata": {"namespace": "a", EXCLUDED_KEY: True}})
    assert scope.pod_labels_excluded({"app": "batch"})
    assert not scope.pod_labels_excluded({"app": "web"})
    assert not PodScope.parse((), (), " ").pod_labels_excluded({"app": "batch"})


def test_slim_pod_keeps_the_node_name_and_the_exclusion_only_with_a_scope() -> None:
    from bigfleet_trio.podcontroller.projections import slim_pod

    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"app": "batch"}},
           "spec": {"nodeName": "n1", "containers": []}}
    plain = slim_pod(pod)
    assert "nodeName" not in plain["metadata"] and EXCLUDED_KEY not in plain["metadata"]
    assert "nodeName" not in plain["spec"]
    scoped = slim_pod(pod, PodScope.parse(exclude_pod_selector="app=batch"))
    assert cached_node_name(scoped) == "n1" and scoped["metadata"][EXCLUDED_KEY] is True
    assert len(scoped) == len(plain)  # the top-level dict does not grow (memory)
    assert {k: v for k, v in scoped["metadata"].items()
            if k not in ("nodeName", EXCLUDED_KEY)} == plain["metadata"]
    assert {k: v for k, v in scoped.items() if k != "metadata"} == {
        k: v for k, v in plain.items() if k != "metadata"}
    other = slim_pod(pod, PodScope.parse([""], (), "app=web"))
    assert cached_node_name(other) is None and EXCLUDED_KEY not in other["metadata"]
    pending = slim_pod({**pod, "spec": {"containers": []}}, PodScope.parse())
    assert cached_node_name(pending) is None
