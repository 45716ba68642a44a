"""Answers of the embedded apiserver that the differential test
(tests/realkube/test_sim_differential.py) found differing from kube-apiserver and that the sim
now matches; the differences it keeps are docs/deviations.md, "The embedded API server against
kube-apiserver"."""

from __future__ import annotations

import json

import httpx

from bigfleet_trio.sim.apiserver.testing import CR_PATH, PODS, UPN_PATH, cr_body, pod_body

DELETE_STATUS_KEYS = {"kind", "apiVersion", "metadata", "status", "details"}


async def test_delete_answers_a_status_except_for_kinds_that_return_the_object(
    client: httpx.AsyncClient,
) -> None:
    """kube-apiserver answers a DELETE that removed the object with a Status (details: name,
    group, plural kind, uid), except for the kinds whose storage returns the deleted object
    (Pods, Namespaces, ServiceAccounts, Services, ...)."""
    created = (await client.post(CR_PATH, json=cr_body("a"))).json()
    r = await client.delete(f"{CR_PATH}/a")
    assert r.status_code == 200
    assert r.json() == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
        "details": {"name": "a", "group": "bigfleet.lucy.sh", "kind": "capacityrequests",
                    "uid": created["metadata"]["uid"]},
    }
    await client.post("/api/v1/nodes", json={"metadata": {"name": "n1"}})
    node = (await client.delete("/api/v1/nodes/n1")).json()
    assert node["kind"] == "Status" and node["details"]["kind"] == "nodes"
    assert "group" not in node["details"]  # core group: omitted, as kube-apiserver does

    await client.post(PODS, json=pod_body("p"))
    pod = (await client.delete(f"{PODS}/p")).json()
    assert pod["kind"] == "Pod" and pod["metadata"]["name"] == "p"


async def test_delete_held_by_a_finalizer_answers_the_object(client: httpx.AsyncClient) -> None:
    await client.post(UPN_PATH, json={
        "apiVersion": "bigfleet.lucy.sh/v1alpha1", "kind": "UpcomingNode",
        "metadata": {"name": "u", "finalizers": ["example.com/hold"]},
        "spec": {"resources": {"cpu": "1"}}})
    r = (await client.delete(f"{UPN_PATH}/u")).json()
    assert r["kind"] == "UpcomingNode" and r["metadata"]["deletionTimestamp"]


async def test_core_group_is_omitted_from_error_details(client: httpx.AsyncClient) -> None:
    r = (await client.get(f"{PODS}/missing")).json()
    assert r["reason"] == "NotFound"
    assert r["details"] == {"name": "missing", "kind": "pods"}


async def test_generation_only_on_kinds_that_track_it(client: httpx.AsyncClient) -> None:
    """kube-apiserver sets metadata.generation on Pods, workloads, PDBs, PriorityClasses, CRDs
    and custom resources; not on Namespaces, Nodes, ConfigMaps, ServiceAccounts, RBAC objects,
    Events or Leases."""
    cm = (await client.post("/api/v1/namespaces/default/configmaps",
                            json={"metadata": {"name": "c"}, "data": {"a": "1"}})).json()
    assert "generation" not in cm["metadata"]
    lease_path = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
    lease = (await client.post(lease_path, json={
        "metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}})).json()
    assert "generation" not in lease["metadata"]
    lease["spec"]["holderIdentity"] = "b"
    renewed = (await client.put(f"{lease_path}/l", json=lease)).json()
    assert "generation" not in renewed["metadata"]
    pod = (await client.post(PODS, json=pod_body("p"))).json()
    assert pod["metadata"]["generation"] == 1
    cr = (await client.post(CR_PATH, json=cr_body("a"))).json()
    assert cr["metadata"]["generation"] == 1


async def test_server_side_apply_that_creates_answers_201(client: httpx.AsyncClient) -> None:
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"},
            "data": {"a": "1"}}
    path = "/api/v1/namespaces/default/configmaps/applied"
    headers = {"content-type": "application/apply-patch+yaml"}
    params = {"fieldManager": "t"}
    r = await client.patch(path, content=json.dumps(body), headers=headers, params=params)
    assert r.status_code == 201
    r = await client.patch(path, content=json.dumps(body), headers=headers, params=params)
    assert r.status_code == 200


async def test_namespace_delete_answers_terminating(client: httpx.AsyncClient) -> None:
    await client.post("/api/v1/namespaces", json={"metadata": {"name": "gone"}})
    r = (await client.delete("/api/v1/namespaces/gone")).json()
    assert r["kind"] == "Namespace"
    assert r["status"]["phase"] == "Terminating"
    assert r["metadata"]["deletionTimestamp"]


async def test_update_without_resource_version_is_invalid_where_kube_apiserver_requires_it(
    client: httpx.AsyncClient,
) -> None:
    """Leases, PodDisruptionBudgets, RuntimeClasses, CRDs and custom resources refuse a PUT
    without metadata.resourceVersion (422); ConfigMaps, Pods and most built-ins take it."""
    lease_path = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
    await client.post(lease_path, json={"metadata": {"name": "l"}, "spec": {}})
    r = await client.put(f"{lease_path}/l", json={"metadata": {"name": "l"},
                                                  "spec": {"holderIdentity": "x"}})
    assert r.status_code == 422
    assert r.json()["reason"] == "Invalid"
    assert r.json()["details"]["causes"][0]["field"] == "metadata.resourceVersion"
    await client.post(CR_PATH, json=cr_body("a"))
    r = await client.put(f"{CR_PATH}/a", json=cr_body("a", priority=5))
    assert r.status_code == 422
    cm_path = "/api/v1/namespaces/default/configmaps"
    await client.post(cm_path, json={"metadata": {"name": "c"}})
    r = await client.put(f"{cm_path}/c", json={"metadata": {"name": "c"}, "data": {"a": "2"}})
    assert r.status_code == 200


async def test_failed_delete_precondition_names_the_kind(client: httpx.AsyncClient) -> None:
    """kube-apiserver's precondition Conflict carries the Kind (``Pod``), not the plural."""
    await client.post(PODS, json=pod_body("p"))
    for pre in ({"uid": "00000000-0000-0000-0000-000000000000"}, {"resourceVersion": "1"}):
        r = await client.request("DELETE", f"{PODS}/p", json={"preconditions": pre})
        assert r.status_code == 409
        assert r.json()["details"] == {"name": "p", "kind": "Pod"}


async def test_generated_names_use_kube_apiserver_alphabet(client: httpx.AsyncClient) -> None:
    """Five characters from ``bcdfghjklmnpqrstvwxz2456789`` (no vowels, no 0/1/3): a generated
    name never sorts before a hand-written ``web-1``, as on kube-apiserver."""
    for _ in range(40):
        r = (await client.post(PODS, json={"metadata": {"generateName": "web-"},
                                           "spec": {"containers": [{"name": "c",
                                                                    "image": "x"}]}})).json()
        suffix = r["metadata"]["name"].removeprefix("web-")
        assert len(suffix) == 5 and set(suffix) <= set("bcdfghjklmnpqrstvwxz2456789"), suffix


async def test_namespaces_serve_no_deletecollection_and_advertise_finalize(
    client: httpx.AsyncClient,
) -> None:
    """As kube-apiserver: DELETE of the namespace collection is 405, and discovery lists the
    ``finalize`` subresource the server answers."""
    r = await client.delete("/api/v1/namespaces")
    assert r.status_code == 405
    doc = (await client.get("/api/v1")).json()
    names = {res["name"]: res for res in doc["resources"]}
    assert "deletecollection" not in names["namespaces"]["verbs"]
    assert names["namespaces/finalize"]["verbs"] == ["update"]


async def test_event_defaults(client: httpx.AsyncClient) -> None:
    r = (await client.post("/api/v1/namespaces/default/events", json={
        "metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "p"},
        "reason": "R", "message": "m"})).json()
    assert r["eventTime"] is None
    assert r["reportingComponent"] == "" and r["reportingInstance"] == ""
    assert r["firstTimestamp"] is None and r["lastTimestamp"] is None


async def test_custom_resource_lists_carry_an_empty_continue(client: httpx.AsyncClient) -> None:
    await client.post(CR_PATH, json=cr_body("a"))
    assert (await client.get(CR_PATH)).json()["metadata"]["continue"] == ""
    assert "continue" not in (await client.get(PODS)).json()["metadata"]


async def test_deleted_pod_answers_its_final_state(client: httpx.AsyncClient) -> None:
    """The sim removes a Pod at once (no kubelet), so its answer is kube-apiserver's for a
    zero-grace deletion: the Pod marked with deletionTimestamp and grace 0."""
    await client.post(PODS, json=pod_body("p"))
    r = (await client.request("DELETE", f"{PODS}/p",
                              json={"gracePeriodSeconds": 0})).json()
    assert r["kind"] == "Pod"
    assert r["metadata"]["deletionGracePeriodSeconds"] == 0
    assert r["metadata"]["deletionTimestamp"]
