"""AvailableCapacityUpdate -> AvailableCapacity (docs/reference.md#availablecapacity-gaps)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import trio

from bigfleet_trio.kube.errors import NotFound
from bigfleet_trio.kube.resources import AVAILABLE_CAPACITIES, EVENTS
from bigfleet_trio.operator.available import (
    AvailableCapacityHandler,
    availability_for_confidence,
    available_capacity_name,
    cost_quantity,
    requirements_to_spec,
    spec_from_update,
)
from bigfleet_trio.operator.kubeevents import EventRecorder
from bigfleet_trio.proto import pb
from tests.support.kube import RecordingKube

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
    # no price sent (proto3 0): cost left unset, not shown as free (docs/crds.md)
    assert spec_from_update(pb.AvailableCapacityUpdate(supersedes_key="k")) == {
        "availability": "None",
        "availableCount": 0,
        "resources": {},
    }
    assert "cost" not in spec_from_update(acu(cost_per_hour=float("nan")))


def _writes(kube: RecordingKube) -> list[tuple[str, Any]]:
    """``(op, body)`` of the writes since the last call."""
    return [(op, body) for op, _name, body in kube.writes()]


async def test_create_then_patch_changed_fields(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    kube = RecordingKube.over_sim(nursery)
    h = AvailableCapacityHandler(kube)
    await h.on_available_capacity(acu(resources=pb.Resources(resources={"cpu": "2", "gpu": "1"})))
    assert _writes(kube) == [
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
    await h.on_available_capacity(
        acu(
            confidence=Conf.CONFIDENCE_MEDIUM,
            available_count=0,
            resources=pb.Resources(resources={"cpu": "2000m"}),
        )
    )
    ((op, body),) = _writes(kube)  # after our own create: no read, its resourceVersion
    assert (op, body["spec"]) == (
        "patch", {"availability": "Medium", "availableCount": 0, "resources": {"gpu": None}})
    assert set(body["metadata"]) == {"resourceVersion"}
    # same content again: no write
    await h.on_available_capacity(
        acu(
            confidence=Conf.CONFIDENCE_MEDIUM,
            available_count=0,
            resources=pb.Resources(resources={"cpu": "2"}),
        )
    )
    assert _writes(kube) == []


async def test_already_exists_becomes_patch(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    kube = RecordingKube.over_sim(nursery)
    # someone creates it right after our Get: the first Get says NotFound, the object exists
    kube.seed(
        AVAILABLE_CAPACITIES,
        {
            "metadata": {"name": NAME},
            "spec": {"availability": "None", "availableCount": 0, "cost": "0", "resources": {}},
        },
    )
    kube.fail = {"get": [NotFound(404, "NotFound", NAME)]}
    await AvailableCapacityHandler(kube).on_available_capacity(acu())
    assert [c[0] for c in kube.writes()] == ["create", "patch"]
    assert kube.objects(AVAILABLE_CAPACITIES)[NAME]["spec"] == {
        "availability": "High",
        "availableCount": 3,
        "cost": "41600u",
        "resources": {},
    }


async def test_conflict_retried(nursery: trio.Nursery, autojump_clock: trio.abc.Clock) -> None:
    kube = RecordingKube.over_sim(nursery)
    spec = {"availability": "None", "availableCount": 0, "cost": "0", "resources": {}}
    kube.seed(AVAILABLE_CAPACITIES, {"metadata": {"name": NAME}, "spec": spec})
    kube.server.faults.fail_next(code=409, verb="patch", resource="availablecapacities")
    await AvailableCapacityHandler(kube).on_available_capacity(acu())
    assert [c[0] for c in kube.writes()] == ["patch", "patch"]
    assert kube.objects(AVAILABLE_CAPACITIES)[NAME]["spec"]["availability"] == "High"


async def test_invalid_gives_up_without_raising(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    kube = RecordingKube.over_sim(nursery)
    kube.server.faults.fail_next(code=422, verb="create", resource="availablecapacities")
    recorder = EventRecorder(kube)
    await nursery.start(recorder.run)
    await AvailableCapacityHandler(kube, events=recorder).on_available_capacity(acu())
    assert [c[0] for c in kube.writes()] == ["create"]
    assert kube.objects(AVAILABLE_CAPACITIES) == {}
    await recorder.wait_written()  # the refusal on the object it was for
    assert [(e["reason"], e["type"], e["involvedObject"]["name"])
            for e in kube.objects(EVENTS, "default").values()] == [
        ("WriteRefused", "Warning", NAME)]


async def test_empty_supersedes_key_ignored(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    kube = RecordingKube.over_sim(nursery)
    await AvailableCapacityHandler(kube).on_available_capacity(acu(supersedes_key=""))
    assert kube.writes() == []


async def test_apiserver_upsert(nursery: trio.Nursery, autojump_clock: trio.abc.Clock) -> None:
    from bigfleet_trio.kube.client import KubeClient
    from bigfleet_trio.kube.config import KubeConfig
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
    assert ac["spec"] == {  # the price went unknown: the old one is removed, not kept
        "availability": "None",
        "availableCount": 0,
        "resources": {},
    }
    assert len((await client.list(AVAILABLE_CAPACITIES)).items) == 1


async def test_an_offer_without_a_price_is_created_without_cost(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    """The create path with no price (the wire's 0): created, no cost, no error."""
    kube = RecordingKube.over_sim(nursery)
    await AvailableCapacityHandler(kube).on_available_capacity(acu(cost_per_hour=0.0))
    assert [c[0] for c in kube.writes()] == ["create"]
    assert "cost" not in kube.objects(AVAILABLE_CAPACITIES)[NAME]["spec"]


async def test_an_update_after_our_own_write_patches_without_a_read(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    """Each update used to cost a GET before its PATCH, both holding a dispatch slot that
    NodeStateUpdates wait for. After our own write the handler diffs against what that write
    returned and patches with its resourceVersion as a precondition: one request. A write by
    someone else in between makes that PATCH conflict, and the update is planned again from a
    fresh read, so their change is not kept silently (docs/rules.md#availablecapacity)."""
    kube = RecordingKube.over_sim(nursery)
    h = AvailableCapacityHandler(kube)
    await h.on_available_capacity(acu())
    assert [r.op for r in kube.history] == ["get", "create"]
    kube.history.clear()
    kube.writes()

    created_rv = kube.objects(AVAILABLE_CAPACITIES)[NAME]["metadata"]["resourceVersion"]
    await h.on_available_capacity(acu(available_count=5))
    assert [r.op for r in kube.history] == ["patch"]
    (patch,) = [body for _op, _name, body in kube.writes()]
    assert patch == {"metadata": {"resourceVersion": created_rv},
                     "spec": {"availableCount": 5}}

    # someone else edits the spec: our next PATCH conflicts, the retry reads and puts it right
    await kube.client.patch(AVAILABLE_CAPACITIES, NAME, {"spec": {"availability": "Low"}})
    kube.history.clear()
    t0 = trio.current_time()
    await h.on_available_capacity(acu(available_count=6))
    assert [r.op for r in kube.history] == ["patch", "get", "patch"]
    assert trio.current_time() == t0  # read at once, no retry backoff slept holding a slot
    assert kube.objects(AVAILABLE_CAPACITIES)[NAME]["spec"]["availability"] == "High"
    assert kube.objects(AVAILABLE_CAPACITIES)[NAME]["spec"]["availableCount"] == 6


@pytest.mark.parametrize(("count", "ops"), [
    (3, ["get", "create"]),  # equal to our last write: read, so the deleted object comes back
    (9, ["patch", "get", "create"]),  # a change: the precondition patch 404s, then read
])
async def test_an_update_after_a_deletion_by_someone_else_creates_it_again(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock, count: int, ops: list[str]
) -> None:
    kube = RecordingKube.over_sim(nursery)
    h = AvailableCapacityHandler(kube)
    await h.on_available_capacity(acu())
    await kube.client.delete(AVAILABLE_CAPACITIES, NAME)
    kube.history.clear()
    await h.on_available_capacity(acu(available_count=count))
    assert [r.op for r in kube.history] == ops
    assert kube.objects(AVAILABLE_CAPACITIES)[NAME]["spec"]["availableCount"] == count
