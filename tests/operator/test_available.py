"""AvailableCapacityUpdate -> AvailableCapacity (docs/reference.md#availablecapacity-gaps)."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest
import trio

from bigfleet_trio.kube.errors import AlreadyExists, Conflict, Invalid, NotFound
from bigfleet_trio.kube.resources import AVAILABLE_CAPACITIES, Resource
from bigfleet_trio.operator.available import (
    AvailableCapacityHandler,
    availability_for_confidence,
    available_capacity_name,
    cost_quantity,
    requirements_to_spec,
    spec_from_update,
)
from bigfleet_trio.proto import pb

Conf = pb.AvailableCapacityUpdateConfidence
Op = pb.NodeSelectorRequirementOperator
KEY = "available:req=zone:In:a|res=cpu"
NAME = "ac-" + hashlib.sha256(KEY.encode()).hexdigest()[:32]


def acu(**kw: Any) -> pb.AvailableCapacityUpdate:
    base: dict[str, Any] = {
        "supersedes_key": KEY,
        "available_count": 3,
        "confidence": Conf.CONFIDENCE_HIGH,
        "cost_per_hour": 0.0416,
    }
    base.update(kw)
    return pb.AvailableCapacityUpdate(**base)


def test_name_hash() -> None:
    # sha256("abc") = ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad
    assert available_capacity_name("abc") == "ac-ba7816bf8f01cfea414140de5dae2223"
    assert available_capacity_name(KEY) == NAME
    assert len(NAME) == 35


@pytest.mark.parametrize(
    ("conf", "availability"),
    [
        (Conf.CONFIDENCE_UNSPECIFIED, "None"),
        (Conf.CONFIDENCE_NONE, "None"),
        (Conf.CONFIDENCE_LOW, "Low"),
        (Conf.CONFIDENCE_MEDIUM, "Medium"),
        (Conf.CONFIDENCE_HIGH, "High"),
        (17, "None"),
    ],
)
def test_confidence_mapping(conf: int, availability: str) -> None:
    assert availability_for_confidence(conf) == availability


@pytest.mark.parametrize(
    ("cost", "quantity"),
    [
        (0.0416, "41600u"),
        (0.5, "500m"),
        (0.1, "100m"),
        (1.25, "1250m"),
        (3.0, "3"),
        (1500.0, "1500"),
        (2000.0, "2k"),
        (1e-12, "1n"),
        (0.0, "0"),
        (float("nan"), "0"),
        (float("inf"), "0"),
        (-1.0, "0"),
    ],
)
def test_cost_quantity(cost: float, quantity: str) -> None:
    assert cost_quantity(cost) == quantity


def test_requirements_standard_operators_only() -> None:
    reqs = [
        pb.NodeSelectorRequirement(key="zone", operator=Op.OPERATOR_IN, values=["a", "b"]),
        pb.NodeSelectorRequirement(key="arch", operator=Op.OPERATOR_NOT_IN, values=["arm64"]),
        pb.NodeSelectorRequirement(key="gpu", operator=Op.OPERATOR_EXISTS),
        pb.NodeSelectorRequirement(key="spot", operator=Op.OPERATOR_DOES_NOT_EXIST),
        pb.NodeSelectorRequirement(key="rack", operator=Op.OPERATOR_SAME),
        pb.NodeSelectorRequirement(key="x", operator=Op.OPERATOR_UNSPECIFIED, values=["1"]),
    ]
    assert requirements_to_spec(reqs) == [
        {"key": "zone", "operator": "In", "values": ["a", "b"]},
        {"key": "arch", "operator": "NotIn", "values": ["arm64"]},
        {"key": "gpu", "operator": "Exists"},
        {"key": "spot", "operator": "DoesNotExist"},
    ]


def test_spec_from_update() -> None:
    u = acu(
        requirements=[
            pb.NodeSelectorRequirement(key="zone", operator=Op.OPERATOR_IN, values=["a"])
        ],
        resources=pb.Resources(resources={"memory": "2048Mi", "cpu": "4", "bad": "four"}),
    )
    assert spec_from_update(u) == {
        "availability": "High",
        "availableCount": 3,
        "cost": "41600u",
        "resources": {"cpu": "4", "memory": "2Gi"},
        "requirements": [{"key": "zone", "operator": "In", "values": ["a"]}],
    }
    assert spec_from_update(pb.AvailableCapacityUpdate(supersedes_key="k")) == {
        "availability": "None",
        "availableCount": 0,
        "cost": "0",
        "resources": {},
    }


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, Any]] = []
        self.fail: dict[str, list[Exception]] = {}

    def _maybe_fail(self, op: str) -> None:
        if self.fail.get(op):
            raise self.fail[op].pop(0)

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        self._maybe_fail("get")
        if name not in self.objects:
            raise NotFound(404, "NotFound", name)
        return copy.deepcopy(self.objects[name])

    async def create(
        self, res: Resource, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        assert res == AVAILABLE_CAPACITIES
        self.calls.append(("create", copy.deepcopy(body)))
        self._maybe_fail("create")
        if body["metadata"]["name"] in self.objects:
            raise AlreadyExists(409, "AlreadyExists", "exists")
        self.objects[body["metadata"]["name"]] = copy.deepcopy(body)
        return body

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: str = "merge",
        subresource: str | None = None,
    ) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        assert patch_type == "merge" and subresource is None
        self.calls.append(("patch", copy.deepcopy(patch)))
        self._maybe_fail("patch")
        spec = self.objects[name]["spec"]
        for k, v in patch["spec"].items():
            if v is None:
                spec.pop(k, None)
            elif isinstance(v, dict) and isinstance(spec.get(k), dict):
                for k2, v2 in v.items():
                    if v2 is None:
                        spec[k].pop(k2, None)
                    else:
                        spec[k][k2] = v2
            else:
                spec[k] = v
        return self.objects[name]

    async def delete(self, *a: Any, **kw: Any) -> None:
        raise AssertionError("AvailableCapacity is never deleted")


async def test_create_then_patch_changed_fields(autojump_clock: trio.abc.Clock) -> None:
    kube = FakeKube()
    h = AvailableCapacityHandler(kube)
    await h.on_available_capacity(acu(resources=pb.Resources(resources={"cpu": "2", "gpu": "1"})))
    assert kube.calls == [
        (
            "create",
            {
                "apiVersion": "bigfleet.lucy.sh/v1alpha1",
                "kind": "AvailableCapacity",
                "metadata": {
                    "name": NAME,
                    "annotations": {"bigfleet.lucy.sh/supersedes-key": KEY},
                },
                "spec": {
                    "availability": "High",
                    "availableCount": 3,
                    "cost": "41600u",
                    "resources": {"cpu": "2", "gpu": "1"},
                },
            },
        )
    ]
    kube.calls.clear()
    await h.on_available_capacity(
        acu(
            confidence=Conf.CONFIDENCE_MEDIUM,
            available_count=0,
            resources=pb.Resources(resources={"cpu": "2000m"}),
        )
    )
    assert kube.calls == [
        (
            "patch",
            {"spec": {"availability": "Medium", "availableCount": 0, "resources": {"gpu": None}}},
        )
    ]
    kube.calls.clear()
    # same content again: no write
    await h.on_available_capacity(
        acu(
            confidence=Conf.CONFIDENCE_MEDIUM,
            available_count=0,
            resources=pb.Resources(resources={"cpu": "2"}),
        )
    )
    assert kube.calls == []


async def test_already_exists_becomes_patch(autojump_clock: trio.abc.Clock) -> None:
    kube = FakeKube()
    real_get = kube.get
    n = 0

    async def racing_get(res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        nonlocal n
        n += 1
        if n == 1:
            kube.objects[name] = {
                "metadata": {"name": name},
                "spec": {"availability": "None", "availableCount": 0, "cost": "0", "resources": {}},
            }
            raise NotFound(404, "NotFound", name)
        return await real_get(res, name, namespace)

    kube.get = racing_get  # type: ignore[method-assign]
    await AvailableCapacityHandler(kube).on_available_capacity(acu())
    assert [c[0] for c in kube.calls] == ["create", "patch"]
    assert kube.objects[NAME]["spec"] == {
        "availability": "High",
        "availableCount": 3,
        "cost": "41600u",
        "resources": {},
    }


async def test_conflict_retried(autojump_clock: trio.abc.Clock) -> None:
    kube = FakeKube()
    kube.objects[NAME] = {"metadata": {"name": NAME}, "spec": {"availability": "None"}}
    kube.fail = {"patch": [Conflict(409, "Conflict", "x")]}
    await AvailableCapacityHandler(kube).on_available_capacity(acu())
    assert [c[0] for c in kube.calls] == ["patch", "patch"]
    assert kube.objects[NAME]["spec"]["availability"] == "High"


async def test_invalid_gives_up_without_raising(autojump_clock: trio.abc.Clock) -> None:
    kube = FakeKube()
    kube.fail = {"create": [Invalid(422, "Invalid", "bad")]}
    await AvailableCapacityHandler(kube).on_available_capacity(acu())
    assert [c[0] for c in kube.calls] == ["create"]


async def test_empty_supersedes_key_ignored(autojump_clock: trio.abc.Clock) -> None:
    kube = FakeKube()
    await AvailableCapacityHandler(kube).on_available_capacity(acu(supersedes_key=""))
    assert kube.calls == []


async def test_apiserver_upsert(nursery: trio.Nursery, autojump_clock: trio.abc.Clock) -> None:
    from bigfleet_trio.kube import KubeClient, KubeConfig
    from bigfleet_trio.sim.apiserver import ApiServer
    from bigfleet_trio.sim.apiserver.testing import InProcessTransport

    server = ApiServer()
    client = KubeClient(
        KubeConfig(server="http://apiserver"), transport=InProcessTransport(server.app, nursery)
    )
    h = AvailableCapacityHandler(client)
    await h.on_available_capacity(
        acu(
            requirements=[
                pb.NodeSelectorRequirement(key="zone", operator=Op.OPERATOR_IN, values=["a"]),
                pb.NodeSelectorRequirement(key="rack", operator=Op.OPERATOR_SAME),
            ]
        )
    )
    ac = await client.get(AVAILABLE_CAPACITIES, NAME)
    assert ac["spec"] == {
        "availability": "High",
        "availableCount": 3,
        "cost": "41600u",
        "resources": {},
        "requirements": [{"key": "zone", "operator": "In", "values": ["a"]}],
    }
    assert ac["metadata"]["annotations"] == {"bigfleet.lucy.sh/supersedes-key": KEY}
    await h.on_available_capacity(
        acu(confidence=Conf.CONFIDENCE_NONE, available_count=0, cost_per_hour=0.0)
    )
    ac = await client.get(AVAILABLE_CAPACITIES, NAME)
    assert ac["spec"] == {
        "availability": "None",
        "availableCount": 0,
        "cost": "0",
        "resources": {},
    }
    assert len((await client.list(AVAILABLE_CAPACITIES)).items) == 1
