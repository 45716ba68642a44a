"""Operator metric names (docs/reference.md#metric-names) plus the session extras are registered."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

import bigfleet_trio.observability.metrics as m


def _names() -> set[str]:
    return {metric.name for metric in REGISTRY.collect()}


@pytest.mark.parametrize(
    "name",
    [
        # the Go reference's (counters registered without the _total suffix by prometheus_client)
        "bigfleet_operator_rollup_duration_seconds",
        "bigfleet_operator_rollup_phase_duration_seconds",
        "bigfleet_operator_acknowledge_duration_seconds",
        "bigfleet_operator_outbox_dropped",
        "bigfleet_operator_acknowledged",
        "bigfleet_operator_session_reconnects",
        "bigfleet_operator_node_state_update_duration_seconds",
        "bigfleet_operator_upcoming_node_writes",
        "bigfleet_operator_dispatch_inflight",
        # ours
        "bigfleet_operator_session_up",
        "bigfleet_operator_frames",
        "bigfleet_operator_coalesced_frames",
        "bigfleet_operator_handler_errors",
        "bigfleet_operator_rollup_errors",
        "bigfleet_operator_node_state_queue_seconds",
        "bigfleet_operator_node_state_worker_wait_seconds",
        # drains (reclaim.py); counters without the _total suffix, as above
        "bigfleet_operator_drains",
        "bigfleet_operator_drains_active",
        "bigfleet_operator_evictions",
    ],
)
def test_metric_registered(name: str) -> None:
    assert name in _names()


def test_bucket_layouts_match_reference() -> None:
    # 1ms x 2^k, 16 buckets -> last finite bound 1ms * 2^15 = 32.768 s
    assert m.exponential_buckets(0.001, 2, 16)[-1] == pytest.approx(32.768)
    assert len(m.exponential_buckets(0.001, 2, 17)) == 17
    # 10ms x 2^k, 16 buckets -> 327.68 s
    assert m.exponential_buckets(0.01, 2, 16)[-1] == pytest.approx(327.68)
    with pytest.raises(ValueError):
        m.exponential_buckets(0, 2, 3)


def test_outbox_dropped_exposed_with_total_suffix() -> None:
    before = REGISTRY.get_sample_value("bigfleet_operator_outbox_dropped_total")
    assert before is not None


@pytest.mark.parametrize(
    ("exposed", "kind"),
    [
        ("bigfleet_operator_drains_total", "counter"),
        ("bigfleet_operator_drains_active", "gauge"),
        ("bigfleet_operator_evictions_total", "counter"),
    ],
)
def test_drain_metrics_exposed_under_their_scrape_names(exposed: str, kind: str) -> None:
    from prometheus_client import generate_latest

    text = generate_latest(REGISTRY).decode()
    assert f"# TYPE {exposed} {kind}\n" in text
