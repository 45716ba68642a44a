"""CRDs: project CRDs installed at start, registration of new CRDs, schema validation, pruning,
Strict field validation, discovery (legacy + aggregated), OpenAPI v3 and Tables."""

from __future__ import annotations

from typing import Any

import httpx

from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.discovery import human_duration
from bigfleet_trio.sim.apiserver.testing import CR_PATH, UPN_PATH, cr_body, patch

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
AGG = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def widget_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {
                "plural": "widgets",
                "singular": "widget",
                "kind": "Widget",
                "shortNames": ["wd"],
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        "size": {"type": "integer", "default": 3},
                                        "free": {
                                            "type": "object",
                                            "x-kubernetes-preserve-unknown-fields": True,
                                        },
                                    },
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


async def test_project_crds_installed_and_established(client: httpx.AsyncClient) -> None:
    lst = (await client.get(CRDS)).json()
    names = sorted(o["metadata"]["name"] for o in lst["items"])
    assert names == [
        "availablecapacities.bigfleet.lucy.sh",
        "capacityrequests.bigfleet.lucy.sh",
        "upcomingnodes.bigfleet.lucy.sh",
    ]
    for crd in lst["items"]:
        conds = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conds == {"NamesAccepted": "True", "Established": "True"}
        assert crd["spec"]["names"]["categories"] == ["fleet"]


async def test_crd_registration_and_deletion(client: httpx.AsyncClient) -> None:
    r = await client.post(CRDS, json=widget_crd())
    assert r.status_code == 201
    r = await client.post(
        "/apis/example.com/v1/namespaces/default/widgets",
        json={"metadata": {"name": "w"}, "spec": {"free": {"x": 1}, "junk": 2}},
    )
    assert r.status_code == 201
    assert r.json()["spec"] == {"size": 3, "free": {"x": 1}}
    assert "warning" in r.headers
    assert (await client.delete(f"{CRDS}/widgets.example.com")).status_code == 200
    assert (await client.get("/apis/example.com/v1/namespaces/default/widgets")).status_code == 404


async def test_crd_name_must_match(client: httpx.AsyncClient) -> None:
    crd = widget_crd()
    crd["metadata"]["name"] = "wrong.example.com"
    r = await client.post(CRDS, json=crd)
    assert r.status_code == 422


async def test_schema_errors_are_422_with_causes(client: httpx.AsyncClient) -> None:
    body = cr_body("a")
    body["spec"] = {
        "priority": "high",
        "resources": {"cpu": "lots"},
        "requirements": [{"key": "k", "operator": "Near"}],
    }
    r = await client.post(CR_PATH, json=body)
    assert r.status_code == 422
    causes = {c["field"]: c for c in r.json()["details"]["causes"]}
    # The requirement operator is a plain string, as upstream's (docs/crds.md): only the two
    # type errors are causes; the operator is the operator's to refuse, not the schema's.
    assert set(causes) == {"spec.priority", "spec.resources.cpu"}
    body["spec"] = {"priority": 1, "resources": {"cpu": "1"}}
    body["spec"]["requirements"] = [{"key": "k", "operator": "Gt", "values": ["3"]}]
    assert (await client.post(CR_PATH, json=body)).status_code == 201
    # An enum the schema does have: the status phase.
    r = await patch(client, f"{CR_PATH}/a/status", {"status": {"phase": "Done"}})
    assert r.status_code == 422
    cause = r.json()["details"]["causes"][0]
    assert cause["field"] == "status.phase"
    assert cause["reason"] == "FieldValueNotSupported"
    assert (
        cause["message"] == 'Unsupported value: "Done": supported values: "Pending", "Acknowledged"'
    )
    r = await client.post(CR_PATH, json={"metadata": {"name": "b"}, "spec": {"priority": 1}})
    assert r.status_code == 422
    c = r.json()["details"]["causes"][0]
    assert c == {
        "reason": "FieldValueRequired",
        "message": "Required value",
        "field": "spec.resources",
    }
    assert (
        r.json()["message"]
        == 'CapacityRequest.bigfleet.lucy.sh "b" is invalid: spec.resources: Required value'
    )


async def test_status_schema_enforced(client: httpx.AsyncClient) -> None:
    await client.post(CR_PATH, json=cr_body("a"))
    r = await patch(client, f"{CR_PATH}/a/status", {"status": {"phase": "Bogus"}})
    assert r.status_code == 422
    r = await patch(
        client,
        f"{CR_PATH}/a/status",
        {"status": {"phase": "Acknowledged", "acknowledgedAt": "2026-01-01T00:00:00Z"}},
    )
    assert r.status_code == 200


async def test_int_or_string_quantities(client: httpx.AsyncClient) -> None:
    body = cr_body("a")
    body["spec"]["resources"] = {"cpu": 2, "memory": "512Mi"}
    body["spec"]["interruptionPenalty"] = "0.5"
    r = await client.post(CR_PATH, json=body)
    assert r.status_code == 201, r.text


async def test_strict_unknown_field_is_400_and_default_prunes(client: httpx.AsyncClient) -> None:
    body = cr_body("a")
    body["spec"]["bogus"] = 1
    r = await client.post(CR_PATH, params={"fieldValidation": "Strict"}, json=body)
    assert r.status_code == 400
    assert r.json()["message"] == 'strict decoding error: unknown field "spec.bogus"'
    r = await client.post(CR_PATH, params={"fieldValidation": "Ignore"}, json=body)
    assert r.status_code == 201 and "bogus" not in r.json()["spec"]


async def test_legacy_discovery(client: httpx.AsyncClient) -> None:
    assert (await client.get("/api")).json()["versions"] == ["v1"]
    groups = {g["name"] for g in (await client.get("/apis")).json()["groups"]}
    assert {"apps", "policy", "bigfleet.lucy.sh", "coordination.k8s.io", "batch"} <= groups
    core = (await client.get("/api/v1")).json()
    by_name = {r["name"]: r for r in core["resources"]}
    assert by_name["pods"]["shortNames"] == ["po"]
    assert (
        by_name["pods/eviction"]["group"] == "policy"
        and by_name["pods/eviction"]["kind"] == "Eviction"
    )
    fleet = (await client.get("/apis/bigfleet.lucy.sh/v1alpha1")).json()
    by_name = {r["name"]: r for r in fleet["resources"]}
    assert by_name["capacityrequests"]["shortNames"] == ["cr", "crs"]
    assert by_name["capacityrequests"]["namespaced"] is True
    assert by_name["upcomingnodes"]["namespaced"] is False
    assert by_name["upcomingnodes"]["categories"] == ["fleet"]


async def test_aggregated_discovery(client: httpx.AsyncClient) -> None:
    r = await client.get("/apis", headers={"accept": AGG})
    assert (
        r.headers["content-type"]
        == "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    )
    items = {i["metadata"]["name"]: i for i in r.json()["items"]}
    fleet = items["bigfleet.lucy.sh"]["versions"][0]["resources"]
    upn = next(x for x in fleet if x["resource"] == "upcomingnodes")
    assert upn["scope"] == "Cluster" and upn["shortNames"] == ["upn"]
    assert upn["subresources"][0]["subresource"] == "status"
    core = (await client.get("/api", headers={"accept": AGG})).json()
    assert [i["metadata"]["name"] for i in core["items"]] == [""]


async def test_openapi_v3(client: httpx.AsyncClient) -> None:
    root = (await client.get("/openapi/v3")).json()
    url = root["paths"]["apis/bigfleet.lucy.sh/v1alpha1"]["serverRelativeURL"]
    doc = (await client.get(url)).json()
    op = doc["paths"][
        "/apis/bigfleet.lucy.sh/v1alpha1/namespaces/{namespace}/capacityrequests/{name}"
    ]["patch"]
    assert op["x-kubernetes-group-version-kind"] == {
        "group": "bigfleet.lucy.sh",
        "version": "v1alpha1",
        "kind": "CapacityRequest",
    }
    assert {"name": "fieldValidation", "in": "query"}.items() <= op["parameters"][0].items()
    await client.post(CRDS, json=widget_crd())
    root2 = (await client.get("/openapi/v3")).json()
    assert root2["paths"]["apis/bigfleet.lucy.sh/v1alpha1"]["serverRelativeURL"] != url
    assert (await client.get("/openapi/v2")).status_code == 404


async def test_table_uses_printer_columns(client: httpx.AsyncClient) -> None:
    await client.post(
        UPN_PATH, json={"metadata": {"name": "u1"}, "spec": {"resources": {"cpu": "4"}}}
    )
    await patch(
        client,
        f"{UPN_PATH}/u1/status",
        {"status": {"phase": "Ready", "nodeRef": {"name": "node-7"}}},
    )
    r = await client.get(UPN_PATH, headers={"accept": TABLE})
    t = r.json()
    assert t["kind"] == "Table"
    assert [c["name"] for c in t["columnDefinitions"]] == [
        "Name",
        "Phase",
        "Node",
        "Age",
        "Instance-Type",
        "Zone",
        "Last-Error",
    ]
    assert t["rows"][0]["cells"][:3] == ["u1", "Ready", "node-7"]
    assert t["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    cr_table = (await client.get(CR_PATH, headers={"accept": TABLE})).json()
    assert [c["name"] for c in cr_table["columnDefinitions"]] == [
        "Name",
        "Phase",
        "Priority",
        "Age",
        "Pod",
        "CPU",
        "Memory",
        "Sent",
        "Offered",
        "Coming",
        "Outcome",
    ]


async def test_table_rows_carry_what_include_object_asks_for(client: httpx.AsyncClient) -> None:
    # kube-apiserver: Metadata (the default) a PartialObjectMetadata, Object the object as
    # served (kind and apiVersion set), None a null; any other value is a 400
    await client.post(CR_PATH, json=cr_body("req1"))
    for query, want in (({}, "PartialObjectMetadata"), ({"includeObject": "Metadata"},
                        "PartialObjectMetadata"), ({"includeObject": "Object"}, "CapacityRequest")):
        for path in (CR_PATH, f"{CR_PATH}/req1"):
            row = (await client.get(path, params=query, headers={"accept": TABLE})).json()
            obj = row["rows"][0]["object"]
            assert obj["kind"] == want, (path, query)
            assert obj["metadata"]["name"] == "req1"
            assert ("spec" in obj) == (want == "CapacityRequest")
            if want == "CapacityRequest":
                assert obj["apiVersion"] == "bigfleet.lucy.sh/v1alpha1"
    none = (await client.get(CR_PATH, params={"includeObject": "None"},
                             headers={"accept": TABLE})).json()
    assert none["rows"][0]["object"] is None
    bad = await client.get(CR_PATH, params={"includeObject": "All"}, headers={"accept": TABLE})
    assert bad.status_code == 400
    assert bad.json()["message"] == 'unrecognized includeObject value: "All"'


def test_human_duration() -> None:
    assert human_duration(5) == "5s"
    assert human_duration(119) == "119s"
    assert human_duration(150) == "2m30s"
    assert human_duration(600) == "10m"
    assert human_duration(3 * 3600 + 120) == "3h2m"
    assert human_duration(10 * 3600) == "10h"
    assert human_duration(50 * 3600) == "2d2h"


def test_custom_crd_paths(tmp_path: Any) -> None:
    import yaml

    p = tmp_path / "w.yaml"
    p.write_text(yaml.safe_dump(widget_crd()))
    s = ApiServer(crd_paths=[str(p)])
    assert sorted(s.crd_resources) == ["widgets.example.com"]
    assert ApiServer(crd_paths=[]).crd_resources == {}
