"""The shipped CRDs (bigfleet_trio/manifests/crds.yaml) compared structurally with upstream
BigFleet's CRDs (docs/crds.md#upstream-compatibility): names, scope, short names, category, the
status subresource, upstream's printer columns first and in order, selectable fields, ``spec``
required at the root, and the spec/status property names, required fields, enums, types, formats
and list/map types; then our own printer columns and a description on every field.

The expected tables below are the upstream facts, written by hand. Where a printer column's JSON
path or type is not part of those facts, the path is the field the column is named after and the
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

# kind -> upstream's CRD facts. Property tables: name -> type ("string", "integer/int32",
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
        # cost is optional: unset when the shard sent no price (docs/crds.md#availablecapacity)
        "spec_required": ["availability", "availableCount", "resources"],
        "status": {},  # "Status is empty."
        "status_required": [],
        "enums": {("spec", "availability"): ["None", "Low", "Medium", "High"]},
    },
}

# Schema paths (property names; "[]" = the list's items) marked atomic upstream. Nothing else in
# the three schemas carries x-kubernetes-list-type / x-kubernetes-map-type.
ATOMIC_LISTS: dict[str, set[str]] = {
    "CapacityRequest": {
        "spec.requirements[].values",
        "spec.coLocation.labelSelector.matchExpressions",
        "spec.coLocation.labelSelector.matchExpressions[].values",
    },
    "UpcomingNode": set(),
    "AvailableCapacity": {"spec.requirements[].values"},
}
ATOMIC_MAPS: dict[str, set[str]] = {
    "CapacityRequest": {"spec.coLocation.labelSelector"},
    "UpcomingNode": {"status.nodeRef"},  # core ObjectReference
    "AvailableCapacity": set(),
}

# Ours, added to upstream's status (docs/deviations.md): optional, so an upstream object is valid.
OUR_STATUS: dict[str, dict[str, str]] = {"CapacityRequest": {"conditions": "list"}}
# Ours: lists keyed like metav1.Conditions (x-kubernetes-list-type map, keyed by type).
OUR_MAP_LISTS: dict[str, set[str]] = {"CapacityRequest": {"status.conditions"}}

# Ours, after upstream's columns: (name, type, jsonPath, priority).
OUR_COLUMNS: dict[str, list[tuple[str, str, str, int]]] = {
    "CapacityRequest": [
        ("Pod", "string", ".metadata.ownerReferences[0].name", 0),
        ("CPU", "string", ".spec.resources.cpu", 0),
        ("Memory", "string", ".spec.resources.memory", 0),
        ("Sent", "string", '.status.conditions[?(@.type=="Sent")].status', 0),
        ("Offered", "string", '.status.conditions[?(@.type=="CapacityOffered")].status', 0),
        ("Coming", "string", '.status.conditions[?(@.type=="MachineComing")].status', 0),
        ("Outcome", "string", '.status.conditions[?(@.type=="MachineComing")].reason', 1),
    ],
    "UpcomingNode": [
        ("Instance-Type", "string", r".spec.labels.node\.kubernetes\.io/instance-type", 0),
        ("Zone", "string", r".spec.labels.topology\.kubernetes\.io/zone", 0),
        ("Last-Error", "string", ".status.lastError", 1),
    ],
    "AvailableCapacity": [
        ("Instance-Type", "string",
         '.spec.requirements[?(@.key=="node.kubernetes.io/instance-type")].values', 0),
        ("Zone", "string",
         '.spec.requirements[?(@.key=="topology.kubernetes.io/zone")].values', 0),
        ("USD/Hour", "string", ".spec.cost", 0),
    ],
}


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
    assert columns[: len(want["columns"])] == want["columns"]  # upstream's, first, in order
    ours = [(c["name"], c["type"], c["jsonPath"], c.get("priority", 0))
            for c in v["additionalPrinterColumns"][len(want["columns"]) :]]
    assert ours == OUR_COLUMNS[kind]
    for c in v["additionalPrinterColumns"][: len(want["columns"])]:
        assert c.get("priority", 0) == 0
    assert [f["jsonPath"] for f in v.get("selectableFields", [])] == want["selectable"]


@pytest.mark.parametrize("kind", sorted(EXPECTED))
@pytest.mark.parametrize("part", ["spec", "status"])
def test_properties_required_and_types(kind: str, part: str) -> None:
    want = EXPECTED[kind]
    root = _schema(CRDS[kind])
    assert root["type"] == "object"
    assert root["required"] == ["spec"]
    assert set(root["properties"]) == {"apiVersion", "kind", "metadata", "spec", "status"}
    schema = root["properties"][part]
    assert schema["type"] == "object"
    props = schema.get("properties", {})
    ours = OUR_STATUS.get(kind, {}) if part == "status" else {}
    assert {name: _type_of(p) for name, p in props.items()} == {**want[part], **ours}
    assert not set(ours) & set(schema.get("required", []))  # an extension is never required
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
    """``requirements``: core NodeSelectorRequirements, operator a plain string (Gt, Lt pass)."""
    req = _schema(CRDS[kind])["properties"]["spec"]["properties"]["requirements"]
    item = req["items"]
    assert item["type"] == "object"
    assert {n: _type_of(p) for n, p in item["properties"].items()} == {
        "key": "string", "operator": "string", "values": "list"}
    assert item["properties"]["operator"]["type"] == "string"
    assert "enum" not in item["properties"]["operator"]
    assert "pattern" not in item["properties"]["operator"]
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


def _walk(schema: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every (path, schema) below ``schema``; list items are ``<path>[]``."""
    out = [(path, schema)]
    for name, prop in (schema.get("properties") or {}).items():
        out.extend(_walk(prop, f"{path}.{name}" if path else name))
    if isinstance(schema.get("items"), dict):
        out.extend(_walk(schema["items"], f"{path}[]"))
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        out.extend(_walk(extra, f"{path}{{}}"))
    return out


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_list_and_map_types_as_upstream(kind: str) -> None:
    nodes = _walk(_schema(CRDS[kind]), "")
    lists = {p: s["x-kubernetes-list-type"] for p, s in nodes if "x-kubernetes-list-type" in s}
    maps = {p: s["x-kubernetes-map-type"] for p, s in nodes if "x-kubernetes-map-type" in s}
    assert lists == {**{p: "atomic" for p in ATOMIC_LISTS[kind]},
                     **{p: "map" for p in OUR_MAP_LISTS.get(kind, set())}}
    for p in OUR_MAP_LISTS.get(kind, set()):
        assert dict(nodes)[p]["x-kubernetes-list-map-keys"] == ["type"]
        assert "type" in dict(nodes)[f"{p}[]"]["required"]
    assert maps == {p: "atomic" for p in ATOMIC_MAPS[kind]}
    for p in ATOMIC_LISTS[kind]:
        assert dict(nodes)[p]["type"] == "array"


def test_co_location_selector_is_a_core_label_selector() -> None:
    selector = _schema(CRDS["CapacityRequest"])["properties"]["spec"]["properties"][
        "coLocation"]["properties"]["labelSelector"]
    expr = selector["properties"]["matchExpressions"]["items"]
    assert {n: _type_of(p) for n, p in expr["properties"].items()} == {
        "key": "string", "operator": "string", "values": "list"}
    assert sorted(expr["required"]) == ["key", "operator"]
    assert selector["properties"]["matchLabels"]["additionalProperties"] == {"type": "string"}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_every_field_is_described(kind: str) -> None:
    """``kubectl explain`` has something to say for every field (docs/crds.md#field-reference).
    ``metadata`` is the standard ObjectMeta, described by Kubernetes itself; map values and the
    string items of a list are described by their map or list."""
    missing = [
        p or "<root>"
        for p, s in _walk(_schema(CRDS[kind]), "")
        if p != "metadata"
        and not p.endswith("{}")
        and not (p.endswith("[]") and s.get("type") == "string")
        and not str(s.get("description", "")).strip()
    ]
    assert missing == []


@pytest.mark.parametrize("kind", ["CapacityRequest", "AvailableCapacity"])
def test_gt_and_lt_pass_the_schema(kind: str) -> None:
    """A CR written by another pipeline with Gt/Lt is accepted, as upstream's CRD accepts it."""
    import jsonschema

    req = _schema(CRDS[kind])["properties"]["spec"]["properties"]["requirements"]
    for op in ("Gt", "Lt", "In", "Exists"):
        instance = [{"key": "example.com/generation", "operator": op, "values": ["3"]}]
        validator = jsonschema.validators.validator_for(req)(req)
        assert [e.message for e in validator.iter_errors(instance)] == [], op
