"""The fleet benchmark's pure parts: the fleet it builds and how it matches timestamps."""

from __future__ import annotations

from typing import Any

import pytest

from bigfleet_trio.sim.shard.catalog import parse_catalog
from scripts.bench._fleet_analysis import match_in_life, pod_cr_latencies, reclaim_latencies
from scripts.bench._fleet_report import _phase_p99
from scripts.bench.fleet import fleet_catalog, fleet_workloads, nsu_latencies, rollup_latencies
from tests.support.tiers import MATPLOTLIB_SKIP


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
    assert [round(x, 2) for x in out.latency["ramp"]] == [0.5, 0.25, 0.5, 0.1]
    assert "reclaim" not in out.latency  # Draining is not timed; a release is a delete
    assert not out.superseded and not out.unmatched


def test_skipped_registered_is_superseded_not_matched_to_the_next_life() -> None:
    """The coalescer wrote Launched -> Ready without Registered; the machine was drained,
    deleted and reused warm minutes later, and that life wrote Registered. The skipped
    CONFIGURING update is superseded by the Ready write 0.4 s after it, not a 200 s latency."""
    nsu = [[1.0, "m1", "SPECULATIVE"], [2.0, "m1", "CREATING"], [3.0, "m1", "IDLE"],
           [4.0, "m1", "CONFIGURING"], [4.1, "m1", "CONFIGURED"], [100.0, "m1", "DRAINING"],
           [101.0, "m1", "IDLE"],
           # next life, warm: straight to the pull
           [204.0, "m1", "CONFIGURING"], [205.0, "m1", "CONFIGURED"]]
    un = {"m1": [(1.2, "Provisioning"), (3.1, "Launched"), (4.4, "Ready"), (100.2, "Draining"),
                 (101.3, "Deleted"), (204.3, "Registered"), (205.2, "Ready")]}
    out = nsu_latencies(nsu, un, lambda t: "ramp" if t < 50 else "churn")
    assert [round(x, 2) for x in out.latency["ramp"]] == [0.2, 0.1, 0.3]  # Prov, Launched, Ready
    assert [round(x, 2) for x in out.superseded["ramp"]] == [0.4]  # CONFIGURING -> Ready write
    assert [round(x, 2) for x in out.latency["churn"]] == [0.3, 0.2]  # the next life's own
    assert not out.unmatched


def test_nsu_match_stops_at_the_end_of_the_life() -> None:
    # Never Ready: drained first. A later life's Ready is another update's.
    ev = [(1.0, "Registered"), (3.0, "Draining"), (4.0, "Deleted"), (50.0, "Ready")]
    assert match_in_life(2.0, "Ready", ev) == ("superseded", 1.0)
    # Without the end-of-life events (a missed watch event), the next update asking for the
    # same phase bounds the search.
    assert match_in_life(2.0, "Ready", [(1.0, "Registered"), (50.0, "Ready")], until=49.0)[0] \
        == "unmatched"
    # A lower phase written late (coalesced writes in flight) does not end the search.
    assert match_in_life(2.0, "Ready", [(2.1, "Registered"), (2.5, "Ready")]) == \
        ("written", 0.5)
    # The write may be seen just before the shard's send stamp.
    assert match_in_life(2.0, "Ready", [(1.98, "Ready")]) == ("written", 0.0)
    # An end-of-life event just before the send is the previous life's, not a stop.
    assert match_in_life(2.0, "Provisioning", [(1.97, "Deleted"), (2.3, "Provisioning")]) == \
        ("written", pytest.approx(0.3))


def test_reclaim_is_matched_by_instruction_and_resends_are_counted_apart() -> None:
    recs = [["reclaim-1", "n1", 10.0, 10.5, 1], ["reclaim-2", "n2", 11.0, 31.5, 3],
            ["reclaim-3", "n3", 12.0, None, 2], ["reclaim-4", "n4", 13.0, 13.2]]
    out = reclaim_latencies(recs, lambda t: "churn")
    assert out.latency["churn"] == [0.5, 20.5, pytest.approx(0.2)]
    assert out.superseded["churn"] == [20.5]
    assert out.unmatched["churn"] == 1


def test_pod_cr_latency_by_uid_with_deleted_and_early_crs_apart() -> None:
    pods = {"a": (1.0, "ramp"), "b": (2.0, "ramp"), "c": (3.0, "churn"), "d": (4.0, "churn"),
            "e": (5.0, "churn")}
    crs = {"a": 1.5, "b": 1.9, "d": 9.0}
    deleted = {"c": 3.5, "d": 8.0}
    out = pod_cr_latencies(pods, crs, deleted)
    assert out["ramp"] == {"latency": [0.5, 0.0], "cr_first": 1, "deleted_first": 0,
                           "missing": 0, "windows": [(("cr-a",), 1.0, 1.5), (("cr-b",), 2.0, 2.0)]}
    assert out["churn"] == {"latency": [], "cr_first": 0, "deleted_first": 2, "missing": 1,
                            "windows": []}


def test_phase_p99_from_bucket_growth_per_phase() -> None:
    counts = [{"end_of": "ramp", "nsu_duration_buckets": {"0.5": 90.0, "1.0": 99.0,
                                                          "2.0": 100.0, "+Inf": 100.0}},
              {"end_of": "churn", "nsu_duration_buckets": {"0.5": 180.0, "1.0": 198.0,
                                                           "2.0": 200.0, "+Inf": 200.0}}]
    assert _phase_p99(counts) == {"ramp": 1.0, "churn": 1.0}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector's matchLabels and In/NotIn/Exists/DoesNotExist expressions over labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        has, value = e["key"] in labels, labels.get(e["key"])
        ok = {"In": has and value in e.get("values", []),
              "NotIn": not has or value not in e.get("values", []),
              "Exists": has, "DoesNotExist": not has}[e["operator"]]
        if not ok:
            return False
    return True


@pytest.mark.parametrize("pods", [300, 2000, 3090])
def test_every_clones_required_pod_affinity_selects_pods_of_the_fleet(pods: int) -> None:
    # kube-scheduler places a Pod with a required podAffinity term only next to a Pod the term
    # selects, or -- when no Pod matches yet -- if the Pod matches its own term. The clones are
    # relabelled `app: <clone>`, so a term still naming the source manifest's `app: mysql` selects
    # nothing and the Pods stay Pending for ever on a real control plane.
    _, workloads = fleet_workloads(pods, 100, seed=1)
    labels = [w.body["spec"]["template"]["metadata"]["labels"] for w in workloads]
    checked = 0
    for w in workloads:
        affinity = w.body["spec"]["template"]["spec"].get("affinity") or {}
        required = (affinity.get("podAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution")
        for term in required or []:
            checked += 1
            assert any(_selects(term["labelSelector"], lab) for lab in labels), w.name
    assert checked


def test_a_failed_stats_poll_answers_none_and_is_counted(
        capsys: pytest.CaptureFixture[str]) -> None:
    # a starved shard that does not answer in time must not end a run half an hour in: the poll
    # reports "not known" (None), and the run keeps the count of such misses
    import socket
    import threading

    from scripts.bench._fleet_observe import StatsPoller

    with socket.socket() as refused:  # a port nothing listens on
        refused.bind(("127.0.0.1", 0))
        port = refused.getsockname()[1]
    poll = StatsPoller(port)
    assert poll() is None and poll.failures == 1

    # an answer cut short (not JSON)
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = srv.accept()
        conn.recv(4096)
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{\"nsu\": [")
        conn.close()

    t = threading.Thread(target=serve)
    t.start()
    poll.port = srv.getsockname()[1]
    assert poll() is None and poll.failures == 2
    t.join()
    srv.close()
    assert "shard /stats poll failed (2 so far)" in capsys.readouterr().err


def test_server_wait_counts_overlapping_requests_once_and_clips_to_the_window() -> None:
    from scripts.bench._fleet_analysis import server_wait

    spans = [(0.0, 2.0), (1.0, 3.0), (2.5, 2.8), (5.0, 6.0), (9.0, 12.0)]
    assert server_wait(spans, 1.5, 10.0) == pytest.approx(1.5 + 1.0 + 1.0)
    assert server_wait(spans, 3.0, 5.0) == 0.0
    assert server_wait([], 0.0, 1.0) == 0.0


def test_agent_own_is_end_to_end_minus_the_requests_on_the_named_objects() -> None:
    from scripts.bench._fleet_analysis import agent_own, trace_index

    index = trace_index([[10.2, 10.7, "POST", "/apis/g/v1/upcomingnodes", "un-m1", 201],
                         [10.6, 10.9, "PATCH", "/apis/g/v1/upcomingnodes/un-m1", "un-m1", 200],
                         [10.0, 11.0, "PATCH", "/api/v1/nodes/other", "other", 200],
                         [10.0, 11.0, "GET", "/api/v1/pods", "", 200]])
    assert agent_own([(("un-m1",), 10.0, 11.0)], index) == [pytest.approx(0.3)]
    assert agent_own([(("nobody",), 10.0, 11.0)], index) == [pytest.approx(1.0)]
    assert agent_own([(("un-m1", "other"), 10.0, 11.0)], index) == [pytest.approx(0.0)]


def test_agent_own_of_a_watched_end_stops_at_the_last_answer_on_its_objects() -> None:
    """A latency the bench ends at its own watch event: after the write's answer, the time until
    the event reaches the bench is the apiserver's watch delivery (and the bench), not the
    agent's."""
    from scripts.bench._fleet_analysis import agent_own, trace_index

    index = trace_index([[10.2, 10.5, "POST", "/apis/g/v1/capacityrequests", "cr-u", 201],
                         [10.6, 10.7, "PATCH", "/apis/g/v1/capacityrequests/cr-u", "cr-u", 200],
                         [11.5, 11.6, "PATCH", "/apis/g/v1/capacityrequests/cr-u", "cr-u", 200]])
    window = (("cr-u",), 10.0, 11.0)  # the bench saw the CR at 11.0, 0.3 s after the answer
    assert agent_own([window], index) == [pytest.approx(0.6)]  # 0.2 + 0.1 + 0.3
    assert agent_own([window], index, watched_end=True) == [pytest.approx(0.3)]  # 0.2 + 0.1
    # no answer inside the window (a request still open, or none traced): the end stays
    assert agent_own([(("cr-u",), 10.0, 10.4)], index, watched_end=True) == [
        pytest.approx(0.2)]
    assert agent_own([(("nobody",), 10.0, 11.0)], index, watched_end=True) == [
        pytest.approx(1.0)]


def test_agent_own_before_the_first_request_is_the_wait_for_a_worker() -> None:
    """The part of agent-own before the agent's first request on the latency's objects: the
    frame or Pod waiting for a worker, a slot or its turn in the queue."""
    from scripts.bench._fleet_analysis import before_first_request, trace_index

    index = trace_index([[10.2, 10.5, "POST", "/apis/g/v1/capacityrequests", "cr-u", 201],
                         [9.0, 9.5, "GET", "/apis/g/v1/capacityrequests/cr-u", "cr-u", 200],
                         [10.6, 10.7, "PATCH", "/apis/g/v1/capacityrequests/cr-u", "cr-u", 200]])
    assert before_first_request([(("cr-u",), 10.0, 11.0)], index) == [pytest.approx(0.2)]
    # no request inside the window: all of it
    assert before_first_request([(("nobody",), 10.0, 11.0)], index) == [pytest.approx(1.0)]
    assert before_first_request([(("cr-u",), 10.8, 11.0)], index) == [pytest.approx(0.2)]


def test_pending_report_counts_the_cluster_once_and_only_for_the_groups_it_reports() -> None:
    """At 50,000 Pods the room per zone for every pending workload, every 5 s, held the bench's
    own loop (and so its watch timestamps) most of the time: the Nodes' use is summed once per
    report, for the ``limit`` groups shown."""
    from scripts.bench import _fleet_observe as obs
    from scripts.bench._fleet_observe import pending_why, pod_view

    class CRs:
        class store:  # noqa: N801 - the informer's attribute name
            @staticmethod
            def get(key: str) -> None:
                return None

    pods = [pod_view({"metadata": {"name": f"dep-{i:04d}-5cc7dd5bd9-aaaa{j}", "namespace": "f",
                                   "uid": f"u{i}-{j}"},
                      "spec": {"containers": [{"name": "a", "resources": {
                          "requests": {"cpu": "1"}}}]},
                      "status": {"phase": "Pending"}})
            for i in range(10) for j in range(i + 1)]
    calls = []
    real = obs.node_use

    def counting(*a: Any) -> Any:
        calls.append(1)
        return real(*a)

    obs.node_use = counting  # type: ignore[assignment]
    try:
        report = pending_why(pods, CRs(), [], limit=3)
    finally:
        obs.node_use = real  # type: ignore[assignment]
    assert [g["n"] for g in report] == [10, 9, 8]
    assert len(calls) == 1 and all("room" in g for g in report)


def test_matched_latencies_carry_windows_naming_their_objects() -> None:
    rec = reclaim_latencies([["r1", "n1,n2", 10.0, 12.5, 1]], lambda t: "churn")
    assert rec.windows["churn"] == [(("n1", "n2"), 10.0, 12.5)]
    # with the shard's Node -> machine map, a reclaim's window also names each Node's
    # UpcomingNode (the drain record is written on it before the ack)
    rec = reclaim_latencies([["r1", "n1,n2", 10.0, 12.5, 1]], lambda t: "churn",
                            machine_of_node={"n1": "m1"})
    assert rec.windows["churn"] == [(("n1", "n2", "un-m1"), 10.0, 12.5)]
    nsu = nsu_latencies([[1.0, "m1", "CREATING"]], {"m1": [(1.5, "Provisioning")]},
                        lambda t: "ramp")
    assert nsu.windows["ramp"] == [(("un-m1",), 1.0, 1.5)]
    pc = pod_cr_latencies({"u1": (1.0, "ramp")}, {"u1": 1.25}, {}, lambda uid: f"cr-{uid}")
    assert pc["ramp"]["windows"] == [(("cr-u1",), 1.0, 1.25)]


def test_plot_bins_latencies_by_start_and_cpu_as_cores() -> None:
    from scripts.bench._fleet_plot import binned, rates

    wins = [(("a",), 100.0, 101.0), (("b",), 101.0, 101.5), (("c",), 120.0, 124.0)]
    assert binned(wins, 100.0, 15.0) == [(7.5, 1.0, 1.0, 1.0), (22.5, 4.0, 4.0, 4.0)]
    assert rates([(0.0, 10.0, 1.0), (10.0, 11.0, 6.0)], 0.0) == [(10.0, 0.5)]


def test_plot_writes_a_png(tmp_path: Any) -> None:
    pytest.importorskip("matplotlib", reason=MATPLOTLIB_SKIP)
    from scripts.bench._fleet_plot import plot

    out = tmp_path / "run.png"
    plot(out, {"x -> y": [(("a",), 1.0, 1.2), (("b",), 20.0, 20.5)]},
         {"operator": [(0.0, 50.0, 0.0), (5.0, 55.0, 1.0), (30.0, 60.0, 4.0)]},
         [(0.0, "ramp"), (10.0, "churn")], "test")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pending_pods_are_grouped_by_workload_with_the_schedulers_message_and_the_crs_pin() -> (
        None):
    from bigfleet_trio.podcontroller.translate import cr_name_for_pod
    from scripts.bench._fleet_observe import pending_why, pod_view

    def pod(name: str, uid: str, *, node: str | None = None, msg: str | None = None,
            job: bool = False) -> dict[str, Any]:
        status: dict[str, Any] = {"phase": "Pending"}
        if msg:
            status["conditions"] = [{"type": "PodScheduled", "status": "False",
                                     "reason": "Unschedulable", "message": msg}]
        refs = [{"kind": "Job", "name": "j"}] if job else []
        return pod_view({"metadata": {"name": name, "namespace": "fleet-9", "uid": uid,
                                      "ownerReferences": refs},
                         "spec": {"nodeName": node} if node else {}, "status": status})

    pin = [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["sim-zone-c"]}]

    class Store:
        def get(self, key: str) -> dict[str, Any] | None:
            return ({"spec": {"requirements": pin}}
                    if key == f"fleet-9/{cr_name_for_pod('u1')}" else None)

    class CRs:
        store = Store()

    pods = [pod("dep-0009-5cc7dd5bd9-aaaaa", "u1", msg="0/76 nodes are available"),
            pod("dep-0009-5cc7dd5bd9-bbbbb", "u2"),
            pod("dep-0009-5cc7dd5bd9-ccccc", "u3", node="n1"),
            pod("sta-0016-7", "u4", msg="affinity"),
            pod("job-0003-xyz", "u5", job=True)]
    assert pending_why(pods, CRs()) == [
        {"workload": "fleet-9/dep-0009", "n": 2, "scheduler": "0/76 nodes are available",
         "cr_requirements": pin},
        {"workload": "fleet-9/sta-0016", "n": 1, "scheduler": "affinity"},
    ]


def test_pending_report_says_where_the_cluster_has_room_for_the_pod_per_zone() -> None:
    """Whether a pinned group's Pod is pending for room in its zone while other zones have
    it, or for room anywhere (fragmentation), is read off the per-zone figures."""
    from scripts.bench._fleet_observe import node_view, pending_why, pod_view

    def node(name: str, zone: str | None, cpu: str, *, cordoned: bool = False) -> dict[str, Any]:
        labels = {"topology.kubernetes.io/zone": zone} if zone else {}
        return node_view({"metadata": {"name": name, "labels": labels},
                          "spec": {"unschedulable": True} if cordoned else {},
                          "status": {"allocatable": {"cpu": cpu, "memory": "8Gi"}}})

    def pod(name: str, uid: str, cpu: str, node: str | None = None) -> dict[str, Any]:
        return pod_view({"metadata": {"name": name, "namespace": "fleet-1", "uid": uid},
                         "spec": {"nodeName": node, "containers": [
                             {"name": "a", "resources": {"requests": {"cpu": cpu}}},
                             {"name": "b"}]} if node else {"containers": [
                             {"name": "a", "resources": {"requests": {"cpu": cpu}}}]},
                         "status": {"phase": "Running" if node else "Pending"}})

    class CRs:
        class store:  # noqa: N801 - the informer's attribute name
            @staticmethod
            def get(key: str) -> None:
                return None

    nodes = [node("a1", "zone-a", "4"), node("a2", "zone-a", "4"), node("c1", "zone-c", "4"),
             node("c2", "zone-c", "4", cordoned=True), node("k", None, "2")]
    pods = [pod("dep-0001-5cc7dd5bd9-aaaaa", "u1", "1500m"),
            pod("dep-0002-5cc7dd5bd9-aaaaa", "u2", "3", node="a1"),
            pod("dep-0002-5cc7dd5bd9-bbbbb", "u3", "500m", node="a2"),
            pod("dep-0002-5cc7dd5bd9-ccccc", "u4", "3", node="c1")]
    [report] = pending_why(pods, CRs(), nodes)
    assert report["pod_cpu"] == 1.5
    # zone-a: 1 + 3.5 free, one node fits; zone-c: c1 has 1 free, c2 is cordoned (no room)
    assert report["room"] == {"zone-a": {"nodes": 2, "free_cpu": 4.5, "fit": 1},
                              "zone-c": {"nodes": 1, "free_cpu": 1.0, "fit": 0},
                              "": {"nodes": 1, "free_cpu": 2.0, "fit": 1}}
    # without nodes, no room figures (the report stays what it was)
    assert "room" not in pending_why(pods, CRs())[0]


def test_saturated_spans_are_where_every_worker_waited_on_the_apiserver() -> None:
    """Spans with at least ``workers`` of the named requests in flight; other requests (another
    resource, or a watch, which the trace does not record) do not count."""
    from scripts.bench._fleet_analysis import saturated_spans

    lines = [[0.0, 4.0, "POST", "/apis/g/v1/upcomingnodes", "un-a", 201],
             [1.0, 3.0, "PATCH", "/apis/g/v1/upcomingnodes/un-b", "un-b", 200],
             [2.0, 5.0, "PATCH", "/apis/g/v1/upcomingnodes/un-c", "un-c", 200],
             [2.5, 6.0, "PATCH", "/api/v1/pods/p", "p", 200],
             [3.0, 3.5, "PATCH", "/api/v1/nodes/n", "n", 200]]
    kinds = ("/upcomingnodes", "/nodes/")
    assert saturated_spans(lines, 2, kinds) == [(1.0, 4.0)]
    assert saturated_spans(lines, 3, kinds) == [(2.0, 3.5)]  # b ends at 3.0, the Node's starts
    assert saturated_spans(lines, 4, kinds) == []
    # an informer's LIST (no object named) is not a worker's request
    assert saturated_spans([*lines, [0.0, 9.0, "GET", "/apis/g/v1/upcomingnodes", "", 200]],
                           4, kinds) == []
    # one request ending as another starts: never both in flight
    assert saturated_spans([[0.0, 1.0, "PUT", "/x", "a", 200], [1.0, 2.0, "PUT", "/x", "b", 200]],
                           2, ("/x",)) == []


def test_queued_behind_the_server_is_the_wait_for_a_worker_while_all_were_at_the_server() -> None:
    """The part of the wait before the first request (a worker, a slot) during which every
    worker held a request the apiserver had not answered: the server's throughput, not the
    agent's work."""
    from scripts.bench._fleet_analysis import queued_behind_server, trace_index

    index = trace_index([[10.5, 10.8, "POST", "/apis/g/v1/upcomingnodes", "un-m", 201]])
    full = [(9.0, 10.1), (10.3, 10.4), (10.45, 12.0)]
    window = (("un-m",), 10.0, 11.0)
    # waited 10.0-10.5 for a worker; every worker at the server for 0.1 + 0.1 + 0.05 of it
    assert queued_behind_server([window], index, full) == [pytest.approx(0.25)]
    assert queued_behind_server([window], index, []) == [0.0]
    # no request inside the window: the whole window was the wait
    assert queued_behind_server([(("nobody",), 10.0, 11.0)], index, full) == [
        pytest.approx(0.1 + 0.1 + 0.55)]


def test_queued_behind_the_server_leaves_out_the_objects_own_requests() -> None:
    """A machine's earlier write still in flight when its next frame arrives is already the
    server's share of that latency (agent-own leaves it out); the saturated spans must not take
    the same seconds out a second time."""
    from scripts.bench._fleet_analysis import agent_own, queued_behind_server, trace_index

    index = trace_index([[9.5, 10.4, "POST", "/apis/g/v1/upcomingnodes", "un-m", 201],
                         [10.6, 10.8, "PATCH", "/apis/g/v1/upcomingnodes/un-m", "un-m", 200]])
    window = (("un-m",), 10.0, 11.0)
    full = [(9.0, 12.0)]
    # waited 10.0-10.6 for the next request; 10.0-10.4 was its own POST, already left out
    assert queued_behind_server([window], index, full) == [pytest.approx(0.2)]
    assert agent_own([window], index) == [pytest.approx(0.4)]


def test_before_the_operator_read_the_frame() -> None:
    """A NodeStateUpdate's wait until the operator's receive pump had the frame (the shard's send
    path and the connection): from the window's start to the first traced read of its machine's
    frame, less its own objects' requests then in flight; a read traced just before the shard's
    send timestamp counts as none."""
    from scripts.bench._fleet_analysis import before_read, frame_reads, trace_index

    reads = frame_reads([[10.3, "node_state_update", "m1"], [12.0, "node_state_update", "m1"],
                         [9.99, "node_state_update", "m2"], [10.0, "reclaim_instruction", "m3"]])
    assert reads == {"m1": [10.3, 12.0], "m2": [9.99]}
    index = trace_index([[9.0, 10.1, "PATCH", "/apis/g/v1/upcomingnodes/un-m1", "un-m1", 200]])
    windows = [(("un-m1",), 10.0, 11.0), (("un-m2",), 10.0, 11.0), (("un-m9",), 10.0, 11.0)]
    assert before_read(windows, reads, index) == [pytest.approx(0.2), 0.0, 0.0]
    # read just before the stamp, the machine's next frame read later in the window: the first
    # read is this frame's, not the next one's
    assert before_read([(("un-m2",), 10.0, 11.0)], {"m2": [9.99, 10.5]}, {}) == [0.0]
