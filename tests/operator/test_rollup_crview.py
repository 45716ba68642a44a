"""crview.slim: the informer projection keeps exactly what the roll-up and acks read."""

from __future__ import annotations

import copy
from typing import Any

from bigfleet_trio.operator.crview import slim
from bigfleet_trio.operator.rollup.translate import contribution_from_cr, cr_key, is_pending


def full_cr(name: str = "web-1", phase: str = "Pending") -> dict[str, Any]:
    return {
        "apiVersion": "bigfleet.lucy.sh/v1alpha1",
        "kind": "CapacityRequest",
        "metadata": {
            "name": name,
            "namespace": "shop",
            "uid": "0b7a-uid",
            "resourceVersion": "4711",
            "generation": 1,
            "creationTimestamp": "2024-01-01T00:00:00Z",
            "labels": {"app": "web"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x" * 2000},
            "ownerReferences": [{"kind": "Pod", "name": name, "uid": "pod-uid"}],
            "managedFields": [{"manager": "upc", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {
            "requirements": [{"key": "zone", "operator": "In", "values": ["a"]}],
            "resources": {"cpu": "500m", "memory": "1Gi"},
            "priority": 100,
            "topologySpread": [
                {"topologyKey": "zone", "maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}
            ],
            "coLocation": {"topologyKey": "host", "labelSelector": {"matchLabels": {"j": "1"}}},
            "interruptionPenalty": "500m",
            "reclamationPenalty": "2",
            "futureField": {"big": "y" * 1000},
        },
        "status": {"phase": phase, "acknowledgedAt": "2024-01-01T00:00:01Z"},
    }


def test_slim_keeps_only_needed_fields() -> None:
    s = slim(full_cr())
    assert s["metadata"] == {
        "name": "web-1",
        "namespace": "shop",
        "uid": "0b7a-uid",
        "resourceVersion": "4711",
        "podName": "web-1",  # for its Events
    }
    assert set(s["spec"]) == {
        "requirements",
        "resources",
        "priority",
        "topologySpread",
        "coLocation",
        "interruptionPenalty",
        "reclamationPenalty",
    }
    assert s["status"] == {"phase": "Pending"}
    assert s["apiVersion"] == "bigfleet.lucy.sh/v1alpha1" and s["kind"] == "CapacityRequest"


def test_slim_preserves_rollup_and_ack_view() -> None:
    full = full_cr()
    s = slim(copy.deepcopy(full))
    assert contribution_from_cr(s) == contribution_from_cr(full)
    assert cr_key(s) == "shop/web-1" and is_pending(s)
    assert not is_pending(slim(full_cr(phase="Acknowledged")))


def test_slim_shares_equal_specs_and_statuses() -> None:
    a = slim(full_cr("a"))
    b = slim(full_cr("b"))
    assert a["spec"] is b["spec"]
    assert a["status"] is b["status"]
    assert a["metadata"]["name"] == "a" and b["metadata"]["name"] == "b"


def test_slim_tolerates_missing_parts() -> None:
    assert slim({"metadata": {"name": "x"}}) == {
        "apiVersion": "",
        "kind": "",
        "metadata": {"name": "x"},
    }
    s = slim({"metadata": {"name": "x", "namespace": "n"}, "spec": "garbage", "status": {}})
    assert s["spec"] == "garbage" and "status" not in s
