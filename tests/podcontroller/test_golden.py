"""Golden tests: every real-workload manifest -> Pods -> CapacityRequest specs.

Expectations live in ``golden/expected.yaml`` and were written by hand from the manifests
(each entry says how its numbers were derived). PriorityClass and RuntimeClass objects are
resolved across all fixture files, as the INDEX.md ``->`` references describe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bigfleet_trio.podcontroller.defaults import load_priority_class_defaults
from bigfleet_trio.podcontroller.translate import (
    OWNED_BY_POD_LABEL,
    build_capacity_request,
    translate_pod,
)
from bigfleet_trio.sim.expand import expand_manifests, load_manifests

HERE = Path(__file__).parent
FIXTURES = HERE.parent / "fixtures" / "real-workloads"
GOLDEN = HERE / "golden"
EXPECTED: dict[str, dict[str, Any]] = yaml.safe_load((GOLDEN / "expected.yaml").read_text())
DEFAULTS = load_priority_class_defaults(GOLDEN / "priority-class-defaults.yaml")
FIXTURE_FILES = sorted(p.name for p in FIXTURES.glob("*.yaml"))
CLASS_OBJECTS = [
    o
    for o in load_manifests(FIXTURES / name for name in FIXTURE_FILES)
    if o.get("kind") in ("PriorityClass", "RuntimeClass")
]


def test_every_fixture_has_an_expectation() -> None:
    assert FIXTURE_FILES, "fixtures missing"
    assert sorted(EXPECTED) == FIXTURE_FILES


def test_every_fixture_keeps_its_source_line() -> None:
    for name in FIXTURE_FILES:
        first = (FIXTURES / name).read_text().splitlines()[0]
        assert first.startswith("# source: "), name
    index = (FIXTURES / "INDEX.md").read_text()
    for name in FIXTURE_FILES:
        assert f"`{name}`" in index, name


def _pods(name: str) -> list[dict[str, Any]]:
    objs = load_manifests([FIXTURES / name])
    classes = [c for c in CLASS_OBJECTS if c not in objs]
    return expand_manifests(objs + classes, include_suspended=True)


@pytest.mark.parametrize("name", FIXTURE_FILES)
def test_golden(name: str) -> None:
    expected = EXPECTED[name]
    pods = _pods(name)
    assert len(pods) == expected["pods"]
    for pod in pods:
        assert pod["metadata"]["namespace"] == expected["namespace"]
        t = translate_pod(pod, DEFAULTS)
        assert t.warnings == ()
        assert t.spec == expected["spec"]
        cr = build_capacity_request(pod, t)
        uid = pod["metadata"]["uid"]
        assert cr["metadata"]["labels"] == {OWNED_BY_POD_LABEL: uid}
        assert cr["metadata"]["namespace"] == expected["namespace"]
        assert cr["metadata"]["ownerReferences"][0]["name"] == pod["metadata"]["name"]
        assert cr["spec"] == expected["spec"]


def test_golden_uid_from_manifest() -> None:
    # kata__k8s-policy-pod.yaml carries metadata.uid: policy-pod-uid.
    (pod,) = _pods("kata__k8s-policy-pod.yaml")
    cr = build_capacity_request(pod, translate_pod(pod, DEFAULTS))
    assert cr["metadata"]["name"] == "cr-policy-pod-uid"
    assert cr["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "policy-pod",
            "uid": "policy-pod-uid",
            "controller": True,
        }
    ]


def test_golden_specs_are_json_ready() -> None:
    import json

    checked = 0
    for name in FIXTURE_FILES:
        for pod in _pods(name):
            spec = translate_pod(pod, DEFAULTS).spec
            assert json.loads(json.dumps(spec)) == spec
            checked += 1
    assert checked >= len(FIXTURE_FILES) > 0  # not vacuous: every fixture file has a Pod
