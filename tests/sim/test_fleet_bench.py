"""The fleet benchmark's pure parts: the fleet it builds and how it matches timestamps."""

from __future__ import annotations

from bigfleet_trio.sim.shard import parse_catalog
from scripts.bench.fleet import fleet_catalog, fleet_workloads, nsu_latencies, rollup_latencies


def test_catalog_has_the_fleet_size_and_parses() -> None:
    doc = fleet_catalog(5000)
    cat = parse_catalog(doc)
    total = sum(s.count for s in cat)
    assert 4950 <= total <= 5000
    gpu = sum(s.count for s in cat if s.instance_type == "g2-standard-24")
    assert gpu == 3 * (100 // 3)


def test_workloads_add_up_with_one_profile_per_clone() -> None:
    classes, workloads = fleet_workloads(2000, 100, seed=1)
    assert sum(w.replicas for w in workloads) >= 2000
    assert {w.kind for w in workloads} == {"Deployment", "StatefulSet", "Job"}
    assert classes and all(c["kind"] == "PriorityClass" for c in classes)
    names = [w.name for w in workloads]
    assert len(set(names)) == len(names)
    reqs = set()
    for w in workloads:
        spec = w.body["spec"]
        tpl = spec["template"]
        assert tpl["metadata"]["labels"] == {"app": w.name}
        c = tpl["spec"]["containers"][0]["resources"]["requests"]
        reqs.add((c["cpu"], c["memory"], c.get("nvidia.com/gpu")))
        if w.kind == "Job":
            assert spec["completions"] == spec["parallelism"] == w.replicas
        else:
            assert spec["replicas"] == w.replicas
            assert spec["selector"] == {"matchLabels": {"app": w.name}}
    assert len(reqs) == len(workloads)  # distinct requests: one Profile each


def test_rollup_latency_matches_the_first_rollup_carrying_the_state_or_a_later_one() -> None:
    states = [(10.0, 1000, 5, "ramp"), (10.5, 2000, 5, "ramp"), (20.0, 3000, 5, "churn")]
    rollups = [[9.0, 1, 0, 0, 10], [12.0, 1, 2000, 5, 10], [25.0, 1, 3000, 5, 10]]
    out = rollup_latencies(states, rollups)
    # 10.0: superseded at 10.5 before any roll-up; the roll-up at 12.0 carries its successor
    assert out["ramp"] == [2.0, 1.5]
    assert out["churn"] == [5.0]


def test_nsu_latency_counts_phase_changes_only() -> None:
    nsu = [[1.0, "m1", "SPECULATIVE"], [2.0, "m1", "CREATING"], [3.0, "m1", "IDLE"],
           [4.0, "m1", "CONFIGURING"], [5.0, "m1", "CONFIGURED"], [9.0, "m1", "DRAINING"],
           [10.0, "m1", "IDLE"]]
    un = {"m1": [(1.5, "Provisioning"), (3.25, "Launched"), (4.5, "Registered"), (5.1, "Ready"),
                 (9.2, "Draining"), (10.3, "Deleted")]}
    out = nsu_latencies(nsu, un, lambda t: "ramp" if t < 6 else "reclaim")
    assert [round(x, 2) for x in out["ramp"]] == [0.5, 0.25, 0.5, 0.1]
    assert "reclaim" not in out  # Draining is not timed; a release is a delete, not Launched
