"""Pure parts of the controller: the slim Pod/CR projections and the merge-patch diff."""

from __future__ import annotations

from typing import Any

from bigfleet_trio.kube.mergepatch import merge_diff as merge_patch_diff
from bigfleet_trio.podcontroller.projections import (
    OWNED_BY_POD_KEY,
    OWNER_POD_KEY,
    index_owner_pod,
    index_owner_uid,
    owner_pod_name,
    owner_uid,
    slim_cr,
    slim_pod,
)
from bigfleet_trio.podcontroller.translate import translate_pod

REQ = "requiredDuringSchedulingIgnoredDuringExecution"
PREF = "preferredDuringSchedulingIgnoredDuringExecution"


def full_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u-1",
            "resourceVersion": "42",
            "labels": {"app": "x"},
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{...big...}",
                "bigfleet.lucy.sh/interruption-penalty": "10",
            },
            "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "uid": "rs-1"}],
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {
            "priority": 5,
            "priorityClassName": "gold",
            "nodeSelector": {"zone": "a"},
            "overhead": {"cpu": "100m"},
            "affinity": {
                "nodeAffinity": {REQ: {"nodeSelectorTerms": []}, PREF: [{"weight": 1}]},
                "podAffinity": {PREF: [{"weight": 1}]},
                "podAntiAffinity": {REQ: [{"topologyKey": "h"}]},
            },
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "env": [{"name": "A"}],
                    "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}},
                }
            ],
            "initContainers": [
                {
                    "name": "i",
                    "image": "busybox",
                    "restartPolicy": "Always",
                    "resources": {"requests": {"memory": "1Gi"}},
                }
            ],
            "volumes": [{"name": "v"}],
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready"}], "podIP": "10.0.0.1"},
    }


def test_slim_pod_keeps_exactly_what_translation_and_events_need() -> None:
    assert slim_pod(full_pod()) == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u-1",
            "annotations": {"bigfleet.lucy.sh/interruption-penalty": "10"},
            # no ownerReferences: nothing reads a Pod's owners (the memory of 150,000 Pods)
        },
        "spec": {
            "priority": 5,
            "priorityClassName": "gold",
            "nodeSelector": {"zone": "a"},
            "overhead": {"cpu": "100m"},
            "affinity": {"nodeAffinity": {REQ: {"nodeSelectorTerms": []}}},
            "containers": [{"resources": {"requests": {"cpu": "1"}}}],
            "initContainers": [
                {"restartPolicy": "Always", "resources": {"requests": {"memory": "1Gi"}}}
            ],
        },
        "status": {"phase": "Running"},
    }


def test_slim_pod_translates_like_the_full_pod() -> None:
    assert translate_pod(slim_pod(full_pod()), None) == translate_pod(full_pod(), None)


def test_slim_pod_hides_status_churn() -> None:
    a, b = full_pod(), full_pod()
    b["metadata"]["resourceVersion"] = "43"
    b["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    assert slim_pod(a) == slim_pod(b)
    b["status"]["phase"] = "Succeeded"
    assert slim_pod(a) != slim_pod(b)


def test_slim_pod_keeps_malformed_shapes_for_translation_to_report() -> None:
    bad = {
        "metadata": {"name": "p", "annotations": "oops"},
        "spec": {"containers": "nope", "affinity": ["x"]},
    }
    assert slim_pod(bad) == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "annotations": "oops"},
        "spec": {"containers": "nope", "affinity": ["x"]},
    }
    assert slim_pod({}) == {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {}}


def test_slim_cr() -> None:
    cr = {
        "apiVersion": "bigfleet.lucy.sh/v1alpha1",
        "kind": "CapacityRequest",
        "metadata": {
            "name": "cr-u",
            "namespace": "ns",
            "uid": "c-1",
            "resourceVersion": "9",
            "labels": {"bigfleet.lucy.sh/owned-by-pod": "u", "x": "y"},
            "ownerReferences": [{"kind": "Pod", "name": "p", "uid": "u"}],
        },
        "spec": {"priority": 1, "resources": {}},
        "status": {"phase": "Acknowledged", "acknowledgedAt": "t"},
    }
    slim = slim_cr(cr)
    # the owned-by-pod label's value and the owner Pod's name are kept as two strings in
    # metadata, not as a labels dict and a list of ownerReference dicts (450 bytes per CR)
    assert slim == {
        "metadata": {
            "name": "cr-u",
            "namespace": "ns",
            "uid": "c-1",
            OWNED_BY_POD_KEY: "u",
            OWNER_POD_KEY: "p",
        },
        "spec": {"priority": 1, "resources": {}},
        "status": {"phase": "Acknowledged"},
    }
    for shape in (cr, slim):  # the readers take the full object and the cached one alike
        assert owner_uid(shape) == "u"
        assert owner_pod_name(shape) == "p"
        assert index_owner_uid(shape) == ["u"]
        assert index_owner_pod(shape) == ["ns/p"]


def test_slim_cr_owner_is_the_first_pod_reference_and_malformed_owners_read_as_none() -> None:
    refs = [{"kind": "ReplicaSet", "name": "rs"}, "junk", {"kind": "Pod", "name": "p1"},
            {"kind": "Pod", "name": "p2"}]
    cr = {"metadata": {"name": "c", "namespace": "ns", "ownerReferences": refs}}
    assert owner_pod_name(slim_cr(cr)) == "p1"
    for bad in ("oops", [{"kind": "Pod", "name": 7}], [{"kind": "Pod"}], []):
        slim = slim_cr({"metadata": {"name": "c", "ownerReferences": bad,
                                     "labels": {"bigfleet.lucy.sh/owned-by-pod": 3}}})
        assert owner_pod_name(slim) is None
        assert owner_uid(slim) == ""
        assert index_owner_pod(slim) == index_owner_uid(slim) == []
    assert owner_uid(slim_cr({})) == "" and owner_pod_name(slim_cr({})) is None


def test_merge_patch_diff() -> None:
    old = {
        "priority": 0,
        "resources": {"cpu": "1", "memory": "1Gi"},
        "requirements": [{"key": "a", "operator": "Exists"}],
        "coLocation": {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "zone"},
        "interruptionPenalty": "5",
    }
    new = {
        "priority": 0,
        "resources": {"cpu": "2", "memory": "1Gi"},
        "requirements": [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}],
        "coLocation": {
            "labelSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
            "topologyKey": "zone",
        },
        "reclamationPenalty": "1",
    }
    assert merge_patch_diff(old, new) == {
        "resources": {"cpu": "2"},
        "requirements": [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}],
        "coLocation": {
            "labelSelector": {
                "matchLabels": None,
                "matchExpressions": [{"key": "app", "operator": "Exists"}],
            }
        },
        "interruptionPenalty": None,
        "reclamationPenalty": "1",
    }
    assert merge_patch_diff(new, new) == {}
    assert merge_patch_diff(None, {"a": 1}) == {"a": 1}
    assert merge_patch_diff({"a": {"b": 1}}, {"a": 2}) == {"a": 2}


def test_slim_pods_of_one_template_share_their_spec_and_status() -> None:
    a, b, c = full_pod(), full_pod(), full_pod()
    b["metadata"].update(name="q", uid="u-2")
    c["spec"]["priority"] = 6
    sa, sb, sc = slim_pod(a), slim_pod(b), slim_pod(c)
    assert sa["spec"] is sb["spec"] and sa["status"] is sb["status"]  # one object per template
    assert sa["metadata"] is not sb["metadata"] and sb["metadata"]["uid"] == "u-2"
    assert sc["spec"] is not sa["spec"] and sc["spec"]["priority"] == 6
    assert sc["spec"] == {**sa["spec"], "priority": 6}
