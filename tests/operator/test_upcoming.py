"""NodeStateUpdate -> UpcomingNode (docs/rules.md#upcomingnode-phases; known bugs 5, 7, 15).

Bug numbers: docs/reference.md#item-numbers-used-in-test-names.
"""

from __future__ import annotations

import copy
import hashlib
import logging
from datetime import UTC, datetime
from typing import Any
from unittest.mock import ANY

import pytest
import trio
from prometheus_client import REGISTRY

from bigfleet_trio.kube.api import KubeAPI
from bigfleet_trio.kube.errors import (
    KubeTransportError,
    NotFound,
)
from bigfleet_trio.kube.mergepatch import merge_diff
from bigfleet_trio.kube.resources import EVENTS, UPCOMING_NODES
from bigfleet_trio.kube.retry import RECONCILE_RETRIABLE
from bigfleet_trio.operator.kubeevents import EventRecorder
from bigfleet_trio.operator.upcoming.handler import UpcomingNodeHandler
from bigfleet_trio.operator.upcoming.plan import (
    DELETE,
    DrainMemory,
    phase_for_state,
    plan_node_state_update,
    spec_equal,
    spec_from_update,
    upcoming_node_name,
)
from bigfleet_trio.proto import pb
from tests.support.kube import RecordingKube
from tests.support.reconcile import until_reconciled

MS = pb.MachineState
NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
NOW_S = "2026-03-01T12:00:00Z"


def nsu(state: int, machine_id: str = "m-1", **kw: Any) -> pb.NodeStateUpdate:
    return pb.NodeStateUpdate(
        supersedes_key=f"node:{machine_id}", machine_id=machine_id, state=state, **kw
    )


def obj(
    phase: str | None = None, spec: dict[str, Any] | None = None, **status: Any
) -> dict[str, Any]:
    o: dict[str, Any] = {"metadata": {"name": "un-m-1"}, "spec": spec or {"resources": {}}}
    if phase is not None:
        o["status"] = {"phase": phase, "provisioningStartTime": "2026-01-01T00:00:00Z", **status}
    return o


# --------------------------------------------------------------------------- pure


@pytest.mark.parametrize(
    ("state", "phase"),
    [
        (MS.SPECULATIVE, "Provisioning"),
        (MS.CREATING, "Provisioning"),
        (MS.IDLE, "Launched"),
        (MS.CONFIGURING, "Registered"),
        (MS.CONFIGURED, "Ready"),
        (MS.DRAINING, "Draining"),
        (MS.DELETING, DELETE),
        (MS.FAILED, "Failed"),
        (MS.UNSPECIFIED, None),
        (42, None),
    ],
)
def test_phase_table(state: int, phase: str | None) -> None:
    assert phase_for_state(state) == phase


def test_name_valid_is_verbatim() -> None:
    assert upcoming_node_name("m-000123") == "un-m-000123"
    assert upcoming_node_name("i-0abc.zone-a") == "un-i-0abc.zone-a"


def test_name_sanitised_with_hash_suffix() -> None:
    h = hashlib.sha256(b"Pool/M_7").hexdigest()[:8]
    assert upcoming_node_name("Pool/M_7") == f"un-pool-m-7-{h}"
    # two IDs that sanitise alike still differ
    assert upcoming_node_name("pool/m_7") != upcoming_node_name("Pool/M_7")


def test_name_trailing_junk_stripped() -> None:
    h = hashlib.sha256(b"abc_").hexdigest()[:8]
    assert upcoming_node_name("abc_") == f"un-abc-{h}"


def test_name_too_long_is_truncated() -> None:
    mid = "a" * 300
    name = upcoming_node_name(mid)
    assert name is not None
    assert len(name) == 253
    assert name.endswith("-" + hashlib.sha256(mid.encode()).hexdigest()[:8])


@pytest.mark.parametrize("mid", ["", "___", "//"])
def test_name_rejected(mid: str) -> None:
    assert upcoming_node_name(mid) is None


def test_spec_from_update() -> None:
    u = nsu(
        MS.IDLE,
        labels={"zone": "a"},
        resources=pb.Resources(resources={"memory": "1024Mi", "cpu": "2000m", "bad": "x1"}),
        taints=[pb.Taint(key="k", value="v", effect="NoSchedule")],
    )
    assert spec_from_update(u) == {
        "resources": {"cpu": "2", "memory": "1Gi"},
        "labels": {"zone": "a"},
        "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}],
    }
    assert spec_from_update(nsu(MS.IDLE)) == {"resources": {}}


@pytest.mark.parametrize(
    ("old", "new", "equal"),
    [
        ({"resources": {}}, {"resources": {}}, True),
        (None, {"resources": {}}, True),
        ({"resources": {"memory": "1024Mi"}}, {"resources": {"memory": "1Gi"}}, True),
        ({"resources": {"memory": "1000Mi"}}, {"resources": {"memory": "1Gi"}}, False),
        ({"resources": {"memory": "junk"}}, {"resources": {"memory": "1Gi"}}, False),
        ({"resources": {}, "labels": {"x": ""}}, {"resources": {}, "labels": {"y": ""}}, False),
        ({"resources": {}, "labels": {}}, {"resources": {}}, True),
        (
            {"resources": {}, "taints": [{"key": "a", "effect": "NoSchedule", "timeAdded": "t"}]},
            {"resources": {}, "taints": [{"key": "a", "value": "", "effect": "NoSchedule"}]},
            True,
        ),
        (
            {"resources": {}, "taints": [{"key": "a"}, {"key": "b"}]},
            {"resources": {}, "taints": [{"key": "b"}, {"key": "a"}]},
            False,
        ),
    ],
)
def test_spec_equal(old: dict[str, Any] | None, new: dict[str, Any], equal: bool) -> None:
    assert spec_equal(old, new) is equal


@pytest.mark.parametrize(
    ("old", "new", "patch"),
    [
        ({"a": 1}, {"a": 1}, {}),
        ({"a": 1}, {"a": 2}, {"a": 2}),
        ({"a": 1, "b": 2}, {"a": 1}, {"b": None}),
        ({"m": {"x": "1", "y": "2"}}, {"m": {"x": "1", "z": "3"}}, {"m": {"y": None, "z": "3"}}),
        ({"l": [1, 2]}, {"l": [2]}, {"l": [2]}),
        (None, {"a": {"b": 1}}, {"a": {"b": 1}}),
    ],
)
def test_merge_diff(old: dict[str, Any] | None, new: dict[str, Any], patch: dict[str, Any]) -> None:
    assert merge_diff(old, new) == patch


def test_plan_first_sight_creates_then_full_status() -> None:
    p = plan_node_state_update(nsu(MS.CREATING, provider_id="aws:///i-1"), None, None, NOW)
    assert p.op == "create"
    assert p.name == "un-m-1"
    assert p.spec == {"resources": {}}
    assert p.status_patch == {
        "status": {
            "phase": "Provisioning",
            "providerID": "aws:///i-1",
            "provisioningStartTime": NOW_S,
        }
    }


def test_plan_status_patch_only_changed_fields_and_sticky() -> None:
    existing = obj(
        "Launched", providerID="p-1", nodeRef={"kind": "Node", "name": "n1"}, lastError="e"
    )
    p = plan_node_state_update(nsu(MS.CONFIGURED), existing, None, NOW)
    assert p.op == "update"
    assert p.spec_patch is None
    # empty provider_id / node_name / last_error never clear the stored values
    assert p.status_patch == {"status": {"phase": "Ready"}}


def test_plan_node_ref_from_node_name() -> None:
    existing = obj("Registered")
    p = plan_node_state_update(nsu(MS.CONFIGURED, node_name="ip-10-0-0-1"), existing, None, NOW)
    assert p.status_patch == {
        "status": {"phase": "Ready", "nodeRef": {"kind": "Node", "name": "ip-10-0-0-1"}}
    }


def test_plan_noop_short_circuit() -> None:
    existing = obj("Ready", providerID="p", nodeRef={"kind": "Node", "name": "n", "uid": "u"})
    p = plan_node_state_update(
        nsu(MS.CONFIGURED, provider_id="p", node_name="n"), existing, None, NOW
    )
    assert p.op == "update"
    assert p.spec_patch is None and p.status_patch is None
    assert p.reason == "no-op"


def test_plan_noop_needs_provisioning_start_time() -> None:
    existing = {
        "metadata": {"name": "un-m-1"},
        "spec": {"resources": {}},
        "status": {"phase": "Ready"},
    }
    p = plan_node_state_update(nsu(MS.CONFIGURED), existing, None, NOW)
    assert p.status_patch == {"status": {"provisioningStartTime": NOW_S}}


def test_plan_failed_sets_last_error() -> None:
    p = plan_node_state_update(nsu(MS.FAILED, last_error="quota"), obj("Provisioning"), None, NOW)
    assert p.status_patch == {"status": {"phase": "Failed", "lastError": "quota"}}


def test_plan_spec_patch_changed_fields_only() -> None:
    existing = obj(
        "Launched",
        spec={"resources": {"cpu": "2", "memory": "1024Mi"}, "labels": {"a": "1", "b": "2"}},
    )
    u = nsu(
        MS.IDLE,
        labels={"a": "1", "c": "3"},
        resources=pb.Resources(resources={"cpu": "2", "memory": "1Gi"}),
    )
    p = plan_node_state_update(u, existing, None, NOW)
    assert p.spec_patch == {"spec": {"labels": {"b": None, "c": "3"}}}
    assert p.status_patch is None


def test_plan_spec_unchanged_no_spec_patch() -> None:
    existing = obj("Launched", spec={"resources": {"cpu": "2"}, "labels": {"a": "1"}})
    u = nsu(MS.IDLE, labels={"a": "1"}, resources=pb.Resources(resources={"cpu": "2000m"}))
    assert plan_node_state_update(u, existing, None, NOW).spec_patch is None


def test_plan_labels_removed_entirely() -> None:
    existing = obj("Launched", spec={"resources": {}, "labels": {"a": "1"}})
    p = plan_node_state_update(nsu(MS.IDLE), existing, None, NOW)
    assert p.spec_patch == {"spec": {"labels": None}}


@pytest.mark.parametrize(
    ("stored", "memory", "op", "mem_after"),
    [
        # Draining -> Idle, sequential
        ("Draining", "draining", "delete", "drained"),
        ("Draining", None, "delete", "drained"),
        # Draining+Idle coalesced into one Idle frame after a reclaim-started drain
        ("Ready", "draining", "delete", "drained"),
        # ... and without the reclaim path: Ready -> Idle still means the machine left
        ("Ready", None, "delete", "drained"),
        ("Registered", None, "delete", "drained"),
        # reclaim wrote Drained (object still there) then Idle arrives
        ("Drained", "drained", "delete", "drained"),
        # reclaim wrote Drained and deleted; replayed Idle must not recreate
        (None, "drained", "ignore", "keep"),
        (None, "draining", "ignore", "keep"),
        # plain Idle: Launched
        ("Provisioning", None, "update", "keep"),
        (None, None, "create", "keep"),
        ("Failed", None, "update", "keep"),
    ],
)
def test_drained_inference(stored: str | None, memory: Any, op: str, mem_after: str) -> None:
    existing = obj(stored) if stored is not None else None
    p = plan_node_state_update(nsu(MS.IDLE), existing, memory, NOW)
    assert p.op == op
    assert p.memory == mem_after
    if op in ("delete", "ignore") and (memory or stored not in (None, "Provisioning", "Failed")):
        assert p.phase == "Drained"


@pytest.mark.parametrize(
    ("state", "memory", "mem_after"),
    [
        (MS.DRAINING, None, "draining"),
        (MS.CONFIGURING, "drained", "forget"),
        (MS.CREATING, "draining", "forget"),
        (MS.FAILED, "draining", "keep"),
    ],
)
def test_memory_transitions(state: int, memory: Any, mem_after: str) -> None:
    assert plan_node_state_update(nsu(state), obj("Ready"), memory, NOW).memory == mem_after


def test_plan_deleting_and_unspecified() -> None:
    assert plan_node_state_update(nsu(MS.DELETING), obj("Ready"), None, NOW).op == "delete"
    assert plan_node_state_update(nsu(MS.DELETING), None, None, NOW).op == "ignore"
    p = plan_node_state_update(nsu(MS.UNSPECIFIED), obj("Ready"), None, NOW)
    assert (p.op, p.name) == ("ignore", "un-m-1")


def test_plan_rejects_empty_and_invalid_machine_id() -> None:
    assert plan_node_state_update(nsu(MS.IDLE, machine_id=""), None, None, NOW).op == "ignore"
    assert plan_node_state_update(nsu(MS.IDLE, machine_id="__"), None, None, NOW).op == "ignore"


def test_drain_memory_bounded() -> None:
    m = DrainMemory(capacity=2)
    m.mark_draining("a")
    m.mark_drained("b")
    m.mark_draining("c")
    assert (m.get("a"), m.get("b"), m.get("c"), len(m)) == (None, "drained", "draining", 2)
    m.forget("b")
    assert m.get("b") is None


# --------------------------------------------------------------------------- handler


def _un(kube: RecordingKube) -> dict[str, Any]:
    """The stored ``un-m-1`` (read from the sim apiserver)."""
    return kube.objects(UPCOMING_NODES)["un-m-1"]


def handler(kube: KubeAPI, memory: DrainMemory | None = None) -> UpcomingNodeHandler:
    return UpcomingNodeHandler(kube, memory or DrainMemory(), now=lambda: NOW)


async def test_lifecycle_to_drained_deleted(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    kube = RecordingKube.over_sim(nursery)
    h = handler(kube)
    await h.on_node_state_update(nsu(MS.CREATING, labels={"zone": "a"}))
    assert kube.writes() == [
        (
            "create",
            "un-m-1",
            {
                "apiVersion": "bigfleet.lucy.sh/v1alpha1",
                "kind": "UpcomingNode",
                "metadata": {"name": "un-m-1"},
                "spec": {"resources": {}, "labels": {"zone": "a"}},
            },
        ),
        (
            "patch/status",
            "un-m-1",
            {"status": {"phase": "Provisioning", "provisioningStartTime": NOW_S}},
        ),
    ]
    await h.on_node_state_update(nsu(MS.IDLE, labels={"zone": "a"}, provider_id="p-1"))
    assert kube.writes() == [
        # a phase change carries the resourceVersion it was planned from (a guard)
        ("patch/status", "un-m-1", {"metadata": {"resourceVersion": ANY},
                                    "status": {"phase": "Launched", "providerID": "p-1"}})
    ]
    await h.on_node_state_update(nsu(MS.CONFIGURED, labels={"zone": "a"}, node_name="n-1"))
    assert kube.writes() == [
        (
            "patch/status",
            "un-m-1",
            {"metadata": {"resourceVersion": ANY}, "status": {"phase": "Ready",
                                                 "nodeRef": {"kind": "Node", "name": "n-1"}}},
        )
    ]
    # rebroadcast on reconnect: nothing written
    await h.on_node_state_update(nsu(MS.CONFIGURED, labels={"zone": "a"}))
    assert kube.writes() == []
    assert _un(kube)["status"] == {
        "phase": "Ready",
        "provisioningStartTime": NOW_S,
        "providerID": "p-1",
        "nodeRef": {"kind": "Node", "name": "n-1"},
    }
    await h.on_node_state_update(nsu(MS.DRAINING, labels={"zone": "a"}))
    assert kube.writes() == [
        ("patch/status", "un-m-1", {"metadata": {"resourceVersion": ANY},
                                    "status": {"phase": "Draining"}})
    ]
    assert h.memory.get("un-m-1") == "draining"
    await h.on_node_state_update(nsu(MS.IDLE, labels={"zone": "a"}))
    assert kube.writes() == [("delete", "un-m-1", None)]
    assert kube.objects(UPCOMING_NODES) == {}
    # a replayed Idle does not resurrect the object
    await h.on_node_state_update(nsu(MS.IDLE, labels={"zone": "a"}))
    assert kube.writes() == []
    assert kube.objects(UPCOMING_NODES) == {}


async def test_coalesced_draining_idle_deletes(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    kube = RecordingKube.over_sim(nursery)
    kube.seed(UPCOMING_NODES, obj("Ready"))
    await handler(kube).on_node_state_update(nsu(MS.IDLE))
    assert kube.writes() == [("delete", "un-m-1", None)]


async def test_reclaim_drained_then_idle(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    kube = RecordingKube.over_sim(nursery)
    memory = DrainMemory()
    memory.mark_drained("un-m-1")  # the reclaim path wrote Drained and deleted the object
    await handler(kube, memory).on_node_state_update(nsu(MS.IDLE))
    assert kube.writes() == []
    assert kube.objects(UPCOMING_NODES) == {}


async def test_conflict_and_transient_errors_retried(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    kube = RecordingKube.over_sim(nursery)
    kube.seed(UPCOMING_NODES, obj("Launched"))
    kube.server.faults.fail_next(code=409, verb="patch", resource="upcomingnodes/status")
    kube.server.faults.fail_next(code=503, verb="patch", resource="upcomingnodes/status")
    kube.fail = {"get": [KubeTransportError("reset")]}  # not an HTTP status: the wrapper's hook
    # the conflict re-plans inside the call; each transient failure goes back to the session
    assert await until_reconciled(handler(kube).on_node_state_update, nsu(MS.CONFIGURING)) == 2
    assert _un(kube)["status"]["phase"] == "Registered"
    assert [c[0] for c in kube.writes()] == ["patch/status"] * 3


async def test_permanent_error_gives_up_without_raising(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    kube = RecordingKube.over_sim(nursery)
    kube.seed(UPCOMING_NODES, obj("Launched"))
    kube.server.faults.fail_next(code=422, verb="patch", resource="upcomingnodes/status")
    recorder = EventRecorder(kube)
    await nursery.start(recorder.run)
    h = UpcomingNodeHandler(kube, DrainMemory(), now=lambda: NOW, events=recorder)
    await h.on_node_state_update(nsu(MS.CONFIGURING))
    assert len(kube.writes()) == 1
    assert _un(kube)["status"]["phase"] == "Launched"
    # ... and says so on the object, for `kubectl describe upcomingnode`
    await recorder.wait_written()
    events = kube.objects(EVENTS, "default")
    assert [(e["reason"], e["type"], e["involvedObject"]["kind"], e["involvedObject"]["name"])
            for e in events.values()] == [
        ("WriteRefused", "Warning", "UpcomingNode", _un(kube)["metadata"]["name"])]
    assert "CONFIGURING" in next(iter(events.values()))["message"]


async def test_forbidden_while_the_apiserver_starts_is_retried(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    """kube-apiserver answers 403 until its RBAC authorizer's caches are synced after a
    (re)start: the realkube tier's restart test lost an UpcomingNode's CONFIGURED update to one
    (the shard never resends it). One 403, then the write lands."""
    kube = RecordingKube.over_sim(nursery)
    kube.seed(UPCOMING_NODES, obj("Launched"))
    kube.server.faults.fail_next(code=403, verb="patch", resource="upcomingnodes/status")
    assert await until_reconciled(handler(kube).on_node_state_update, nsu(MS.CONFIGURING)) == 1
    assert [c[0] for c in kube.writes()] == ["patch/status"] * 2
    assert _un(kube)["status"]["phase"] == "Registered"


@pytest.mark.parametrize("code", [403, 500])
async def test_a_failure_that_lasts_is_raised_to_the_session_never_given_up(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock, code: int
) -> None:
    """A grant missing or a server down: each call writes once and raises for the session to
    retry with backoff (no nested retry budget), and the write lands once the server answers."""
    kube = RecordingKube.over_sim(nursery)
    kube.seed(UPCOMING_NODES, obj("Launched"))
    kube.server.faults.fail_next(20, code=code, verb="patch", resource="upcomingnodes/status")
    h = handler(kube)
    with pytest.raises(RECONCILE_RETRIABLE):
        await h.on_node_state_update(nsu(MS.CONFIGURING))
    assert len(kube.writes()) in (1, 5)  # a 5xx is the client's to repeat (5 tries)
    assert _un(kube)["status"]["phase"] == "Launched"
    assert await until_reconciled(h.on_node_state_update, nsu(MS.CONFIGURING)) >= 3
    assert _un(kube)["status"]["phase"] == "Registered"


async def test_concurrent_create_replans(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    kube = RecordingKube.over_sim(nursery)
    # someone creates it right after our Get: the first Get says NotFound, the object exists
    kube.seed(UPCOMING_NODES, obj("Provisioning"))
    kube.fail = {"get": [NotFound(404, "NotFound", "un-m-1")]}
    await handler(kube).on_node_state_update(nsu(MS.IDLE))
    assert [c[0] for c in kube.writes()] == ["create", "patch/status"]
    assert _un(kube)["status"]["phase"] == "Launched"


async def test_unspecified_writes_nothing_and_deleting_deletes(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    kube = RecordingKube.over_sim(nursery)
    kube.seed(UPCOMING_NODES, obj("Ready"))
    h = handler(kube)
    await h.on_node_state_update(nsu(MS.UNSPECIFIED))
    assert kube.writes() == []
    await h.on_node_state_update(nsu(MS.DELETING))
    assert kube.writes() == [("delete", "un-m-1", None)]
    await h.on_node_state_update(nsu(MS.DELETING))
    assert kube.writes() == []


def _upcoming_lines(caplog: pytest.LogCaptureFixture, word: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "bigfleet_trio.operator.upcoming" and word in r.getMessage()
    ]


async def test_invalid_machine_id_sanitised_and_logged_once_per_update(
    caplog: pytest.LogCaptureFixture, nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    caplog.set_level(logging.INFO, logger="bigfleet_trio.operator.upcoming")
    kube = RecordingKube.over_sim(nursery)
    h = handler(kube)
    # "Pool/M_7": upper case, "/" and "_" are not allowed in an object name
    name = "un-pool-m-7-" + hashlib.sha256(b"Pool/M_7").hexdigest()[:8]
    await h.on_node_state_update(nsu(MS.CREATING, machine_id="Pool/M_7"))
    assert [w[:2] for w in kube.writes()] == [("create", name), ("patch/status", name)]
    [rec] = _upcoming_lines(caplog, "sanitised")
    assert rec.levelno == logging.INFO
    assert rec.getMessage() == f"upcoming: machine_id sanitised machine_id='Pool/M_7' name={name}"
    # the next update for that machine is a new decision: one more line, same object
    await h.on_node_state_update(nsu(MS.IDLE, machine_id="Pool/M_7"))
    assert [w[:2] for w in kube.writes()] == [("patch/status", name)]
    assert len(_upcoming_lines(caplog, "sanitised")) == 2
    # a valid machine id is used verbatim, silently
    await h.on_node_state_update(nsu(MS.CREATING, machine_id="m-2"))
    assert len(_upcoming_lines(caplog, "sanitised")) == 2


async def test_unusable_machine_id_rejected_and_logged(
    caplog: pytest.LogCaptureFixture, nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    caplog.set_level(logging.INFO, logger="bigfleet_trio.operator.upcoming")
    kube = RecordingKube.over_sim(nursery)
    await handler(kube).on_node_state_update(nsu(MS.CREATING, machine_id="_/_"))
    assert kube.writes() == []
    assert kube.objects(UPCOMING_NODES) == {}
    [rec] = _upcoming_lines(caplog, "rejected")
    assert rec.levelno == logging.WARNING
    assert rec.getMessage() == (
        "upcoming: machine_id has no usable character, rejected machine_id='_/_'"
    )
    [ignored] = _upcoming_lines(caplog, "ignored")
    assert "machine_id='_/_'" in ignored.getMessage()
    assert "reason=invalid machine_id" in ignored.getMessage()


_WRITE_KEYS = [
    (op, outcome)
    for op in ("create", "spec_update", "status_update", "delete")
    for outcome in ("success", "conflict", "error", "noop")
]
_PHASES = ["Provisioning", "Launched", "Registered", "Ready", "Draining", "Failed", "Deleting"]


def _metric_snapshot() -> dict[str, float]:
    out: dict[str, float] = {}
    for op, outcome in _WRITE_KEYS:
        out[f"{op}/{outcome}"] = (
            REGISTRY.get_sample_value(
                "bigfleet_operator_upcoming_node_writes_total", {"op": op, "outcome": outcome}
            )
            or 0.0
        )
    for phase in _PHASES:
        out[phase] = (
            REGISTRY.get_sample_value(
                "bigfleet_operator_node_state_update_duration_seconds_count", {"phase": phase}
            )
            or 0.0
        )
    return out


def _metric_delta(before: dict[str, float]) -> dict[str, float]:
    after = _metric_snapshot()
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


async def test_metrics_writes_and_duration(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    # docs/reference.md#metric-names: writes_total{op,outcome} per apiserver write attempt
    # (conflict = AlreadyExists or Conflict), status_update/noop when nothing changed; the duration
    # histogram once per update, labelled with the phase before Drained inference.
    before = _metric_snapshot()
    kube = RecordingKube.over_sim(nursery)
    h = handler(kube)
    await h.on_node_state_update(nsu(MS.CREATING, labels={"zone": "a"}))  # create + status
    await h.on_node_state_update(nsu(MS.CREATING, labels={"zone": "a"}))  # no-op
    kube.server.faults.fail_next(code=409, verb="patch", resource="upcomingnodes")
    # spec patch conflicts, retried: spec + status written
    await h.on_node_state_update(nsu(MS.CONFIGURING, labels={"zone": "b"}))
    await h.on_node_state_update(nsu(MS.IDLE, labels={"zone": "b"}))  # left the cluster: delete
    assert kube.objects(UPCOMING_NODES) == {}
    kube.seed(UPCOMING_NODES, obj("Ready"))
    kube.server.faults.fail_next(code=422, verb="delete", resource="upcomingnodes")
    await h.on_node_state_update(nsu(MS.DELETING))  # delete refused (permanent)
    assert _metric_delta(before) == {
        "create/success": 1,
        "status_update/success": 2,
        "status_update/noop": 1,
        "spec_update/conflict": 1,
        "spec_update/success": 1,
        "delete/success": 1,
        "delete/error": 1,
        "Provisioning": 2,
        "Registered": 1,
        "Launched": 1,
        "Deleting": 1,
    }


async def test_metrics_create_conflict(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    before = _metric_snapshot()
    kube = RecordingKube.over_sim(nursery)
    # someone creates it right after our Get: the first Get says NotFound, the object exists
    kube.seed(UPCOMING_NODES, obj("Provisioning"))
    kube.fail = {"get": [NotFound(404, "NotFound", "un-m-1")]}
    await handler(kube).on_node_state_update(nsu(MS.IDLE))
    assert _metric_delta(before) == {
        "create/conflict": 1,
        "status_update/success": 1,
        "Launched": 1,
    }


async def test_spec_refresh_written_once(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    kube = RecordingKube.over_sim(nursery)
    spec = {"resources": {"cpu": "2"}, "labels": {"a": "1"}}
    kube.seed(UPCOMING_NODES, obj("Launched", spec=spec))
    h = handler(kube)
    u = nsu(MS.IDLE, labels={"a": "2"}, resources=pb.Resources(resources={"cpu": "2"}))
    await h.on_node_state_update(u)
    assert kube.writes() == [("patch", "un-m-1", {"spec": {"labels": {"a": "2"}}})]
    await h.on_node_state_update(u)
    assert kube.writes() == []


# --------------------------------------------------------------------------- on the test apiserver


async def test_apiserver_sequence_coalesced_drain_deletes(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    from bigfleet_trio.kube.client import KubeClient
    from bigfleet_trio.kube.config import KubeConfig
    from bigfleet_trio.sim.apiserver import ApiServer
    from bigfleet_trio.sim.apiserver.testing import InProcessTransport

    server = ApiServer()
    client = KubeClient(
        KubeConfig(server="http://apiserver"), transport=InProcessTransport(server.app, nursery)
    )
    h = UpcomingNodeHandler(client, DrainMemory(), now=lambda: NOW)
    res = pb.Resources(resources={"cpu": "4000m", "memory": "16384Mi"})
    await h.on_node_state_update(nsu(MS.CREATING, labels={"zone": "a"}, resources=res))
    un = await client.get(UPCOMING_NODES, "un-m-1")
    assert un["spec"] == {"resources": {"cpu": "4", "memory": "16Gi"}, "labels": {"zone": "a"}}
    assert un["status"] == {"phase": "Provisioning", "provisioningStartTime": NOW_S}
    await h.on_node_state_update(nsu(MS.IDLE, provider_id="aws:///i-1", labels={"zone": "a"}))
    await h.on_node_state_update(nsu(MS.CONFIGURED, node_name="ip-1", labels={"zone": "a"}))
    un = await client.get(UPCOMING_NODES, "un-m-1")
    assert un["status"] == {
        "phase": "Ready",
        "provisioningStartTime": NOW_S,
        "providerID": "aws:///i-1",
        "nodeRef": {"kind": "Node", "name": "ip-1"},
    }
    assert un["spec"]["resources"] == {}  # the IDLE frame carried no resources
    rv = un["metadata"]["resourceVersion"]
    await h.on_node_state_update(nsu(MS.CONFIGURED, labels={"zone": "a"}))  # rebroadcast
    assert (await client.get(UPCOMING_NODES, "un-m-1"))["metadata"]["resourceVersion"] == rv
    # DRAINING then IDLE coalesced into one IDLE frame: the object is deleted
    await h.on_node_state_update(nsu(MS.IDLE, labels={"zone": "a"}))
    with pytest.raises(NotFound):
        await client.get(UPCOMING_NODES, "un-m-1")
    await h.on_node_state_update(nsu(MS.IDLE, labels={"zone": "a"}))  # replay after reconnect
    with pytest.raises(NotFound):
        await client.get(UPCOMING_NODES, "un-m-1")


# --------------------------------------------------------------------------- cached lookup
#
# With ``get_cached`` (the UpcomingNode informer's store) the handler plans from the cache plus
# its own per-machine "last write" overlay (whichever has the larger resourceVersion), so a
# frame costs one status PATCH instead of GET + PATCH. Counted with the apiserver's counters.

_UN_KEYS = [
    (verb, res)
    for verb in ("get", "create", "patch", "delete")
    for res in ("upcomingnodes", "upcomingnodes/status")
]


def _un_requests(server: Any) -> dict[tuple[str, str], int]:
    """Non-zero get/create/patch/delete counters on upcomingnodes (informer list/watch left out)."""
    return {k: server.counters[k] for k in _UN_KEYS if server.counters[k]}


def _apiserver(nursery: trio.Nursery) -> tuple[Any, Any]:
    from bigfleet_trio.kube.client import KubeClient
    from bigfleet_trio.kube.config import KubeConfig
    from bigfleet_trio.sim.apiserver import ApiServer
    from bigfleet_trio.sim.apiserver.testing import InProcessTransport

    server = ApiServer()
    client = KubeClient(
        KubeConfig(server="http://apiserver"), transport=InProcessTransport(server.app, nursery)
    )
    return server, client


def _seed(server: Any, phase: str, **status: Any) -> dict[str, Any]:
    """Store ``un-m-1`` with ``phase`` in-process (no counters); returns the stored object."""
    res = server.find("upcomingnodes")
    server.create(
        res,
        None,
        {
            "apiVersion": "bigfleet.lucy.sh/v1alpha1",
            "kind": "UpcomingNode",
            "metadata": {"name": "un-m-1"},
            "spec": {"resources": {}},
        },
    )
    server.patch(
        res,
        None,
        "un-m-1",
        {"status": {"phase": phase, "provisioningStartTime": "2026-01-01T00:00:00Z", **status}},
        "application/merge-patch+json",
        subresource="status",
    )
    return copy.deepcopy(server.get(res, None, "un-m-1"))


def _stored(server: Any) -> dict[str, Any] | None:
    try:
        return server.get(server.find("upcomingnodes"), None, "un-m-1")
    except Exception:
        return None


def _rv(o: dict[str, Any]) -> str:
    return str(o["metadata"]["resourceVersion"])


def test_choose_view_by_resource_version() -> None:
    from bigfleet_trio.operator.upcoming.handler import LastWrite, choose_view

    def o(rv: str | None, phase: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": "un-m-1"}
        if rv is not None:
            meta["resourceVersion"] = rv
        return {"metadata": meta, "status": {"phase": phase}}

    ours = o("10", "Registered")
    # no write of ours: the cache as is
    assert choose_view(o("3", "Ready"), None) == (o("3", "Ready"), False)
    assert choose_view(None, None) == (None, False)
    # the cache lags our write (older rv, or not yet created there): our write wins, kept
    assert choose_view(o("9", "Launched"), LastWrite.of(ours)) == (ours, True)
    assert choose_view(None, LastWrite.of(ours)) == (ours, True)
    # the cache caught up (same rv) or someone wrote after us (larger rv): cache, overlay dropped
    assert choose_view(o("10", "Registered"), LastWrite.of(ours)) == (o("10", "Registered"), False)
    assert choose_view(o("11", "Ready"), LastWrite.of(ours)) == (o("11", "Ready"), False)
    # rv not an integer (never on a real apiserver): our write wins
    assert choose_view(o("x", "Ready"), LastWrite.of(o(None, "Failed"))) == (
        o(None, "Failed"),
        True,
    )
    # we deleted it at rv 10: a cached copy up to rv 10 is the stale pre-delete object
    gone = LastWrite.deleted("10")
    assert choose_view(o("10", "Draining"), gone) == (None, True)
    assert choose_view(o("7", "Draining"), gone) == (None, True)
    # ... the cache saw the delete: tombstone dropped; a larger rv is a new object
    assert choose_view(None, gone) == (None, False)
    assert choose_view(o("12", "Provisioning"), gone) == (o("12", "Provisioning"), False)


def test_settled_by_event() -> None:
    from bigfleet_trio.operator.upcoming.handler import LastWrite, settled_by_event

    def o(rv: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": "un-m-1"}
        if rv is not None:
            meta["resourceVersion"] = rv
        return {"metadata": meta}

    ours = LastWrite.of(o("10"))
    # the watch delivers our write, or a later one: the cache holds it now
    assert settled_by_event(ours, o("10"), deleted=False)
    assert settled_by_event(ours, o("11"), deleted=False)
    # an event from before our write: the cache still lags it
    assert not settled_by_event(ours, o("9"), deleted=False)
    # deleted at or after our write: the cache's "gone" is the truth
    assert settled_by_event(ours, o("12"), deleted=True)
    # a deletion from before our write (a former life), or a relist's synthesized delete of
    # what the cache last saw: our write is still the fresher view
    assert not settled_by_event(ours, o("9"), deleted=True)
    # our tombstone (the object we deleted was at rv 10; its deletion is rv 11 or later)
    gone = LastWrite.deleted("10")
    assert settled_by_event(gone, o("11"), deleted=True)
    assert not settled_by_event(gone, o("10"), deleted=False)  # the stale pre-delete copy
    assert settled_by_event(gone, o("12"), deleted=False)  # a new life, newer than our delete
    # no integer resourceVersion on either side: kept (choose_view keeps ours)
    assert not settled_by_event(LastWrite.of(o(None)), o("12"), deleted=False)
    assert not settled_by_event(ours, o("x"), deleted=True)


async def test_overlay_entries_dropped_once_the_informer_sees_the_writes(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    # the overlay only bridges the watch's lag: an entry left behind for every machine ever
    # written (until the next frame for that machine) grew the operator without bound
    from bigfleet_trio.kube.informer import Informer, drop_managed_fields

    server, client = _apiserver(nursery)
    inf = Informer(client, UPCOMING_NODES, transform=drop_managed_fields)
    h = UpcomingNodeHandler(client, DrainMemory(), now=lambda: NOW, get_cached=inf.store.get)
    h.attach(inf)
    await nursery.start(inf.run)
    await inf.wait_synced()
    machines = [f"m-{i}" for i in range(20)]
    for m in machines:
        await h.on_node_state_update(nsu(MS.CREATING, machine_id=m))
        await h.on_node_state_update(nsu(MS.IDLE, machine_id=m))
    await trio.sleep(1)
    assert len(inf.store) == len(machines)
    assert h.overlay_entries == 0
    # our deletes leave tombstones, dropped as the watch delivers each deletion
    for m in machines:
        await h.on_node_state_update(nsu(MS.DELETING, machine_id=m))
    await trio.sleep(1)
    assert len(inf.store) == 0
    assert h.overlay_entries == 0


async def test_requests_per_frame_without_lookup_get_and_patch(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    # the baseline: a live GET and a status PATCH per frame (2 requests)
    server, client = _apiserver(nursery)
    _seed(server, "Launched")
    h = UpcomingNodeHandler(client, DrainMemory(), now=lambda: NOW)
    await h.on_node_state_update(nsu(MS.CONFIGURING))
    await h.on_node_state_update(nsu(MS.CONFIGURED, node_name="n-1"))
    assert _un_requests(server) == {
        ("get", "upcomingnodes"): 2,
        ("patch", "upcomingnodes/status"): 2,
    }


async def test_informer_lookup_configuring_configured_two_patches_no_gets(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    from bigfleet_trio.kube.informer import Informer

    server, client = _apiserver(nursery)
    _seed(server, "Launched", providerID="p-1")
    inf = Informer(client, UPCOMING_NODES)
    await nursery.start(inf.run)
    await inf.wait_synced()
    assert inf.store.get("un-m-1") is not None
    server.counters.reset()
    h = UpcomingNodeHandler(client, DrainMemory(), now=lambda: NOW, get_cached=inf.store.get)
    await h.on_node_state_update(nsu(MS.CONFIGURING))
    await h.on_node_state_update(nsu(MS.CONFIGURED, node_name="n-1"))
    # one request per frame
    assert _un_requests(server) == {("patch", "upcomingnodes/status"): 2}
    assert _stored(server)["status"] == {  # type: ignore[index]
        "phase": "Ready",
        "provisioningStartTime": "2026-01-01T00:00:00Z",
        "providerID": "p-1",
        "nodeRef": {"kind": "Node", "name": "n-1"},
    }
    # rebroadcast after the cache caught up: nothing at all
    await trio.sleep(1)
    assert inf.store.get("un-m-1")["status"]["phase"] == "Ready"  # type: ignore[index]
    server.counters.reset()
    await h.on_node_state_update(nsu(MS.CONFIGURED))
    assert _un_requests(server) == {}


async def test_lagging_cache_right_patches_and_no_spurious_noop(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    server, client = _apiserver(nursery)
    launched = _seed(server, "Launched")
    cache = {"un-m-1": launched}  # never catches up: always the pre-write object
    h = UpcomingNodeHandler(client, DrainMemory(), now=lambda: NOW, get_cached=cache.get)
    server.counters.reset()
    await h.on_node_state_update(nsu(MS.CONFIGURING))
    await h.on_node_state_update(nsu(MS.CONFIGURED, node_name="n-1"))
    await h.on_node_state_update(nsu(MS.CONFIGURED, node_name="n-1"))  # rebroadcast: no-op
    assert _un_requests(server) == {("patch", "upcomingnodes/status"): 2}
    assert _stored(server)["status"]["phase"] == "Ready"  # type: ignore[index]
    assert _stored(server)["status"]["nodeRef"] == {"kind": "Node", "name": "n-1"}  # type: ignore[index]


async def test_lagging_cache_idle_after_registered_is_drained_not_noop(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    # the cache still says Launched; planning from it would make IDLE a no-op (and miss the
    # Drained inference). Our overlay says Registered: IDLE means the machine left -> delete.
    server, client = _apiserver(nursery)
    cache = {"un-m-1": _seed(server, "Launched")}
    h = UpcomingNodeHandler(client, DrainMemory(), now=lambda: NOW, get_cached=cache.get)
    server.counters.reset()
    await h.on_node_state_update(nsu(MS.CONFIGURING))
    await h.on_node_state_update(nsu(MS.IDLE))
    assert _un_requests(server) == {
        ("patch", "upcomingnodes/status"): 1,
        ("delete", "upcomingnodes"): 1,
    }
    assert _stored(server) is None
    assert h.memory.get("un-m-1") == "drained"


async def test_cache_newer_than_our_write_wins(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    # we wrote Registered; then another writer set Ready (larger rv) and the cache has it:
    # a CONFIGURED frame is a no-op, as it would be with a live GET.
    server, client = _apiserver(nursery)
    cache = {"un-m-1": _seed(server, "Launched")}
    h = UpcomingNodeHandler(client, DrainMemory(), now=lambda: NOW, get_cached=cache.get)
    await h.on_node_state_update(nsu(MS.CONFIGURING))
    server.patch(
        server.find("upcomingnodes"),
        None,
        "un-m-1",
        {"status": {"phase": "Ready"}},
        "application/merge-patch+json",
        subresource="status",
    )
    cache["un-m-1"] = copy.deepcopy(_stored(server))  # type: ignore[arg-type]
    server.counters.reset()
    await h.on_node_state_update(nsu(MS.CONFIGURED))
    assert _un_requests(server) == {}


async def test_cached_already_exists_on_create_recovers_with_live_get(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    server, client = _apiserver(nursery)
    _seed(server, "Launched", providerID="p-1")
    cache: dict[str, dict[str, Any]] = {}  # the cache has not seen the object yet
    h = UpcomingNodeHandler(client, DrainMemory(), now=lambda: NOW, get_cached=cache.get)
    server.counters.reset()
    await h.on_node_state_update(nsu(MS.CONFIGURING))
    assert _un_requests(server) == {
        ("create", "upcomingnodes"): 1,
        ("get", "upcomingnodes"): 1,
        ("patch", "upcomingnodes/status"): 1,
    }
    # re-planned from the live object: sticky fields and the start time are kept
    assert _stored(server)["status"] == {  # type: ignore[index]
        "phase": "Registered",
        "provisioningStartTime": "2026-01-01T00:00:00Z",
        "providerID": "p-1",
    }
    # and the next frame plans from what we wrote: one patch
    server.counters.reset()
    await h.on_node_state_update(nsu(MS.CONFIGURED))
    assert _un_requests(server) == {("patch", "upcomingnodes/status"): 1}
    assert _stored(server)["status"]["phase"] == "Ready"  # type: ignore[index]


async def test_cached_not_found_on_patch_recovers_with_live_get(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    server, client = _apiserver(nursery)
    stale = _seed(server, "Registered")
    server.delete(server.find("upcomingnodes"), None, "un-m-1")
    cache = {"un-m-1": stale}  # the cache has not seen the delete
    h = UpcomingNodeHandler(client, DrainMemory(), now=lambda: NOW, get_cached=cache.get)
    server.counters.reset()
    await h.on_node_state_update(nsu(MS.CONFIGURED))
    assert _un_requests(server) == {
        ("patch", "upcomingnodes/status"): 2,  # 404, then the write after the create
        ("get", "upcomingnodes"): 1,
        ("create", "upcomingnodes"): 1,
    }
    assert _stored(server)["status"] == {  # type: ignore[index]
        "phase": "Ready",
        "provisioningStartTime": NOW_S,
    }


async def test_cached_noop_rebroadcast_writes_nothing(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    server, client = _apiserver(nursery)
    cache = {
        "un-m-1": _seed(server, "Ready", providerID="p", nodeRef={"kind": "Node", "name": "n"})
    }
    h = UpcomingNodeHandler(client, DrainMemory(), now=lambda: NOW, get_cached=cache.get)
    server.counters.reset()
    before = _metric_snapshot()
    for _ in range(3):
        await h.on_node_state_update(nsu(MS.CONFIGURED, provider_id="p", node_name="n"))
    assert _un_requests(server) == {}
    assert _metric_delta(before) == {"status_update/noop": 3, "Ready": 3}


async def test_cached_drained_delete_and_stale_cache_after_delete(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    server, client = _apiserver(nursery)
    cache = {"un-m-1": _seed(server, "Draining")}
    h = UpcomingNodeHandler(client, DrainMemory(), now=lambda: NOW, get_cached=cache.get)
    server.counters.reset()
    await h.on_node_state_update(nsu(MS.IDLE))  # Draining -> Idle: Drained, deleted
    assert _un_requests(server) == {("delete", "upcomingnodes"): 1}
    assert _stored(server) is None
    assert h.memory.get("un-m-1") == "drained"
    # the cache still shows the deleted object: a replayed Idle neither writes nor recreates
    server.counters.reset()
    await h.on_node_state_update(nsu(MS.IDLE))
    assert _un_requests(server) == {}
    # a new life while the cache is still stale: created directly (no 404 round trip)
    await h.on_node_state_update(nsu(MS.CREATING))
    assert _un_requests(server) == {
        ("create", "upcomingnodes"): 1,
        ("patch", "upcomingnodes/status"): 1,
    }
    assert _stored(server)["status"] == {  # type: ignore[index]
        "phase": "Provisioning",
        "provisioningStartTime": NOW_S,
    }


async def test_cached_deleting_deletes(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    server, client = _apiserver(nursery)
    cache = {"un-m-1": _seed(server, "Ready")}
    h = UpcomingNodeHandler(client, DrainMemory(), now=lambda: NOW, get_cached=cache.get)
    server.counters.reset()
    await h.on_node_state_update(nsu(MS.DELETING))
    await h.on_node_state_update(nsu(MS.DELETING))  # stale cache: nothing more
    assert _un_requests(server) == {("delete", "upcomingnodes"): 1}
    assert _stored(server) is None
