"""Bad input never crashes the server (no 5xx) and never changes stored objects."""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.testing import (
    CR_PATH,
    JSONPATCH,
    MERGE,
    PODS,
    SMP,
    cr_body,
    open_client,
    patch,
    pod_body,
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "metadata",
                    "spec",
                    "status",
                    "labels",
                    "name",
                    "priority",
                    "resources",
                    "cpu",
                    "finalizers",
                    "ownerReferences",
                    "kind",
                    "apiVersion",
                    "uid",
                    "x",
                ]
            ),
            children,
            max_size=4,
        )
    ),
    max_leaves=12,
)


async def test_type_confused_metadata_is_400(client: httpx.AsyncClient) -> None:
    for meta in (
        {"name": "a", "labels": {"x": 1}},
        {"name": 5},
        {"name": "a", "finalizers": "x"},
        {"name": "a", "ownerReferences": [1]},
    ):
        r = await client.post(CR_PATH, json={**cr_body("a"), "metadata": meta})
        assert r.status_code == 400, meta
    r = await client.post(
        CR_PATH, json={**cr_body("a"), "metadata": {"name": "a", "labels": {"bad key!": "v"}}}
    )
    assert r.status_code == 422
    await client.post(PODS, json=pod_body("p"))
    r = await patch(client, f"{PODS}/p", {"metadata": {"labels": {"a": ["x"]}}})
    assert r.status_code == 400


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    payload=json_values,
    kind=st.sampled_from(
        ["merge", "json", "smp", "put", "post", "status", "evict", "delete", "pod", "pdb"]
    ),
)
def test_fuzzed_writes_never_5xx_or_corrupt(payload: Any, kind: str) -> None:
    import trio

    async def main() -> None:
        api = ApiServer()
        async with open_client(api) as client:
            assert (await client.post(CR_PATH, json=cr_body("a"))).status_code == 201
            assert (await client.post(PODS, json=pod_body("p"))).status_code == 201
            before_cr = json.dumps(api.store.get(api.find("cr"), "default", "a"), sort_keys=True)
            before_pod = json.dumps(api.store.get(api.find("pods"), "default", "p"), sort_keys=True)
            raw = json.dumps(payload)
            if kind == "merge":
                r = await client.patch(f"{CR_PATH}/a", content=raw, headers=MERGE)
            elif kind == "json":
                r = await client.patch(f"{CR_PATH}/a", content=raw, headers=JSONPATCH)
            elif kind == "smp":
                r = await client.patch(f"{PODS}/p", content=raw, headers=SMP)
            elif kind == "put":
                r = await client.put(
                    f"{CR_PATH}/a", content=raw, headers={"content-type": "application/json"}
                )
            elif kind == "post":
                r = await client.post(
                    CR_PATH, content=raw, headers={"content-type": "application/json"}
                )
            elif kind == "status":
                r = await client.patch(f"{CR_PATH}/a/status", content=raw, headers=MERGE)
            elif kind == "evict":
                r = await client.post(
                    f"{PODS}/p/eviction", content=raw, headers={"content-type": "application/json"}
                )
            elif kind == "pod":
                r = await client.post(
                    PODS, json={"metadata": {"name": "q"}, "spec": payload, "status": payload}
                )
                table = await client.get(
                    PODS, headers={"accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
                )
                assert table.status_code == 200
            elif kind == "pdb":
                pdbs = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"
                r = await client.post(
                    pdbs, json={"metadata": {"name": "b"}, "spec": {"selector": payload}}
                )
                if r.status_code == 201:
                    await client.patch(
                        f"{pdbs}/b/status", content=json.dumps({"status": payload}), headers=MERGE
                    )
                    await client.patch(
                        f"{PODS}/p/status", content=b'{"status":{"phase":"Running"}}', headers=MERGE
                    )
                    before_pod = json.dumps(
                        api.store.get(api.find("pods"), "default", "p"), sort_keys=True
                    )
                    ev = await client.post(f"{PODS}/p/eviction", json={"metadata": {"name": "p"}})
                    assert ev.status_code < 500, ev.text
            else:
                r = await client.request(
                    "DELETE",
                    f"{CR_PATH}/a",
                    content=raw,
                    headers={"content-type": "application/json"},
                )
            assert r.status_code < 500, (kind, raw, r.text)
            body = r.json()
            if r.status_code >= 400:
                assert body["kind"] == "Status" and body["code"] == r.status_code
                assert (
                    json.dumps(api.store.get(api.find("cr"), "default", "a"), sort_keys=True)
                    == before_cr
                )
                assert (
                    json.dumps(api.store.get(api.find("pods"), "default", "p"), sort_keys=True)
                    == before_pod
                )
            # Whatever happened, every stored object is still well-formed JSON with metadata.
            for res in (api.find("cr"), api.find("pods")):
                for obj in api.store.items(res):
                    assert isinstance(obj["metadata"]["name"], str)
                    json.dumps(obj)

    trio.run(main)


async def test_object_verbs_on_a_collection_are_405_as_on_kube_apiserver(
    client: httpx.AsyncClient,
) -> None:
    """PUT or PATCH of a collection URL names no object: kube-apiserver answers 405
    MethodNotAllowed (found by the differential test, case ``method-not-allowed``)."""
    for method, headers in (("PUT", {"content-type": "application/json"}), ("PATCH", MERGE)):
        r = await client.request(method, PODS, content=b"{}", headers=headers)
        assert r.status_code == 405, (method, r.text)
        assert r.json()["reason"] == "MethodNotAllowed"
