"""The shipped CRDs (bigfleet_trio/manifests/crds.yaml) against /work/shared/protocol.md
"Custom resources" as a whole (issue 7): names, scope, short names, category, the status
subresource, printer columns, selectable fields, and the spec/status property names, required
fields, enums and types protocol.md lists (reference-behavior.md §13 says the same).

The expected table below is written by hand from protocol.md. Where protocol.md names a printer
column but not its JSON path or type, the path is the field the column is named after and the
type follows from the field (int32 -> integer, quantity/enum -> string, Age -> date of
``.metadata.creationTimestamp``, the kubectl convention).
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import pytest
import yaml

GROUP = "bigfleet.lucy.sh"
VERSION = "v1alpha1"

QUANTITY = "quantity"  # int-or-string quantity (x-kubernetes-int-or-string + quantity pattern)
QUANTITY_MAP = "map of quantity"

# kind -> what protocol.md says. Property tables: name -> type ("string", "integer/int32",
# "date-time", QUANTITY, QUANTITY_MAP, "map", "list", "object").
EXPECTED: dict[str, dict[str, Any]] = {
    "CapacityRequest": {
        "plural": "capacityrequests",
        "singular": "capacityrequest",
        "scope": "Namespaced",
        "shortNames": ["cr", "crs"],
        "columns": [
            ("Phase", "string", ".status.phase"),
            ("Priority", "integer", ".spec.priority"),
            ("Age", "date", ".metadata.creationTimestamp"),
        ],
        "selectable": [".status.phase"],
        "spec": {
            "priority": "integer/int32",
            "resources": QUANTITY_MAP,
            "requirements": "list",
            "coLocation": "object",
            "topologySpread": "list",
            "interruptionPenalty": QUANTITY,
            "reclamationPenalty": QUANTITY,
        },
        "spec_required": ["priority", "resources"],
        "status": {"phase": "string", "acknowledgedAt": "date-time"},
        "status_required": ["phase"],
        "enums": {("status", "phase"): ["Pending", "Acknowledged"]},
    },
    "UpcomingNode": {
        "plural": "upcomingnodes",
        "singular": "upcomingnode",
        "scope": "Cluster",
        "shortNames": ["upn"],
        "columns": [
            ("Phase", "string", ".status.phase"),
            ("Node", "string", ".status.nodeRef.name"),
            ("Age", "date", ".metadata.creationTimestamp"),
        ],
        "selectable": [],
        "spec": {"labels": "map", "resources": QUANTITY_MAP, "taints": "list"},
        "spec_required": ["resources"],
        "status": {
            "phase": "string",
            "nodeRef": "object",
            "providerID": "string",
            "lastError": "string",
            "provisioningStartTime": "date-time",
        },
        "status_required": ["phase"],
        "enums": {
            ("status", "phase"): [
                "Provisioning", "Launched", "Registered", "Ready", "Draining", "Drained",
                "Failed",
            ],
        },
    },
    "AvailableCapacity": {
        "plural": "availablecapacities",
        "singular": "availablecapacity",
        "scope": "Cluster",
        "shortNames": ["avc"],
        "columns": [
            ("Availability", "string", ".spec.availability"),
            ("Available", "integer", ".spec.availableCount"),
            ("Cost", "string", ".spec.cost"),
        ],
        "selectable": [],
        "spec": {
            "availability": "string",
            "availableCount": "integer/int32",
            "cost": QUANTITY,
            "requirements": "list",
            "resources": QUANTITY_MAP,
        },
        "spec_required": ["availability", "availableCount", "cost", "resources"],
        "status": {},  # "Status is empty."
        "status_required": [],
        "enums": {("spec", "availability"): ["None", "Low", "Medium", "High"]},
    },
}

REQUIREMENT_OPERATORS = ["In", "NotIn", "Exists", "DoesNotExist"]


def _load() -> dict[str, dict[str, Any]]:
    text = resources.files("bigfleet_trio").joinpath("manifests/crds.yaml").read_text()
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    out: dict[str, dict[str, Any]] = {}
    for d in docs:
        assert d["apiVersion"] == "apiextensions.k8s.io/v1"
        assert d["kind"] == "CustomResourceDefinition"
        kind = d["spec"]["names"]["kind"]
        assert kind not in out, f"{kind} defined twice"
        out[kind] = d
    return out


CRDS = _load()


def _version(crd: dict[str, Any]) -> dict[str, Any]:
    versions = crd["spec"]["versions"]
    assert [v["name"] for v in versions] == [VERSION]
    return dict(versions[0])


def _schema(crd: dict[str, Any]) -> dict[str, Any]:
    return dict(_version(crd)["schema"]["openAPIV3Schema"])


def _is_quantity(prop: dict[str, Any]) -> bool:
    return (
        prop.get("x-kubernetes-int-or-string") is True
        and prop.get("anyOf") == [{"type": "integer"}, {"type": "string"}]
        and isinstance(prop.get("pattern"), str)
        and "type" not in prop
    )


def _type_of(prop: dict[str, Any]) -> str:
    """Classify a schema property into the vocabulary of :data:`EXPECTED`."""
    if _is_quantity(prop):
        return QUANTITY
    t = prop.get("type")
    if t == "integer":
        return f"integer/{prop.get('format')}" if prop.get("format") else "integer"
    if t == "string":
        return "date-time" if prop.get("format") == "date-time" else "string"
    if t == "array":
        return "list"
    if t == "object":
        extra = prop.get("additionalProperties")
        if isinstance(extra, dict):
            return QUANTITY_MAP if _is_quantity(extra) else "map"
        return "object"
    return f"?{prop!r}"


def test_exactly_the_three_protocol_kinds() -> None:
    assert sorted(CRDS) == sorted(EXPECTED)


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_names_scope_group_version(kind: str) -> None:
    want, crd = EXPECTED[kind], CRDS[kind]
    assert crd["metadata"]["name"] == f"{want['plural']}.{GROUP}"
    spec = crd["spec"]
    assert spec["group"] == GROUP
    assert spec["scope"] == want["scope"]
    assert spec["names"] == {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": want["plural"],
        "singular": want["singular"],
        "shortNames": want["shortNames"],
        "categories": ["fleet"],  # "All three are in category `fleet`."
    }
    v = _version(crd)
    assert v["served"] is True and v["storage"] is True


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_status_subresource_columns_and_selectable_fields(kind: str) -> None:
    want, v = EXPECTED[kind], _version(CRDS[kind])
    assert v.get("subresources") == {"status": {}}
    columns = [(c["name"], c["type"], c["jsonPath"]) for c in v["additionalPrinterColumns"]]
    assert columns == want["columns"]
    assert [f["jsonPath"] for f in v.get("selectableFields", [])] == want["selectable"]


@pytest.mark.parametrize("kind", sorted(EXPECTED))
@pytest.mark.parametrize("part", ["spec", "status"])
def test_properties_required_and_types(kind: str, part: str) -> None:
    want = EXPECTED[kind]
    root = _schema(CRDS[kind])
    assert root["type"] == "object"
    assert set(root["properties"]) == {"apiVersion", "kind", "metadata", "spec", "status"}
    schema = root["properties"][part]
    assert schema["type"] == "object"
    props = schema.get("properties", {})
    assert {name: _type_of(p) for name, p in props.items()} == want[part]
    assert sorted(schema.get("required", [])) == sorted(want[f"{part}_required"])


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_enums(kind: str) -> None:
    root = _schema(CRDS[kind])
    found: dict[tuple[str, str], list[str]] = {}
    for part in ("spec", "status"):
        for name, prop in root["properties"][part].get("properties", {}).items():
            if "enum" in prop:
                found[(part, name)] = prop["enum"]
    assert found == EXPECTED[kind]["enums"]


@pytest.mark.parametrize("kind", ["CapacityRequest", "AvailableCapacity"])
def test_requirements_are_node_selector_requirements(kind: str) -> None:
    """``requirements``: list of {key, operator (In|NotIn|Exists|DoesNotExist), values}."""
    req = _schema(CRDS[kind])["properties"]["spec"]["properties"]["requirements"]
    item = req["items"]
    assert item["type"] == "object"
    assert {n: _type_of(p) for n, p in item["properties"].items()} == {
        "key": "string", "operator": "string", "values": "list"}
    assert item["properties"]["operator"]["enum"] == REQUIREMENT_OPERATORS
    assert item["properties"]["values"]["items"] == {"type": "string"}
    assert sorted(item["required"]) == ["key", "operator"]


def test_capacity_request_co_location_and_topology_spread() -> None:
    spec = _schema(CRDS["CapacityRequest"])["properties"]["spec"]["properties"]
    co = spec["coLocation"]
    assert {n: _type_of(p) for n, p in co["properties"].items()} == {
        "labelSelector": "object", "topologyKey": "string"}
    assert co["required"] == ["topologyKey"]
    selector = co["properties"]["labelSelector"]["properties"]
    assert {n: _type_of(p) for n, p in selector.items()} == {
        "matchLabels": "map", "matchExpressions": "list"}
    spread = spec["topologySpread"]["items"]
    assert {n: _type_of(p) for n, p in spread["properties"].items()} == {
        "maxSkew": "integer/int32", "topologyKey": "string", "whenUnsatisfiable": "string"}
    assert sorted(spread["required"]) == ["maxSkew", "topologyKey", "whenUnsatisfiable"]


def test_upcoming_node_taints_and_node_ref() -> None:
    root = _schema(CRDS["UpcomingNode"])["properties"]
    taint = root["spec"]["properties"]["taints"]["items"]
    assert {n: _type_of(p) for n, p in taint["properties"].items()} == {
        "key": "string", "value": "string", "effect": "string", "timeAdded": "date-time"}
    # nodeRef is a core ObjectReference (its name feeds the Node printer column)
    ref = root["status"]["properties"]["nodeRef"]["properties"]
    assert set(ref) == {"apiVersion", "kind", "name", "namespace", "uid", "resourceVersion",
                        "fieldPath"}
    assert all(_type_of(p) == "string" for p in ref.values())


def _quantity_props() -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for kind, crd in sorted(CRDS.items()):
        spec = _schema(crd)["properties"]["spec"]["properties"]
        for name, prop in sorted(spec.items()):
            if _type_of(prop) == QUANTITY:
                out.append((kind, name, prop))
            elif _type_of(prop) == QUANTITY_MAP:
                out.append((kind, name, prop["additionalProperties"]))
    return out


def test_every_quantity_field_is_covered() -> None:
    assert [(k, n) for k, n, _ in _quantity_props()] == [
        ("AvailableCapacity", "cost"),
        ("AvailableCapacity", "resources"),
        ("CapacityRequest", "interruptionPenalty"),
        ("CapacityRequest", "reclamationPenalty"),
        ("CapacityRequest", "resources"),
        ("UpcomingNode", "resources"),
    ]


@pytest.mark.parametrize(("kind", "name", "prop"), _quantity_props(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_quantity_pattern_accepts_quantities_only(kind: str, name: str,
                                                  prop: dict[str, Any]) -> None:
    pattern = re.compile(prop["pattern"])
    for ok in ("1", "100m", "1.5", "0.0042", "16Gi", "1e3", "2E-3", "+1", "-5", ".5", "8k"):
        assert pattern.fullmatch(ok), (kind, name, ok)
    for bad in ("", "abc", "1 Gi", "1gi", "1KiB", "1.2.3", "Gi"):
        assert not pattern.fullmatch(bad), (kind, name, bad)
