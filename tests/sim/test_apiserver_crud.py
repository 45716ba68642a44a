"""CRUD, status split, generation, preconditions, pagination, deletecollection, finalizers, GC
and Status error shapes of the embedded apiserver, as a real apiserver answers."""

from __future__ import annotations

import httpx

from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.testing import (
    CR_PATH,
    JSONPATCH,
    MERGE,
    NODES,
    PODS,
    SMP,
    cr_body,
    patch,
    pod_body,
)


async def test_create_sets_server_fields_and_drops_status(client: httpx.AsyncClient) -> None:
    r = await client.post(CR_PATH, json=cr_body("a", status={"phase": "Acknowledged"}))
    assert r.status_code == 201
    obj = r.json()
    meta = obj["metadata"]
    assert meta["namespace"] == "default"
    assert meta["generation"] == 1
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert int(meta["resourceVersion"]) > 0
    assert "status" not in obj
    assert obj["apiVersion"] == "bigfleet.lucy.sh/v1alpha1" and obj["kind"] == "CapacityRequest"


async def test_already_exists_and_not_found_status_shapes(client: httpx.AsyncClient) -> None:
    await client.post(CR_PATH, json=cr_body("a"))
    r = await client.post(CR_PATH, json=cr_body("a"))
    assert r.status_code == 409
    assert r.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'capacityrequests.bigfleet.lucy.sh "a" already exists',
        "reason": "AlreadyExists",
        "details": {"name": "a", "group": "bigfleet.lucy.sh", "kind": "capacityrequests"},
        "code": 409,
    }
    r = await client.get(f"{PODS}/nope")
    assert r.status_code == 404
    body = r.json()
    assert body["reason"] == "NotFound" and body["message"] == 'pods "nope" not found'
    # kube-apiserver leaves the core group out (StatusDetails fields are omitempty)
    assert body["details"] == {"name": "nope", "kind": "pods"}


async def test_create_in_missing_namespace_is_404(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/v1/namespaces/ghost/pods", json=pod_body("p"))
    assert r.status_code == 404
    assert r.json()["message"] == 'namespaces "ghost" not found'


async def test_generate_name(client: httpx.AsyncClient) -> None:
    body = cr_body("")
    body["metadata"] = {"generateName": "req-"}
    r = await client.post(CR_PATH, json=body)
    assert r.status_code == 201
    name = r.json()["metadata"]["name"]
    assert name.startswith("req-") and len(name) == len("req-") + 5


async def test_bad_names_are_422(client: httpx.AsyncClient) -> None:
    r = await client.post(CR_PATH, json=cr_body("Bad_Name"))
    assert r.status_code == 422
    body = r.json()
    assert body["reason"] == "Invalid"
    assert body["details"]["causes"][0]["field"] == "metadata.name"
    assert body["message"].startswith(
        'CapacityRequest.bigfleet.lucy.sh "Bad_Name" is invalid: '
        'metadata.name: Invalid value: "Bad_Name"'
    )
    r = await client.post("/api/v1/namespaces", json={"metadata": {"name": "a.b"}})
    assert r.status_code == 422
    r = await client.post(CR_PATH, json=cr_body(""))
    assert r.status_code == 422
    assert r.json()["details"]["causes"][0]["reason"] == "FieldValueRequired"


async def test_trailing_newline_names_and_labels_are_refused(
    client: httpx.AsyncClient,
) -> None:
    # Python's '$' matches before a final newline; the real apiserver refuses all of these.
    r = await client.post(CR_PATH, json=cr_body("abc\n"))
    assert r.status_code == 422, r.text
    assert r.json()["details"]["causes"][0]["field"] == "metadata.name"
    r = await client.post("/api/v1/namespaces", json={"metadata": {"name": "ns\n"}})
    assert r.status_code == 422, r.text
    body = cr_body("ok")
    body["metadata"]["labels"] = {"app": "web\n"}
    r = await client.post(CR_PATH, json=body)
    assert r.status_code == 422, r.text


async def test_malformed_bodies_are_400_and_store_untouched(
    client: httpx.AsyncClient, api: ApiServer
) -> None:
    rv = api.store.rv
    r = await client.post(
        CR_PATH, content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["reason"] == "BadRequest"
    r = await client.post(CR_PATH, content=b"a: [b", headers={"content-type": "application/yaml"})
    assert r.status_code == 400
    r = await client.post(CR_PATH, content=b"[1,2]", headers={"content-type": "application/json"})
    assert r.status_code == 400
    r = await client.post(CR_PATH, json={**cr_body("x"), "kind": "Pod"})
    assert r.status_code == 400
    body = cr_body("x")
    body["metadata"]["namespace"] = "other"
    r = await client.post(CR_PATH, json=body)
    assert r.status_code == 400
    assert "does not match the namespace" in r.json()["message"]
    assert api.store.rv == rv


async def test_yaml_body_accepted(client: httpx.AsyncClient) -> None:
    text = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm1\ndata:\n  a: b\n"
    r = await client.post(
        "/api/v1/namespaces/default/configmaps",
        content=text,
        headers={"content-type": "application/yaml"},
    )
    assert r.status_code == 201
    assert r.json()["data"] == {"a": "b"}


async def test_global_rv_strictly_increases_and_noop_keeps_rv(client: httpx.AsyncClient) -> None:
    a = (await client.post(CR_PATH, json=cr_body("a"))).json()
    n = (await client.post(NODES, json={"metadata": {"name": "n1"}})).json()
    p = (await client.post(PODS, json=pod_body("p"))).json()
    rvs = [int(o["metadata"]["resourceVersion"]) for o in (a, n, p)]
    assert rvs == sorted(rvs) and len(set(rvs)) == 3
    r1 = (await patch(client, f"{CR_PATH}/a", {"spec": {"priority": 5}})).json()
    r2 = (await patch(client, f"{CR_PATH}/a", {"spec": {"priority": 5}})).json()
    assert r1["metadata"]["resourceVersion"] == r2["metadata"]["resourceVersion"]
    assert int(r1["metadata"]["resourceVersion"]) > rvs[2]
    lst = (await client.get("/apis/bigfleet.lucy.sh/v1alpha1/capacityrequests")).json()
    assert int(lst["metadata"]["resourceVersion"]) >= int(r1["metadata"]["resourceVersion"])


async def test_spec_vs_status_split_and_generation(client: httpx.AsyncClient) -> None:
    await client.post(CR_PATH, json=cr_body("a"))
    obj = (await patch(client, f"{CR_PATH}/a", {"spec": {"priority": 2}})).json()
    assert obj["metadata"]["generation"] == 2
    obj = (
        await patch(
            client,
            f"{CR_PATH}/a/status",
            {"spec": {"priority": 99}, "status": {"phase": "Acknowledged"}},
        )
    ).json()
    assert obj["status"] == {"phase": "Acknowledged"}
    assert obj["spec"]["priority"] == 2
    assert obj["metadata"]["generation"] == 2
    obj = (await patch(client, f"{CR_PATH}/a", {"status": {"phase": "Pending"}})).json()
    assert obj["status"] == {"phase": "Acknowledged"}
    assert obj["metadata"]["generation"] == 2
    obj = (await patch(client, f"{CR_PATH}/a", {"metadata": {"labels": {"x": "y"}}})).json()
    assert obj["metadata"]["generation"] == 2 and obj["metadata"]["labels"] == {"x": "y"}


async def test_update_conflict_on_stale_rv(client: httpx.AsyncClient) -> None:
    lease_path = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
    obj = (
        await client.post(
            lease_path, json={"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}
        )
    ).json()
    a = dict(obj, spec={"holderIdentity": "b"})
    b = dict(obj, spec={"holderIdentity": "c"})
    r = await client.put(f"{lease_path}/l", json=a)
    assert r.status_code == 200
    r = await client.put(f"{lease_path}/l", json=b)
    assert r.status_code == 409
    assert r.json()["reason"] == "Conflict"
    assert r.json()["message"] == (
        'Operation cannot be fulfilled on leases.coordination.k8s.io "l": '
        "the object has been modified; "
        "please apply your changes to the latest version and try again"
    )
    r = await patch(
        client,
        f"{lease_path}/l",
        {
            "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
            "spec": {"holderIdentity": "d"},
        },
    )
    assert r.status_code == 409
    # a Lease, like a custom resource, refuses a PUT without resourceVersion (kube-apiserver);
    # a ConfigMap takes it
    unconditional = {"metadata": {"name": "l"}, "spec": {"holderIdentity": "e"}}
    r = await client.put(f"{lease_path}/l", json=unconditional)
    assert r.status_code == 422
    cm_path = "/api/v1/namespaces/default/configmaps"
    await client.post(cm_path, json={"metadata": {"name": "c"}})
    r = await client.put(f"{cm_path}/c", json={"metadata": {"name": "c"}, "data": {"a": "e"}})
    assert r.status_code == 200 and r.json()["data"]["a"] == "e"
    r = await client.put(f"{lease_path}/missing", json={"metadata": {"name": "missing"}})
    assert r.status_code == 404


async def test_patch_types(client: httpx.AsyncClient) -> None:
    await client.post(CR_PATH, json=cr_body("a"))
    await client.post(PODS, json=pod_body("p"))
    r = await patch(client, f"{CR_PATH}/a", {"spec": {"priority": 3}}, SMP)
    assert r.status_code == 415 and r.json()["reason"] == "UnsupportedMediaType"
    assert (
        "accepted media types include: application/json-patch+json, application/merge-patch+json"
        in r.json()["message"]
    )
    r = await patch(
        client, f"{PODS}/p", {"spec": {"containers": [{"name": "c", "image": "nginx"}]}}, SMP
    )
    assert r.status_code == 200
    assert r.json()["spec"]["containers"] == [{"name": "c", "image": "nginx"}]
    r = await patch(
        client, f"{CR_PATH}/a", [{"op": "test", "path": "/spec/priority", "value": 42}], JSONPATCH
    )
    assert r.status_code == 422 and r.json()["reason"] == "Invalid"
    r = await patch(
        client,
        f"{CR_PATH}/a",
        [{"op": "replace", "path": "/spec/priority", "value": 42}],
        JSONPATCH,
    )
    assert r.status_code == 200 and r.json()["spec"]["priority"] == 42
    r = await client.patch(f"{CR_PATH}/a", content=b"{}", headers={"content-type": "text/plain"})
    assert r.status_code == 415
    r = await client.patch(f"{CR_PATH}/a", content=b"{oops", headers=MERGE)
    assert r.status_code == 400


async def test_merge_patch_null_deletes_and_schema_validation_on_patch(
    client: httpx.AsyncClient,
) -> None:
    await client.post(
        CR_PATH, json=cr_body("a", metadata={"name": "a", "labels": {"x": "1", "y": "2"}})
    )
    r = await patch(client, f"{CR_PATH}/a", {"metadata": {"labels": {"x": None}}})
    assert r.json()["metadata"]["labels"] == {"y": "2"}
    r = await patch(client, f"{CR_PATH}/a", {"spec": {"priority": "high"}})
    assert r.status_code == 422
    got = (await client.get(f"{CR_PATH}/a")).json()
    assert got["spec"]["priority"] == 1


async def test_pagination_snapshot(client: httpx.AsyncClient) -> None:
    for i in range(5):
        await client.post(PODS, json=pod_body(f"p{i}"))
    r1 = (await client.get(PODS, params={"limit": "2"})).json()
    assert [o["metadata"]["name"] for o in r1["items"]] == ["p0", "p1"]
    assert r1["metadata"]["remainingItemCount"] == 3
    cont = r1["metadata"]["continue"]
    await client.post(PODS, json=pod_body("p5"))
    names = [o["metadata"]["name"] for o in r1["items"]]
    while cont:
        page = (await client.get(PODS, params={"limit": "2", "continue": cont})).json()
        assert page["metadata"]["resourceVersion"] == r1["metadata"]["resourceVersion"]
        names += [o["metadata"]["name"] for o in page["items"]]
        cont = page["metadata"].get("continue")
    assert names == ["p0", "p1", "p2", "p3", "p4"]
    full = (await client.get(PODS)).json()
    assert len(full["items"]) == 6 and "continue" not in full["metadata"]
    r = await client.get(PODS, params={"limit": "2", "continue": "!!garbage"})
    assert r.status_code == 400


async def test_expired_continue_is_410(client: httpx.AsyncClient, api: ApiServer) -> None:
    for i in range(3):
        await client.post(PODS, json=pod_body(f"p{i}"))
    cont = (await client.get(PODS, params={"limit": "1"})).json()["metadata"]["continue"]
    api.pager.expire_all()
    r = await client.get(PODS, params={"limit": "1", "continue": cont})
    assert r.status_code == 410 and r.json()["reason"] == "Expired"


async def test_selectors(client: httpx.AsyncClient) -> None:
    await client.post(PODS, json=pod_body("a", "n1", {"app": "web"}))
    await client.post(PODS, json=pod_body("b", "n2", {"app": "web", "canary": "1"}))
    await client.post(PODS, json=pod_body("c", "n1", {"app": "db"}))

    async def names(**params: str) -> list[str]:
        r = await client.get("/api/v1/pods", params=params)
        assert r.status_code == 200, r.text
        return [o["metadata"]["name"] for o in r.json()["items"]]

    assert await names(fieldSelector="spec.nodeName=n1") == ["a", "c"]
    assert await names(labelSelector="app in (web),!canary") == ["a"]
    assert await names(labelSelector="app!=web") == ["c"]
    assert await names(fieldSelector="status.phase=Pending,metadata.name!=a") == ["b", "c"]
    r = await client.get("/api/v1/pods", params={"fieldSelector": "spec.foo=x"})
    assert r.status_code == 400 and r.json()["message"] == "field label not supported: spec.foo"
    r = await client.get("/api/v1/pods", params={"labelSelector": "app in (web"})
    assert r.status_code == 400
    r = await client.get(
        "/apis/bigfleet.lucy.sh/v1alpha1/capacityrequests",
        params={"fieldSelector": "status.phase=Pending"},
    )
    assert r.status_code == 200
    r = await client.get(
        "/apis/bigfleet.lucy.sh/v1alpha1/capacityrequests",
        params={"fieldSelector": "spec.priority=1"},
    )
    assert r.status_code == 400
    r = await client.get(NODES, params={"fieldSelector": "spec.unschedulable=false"})
    assert r.status_code == 200


async def test_deletecollection(client: httpx.AsyncClient) -> None:
    await client.post(PODS, json=pod_body("a", labels={"app": "web"}))
    await client.post(PODS, json=pod_body("b", labels={"app": "web"}))
    await client.post(PODS, json=pod_body("c", labels={"app": "db"}))
    r = await client.request("DELETE", PODS, params={"labelSelector": "app=web"})
    assert r.status_code == 200
    assert r.json()["kind"] == "PodList"
    assert sorted(o["metadata"]["name"] for o in r.json()["items"]) == ["a", "b"]
    left = (await client.get(PODS)).json()["items"]
    assert [o["metadata"]["name"] for o in left] == ["c"]


async def test_finalizers_and_deletion_timestamp(client: httpx.AsyncClient) -> None:
    body = cr_body("a")
    body["metadata"]["finalizers"] = ["example.com/hold"]
    await client.post(CR_PATH, json=body)
    r = await client.delete(f"{CR_PATH}/a")
    assert r.status_code == 200
    obj = r.json()
    assert obj["metadata"]["deletionTimestamp"] and obj["metadata"]["generation"] == 2
    r = await patch(
        client,
        f"{CR_PATH}/a",
        {"metadata": {"finalizers": ["example.com/hold", "example.com/new"]}},
    )
    assert r.status_code == 422
    assert r.json()["details"]["causes"][0]["field"] == "metadata.finalizers"
    r = await patch(client, f"{CR_PATH}/a", {"metadata": {"finalizers": None}})
    assert r.status_code == 200
    assert (await client.get(f"{CR_PATH}/a")).status_code == 404


async def test_delete_preconditions(client: httpx.AsyncClient) -> None:
    await client.post(PODS, json=pod_body("p"))
    r = await client.request("DELETE", f"{PODS}/p", json={"preconditions": {"uid": "nope"}})
    assert r.status_code == 409
    r = await client.request(
        "DELETE",
        f"{PODS}/p",
        content=b"k8s\x00\x01protobuf",
        headers={"content-type": "application/vnd.kubernetes.protobuf"},
    )
    assert r.status_code == 200
    assert (await client.delete(f"{PODS}/p")).status_code == 404


async def test_owner_reference_gc(client: httpx.AsyncClient, api: ApiServer) -> None:
    p = (await client.post(PODS, json=pod_body("p"))).json()
    q = (await client.post(PODS, json=pod_body("q"))).json()
    ref_p = {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": p["metadata"]["uid"]}
    ref_q = {"apiVersion": "v1", "kind": "Pod", "name": "q", "uid": q["metadata"]["uid"]}
    await client.post(
        CR_PATH, json=cr_body("one", metadata={"name": "one", "ownerReferences": [ref_p]})
    )
    await client.post(
        CR_PATH, json=cr_body("two", metadata={"name": "two", "ownerReferences": [ref_p, ref_q]})
    )
    assert (await client.delete(f"{PODS}/p")).status_code == 200
    assert (await client.get(f"{CR_PATH}/one")).status_code == 404
    assert (await client.get(f"{CR_PATH}/two")).status_code == 200
    await client.delete(f"{PODS}/q")
    assert (await client.get(f"{CR_PATH}/two")).status_code == 404
    # Orphan propagation keeps the dependent and strips the reference.
    r = (await client.post(PODS, json=pod_body("r"))).json()
    ref_r = {"apiVersion": "v1", "kind": "Pod", "name": "r", "uid": r["metadata"]["uid"]}
    await client.post(
        CR_PATH, json=cr_body("three", metadata={"name": "three", "ownerReferences": [ref_r]})
    )
    await client.request("DELETE", f"{PODS}/r", json={"propagationPolicy": "Orphan"})
    kept = (await client.get(f"{CR_PATH}/three")).json()
    assert "ownerReferences" not in kept["metadata"]


async def test_dangling_owner_is_collected(client: httpx.AsyncClient) -> None:
    ref = {"apiVersion": "v1", "kind": "Pod", "name": "gone", "uid": "00000000-dead"}
    r = await client.post(
        CR_PATH, json=cr_body("x", metadata={"name": "x", "ownerReferences": [ref]})
    )
    assert r.status_code == 201
    assert (await client.get(f"{CR_PATH}/x")).status_code == 404


async def test_namespace_delete_cascades(client: httpx.AsyncClient) -> None:
    await client.post("/api/v1/namespaces", json={"metadata": {"name": "team"}})
    await client.post("/api/v1/namespaces/team/pods", json=pod_body("p"))
    assert (await client.delete("/api/v1/namespaces/team")).status_code == 200
    assert (await client.get("/api/v1/namespaces/team/pods/p")).status_code == 404
    assert (await client.delete("/api/v1/namespaces/default")).status_code == 403


async def test_node_strategic_patch_cordon(client: httpx.AsyncClient) -> None:
    await client.post(
        NODES,
        json={
            "metadata": {"name": "n1"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        },
    )
    r = await patch(client, f"{NODES}/n1", {"spec": {"unschedulable": True}}, SMP)
    assert r.json()["spec"] == {"unschedulable": True}
    assert r.json()["status"]["conditions"][0]["type"] == "Ready"
    r = await patch(client, f"{NODES}/n1", {"spec": {"unschedulable": None}}, SMP)
    assert r.json()["spec"] == {}


async def test_unknown_routes(client: httpx.AsyncClient) -> None:
    assert (await client.get("/apis/nope.io/v1/things")).status_code == 404
    assert (await client.get("/api/v1/namespaces/default/nodes")).status_code == 404
    assert (await client.get("/api/v1/namespaces/default/pods/p/bogus")).status_code == 404
    assert (await client.get("/healthz")).text == "ok"


async def test_only_the_newest_list_snapshots_are_kept(
    client: httpx.AsyncClient, api: ApiServer
) -> None:
    from bigfleet_trio.sim.apiserver.paging import KEPT_SNAPSHOTS

    for i in range(2):
        await client.post(PODS, json=pod_body(f"p{i}"))
    tokens = [
        (await client.get(PODS, params={"limit": "1"})).json()["metadata"]["continue"]
        for _ in range(KEPT_SNAPSHOTS + 1)
    ]
    assert (await client.get(PODS, params={"limit": "1", "continue": tokens[0]})).status_code == 410
    last = await client.get(PODS, params={"limit": "1", "continue": tokens[-1]})
    assert last.status_code == 200 and [o["metadata"]["name"] for o in last.json()["items"]] == [
        "p1"
    ]
