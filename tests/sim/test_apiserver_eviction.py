"""pods/eviction with PodDisruptionBudget evaluation, as the real apiserver does it."""

from __future__ import annotations

from typing import Any

import httpx

from bigfleet_trio.sim.apiserver.testing import PODS, patch, pod_body

PDBS = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"


def eviction(name: str) -> dict[str, Any]:
    return {
        "kind": "Eviction",
        "apiVersion": "policy/v1",
        "metadata": {"name": name, "namespace": "default"},
        "deleteOptions": {},
    }


async def running_pod(
    client: httpx.AsyncClient, name: str, ready: bool = True, labels: dict[str, str] | None = None
) -> None:
    await client.post(
        PODS, json=pod_body(name, "n1", labels if labels is not None else {"app": "web"})
    )
    st = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    r = await patch(client, f"{PODS}/{name}/status", {"status": st})
    assert r.status_code == 200


async def make_pdb(
    client: httpx.AsyncClient,
    allowed: int,
    *,
    observed: int = 1,
    name: str = "pdb1",
    healthy: int = 2,
) -> None:
    await client.post(
        PDBS,
        json={
            "metadata": {"name": name},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
        },
    )
    await patch(
        client,
        f"{PDBS}/{name}/status",
        {
            "status": {
                "observedGeneration": observed,
                "disruptionsAllowed": allowed,
                "currentHealthy": healthy,
                "desiredHealthy": 1,
                "expectedPods": 2,
            }
        },
    )


async def test_evict_without_pdb_deletes(client: httpx.AsyncClient) -> None:
    await running_pod(client, "p")
    r = await client.post(f"{PODS}/p/eviction", json=eviction("p"))
    assert r.status_code == 201
    assert r.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }
    assert (await client.get(f"{PODS}/p")).status_code == 404


async def test_evict_missing_pod_is_404(client: httpx.AsyncClient) -> None:
    r = await client.post(f"{PODS}/ghost/eviction", json=eviction("ghost"))
    assert r.status_code == 404


async def test_pdb_allows_one_then_blocks(client: httpx.AsyncClient) -> None:
    await running_pod(client, "a")
    await running_pod(client, "b")
    await make_pdb(client, allowed=1)
    r = await client.post(f"{PODS}/a/eviction", json=eviction("a"))
    assert r.status_code == 201
    pdb = (await client.get(f"{PDBS}/pdb1")).json()
    assert pdb["status"]["disruptionsAllowed"] == 0
    assert "a" in pdb["status"]["disruptedPods"]
    r = await client.post(f"{PODS}/b/eviction", json=eviction("b"))
    assert r.status_code == 429
    body = r.json()
    assert body["reason"] == "TooManyRequests"
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    # more healthy than desired, yet no disruption left: kube-apiserver's default wording
    assert body["details"]["causes"] == [
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget pdb1 does not allow evicting pods currently",
        }
    ]
    assert (await client.get(f"{PODS}/b")).status_code == 200


async def test_no_disruption_left_says_why_as_kube_apiserver_does(
    client: httpx.AsyncClient,
) -> None:
    await running_pod(client, "a")
    await make_pdb(client, allowed=0, healthy=1)
    causes = (await client.post(f"{PODS}/a/eviction", json=eviction("a"))).json()["details"]
    assert causes == {"causes": [{
        "reason": "DisruptionBudget",
        "message": "The disruption budget pdb1 needs 1 healthy pods and has 1 currently",
    }]}
    for reason, message, expected in [
        ("SyncFailed", "no controller",
         "The disruption budget pdb1 does not allow evicting pods currently because it failed "
         "sync: no controller"),
        ("InsufficientPods", "too few", "The disruption budget pdb1 does not allow evicting "
         "pods currently (InsufficientPods): too few"),
    ]:
        await patch(client, f"{PDBS}/pdb1/status", {"status": {
            "currentHealthy": 2 if reason != "SyncFailed" else 1,
            "conditions": [{"type": "DisruptionAllowed", "status": "False", "reason": reason,
                            "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        }})
        r = await client.post(f"{PODS}/a/eviction", json=eviction("a"))
        assert r.json()["details"]["causes"][0]["message"] == expected


async def test_negative_disruptions_allowed_is_403_naming_the_budget(
    client: httpx.AsyncClient,
) -> None:
    await running_pod(client, "a")
    await make_pdb(client, allowed=-1)
    r = await client.post(f"{PODS}/a/eviction", json=eviction("a"))
    assert r.status_code == 403
    body = r.json()
    assert (body["reason"], body["message"]) == (
        "Forbidden",
        'poddisruptionbudget.policy "pdb1" is forbidden: pdb disruptions allowed is negative')
    assert body["details"] == {
        "name": "pdb1", "group": "policy", "kind": "poddisruptionbudget",
        "causes": [{"reason": "DisruptionBudget", "message": "The disruption budget pdb1 does "
                    "not allow evicting pods currently: pdb disruptions allowed is negative"}],
    }
    assert (await client.get(f"{PODS}/a")).status_code == 200


async def test_pdb_not_observed_yet(client: httpx.AsyncClient) -> None:
    await running_pod(client, "a")
    await make_pdb(client, allowed=1, observed=0)
    r = await client.post(f"{PODS}/a/eviction", json=eviction("a"))
    assert r.status_code == 429
    assert r.json()["details"]["retryAfterSeconds"] == 10
    assert r.headers["retry-after"] == "10"
    assert "still being processed" in r.json()["details"]["causes"][0]["message"]


async def test_unready_pod_evicted_when_budget_healthy(client: httpx.AsyncClient) -> None:
    await running_pod(client, "a", ready=False)
    await make_pdb(client, allowed=0, healthy=2)
    r = await client.post(f"{PODS}/a/eviction", json=eviction("a"))
    assert r.status_code == 201


async def test_pending_pod_skips_pdb(client: httpx.AsyncClient) -> None:
    await client.post(PODS, json=pod_body("p", labels={"app": "web"}))
    await make_pdb(client, allowed=0)
    r = await client.post(f"{PODS}/p/eviction", json=eviction("p"))
    assert r.status_code == 201


async def test_two_pdbs_is_500(client: httpx.AsyncClient) -> None:
    await running_pod(client, "a")
    await make_pdb(client, allowed=1, name="x")
    await make_pdb(client, allowed=1, name="y")
    r = await client.post(f"{PODS}/a/eviction", json=eviction("a"))
    assert r.status_code == 500


async def test_eviction_name_mismatch_is_400(client: httpx.AsyncClient) -> None:
    await running_pod(client, "a")
    r = await client.post(f"{PODS}/a/eviction", json=eviction("b"))
    assert r.status_code == 400


async def test_pdb_controller_tracks_pods_and_gates_evictions() -> None:
    from bigfleet_trio.sim.apiserver import ApiServer
    from bigfleet_trio.sim.apiserver.testing import open_client

    api = ApiServer(pdb_controller=True)
    async with open_client(api) as client:
        rs = (
            await client.post(
                "/apis/apps/v1/namespaces/default/replicasets",
                json={"metadata": {"name": "rs"}, "spec": {"replicas": 3}},
            )
        ).json()
        ref = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": "rs",
            "uid": rs["metadata"]["uid"],
            "controller": True,
        }
        await client.post(
            PDBS,
            json={
                "metadata": {"name": "pdb1"},
                "spec": {"maxUnavailable": "50%", "selector": {"matchLabels": {"app": "web"}}},
            },
        )

        async def owned_pod(name: str) -> None:
            await client.post(
                PODS, json=pod_body(name, "n1", {"app": "web"}, ownerReferences=[ref])
            )
            st = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
            await patch(client, f"{PODS}/{name}/status", {"status": st})

        for name in ("a", "b", "c"):
            await owned_pod(name)
        await running_pod(client, "other", labels={"app": "db"})
        st = (await client.get(f"{PDBS}/pdb1")).json()["status"]
        # RS scale 3; maxUnavailable 50% of 3 rounds up to 2 -> desiredHealthy 1;
        # 3 healthy -> 2 allowed.
        assert (
            st["expectedPods"],
            st["currentHealthy"],
            st["desiredHealthy"],
            st["disruptionsAllowed"],
        ) == (3, 3, 1, 2)
        assert st["observedGeneration"] == 1
        assert (await client.post(f"{PODS}/a/eviction", json=eviction("a"))).status_code == 201
        assert (await client.post(f"{PODS}/b/eviction", json=eviction("b"))).status_code == 201
        r = await client.post(f"{PODS}/c/eviction", json=eviction("c"))
        assert r.status_code == 429
        assert (
            r.json()["details"]["causes"][0]["message"]
            == "The disruption budget pdb1 needs 1 healthy pods and has 1 currently"
        )
        await owned_pod("d")
        st = (await client.get(f"{PDBS}/pdb1")).json()["status"]
        assert (st["currentHealthy"], st["disruptionsAllowed"]) == (2, 1)
