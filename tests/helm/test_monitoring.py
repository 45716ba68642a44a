"""The shipped alerts and dashboard (config/monitoring/, the chart's copies, docs/operate.md):
checked and unit-tested by the real promtool, built from its Go module
(scripts/realkube/tools.py), one unit test per alert, a runbook section per alert, and the
copies kept equal. That every queried metric is exported is shown against running binaries in
tests/sim/test_pieces_path.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from scripts import gen_dashboard
from scripts.realkube.tools import find_tool
from tests.support.helm import CHART
from tests.support.monitoring import MONITORING
from tests.support.realkube import REQUIRE_ENV
from tests.support.tiers import PROMTOOL_SKIP
from tests.test_docs import github_slugs

ROOT = Path(__file__).resolve().parents[2]
RULES = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
ALERTS = [r for g in RULES["groups"] for r in g["rules"] if "alert" in r]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    found = find_tool("promtool")
    if found is None:
        msg = PROMTOOL_SKIP
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{msg} ({REQUIRE_ENV} is set)", pytrace=False)
        pytest.skip(msg)
    return subprocess.run([found, *args], cwd=MONITORING, capture_output=True, text=True,
                          timeout=120, check=False)


def test_promtool_check_rules() -> None:
    proc = promtool("check", "rules", "alerts.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in proc.stdout


def test_promtool_test_rules() -> None:
    proc = promtool("test", "rules", "alerts_test.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_has_a_unit_test_that_expects_it_to_fire() -> None:
    tests = yaml.safe_load((MONITORING / "alerts_test.yaml").read_text())["tests"]
    firing = {t["alertname"] for case in tests for t in case["alert_rule_test"]
              if t["exp_alerts"]}
    quiet = {t["alertname"] for case in tests for t in case["alert_rule_test"]
             if not t["exp_alerts"]}
    names = {a["alert"] for a in ALERTS}
    assert firing == names and quiet == names


def test_every_alert_has_a_runbook_section() -> None:
    anchors = github_slugs((ROOT / "docs" / "operate.md").read_text())
    for alert in ALERTS:
        url = alert["annotations"]["runbook_url"]
        assert url.endswith(f"docs/operate.md#{alert['alert'].lower()}"), url
        assert alert["alert"].lower() in anchors, alert["alert"]
        assert alert["labels"]["severity"] in ("critical", "warning")


def test_the_copies_are_equal() -> None:
    assert (CHART / "files" / "alerts.yaml").read_bytes() == (
        MONITORING / "alerts.yaml").read_bytes()
    assert (CHART / "files" / "dashboard.json").read_bytes() == (
        MONITORING / "dashboard.json").read_bytes()
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert rule["kind"] == "PrometheusRule" and rule["spec"] == RULES


def test_the_dashboard_is_what_the_generator_writes() -> None:
    assert (MONITORING / "dashboard.json").read_text() == gen_dashboard.render(), (
        "run python -m scripts.gen_dashboard")


def test_the_dashboard_has_the_panels_operators_need() -> None:
    dash = json.loads((MONITORING / "dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", ()))
    for needed in ("session_up", "session_reconnects", "rollup_needs", "rollup_duration",
                   "bootstrap_answers_expired", "node_state_update_duration", "drains",
                   "evictions", "outbox_dropped", "kube_client_request_duration",
                   "kube_client_throttled", "informer_relists", "event_loop_lag",
                   "leader_election_is_leader", "process_resident_memory",
                   "process_cpu_seconds", "capacityrequests_excluded_current",
                   "capacityrequests_outcome", "outcome_writes", "kube_events"):
        assert re.search(needed, exprs), needed
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
