"""``bigfleet-trio demo --json --quiet``, the README's first command, through the CLI entry point:
three clusters share the simulated shard's pool, and the summary says what moved where, and why.

Expected values worked out by hand from ``demo_world.fleet_shapes(3)`` / ``fleet_manifests`` and
docs/rules.md#simulated-fleet: the fleet pool has 3 on-demand and 2 spot machines; the first
cluster's ``fleet-idle``, the second's ``fleet-reports`` and the third's ``fleet-web`` take the 3
on-demand ones, the second's ``fleet-batch`` (interruption penalty $0) the 2 spot ones. Then the
first scales ``fleet-idle`` to 0 (its machine is reclaimed as surplus) and the third's
``fleet-web`` (priority 1000) bursts to 3 replicas: it gets the reclaimed machine and preempts
``fleet-reports`` (priority 10, the only lower-priority on-demand work left), whose Pod waits.

Real sockets and real time, bounded by the demo's own ``--timeout`` (a bound, not a speed claim).
"""

from __future__ import annotations

import json

import pytest

from bigfleet_trio import cli

pytestmark = pytest.mark.usefixtures("restore_root_logging")  # tests/conftest.py


def test_the_first_command_moves_machines_between_three_clusters(
        capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["demo", "--json", "--quiet", "--timeout", "150s"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    [line] = captured.out.splitlines()
    s = json.loads(line)
    assert s["ok"] is True, s["failure"]
    names = [c["name"] for c in s["clusters"]]
    assert names == ["demo-cluster", "demo-cluster-2", "demo-cluster-3"]
    by_name = {c["name"]: c for c in s["clusters"]}

    moves = {(m["from"], m["to"], m["why"]) for m in s["moves"]}
    assert moves == {("demo-cluster", "demo-cluster-3", "surplus"),
                     ("demo-cluster-2", "demo-cluster-3", "preempted")}
    assert all(m["instance_type"] == "fleet-od-4" and not m["spot"] for m in s["moves"])
    assert s["preemptions"] == 1
    # spot for the interruption-tolerant batch work only
    assert s["spot_machines"] == 2 == by_name["demo-cluster-2"]["spot_machines"]
    assert by_name["demo-cluster-3"]["spot_machines"] == 0
    # the burst got its machines; the preempted work waits, and the summary says why
    assert by_name["demo-cluster-3"]["pods_bound"] == by_name["demo-cluster-3"]["pods"] == 3
    [pending] = by_name["demo-cluster-2"]["pods_pending"]
    assert pending.startswith("fleet/fleet-reports-")
    assert "preempted by higher-priority demand" in by_name["demo-cluster-2"]["pending_why"]
    assert any("moved demo-cluster-2 -> demo-cluster-3" in line and "preempted" in line
               for line in s["story"])
    # the first cluster's scenario as before: its scale-down reclaimed and drained
    assert s["reclaims_issued"] == s["reclaims_acked"] == s["drains_completed"] >= 2
