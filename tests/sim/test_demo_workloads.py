"""``bigfleet-trio demo --workloads DIR --quiet --json`` in-process through the CLI entry point
the demo applies the manifests of DIR instead of the bundled ones, prints only
the JSON summary, and exits 0 once the scale-up and the scale-down converged.

The demo runs its own ``trio.run`` with real sockets (apiserver over HTTP, the shard stream over
grpclib on loopback), so this is a synchronous test in real time, as test_demo_e2e.py is; the
demo's own ``--timeout`` bounds it.

Expected values worked out by hand from the manifest below: one Deployment ``web`` in namespace
``default`` with 3 replicas of one container requesting cpu 100m -> 3 Pods -> 3 CRs (one per
Pod, docs/rules.md#pod-translation), one CapacityNeed since their specs are identical, all bound
on one machine (300m fits the smallest shape); the only workload is the one scaled down (3 Pods
deleted), so afterwards no Pod is left and that machine is reclaimed, drained and released.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bigfleet_trio import cli

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: default
spec:
  replicas: 3
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
      - name: web
        image: nginx:1.27
        resources:
          requests:
            cpu: 100m
            memory: 64Mi
"""


pytestmark = pytest.mark.usefixtures("restore_root_logging")  # tests/conftest.py


def test_demo_workloads_dir_quiet_json_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workloads = tmp_path / "workloads"
    workloads.mkdir()
    (workloads / "web.yaml").write_text(DEPLOYMENT)
    # a non-manifest file next to it is ignored (only *.yaml, *.yml, *.json are applied)
    (workloads / "README.md").write_text("not a manifest\n")

    rc = cli.main(["demo", "--workloads", str(workloads), "--quiet", "--json", "--clusters", "1",
                   "--timeout", "60s", "--kubeconfig-out", str(tmp_path / "kubeconfig")])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert captured.err == ""

    # --quiet: no progress lines; --json: exactly one line, one JSON object
    lines = captured.out.splitlines()
    assert len(lines) == 1, captured.out
    s = json.loads(lines[0])

    assert s["ok"] is True and s["failure"] is None
    assert s["kubeconfig"] == str(tmp_path / "kubeconfig")
    assert s["workloads"] == ["Deployment/web"]
    assert s["pods_created"] == 3
    assert s["crs"] == 3
    assert s["pods_bound"] == 3
    # three identical CRs share one profile and no co-location group -> one CapacityNeed
    assert s["needs"] == 1 and s["rollups"] >= 1
    # 3 x (100m, 64Mi) = 300m / 192Mi fits the smallest shape (4 cpu / 16Gi): one machine
    assert s["machines_configured"] == 1
    assert s["upcoming_ready"] == 1
    assert s["nodes_ready"] == 1
    # scale-down of the only workload: all 3 Pods gone, reclaimed machines drained and released
    assert s["scaled_down"] == "Deployment/web"
    assert s["pods_deleted"] == 3
    assert s["final_pods"] == 0
    assert s["pods_replaced"] == 0
    assert s["reclaims_issued"] == 1
    assert s["reclaims_acked"] == s["reclaims_issued"]
    assert s["upcoming_deleted"] == s["reclaims_issued"]
    assert s["drains_completed"] == s["reclaims_issued"]
    assert len(s["reclaimed_nodes"]) == s["reclaims_issued"]
    assert s["final_machines_configured"] == 0
    assert set(s["timings"]) == {"applied", "all_bound", "reclaim", "total"}


def test_demo_workloads_dir_missing_is_usage_error_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = cli.main(["demo", "--workloads", str(tmp_path / "nope"), "--quiet", "--json"])
    captured = capsys.readouterr()
    assert rc == 1
    assert captured.out == ""
    assert f"--workloads: {tmp_path / 'nope'}: not a directory" in captured.err
