"""The rule that drops a MODIFIED Pod before its projection (docs/kube-api.md#unchanged-pod-events):
``pod_unchanged`` says True only when ``slim_pod`` would give the cached projection, for every
mutation below and every scope; it says True for the status heartbeats it exists for."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from bigfleet_trio.kube.disruption import DO_NOT_DISRUPT
from bigfleet_trio.podcontroller.projections import pod_unchanged, slim_pod
from bigfleet_trio.podcontroller.scope import PodScope
from bigfleet_trio.podcontroller.zonepin import ZONE_LABEL

Pod = dict[str, Any]


def _pod(*, node: str | None = None, zone: bool = False) -> Pod:
    labels = {"app": "web"}
    if zone:
        labels[ZONE_LABEL] = "zone-a"
    pod: Pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "10",
                     "generation": 1, "labels": labels,
                     "annotations": {"team": "a", DO_NOT_DISRUPT: "true"}},
        "spec": {"containers": [{"name": "c", "image": "i:1",
                                 "resources": {"requests": {"cpu": "1"}}}],
                 "nodeSelector": {"disk": "ssd"}},
        "status": {"phase": "Pending",
                   "conditions": [{"type": "PodScheduled", "status": "False"}]},
    }
    if node is not None:
        pod["spec"]["nodeName"] = node
        pod["status"]["phase"] = "Running"
    return pod


def _meta(p: Pod) -> dict[str, Any]:
    meta: dict[str, Any] = p["metadata"]
    return meta


def _heartbeat(p: Pod) -> None:  # kubelet's status write: conditions and a new resourceVersion
    p["status"]["conditions"].append({"type": "Ready", "status": "True"})
    p["status"]["containerStatuses"] = [{"name": "c", "ready": True, "restartCount": 3}]
    _meta(p)["resourceVersion"] = "11"


def _spec_change(p: Pod) -> None:  # an in-place resize: the apiserver bumps the generation
    p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
    _meta(p)["generation"] = 2


def _image_change(p: Pod) -> None:  # a spec change the projection does not read
    p["spec"]["containers"][0]["image"] = "i:2"
    _meta(p)["generation"] = 2


def _bind(p: Pod) -> None:  # the binding: nodeName set, the generation not bumped
    p["spec"]["nodeName"] = "n1"


def _no_generation(p: Pod) -> None:
    _meta(p).pop("generation")
    _heartbeat(p)


# (name, mutation, pod_unchanged without a scope): every mutation that leaves the projection
# equal either says True or is one the rule cannot see without the spec.
MUTATIONS: list[tuple[str, Callable[[Pod], None], bool]] = [
    ("heartbeat", _heartbeat, True),
    ("resourceVersion only", lambda p: _meta(p).update(resourceVersion="12"), True),
    ("other annotation", lambda p: _meta(p)["annotations"].update(team="b"), True),
    ("other label, unbound", lambda p: _meta(p)["labels"].update(app="api"), True),
    ("managedFields", lambda p: _meta(p).update(managedFields=[{"manager": "kubelet"}]), True),
    ("phase", lambda p: p["status"].update(phase="Failed"), False),
    ("phase dropped", lambda p: p.pop("status"), False),
    ("resize", _spec_change, False),
    ("image", _image_change, False),
    ("kept annotation", lambda p: _meta(p)["annotations"].update({DO_NOT_DISRUPT: "false"}),
     False),
    ("kept annotation removed", lambda p: _meta(p)["annotations"].pop(DO_NOT_DISRUPT), False),
    ("annotations malformed", lambda p: _meta(p).update(annotations="x"), False),
    ("deletionTimestamp", lambda p: _meta(p).update(deletionTimestamp="2026-12-03T00:00:00Z"),
     False),
    ("uid", lambda p: _meta(p).update(uid="u2"), False),
    ("no generation", _no_generation, False),
    ("generation malformed", lambda p: _meta(p).update(generation="1"), False),
    ("bind, no zone label", _bind, True),
    ("metadata malformed", lambda p: p.update(metadata="x"), False),
]

SCOPES = {
    "no scope": None,
    "watches nodes": PodScope.parse(),
    "excludes app=api": PodScope.parse((), exclude_pod_selector="app=api"),  # no Node cache
}

# mutations whose answer a scope changes
SCOPED = {
    ("watches nodes", "bind, no zone label"): False,  # the scope keeps the Node's name
    ("excludes app=api", "other label, unbound"): False,  # the label now excludes the Pod
}


@pytest.mark.parametrize("scope_name", SCOPES)
@pytest.mark.parametrize(("name", "mutate", "expected"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_unchanged_only_when_the_projection_would_be_equal(
    scope_name: str, name: str, mutate: Callable[[Pod], None], expected: bool,
) -> None:
    scope = SCOPES[scope_name]
    base = _pod()
    new = copy.deepcopy(base)
    mutate(new)
    old = slim_pod(base, scope)
    verdict = pod_unchanged(old, new, scope)
    assert verdict is SCOPED.get((scope_name, name), expected)
    if verdict and isinstance(new.get("metadata"), dict):
        assert slim_pod(new, scope) == old  # a skip never hides a change


@pytest.mark.parametrize("scope_name", SCOPES)
def test_a_bound_pod_with_a_zone_label_is_seen_binding(scope_name: str) -> None:
    scope = SCOPES[scope_name]
    base = _pod(zone=True)
    new = copy.deepcopy(base)
    _bind(new)
    assert not pod_unchanged(slim_pod(base, scope), new, scope)
    assert slim_pod(new, scope) != slim_pod(base, scope)  # the zone labels are kept once bound


@pytest.mark.parametrize("scope_name", SCOPES)
def test_a_running_pods_heartbeats_are_unchanged(scope_name: str) -> None:
    scope = SCOPES[scope_name]
    base = _pod(node="n1", zone=True)
    new = copy.deepcopy(base)
    _heartbeat(new)
    assert pod_unchanged(slim_pod(base, scope), new, scope)


def test_the_head_the_decoder_builds_answers_as_the_whole_pod() -> None:
    """kube/protowire.py's ``pod_head`` keeps metadata, spec.nodeName and status.phase."""
    scope = SCOPES["watches nodes"]
    base = _pod(node="n1")
    for _name, mutate, _ in MUTATIONS:
        new = copy.deepcopy(base)
        mutate(new)
        meta = new.get("metadata")
        if not isinstance(meta, dict):
            continue
        head: Pod = {"metadata": meta, "spec": {"nodeName": new["spec"].get("nodeName")}}
        if "status" in new:
            head["status"] = {"phase": new["status"]["phase"]}
        old = slim_pod(base, scope)
        assert pod_unchanged(old, head, scope) is pod_unchanged(old, new, scope)


def test_a_malformed_cached_value_is_never_unchanged() -> None:
    assert not pod_unchanged({"metadata": "x"}, _pod())
    assert not pod_unchanged({}, _pod())
