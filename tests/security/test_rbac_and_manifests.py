"""RBAC in ``config/rbac`` against what the code really calls, and the Deployments'
security context (FAULTS.md, "Security").

The calls are recorded, not guessed: each component runs through its whole lifecycle on the
embedded apiserver behind a recording transport, and every HTTP request is mapped to its RBAC
(apiGroup, resource[/subresource], verb). Then:

* every recorded triple is granted by the component's ClusterRole/Role (nothing would be 403);
* every granted triple was recorded, or is listed in ``UNEXERCISED`` with the code that needs
  it (nothing more is granted than the code uses).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import trio
import trio.testing
import yaml

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.leader import LeaderElector
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, PODS
from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.testing import InProcessTransport

CONFIG = Path(__file__).resolve().parents[2] / "config"
RBAC = CONFIG / "rbac"

Triple = tuple[str, str, str]  # (apiGroup, resource[/sub], verb)

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<res>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)


def rbac_triple(method: str, path: str, params: httpx.QueryParams) -> Triple:
    m = _PATH.match(path)
    assert m, path
    group = "" if m["core"] else m["group"]
    res = m["res"]
    if m["res"] == "namespaces" and m["name"] and not m["ns"]:
        pass
    if m["sub"]:
        res = f"{res}/{m['sub']}"
    named = bool(m["name"])
    verb = {
        "GET": ("watch" if params.get("watch") in ("true", "1") else
                ("get" if named else "list")),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if named else "deletecollection",
    }[method]
    return group, res, verb


class RecordingTransport(InProcessTransport):
    def __init__(self, app: Any, nursery: trio.Nursery) -> None:
        super().__init__(app, nursery)
        self.calls: set[Triple] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.calls.add(rbac_triple(request.method, request.url.path, request.url.params))
        return await super().handle_async_request(request)


def granted(*files: str, service_account: str) -> set[Triple]:
    out: set[Triple] = set()
    for f in files:
        for doc in yaml.safe_load_all((RBAC / f).read_text()):
            if not doc or doc["kind"] not in ("ClusterRole", "Role"):
                continue
            assert doc["metadata"]["name"].startswith(service_account)
            for rule in doc["rules"]:
                assert "*" not in rule["verbs"] and "*" not in rule["resources"]
                assert "*" not in rule["apiGroups"]
                for g in rule["apiGroups"]:
                    for r in rule["resources"]:
                        for v in rule["verbs"]:
                            out.add((g, r, v))
    return out


LEASE = {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}


async def _leader_calls(transport: RecordingTransport) -> None:
    client = KubeClient(KubeConfig(server="http://apiserver"), transport=transport)
    elector = LeaderElector(client, name="x", namespace="default", identity="me")
    async with elector.leading():
        await trio.sleep(5)  # renew twice (PUT)


# Granted, but our lifecycle below does not reach the call; each names the code that needs it.
OPERATOR_UNEXERCISED: dict[Triple, str] = {
    ("bigfleet.lucy.sh", "upcomingnodes", "patch"):
        "operator/upcoming.py UpcomingNodeHandler._patch: spec patch on a label change",
    ("bigfleet.lucy.sh", "upcomingnodes", "get"):
        "operator/upcoming.py:664 re-read after a Conflict",
    ("bigfleet.lucy.sh", "availablecapacities", "get"):
        "operator/available.py:199 read before upsert",
    ("", "nodes", "get"): "operator/reclaim.py:745 resolve a reclaim entry to a Node",
    ("", "events", "create"): "operator/wiring.py:270 Warning Event for an excluded CR",
    ("bigfleet.lucy.sh", "capacityrequests", "list"):
        "kube/informer.py Informer._relist: the paged LIST when a streaming list is refused",
}

async def _operator_calls() -> set[Triple]:
    from tests.faults._harness import harness
    from tests.faults.test_shard_faults import _lifecycle

    used: set[Triple] = set()
    async with harness() as h:
        # an excluded CR (Warning Event) besides the two that drive machines up and down
        for name, cpu, prio in (("neg", "-1", 1), ("w", "3", 100), ("v", "3", 100)):
            await h.client.create(CAPACITY_REQUESTS, {
                "apiVersion": "bigfleet.lucy.sh/v1alpha1", "kind": "CapacityRequest",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"priority": prio, "resources": {"cpu": cpu}}}, "default")
        setup = len(h.transport.requests)
        async with trio.open_nursery() as run:
            await run.start(h.operator.run)
            await _lifecycle(h)
            run.cancel_scope.cancel()
        # _lifecycle's own writes (one Pod, two CR deletes) share the client: not the operator's
        own = {("POST", "/api/v1/namespaces/default/pods"),
               ("DELETE", "/apis/bigfleet.lucy.sh/v1alpha1/namespaces/default/capacityrequests/w"),
               ("DELETE", "/apis/bigfleet.lucy.sh/v1alpha1/namespaces/default/capacityrequests/v")}
        for method, path, params in h.transport.requests[setup:]:
            if (method, path) not in own:
                used.add(rbac_triple(method, path, params))
        rec = RecordingTransport(h.server.app, h.nursery)
        await _leader_calls(rec)
        used |= rec.calls
    return used


async def test_operator_calls_are_all_granted(autojump_clock: trio.testing.MockClock) -> None:
    used = await _operator_calls()
    grants = granted("operator.yaml", service_account="bigfleet-operator")
    assert ("", "pods/eviction", "create") in used  # the lifecycle really drained
    assert used - grants == set(), f"called but not granted: {sorted(used - grants)}"


async def test_operator_is_granted_nothing_more(autojump_clock: trio.testing.MockClock) -> None:
    used = await _operator_calls()
    grants = granted("operator.yaml", service_account="bigfleet-operator")
    unused = grants - used - set(OPERATOR_UNEXERCISED)
    assert unused == set(), f"granted but never called: {sorted(unused)}"


# ------------------------------------------------------------------------------ pod controller

POD_CONTROLLER_UNEXERCISED: dict[Triple, str] = {
    ("bigfleet.lucy.sh", "capacityrequests", "get"):
        "podcontroller/controller.py:635 re-read after AlreadyExists (cache lag)",
    ("bigfleet.lucy.sh", "capacityrequests", "patch"):
        "podcontroller/controller.py:703 update the CR after an in-place Pod resize",
    ("bigfleet.lucy.sh", "capacityrequests", "delete"):
        "podcontroller/controller.py:714 delete one orphan CR (uid precondition)",
    ("", "pods", "get"): "podcontroller/controller.py:734 live check of an orphan CR's owner",
}


async def _pod_controller_calls() -> set[Triple]:
    from bigfleet_trio.podcontroller.controller import PodController
    from bigfleet_trio.podcontroller.scope import PodScope

    server = ApiServer()
    async with trio.open_nursery() as nursery:
        rec = RecordingTransport(server.app, nursery)
        client = KubeClient(KubeConfig(server="http://apiserver"), transport=rec)
        setup = KubeClient(KubeConfig(server="http://apiserver"),
                           transport=InProcessTransport(server.app, nursery))

        def pod(name: str, **meta: Any) -> dict[str, Any]:
            return {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": "default", **meta},
                    "spec": {"containers": [{"name": "c", "image": "x", "resources": {
                        "requests": {"cpu": "500m"}}}]}}

        async def crs() -> list[dict[str, Any]]:
            return (await setup.list(CAPACITY_REQUESTS, "default")).items

        async def until(pred: Any) -> None:
            with trio.fail_after(60):
                while not await pred():  # noqa: ASYNC110 - polls the apiserver
                    await trio.sleep(0.1)

        # the binary's default scope: the Node cache of --unmanaged-node-selector
        ctl = PodController(client, orphan_grace=1.0, scope=PodScope.parse())
        async with trio.open_nursery() as run:
            await run.start(ctl.run)
            await setup.create(PODS, pod("a"))
            await setup.create(PODS, pod("b", annotations={
                "bigfleet.lucy.sh/interruption-penalty": "lots"}))  # Warning Event
            await setup.create(PODS, pod("gone"))

            async def three() -> bool:
                return len(await crs()) == 3

            await until(three)
            for c in await crs():  # a hand-deleted CR is recreated
                if c["metadata"]["ownerReferences"][0]["name"] == "a":
                    await setup.delete(CAPACITY_REQUESTS, c["metadata"]["name"], "default")
            await setup.delete(PODS, "gone", "default")
            await setup.patch(PODS, "b", {"status": {"phase": "Succeeded"}}, "default",
                              subresource="status")

            async def one() -> bool:
                return len(await crs()) == 1

            await until(one)
            await trio.sleep(5)
            run.cancel_scope.cancel()
        await _leader_calls(rec)
        nursery.cancel_scope.cancel()
    return rec.calls


async def test_pod_controller_calls_are_all_granted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    used = await _pod_controller_calls()
    grants = granted("pod-controller.yaml", service_account="bigfleet-pod-controller")
    # a terminal Pod's CRs are deleted by name (docs/deviations.md, terminal Pods)
    assert ("bigfleet.lucy.sh", "capacityrequests", "delete") in used
    assert ("bigfleet.lucy.sh", "capacityrequests", "deletecollection") not in used
    assert used - grants == set(), f"called but not granted: {sorted(used - grants)}"
    unused = grants - used - set(POD_CONTROLLER_UNEXERCISED)
    assert unused == set(), f"granted but never called: {sorted(unused)}"


# ------------------------------------------------------------------------------ Deployments


def _deployments() -> list[dict[str, Any]]:
    out = []
    for f in sorted((CONFIG / "manager").glob("*.yaml")):
        out += [d for d in yaml.safe_load_all(f.read_text())
                if isinstance(d, dict) and d.get("kind") == "Deployment"]
    return out


def test_deployments_run_non_root_with_read_only_root_filesystem() -> None:
    deps = _deployments()
    assert {d["metadata"]["name"] for d in deps} == {"bigfleet-operator",
                                                      "bigfleet-pod-controller"}
    for d in deps:
        pod_spec = d["spec"]["template"]["spec"]
        psc = pod_spec.get("securityContext") or {}
        assert psc.get("runAsNonRoot") is True
        assert pod_spec.get("hostNetwork") in (None, False)
        assert pod_spec.get("hostPID") in (None, False)
        for c in pod_spec["containers"] + pod_spec.get("initContainers", []):
            sc = c.get("securityContext") or {}
            assert sc.get("readOnlyRootFilesystem") is True, c["name"]
            assert sc.get("allowPrivilegeEscalation") is False, c["name"]
            assert sc.get("privileged") in (None, False)
            assert sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True
            uid = sc.get("runAsUser", psc.get("runAsUser"))
            assert isinstance(uid, int) and uid != 0
            assert "ALL" in (sc.get("capabilities") or {}).get("drop", [])
            assert not (sc.get("capabilities") or {}).get("add")
        # the service account token is only mounted where the API is used, never a host path
        for v in pod_spec.get("volumes", []):
            assert "hostPath" not in v
