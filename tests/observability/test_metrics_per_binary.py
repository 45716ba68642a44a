"""Each binary's /metrics carries its own families plus the shared process ones, never the other
binary's (an alert on the operator's session_up must not fire on the pod controller)."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

import bigfleet_trio.operator.app  # noqa: F401  (registers every operator metric)
import bigfleet_trio.podcontroller.app  # noqa: F401  (registers the pod controller's)
from bigfleet_trio.observability.metrics import BinaryRegistry, owner_of

SHARED = [
    "bigfleet_build_info",  # both binaries: which build runs (docs/reference.md#exit-codes)
    "bigfleet_gc_frozen_objects",  # both: the heap freeze (docs/kube-api.md#garbage-collector)
    "bigfleet_kube_client_connections_opened",
    "process_cpu_seconds",
    "process_max_fds",
    "process_open_fds",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
    "process_virtual_memory_bytes",
    "python_gc_collections",
    "python_gc_objects_collected",
    "python_gc_objects_uncollectable",
    "python_info",
]

OPERATOR = [
    "bigfleet_operator_acknowledge_duration_seconds",
    "bigfleet_operator_acknowledged",
    "bigfleet_operator_bootstrap_answers_expired",
    "bigfleet_operator_bootstrap_render_failures",
    "bigfleet_operator_capacityrequests_excluded",
    "bigfleet_operator_capacityrequests_excluded_current",
    "bigfleet_operator_capacityrequests_outcome",
    "bigfleet_operator_coalesced_frames",
    "bigfleet_operator_dispatch_inflight",
    "bigfleet_operator_drains",
    "bigfleet_operator_drains_active",
    "bigfleet_operator_evictions",
    "bigfleet_operator_frames",
    "bigfleet_operator_handler_errors",
    "bigfleet_operator_kube_events",
    "bigfleet_operator_malformed_frames",
    "bigfleet_operator_node_state_queue_seconds",
    "bigfleet_operator_node_state_update_duration_seconds",
    "bigfleet_operator_node_state_worker_wait_seconds",
    "bigfleet_operator_outbox_dropped",
    "bigfleet_operator_outcome_writes",
    "bigfleet_operator_reclaim_instruction_ids_reused",
    "bigfleet_operator_reconcile_failing_oldest_seconds",
    "bigfleet_operator_reconcile_permanent_errors",
    "bigfleet_operator_reconcile_retries",
    "bigfleet_operator_rollup_capacityrequests",
    "bigfleet_operator_rollup_consistency_mismatches",
    "bigfleet_operator_rollup_duration_seconds",
    "bigfleet_operator_rollup_errors",
    "bigfleet_operator_rollup_needs",
    "bigfleet_operator_rollup_phase_duration_seconds",
    "bigfleet_operator_session_closes",
    "bigfleet_operator_session_reconnects",
    "bigfleet_operator_session_up",
    "bigfleet_operator_unknown_enum_values",
    "bigfleet_operator_upcoming_node_writes",
]

POD_CONTROLLER = [
    "bigfleet_unschedulable_pod_controller_reconciles",
    "bigfleet_unschedulable_pod_controller_zone_pins",
]

STANDARD = [  # client-go's and controller-runtime's names, in both binaries
    "controller_runtime_reconcile",
    "controller_runtime_reconcile_errors",
    "controller_runtime_reconcile_time_seconds",
    "leader_election_master_status",
    "rest_client_request_duration_seconds",
    "rest_client_requests",
    "workqueue_adds",
    "workqueue_depth",
    "workqueue_longest_running_processor_seconds",
    "workqueue_queue_duration_seconds",
    "workqueue_retries",
    "workqueue_unfinished_work_seconds",
    "workqueue_work_duration_seconds",
]


def _own(binary: str) -> list[str]:
    return [f for f in BinaryRegistry(binary).families() if owner_of(f) is not None]


def test_operator_families() -> None:
    assert _own("operator") == OPERATOR, "new operator metric? add it to OPERATOR here"
    assert set(SHARED + STANDARD) <= set(BinaryRegistry("operator").families())


def test_pod_controller_families() -> None:
    assert _own("pod-controller") == POD_CONTROLLER
    text = generate_latest(BinaryRegistry("pod-controller")).decode()
    assert "bigfleet_operator_session_up" not in text
    assert "bigfleet_unschedulable_pod_controller_reconciles_total" in text
    assert set(SHARED + STANDARD) <= set(BinaryRegistry("pod-controller").families())


def test_restricted_query_stays_within_the_binary() -> None:
    """``/metrics?name[]=…`` (prometheus_client's restricted registry) cannot reach across."""
    reg = BinaryRegistry("pod-controller").restricted_registry(
        ["bigfleet_operator_session_up", "bigfleet_unschedulable_pod_controller_reconciles_total"]
    )
    assert [f.name for f in reg.collect()] == ["bigfleet_unschedulable_pod_controller_reconciles"]


def test_everything_for_the_demo_and_unknown_binary_refused() -> None:
    assert set(OPERATOR + POD_CONTROLLER) <= set(BinaryRegistry(None).families())
    with pytest.raises(ValueError, match="unknown binary"):
        BinaryRegistry("shard")


def test_frozen_objects_gauge_reads_the_permanent_generation() -> None:
    import gc

    def frozen() -> float:
        text = generate_latest(BinaryRegistry("pod-controller")).decode()
        line = next(x for x in text.splitlines() if x.startswith("bigfleet_gc_frozen_objects "))
        return float(line.split()[1])

    gc.freeze()
    try:
        assert frozen() == gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert frozen() == 0
