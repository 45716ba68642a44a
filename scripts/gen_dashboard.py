"""Writes the Grafana dashboard (config/monitoring/dashboard.json and the chart's copy) from the
panel list below: ``python -m scripts.gen_dashboard``. tests/helm/test_monitoring.py checks the
files are current and that every metric a panel queries is one the binaries export."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUTPUTS = (ROOT / "config" / "monitoring" / "dashboard.json",
           ROOT / "charts" / "bigfleet-trio" / "files" / "dashboard.json")
SEL = 'namespace=~"$namespace"'

# (row, [(title, unit, [(legend, PromQL)])]); $namespace is a dashboard variable
ROWS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]]]]]] = [
    ("Operator: the session", [
        ("Session up (max over replicas)", "short", [
            ("{{namespace}}", f"max by (namespace) (bigfleet_operator_session_up{{{SEL}}})")]),
        ("Reconnects and session closes / 5m", "short", [
            ("reconnects",
             f"sum(increase(bigfleet_operator_session_reconnects_total{{{SEL}}}[5m]))"),
            ("closes {{reason}}",
             f"sum by (reason) (increase(bigfleet_operator_session_closes_total{{{SEL}}}[5m]))")]),
        ("Roll-up size", "short", [
            ("CapacityNeeds", f"max(bigfleet_operator_rollup_needs{{{SEL}}})"),
            ("CapacityRequests", f"max(bigfleet_operator_rollup_capacityrequests{{{SEL}}})")]),
        ("Roll-ups per minute and build p99 (60 / rate = age between roll-ups)", "short", [
            ("roll-ups / min",
             f"sum(rate(bigfleet_operator_rollup_duration_seconds_count{{{SEL}}}[5m])) * 60"),
            ("build p99 s", "histogram_quantile(0.99, sum by (le) (rate("
             f"bigfleet_operator_rollup_duration_seconds_bucket{{{SEL}}}[5m])))")]),
        ("Frames per second by kind", "ops", [
            ("{{direction}} {{kind}}", "sum by (direction, kind) (rate("
             f"bigfleet_operator_frames_total{{{SEL}}}[5m]))")]),
        ("Bootstrap answers late, outbox drops / 10m", "short", [
            ("bootstrap answers late", "sum(increase("
             f"bigfleet_operator_bootstrap_answers_expired_total{{{SEL}}}[10m]))"),
            ("outbox drops",
             f"sum(increase(bigfleet_operator_outbox_dropped_total{{{SEL}}}[10m]))")]),
    ]),
    ("Operator: machines and reclaims", [
        ("NodeStateUpdate handling p99 by phase", "s", [
            ("{{phase}}", "histogram_quantile(0.99, sum by (le, phase) (rate("
             f"bigfleet_operator_node_state_update_duration_seconds_bucket{{{SEL}}}[5m])))")]),
        ("UpcomingNode writes / s", "ops", [
            ("{{op}} {{outcome}}", "sum by (op, outcome) (rate("
             f"bigfleet_operator_upcoming_node_writes_total{{{SEL}}}[5m]))")]),
        ("Drains in progress and finished / 30m", "short", [
            ("active", f"sum(bigfleet_operator_drains_active{{{SEL}}})"),
            ("{{outcome}}",
             f"sum by (outcome) (increase(bigfleet_operator_drains_total{{{SEL}}}[30m]))")]),
        ("Evictions / 5m", "short", [
            ("{{result}}",
             f"sum by (result) (increase(bigfleet_operator_evictions_total{{{SEL}}}[5m]))")]),
    ]),
    ("Outcomes: what became of the demand", [
        ("CapacityRequests by outcome (leader's last pass)", "short", [
            ("{{condition}} {{status}} {{reason}}", "max by (condition, status, reason) ("
             f"bigfleet_operator_capacityrequests_outcome{{{SEL}}})")]),
        ("Excluded from the roll-up, no capacity offered, nothing came", "short", [
            ("excluded",
             f"max(bigfleet_operator_capacityrequests_excluded_current{{{SEL}}})"),
            ("no capacity offered", "max(bigfleet_operator_capacityrequests_outcome{"
             f'condition="CapacityOffered",status="False",{SEL}}})'),
            ("nothing came", "max(bigfleet_operator_capacityrequests_outcome{"
             f'condition="MachineComing",reason="NothingCame",{SEL}}})')]),
        ("Condition writes / 5m", "short", [
            ("{{outcome}}", "sum by (outcome) (increase("
             f"bigfleet_operator_outcome_writes_total{{{SEL}}}[5m]))")]),
        ("Pod Events / 5m by reason", "short", [
            ("{{reason}} {{outcome}}", "sum by (reason, outcome) (increase("
             f"bigfleet_operator_kube_events_total{{{SEL}}}[5m]))")]),
        ("Drains failed past their grace / 30m", "short", [
            ("failed", "sum(increase(bigfleet_operator_drains_total{outcome=\"failed\","
             f"{SEL}}}[30m]))")]),
    ]),
    ("Pod controller", [
        ("Reconciles / s", "ops", [
            ("{{outcome}}", "sum by (outcome) (rate("
             f"bigfleet_unschedulable_pod_controller_reconciles_total{{{SEL}}}[5m]))")]),
        ("Work queue depth", "short", [
            ("{{name}}", f"sum by (name) (workqueue_depth{{{SEL}}})")]),
        ("Longest-held key (a stuck worker grows here)", "s", [
            ("{{pod}} {{name}}",
             f"max by (pod, name) (workqueue_longest_running_processor_seconds{{{SEL}}})")]),
    ]),
    ("Kubernetes client and caches (both binaries)", [
        ("Apiserver requests / s", "ops", [
            ("{{job}} {{verb}} {{code}}", "sum by (job, verb, code) (rate("
             f"bigfleet_kube_client_request_duration_seconds_count{{{SEL}}}[5m]))")]),
        ("Apiserver request p99", "s", [
            ("{{job}} {{verb}}", "histogram_quantile(0.99, sum by (le, job, verb) (rate("
             f"bigfleet_kube_client_request_duration_seconds_bucket{{{SEL}}}[5m])))")]),
        ("429s (API Priority and Fairness) / 5m", "short", [
            ("{{job}}",
             f"sum by (job) (increase(bigfleet_kube_client_throttled_total{{{SEL}}}[5m]))")]),
        ("Informer relists / 1h", "short", [
            ("{{job}} {{resource}} {{reason}}", "sum by (job, resource, reason) (increase("
             f"bigfleet_informer_relists_total{{{SEL}}}[1h]))")]),
        ("Informers synced", "short", [
            ("{{pod}} {{resource}}", f"bigfleet_informer_synced{{{SEL}}}")]),
    ]),
    ("Process (both binaries)", [
        ("Leader (sum over replicas: 1 is healthy)", "short", [
            ("{{job}}", f"sum by (job) (bigfleet_leader_election_is_leader{{{SEL}}})")]),
        ("Event-loop lag p99 and max bucket", "s", [
            ("{{pod}} p99", "histogram_quantile(0.99, sum by (le, pod) (rate("
             f"bigfleet_event_loop_lag_seconds_bucket{{{SEL}}}[5m])))")]),
        ("RSS", "bytes", [
            ("{{pod}}", f"process_resident_memory_bytes{{{SEL}}}")]),
        ("CPU (cores)", "short", [
            ("{{pod}}", f"rate(process_cpu_seconds_total{{{SEL}}}[5m])")]),
        ("Metrics-auth decisions / 10m", "short", [
            ("{{job}} {{decision}}", "sum by (job, decision) (increase("
             f"bigfleet_diagnostics_auth_decisions_total{{{SEL}}}[10m]))")]),
    ]),
]


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (schemaVersion 39; datasource a variable)."""
    panels: list[dict[str, Any]] = []
    y = 0
    pid = 1
    for row, items in ROWS:
        panels.append({"type": "row", "title": row, "id": pid, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid += 1
        y += 1
        for i, (title, unit, targets) in enumerate(items):
            panels.append({
                "type": "timeseries", "title": title, "id": pid,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": y + 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": [{"refId": chr(ord("A") + k), "expr": expr, "legendFormat": legend,
                             "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                            for k, (legend, expr) in enumerate(targets)]})
            pid += 1
        y += 8 * ((len(items) + 1) // 2)
    return {
        "title": "bigfleet-trio", "uid": "bigfleet-trio", "schemaVersion": 39, "version": 1,
        "tags": ["bigfleet"], "timezone": "utc", "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "description": "The operator and the pod controller (docs/operate.md#dashboard)",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus",
             "label": "Prometheus"},
            {"name": "namespace", "type": "query", "label": "namespace",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": "label_values(bigfleet_build_info, namespace)", "includeAll": True,
             "multi": True, "refresh": 2}]},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main() -> int:
    text = render()
    for path in OUTPUTS:
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
