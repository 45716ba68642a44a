"""Pure units of the embedded apiserver: selectors, patches, name and schema validation."""

from __future__ import annotations

import pytest

from bigfleet_trio.kube.labelselector import match_labels
from bigfleet_trio.sim.apiserver.errors import ApiError
from bigfleet_trio.sim.apiserver.metadata import validate_name
from bigfleet_trio.sim.apiserver.patching import merge_patch, strategic_merge_patch
from bigfleet_trio.sim.apiserver.selectors import (
    label_selector_from_object,
    parse_field_selector,
    parse_label_selector,
)
from bigfleet_trio.sim.apiserver.validation import SchemaValidator


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("app=web", {"app": "web"}, True),
        ("app==web", {"app": "db"}, False),
        ("app!=web", {}, True),
        ("app!=web", {"app": "web"}, False),
        ("app in (web, db)", {"app": "db"}, True),
        ("app notin (web)", {}, True),
        ("app notin (web)", {"app": "web"}, False),
        ("app", {"app": ""}, True),
        ("!app", {"app": "x"}, False),
        ("tier>2", {"tier": "3"}, True),
        ("tier<2", {"tier": "3"}, False),
        ("tier>2", {}, False),
        ("app in (web),!canary", {"app": "web", "canary": "1"}, False),
        ("example.com/team=a,app", {"example.com/team": "a", "app": "x"}, True),
        ("", {"x": "y"}, True),
    ],
)
def test_label_selectors(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert match_labels(parse_label_selector(selector), labels) is expected


@pytest.mark.parametrize(
    "bad",
    ["app in (web", "app=web)", "a=b=c", "tier>x", "-bad=x", "app in ()", "k=" + "v" * 64, ","],
)
def test_bad_label_selectors_are_400(bad: str) -> None:
    with pytest.raises(ApiError) as exc:
        parse_label_selector(bad)
    assert exc.value.code == 400


def test_field_selectors() -> None:
    ok = {"spec.nodeName", "metadata.name"}
    assert parse_field_selector("spec.nodeName=n1,metadata.name!=x", ok.__contains__) == [
        ("spec.nodeName", "=", "n1"),
        ("metadata.name", "!=", "x"),
    ]
    assert parse_field_selector("spec.nodeName==n1", ok.__contains__) == [
        ("spec.nodeName", "=", "n1")
    ]
    with pytest.raises(ApiError) as exc:
        parse_field_selector("spec.foo=x", ok.__contains__)
    assert exc.value.message == "field label not supported: spec.foo"
    with pytest.raises(ApiError):
        parse_field_selector("spec.nodeName", ok.__contains__)


def test_label_selector_objects() -> None:
    assert label_selector_from_object(None) is None
    assert label_selector_from_object({}) == []
    reqs = label_selector_from_object(
        {
            "matchLabels": {"a": "1"},
            "matchExpressions": [{"key": "b", "operator": "NotIn", "values": ["x"]}],
        }
    )
    assert (
        reqs is not None
        and match_labels(reqs, {"a": "1", "b": "y"})
        and not match_labels(reqs, {"a": "1", "b": "x"})
    )


def test_merge_patch_rfc7386_and_inputs_untouched() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]}
    patch = {"a": "z", "c": {"f": None}, "l": [3]}
    assert merge_patch(target, patch) == {"a": "z", "c": {"d": "e"}, "l": [3]}
    assert target == {"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]}
    assert merge_patch({"a": 1}, {"b": {"c": None}}) == {"a": 1, "b": {}}


def test_strategic_merge_patch_subset() -> None:
    pod = {
        "spec": {
            "containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "2"}],
            "tolerations": [{"key": "x"}],
        },
        "metadata": {"finalizers": ["f1"]},
    }
    out = strategic_merge_patch(
        pod, {"spec": {"containers": [{"name": "b", "image": "3"}, {"name": "c", "image": "4"}]}}
    )
    assert out["spec"]["containers"] == [
        {"name": "a", "image": "1"},
        {"name": "b", "image": "3"},
        {"name": "c", "image": "4"},
    ]
    out = strategic_merge_patch(pod, {"spec": {"containers": [{"name": "a", "$patch": "delete"}]}})
    assert out["spec"]["containers"] == [{"name": "b", "image": "2"}]
    out = strategic_merge_patch(
        pod,
        {
            "spec": {
                "$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
                "containers": [{"name": "a", "image": "9"}],
            }
        },
    )
    assert [c["name"] for c in out["spec"]["containers"]] == ["b", "a"]
    assert out["spec"]["containers"][1]["image"] == "9"
    out = strategic_merge_patch(pod, {"metadata": {"finalizers": ["f2"]}})
    assert out["metadata"]["finalizers"] == ["f1", "f2"]
    out = strategic_merge_patch(pod, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["f1"]}})
    assert out["metadata"]["finalizers"] == []
    out = strategic_merge_patch(pod, {"spec": {"$patch": "replace", "containers": []}})
    assert out["spec"] == {"containers": []}
    out = strategic_merge_patch(
        {"spec": {"unschedulable": True, "podCIDR": "x"}}, {"spec": {"unschedulable": None}}
    )
    assert out == {"spec": {"podCIDR": "x"}}
    assert pod["spec"]["containers"][0] == {"name": "a", "image": "1"}


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("a", True),
        ("a.b-c", True),
        ("A", False),
        ("-a", False),
        ("a_b", False),
        ("a" * 253, True),
        ("a" * 254, False),
    ],
)
def test_subdomain_names(name: str, ok: bool) -> None:
    assert (validate_name(name) == []) is ok


def test_label_names() -> None:
    assert validate_name("team-a", label=True) == []
    assert validate_name("a.b", label=True)[0]["reason"] == "FieldValueInvalid"
    assert validate_name("", label=True)[0]["reason"] == "FieldValueRequired"


def test_schema_prune_default_and_nullable() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "n": {"type": "integer", "default": 7},
                    "s": {"type": "string", "nullable": True},
                    "m": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            }
        },
    }
    v = SchemaValidator(schema)
    obj, unknown = v.prune(
        {"metadata": {"name": "x"}, "spec": {"s": None, "m": {"a": "b"}, "zz": 1}, "extra": 2}
    )
    assert obj == {"metadata": {"name": "x"}, "spec": {"s": None, "m": {"a": "b"}, "n": 7}}
    assert unknown == ["spec.zz", "extra"]
    assert v.validate(obj) == []
    assert v.validate({"spec": {"n": "x"}})[0]["field"] == "spec.n"


def test_compiled_checker_agrees_with_jsonschema() -> None:
    from bigfleet_trio.sim.apiserver import ApiServer

    api = ApiServer()
    v = api.find("cr").validator
    assert v is not None and v._fast is not None
    cases = [
        {"spec": {"priority": 1, "resources": {"cpu": "1"}}},
        {"spec": {"priority": "x", "resources": {"cpu": "lots", "mem": 3}}},
        {"spec": {"priority": 1.5, "resources": {}}, "status": {"phase": "Nope"}},
        {
            "spec": {
                "resources": {"cpu": True},
                "requirements": [{"key": "k", "operator": "In", "values": [1]}],
            }
        },
        {
            "spec": {
                "priority": 1,
                "resources": {"cpu": "1"},
                "coLocation": {},
                "topologySpread": [{"maxSkew": 1}],
            }
        },
        {
            "spec": {"priority": 1, "resources": {"cpu": "1"}, "interruptionPenalty": [1]},
            "status": {},
        },
        {"spec": "not-an-object"},
    ]
    for obj in cases:
        fast = sorted((c["field"], c["reason"]) for c in v.validate(obj))
        slow = sorted((c["field"], c["reason"]) for c in v._validate_jsonschema(obj))
        assert fast == slow, obj


def test_protobuf_namespace_decode() -> None:
    from bigfleet_trio.sim.apiserver.protobuf import ProtobufError, decode

    def ld(num: int, payload: bytes) -> bytes:
        return bytes([num << 3 | 2, len(payload)]) + payload

    label = ld(1, b"a") + ld(2, b"b")
    meta = ld(1, b"foo") + ld(11, label)
    type_meta = ld(1, b"v1") + ld(2, b"Namespace")
    body = b"k8s\x00" + ld(1, type_meta) + ld(2, ld(1, meta))
    assert decode(body) == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "foo", "labels": {"a": "b"}},
    }
    with pytest.raises(ProtobufError):
        decode(b"k8s\x00" + ld(1, ld(1, b"apps/v1") + ld(2, b"Deployment")))
    with pytest.raises(ProtobufError):
        decode(b"k8s\x00\x0a\x7f")
    with pytest.raises(ProtobufError):
        decode(b"{}")


def test_pdb_status_pure() -> None:
    from bigfleet_trio.sim.apiserver.controllers import pdb_status

    def pod(name: str, healthy: bool) -> dict:
        st = (
            {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
            if healthy
            else {"phase": "Pending"}
        )
        return {"metadata": {"name": name, "labels": {"app": "web"}}, "status": st}

    pods = [
        pod("a", True),
        pod("b", True),
        pod("c", False),
        {"metadata": {"name": "x", "labels": {"app": "db"}}, "status": {}},
    ]
    pdb = {
        "metadata": {"name": "p", "generation": 2},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}},
    }
    st = pdb_status(pdb, pods, {"disruptedPods": {"a": "t", "gone": "t"}})
    assert (
        st["expectedPods"],
        st["currentHealthy"],
        st["desiredHealthy"],
        st["disruptionsAllowed"],
    ) == (3, 2, 2, 0)
    assert st["observedGeneration"] == 2 and st["disruptedPods"] == {"a": "t"}
    assert st["conditions"][0]["status"] == "False"
    pdb["spec"] = {"minAvailable": "50%", "selector": {"matchLabels": {"app": "web"}}}
    st = pdb_status(pdb, pods, None)
    assert (st["desiredHealthy"], st["disruptionsAllowed"]) == (2, 0)
    pdb["spec"] = {"maxUnavailable": 1, "selector": {}}
    st = pdb_status(pdb, pods, None)
    assert (st["expectedPods"], st["desiredHealthy"], st["disruptionsAllowed"]) == (4, 3, 0)
    pdb["spec"] = {"maxUnavailable": 1}
    assert pdb_status(pdb, pods, None)["expectedPods"] == 0
