"""The bench's kube-apiserver /metrics analysis (scripts/bench/_apiserver_metrics.py): pure."""
# ruff: noqa: E501  (Prometheus exposition lines are long by nature)

from __future__ import annotations

import pytest

from scripts.bench import _apiserver_metrics as M
from scripts.bench.podcontroller import mean_per_pod

_CR = 'group="bigfleet.lucy.sh",resource="capacityrequests",scope="resource",version="v1alpha1"'


def _text(post: int, patch: int, conflicts: int, watch: int, events: int) -> str:
    return f"""\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{{code="201",component="apiserver",dry_run="",{_CR},subresource="",verb="POST"}} {post}
apiserver_request_total{{code="200",component="apiserver",dry_run="",{_CR},subresource="status",verb="PATCH"}} {patch}
apiserver_request_total{{code="409",component="apiserver",dry_run="",{_CR},subresource="status",verb="PATCH"}} {conflicts}
apiserver_request_total{{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"}} {watch}
apiserver_request_total{{code="200",component="",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"}} {watch}
# HELP apiserver_watch_events_total [ALPHA] Number of events sent in watch clients
# TYPE apiserver_watch_events_total counter
apiserver_watch_events_total{{group="bigfleet.lucy.sh",resource="capacityrequests",version="v1alpha1"}} {events}
apiserver_watch_events_total{{group="",kind="Pod",version="v1"}} {events}
# HELP apiserver_response_sizes [STABLE] Response size distribution in bytes.
# TYPE apiserver_response_sizes histogram
apiserver_response_sizes_bucket{{component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1",le="+Inf"}} 2
apiserver_response_sizes_sum{{component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"}} 4000
apiserver_response_sizes_count{{component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"}} 2
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
"""


def test_per_pod_by_verb_resource_code_with_conflicts() -> None:
    before = M.parse(_text(post=10, patch=5, conflicts=0, watch=1, events=100))
    after = M.parse(_text(post=210, patch=185, conflicts=20, watch=2, events=700))
    got = M.per_pod(before, after, 200)
    req = got["requests"]
    assert req["POST capacityrequests 201"] == 1.0
    assert req["PATCH capacityrequests/status 200"] == 0.9
    assert req["PATCH capacityrequests/status 409"] == 0.1
    assert req["409 conflicts"] == 0.1
    # two label sets differing only in labels the report folds: summed
    assert req["WATCH pods 200"] == 2 / 200
    assert req["total"] == pytest.approx(1.0 + 0.9 + 0.1 + 0.01)
    assert got["watch_events"] == {"capacityrequests": 3.0, "Pod": 3.0}
    assert "LIST pods" not in got["response_bytes"]  # unchanged: dropped


def test_counter_reset_counts_from_zero_and_pods_must_be_positive() -> None:
    before = M.parse(_text(post=500, patch=0, conflicts=0, watch=0, events=0))
    after = M.parse(_text(post=100, patch=0, conflicts=0, watch=0, events=0))
    assert M.per_pod(before, after, 100)["requests"]["POST capacityrequests 201"] == 1.0
    with pytest.raises(ValueError):
        M.per_pod(before, after, 0)


def test_table_and_mean_over_rounds() -> None:
    lines = M.table({"ours": {"a": 1.0, "b": 2.0}, "kopf": {"a": 3.0}})
    assert lines[1].split() == ["a", "1.000", "3.000"]
    assert lines[2].split() == ["b", "2.000", "-"]
    assert M.table({"ours": {}}) == []
    assert [ln.split()[0] for ln in M.table({"ours": {"a": 0.001, "b": 0.5}, "kopf": {"a": 0.002}},
                                            min_value=0.01)[1:]] == ["b"]
    mean = mean_per_pod([{"requests": {"x": 1.0}}, {"requests": {"x": 3.0, "y": 2.0}}])
    assert mean == {"requests": {"x": 2.0, "y": 1.0}}


def test_parse_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        M.parse("this is { not metrics")
