"""The ``/scale`` subresource (autoscaling/v1 Scale) of Deployments, ReplicaSets and
StatefulSets over in-process HTTP; ``kubectl scale`` itself is in the kubectl suite."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.scale import scale_of
from bigfleet_trio.sim.apiserver.testing import JSONPATCH, MERGE, PODS, patch, pod_body

APPS = "/apis/apps/v1/namespaces/default"


def workload(kind: str, name: str, replicas: int | None = 2) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {
            "matchLabels": {"app": name},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["b", "a"]}],
        },
        "template": {
            "metadata": {"labels": {"app": name, "tier": "a"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        },
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}


@pytest.mark.parametrize(
    ("plural", "kind"),
    [("deployments", "Deployment"), ("replicasets", "ReplicaSet"), ("statefulsets", "StatefulSet")],
)
async def test_get_and_merge_patch_scale(
    client: httpx.AsyncClient, plural: str, kind: str
) -> None:
    assert (await client.post(f"{APPS}/{plural}", json=workload(kind, "w"))).status_code == 201
    r = await client.get(f"{APPS}/{plural}/w/scale")
    assert r.status_code == 200
    body = r.json()
    assert body["kind"] == "Scale" and body["apiVersion"] == "autoscaling/v1"
    assert body["metadata"]["name"] == "w" and body["metadata"]["namespace"] == "default"
    assert body["spec"] == {"replicas": 2}
    assert body["status"] == {"replicas": 0, "selector": "app=w,tier in (a,b)"}
    r = await patch(client, f"{APPS}/{plural}/w/scale", {"spec": {"replicas": 4}}, MERGE)
    assert r.status_code == 200 and r.json()["spec"] == {"replicas": 4}
    obj = (await client.get(f"{APPS}/{plural}/w")).json()
    assert obj["spec"]["replicas"] == 4
    assert obj["metadata"]["generation"] == 2
    assert r.json()["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]


async def test_put_scale_checks_resource_version_and_replicas(client: httpx.AsyncClient) -> None:
    await client.post(f"{APPS}/deployments", json=workload("Deployment", "w"))
    cur = (await client.get(f"{APPS}/deployments/w/scale")).json()
    stale = dict(cur, metadata=dict(cur["metadata"], resourceVersion="1"), spec={"replicas": 3})
    r = await client.put(f"{APPS}/deployments/w/scale", json=stale)
    assert r.status_code == 409 and r.json()["reason"] == "Conflict"
    neg = dict(cur, spec={"replicas": -1})
    r = await client.put(f"{APPS}/deployments/w/scale", json=neg)
    assert r.status_code == 422
    assert r.json()["message"] == (
        'Scale.autoscaling "w" is invalid: spec.replicas: Invalid value: -1: must be greater '
        "than or equal to 0"
    )
    r = await client.put(f"{APPS}/deployments/w/scale", json=dict(cur, spec={"replicas": 3}))
    assert r.status_code == 200 and r.json()["spec"] == {"replicas": 3}


async def test_json_patch_and_no_op_scale(client: httpx.AsyncClient, api: ApiServer) -> None:
    await client.post(f"{APPS}/deployments", json=workload("Deployment", "w"))
    rv = api.store.rv
    ops = [{"op": "replace", "path": "/spec/replicas", "value": 2}]
    r = await patch(client, f"{APPS}/deployments/w/scale", ops, JSONPATCH)
    assert r.status_code == 200
    assert api.store.rv == rv  # same replicas: no write, no new resourceVersion
    ops = [{"op": "test", "path": "/spec/replicas", "value": 9}]
    r = await patch(client, f"{APPS}/deployments/w/scale", ops, JSONPATCH)
    assert r.status_code == 422


async def test_scale_is_not_served_for_pods_or_missing_objects(client: httpx.AsyncClient) -> None:
    await client.post(PODS, json=pod_body("p"))
    assert (await client.get(f"{PODS}/p/scale")).status_code == 404
    assert (await client.get(f"{APPS}/deployments/nope/scale")).status_code == 404
    await client.post(f"{APPS}/deployments", json=workload("Deployment", "w"))
    assert (await client.post(f"{APPS}/deployments/w/scale", json={})).status_code == 405


async def test_discovery_lists_scale_subresources(client: httpx.AsyncClient) -> None:
    names = {r["name"]: r for r in (await client.get("/apis/apps/v1")).json()["resources"]}
    for plural in ("deployments", "replicasets", "statefulsets"):
        entry = names[f"{plural}/scale"]
        assert (entry["group"], entry["version"], entry["kind"]) == ("autoscaling", "v1", "Scale")
        assert entry["verbs"] == ["get", "patch", "update"]
    assert "daemonsets/scale" not in names


def test_scale_defaults_replicas_to_one_and_omits_zero() -> None:
    obj = {"metadata": {"name": "w", "resourceVersion": "5"}, "spec": {}}
    assert scale_of(obj)["spec"] == {"replicas": 1}
    obj["spec"] = {"replicas": 0}
    assert scale_of(obj)["spec"] == {}
    assert scale_of(obj)["status"] == {"replicas": 0, "selector": ""}
