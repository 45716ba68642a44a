"""OpenAPI v3 of the embedded apiserver: component schemas for built-ins and CRDs (shapes over
in-process HTTP); ``kubectl explain`` reading them is in the kubectl suite."""

from __future__ import annotations

from pathlib import Path

import httpx

from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.openapi import builtin_schemas, crd_schema_name
from bigfleet_trio.sim.apiserver.testing import open_client

POD = "io.k8s.api.core.v1.Pod"
META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"

WIDGET_CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          description: A Widget is a test kind.
          properties:
            spec:
              type: object
              description: What the widget should be.
              properties:
                size:
                  type: integer
                  description: Size in millimetres.
"""


async def test_root_lists_every_group_version_with_a_hash(client: httpx.AsyncClient) -> None:
    paths = (await client.get("/openapi/v3")).json()["paths"]
    assert {"api/v1", "apis/apps/v1", "apis/bigfleet.lucy.sh/v1alpha1",
            "apis/rbac.authorization.k8s.io/v1"} <= set(paths)
    assert paths["api/v1"]["serverRelativeURL"].startswith("/openapi/v3/api/v1?hash=")


async def test_core_v1_has_builtin_schemas_with_references(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi/v3/api/v1")).json()
    schemas = doc["components"]["schemas"]
    pod = schemas[POD]
    assert pod["x-kubernetes-group-version-kind"] == [{"group": "", "kind": "Pod", "version": "v1"}]
    assert pod["description"].startswith("Pod is a collection of containers")
    assert pod["properties"]["spec"]["allOf"] == [
        {"$ref": "#/components/schemas/io.k8s.api.core.v1.PodSpec"}
    ]
    # every reference resolves inside the document
    refs: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.add(node["$ref"].rsplit("/", 1)[1])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schemas)
    assert refs - set(schemas) == set()
    assert "io.k8s.api.policy.v1.Eviction" in schemas  # pods/eviction's body
    patch_ops = [p["patch"] for p in doc["paths"].values()]
    assert all(op["parameters"][0]["name"] == "fieldValidation" for op in patch_ops)


async def test_apps_v1_carries_the_scale_subresource_kind(client: httpx.AsyncClient) -> None:
    schemas = (await client.get("/openapi/v3/apis/apps/v1")).json()["components"]["schemas"]
    assert "io.k8s.api.apps.v1.Deployment" in schemas
    assert "io.k8s.api.autoscaling.v1.Scale" in schemas


async def test_crd_schema_keeps_descriptions_and_gets_object_meta(tmp_path: Path) -> None:
    crd = tmp_path / "widget.yaml"
    crd.write_text(WIDGET_CRD)
    api = ApiServer(crd_paths=[str(crd)])
    async with open_client(api) as client:
        before = (await client.get("/openapi/v3")).json()["paths"]["apis/example.com/v1"]
        doc = (await client.get("/openapi/v3/apis/example.com/v1")).json()
        schemas = doc["components"]["schemas"]
        widget = schemas["com.example.v1.Widget"]
        assert widget["description"] == "A Widget is a test kind."
        assert widget["properties"]["spec"]["properties"]["size"] == {
            "type": "integer",
            "description": "Size in millimetres.",
        }
        assert widget["properties"]["metadata"]["allOf"] == [
            {"$ref": f"#/components/schemas/{META}"}
        ]
        assert widget["x-kubernetes-group-version-kind"] == [
            {"group": "example.com", "kind": "Widget", "version": "v1"}
        ]
        assert META in schemas
        # a changed CRD changes the hash kubectl caches by
        api.install_crd_text(WIDGET_CRD.replace("Size in millimetres.", "Size in mm."))
        after = (await client.get("/openapi/v3")).json()["paths"]["apis/example.com/v1"]
        assert after != before
        doc = (await client.get("/openapi/v3/apis/example.com/v1")).json()
        size = doc["components"]["schemas"]["com.example.v1.Widget"]["properties"]["spec"]
        assert size["properties"]["size"]["description"] == "Size in mm."


def test_crd_schema_name_reverses_the_group(api: ApiServer) -> None:
    assert crd_schema_name(api.find("capacityrequests")) == (
        "sh.lucy.bigfleet.v1alpha1.CapacityRequest"
    )


def test_builtin_schemas_cover_every_served_builtin_kind(api: ApiServer) -> None:
    kinds = {
        (g["group"], g["version"], g["kind"])
        for s in builtin_schemas().values()
        for g in s.get("x-kubernetes-group-version-kind") or ()
    }
    served = {(r.group, r.version, r.kind) for r in api.resources.values() if not r.custom}
    assert served - kinds == set()


async def test_unknown_group_version_is_404(client: httpx.AsyncClient) -> None:
    assert (await client.get("/openapi/v3/apis/nope/v1")).status_code == 404
