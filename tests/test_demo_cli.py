"""``bigfleet-trio demo`` output contract: --json is pure JSON on stdout (progress on stderr), a
failed run keeps what it last observed and says why in one line, the demo serves diagnostics and
names them in the --keep-running banner."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from bigfleet_trio import cli
from bigfleet_trio.knobs import ConfigError
from bigfleet_trio.sim import demo
from bigfleet_trio.sim.demo_options import DemoOptions

pytestmark = pytest.mark.usefixtures("restore_root_logging")  # tests/conftest.py

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: nginx:1.27
        resources: {requests: {cpu: %s, memory: 64Mi}}
"""


def test_failure_line_is_one_plain_line() -> None:
    line = demo.failure_line(90, "scale-up", "3 Pods not bound to a node")
    assert line == ("not done after 90s while waiting for every Pod to get a machine and be "
                    "bound: 3 Pods not bound to a node")
    assert demo.failure_line(5, "apply", None) == (
        "not done after 5s while applying the workloads: no progress observed")


def test_summary_and_banner_name_the_diagnostics() -> None:
    s = demo.DemoSummary(kubeconfig="/tmp/kc", diagnostics="127.0.0.1:4242")
    table = demo.render_summary(s, live=True)  # --keep-running: the listener still serves
    assert "http://127.0.0.1:4242/metrics" in table and "ws://127.0.0.1:4242/events" in table
    assert "http://127.0.0.1:4242/metrics" not in demo.render_summary(s)  # the run is over
    assert "time to all Pods bound           -" in table  # not reached: no made-up 0.0s
    out = io.StringIO()
    demo.print_keep_running_banner(s, out)
    text = out.getvalue()
    assert "export KUBECONFIG=/tmp/kc" in text
    for url in ("http://127.0.0.1:4242/metrics", "http://127.0.0.1:4242/healthz",
                "http://127.0.0.1:4242/readyz"):
        assert url in text
    assert "events --addr 127.0.0.1:4242" in text


def test_demo_metrics_addr_validated() -> None:
    assert DemoOptions().metrics_addr == "127.0.0.1:0"
    DemoOptions(metrics_addr="0").validate()
    with pytest.raises(ConfigError, match="^--metrics-addr: invalid address 'x'"):
        DemoOptions(metrics_addr="x").validate()


@pytest.mark.slow
def test_json_without_quiet_is_pure_json_on_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "web.yaml").write_text(DEPLOYMENT % "100m")
    rc = cli.main(["demo", "--workloads", str(tmp_path), "--json", "--timeout", "60s",
                   "--clusters", "1"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    s = json.loads(captured.out)  # the whole of stdout is one JSON document
    assert s["ok"] is True and s["pods_created"] == 2
    assert "applied 1 objects" in captured.err  # progress went to stderr
    assert "diagnostics    http://" + s["diagnostics"] + "/metrics" in captured.err


@pytest.mark.slow
def test_failed_demo_keeps_last_observed_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 2 Pods asking for more CPU than any machine has: CRs appear, no machine ever fits them
    (tmp_path / "web.yaml").write_text(DEPLOYMENT % "100000")
    rc = cli.main(["demo", "--workloads", str(tmp_path), "--quiet", "--json", "--timeout", "8s",
                   "--clusters", "1"])
    captured = capsys.readouterr()
    assert rc == 1
    s = json.loads(captured.out)
    assert s["ok"] is False
    assert s["pods_created"] == 2 and s["crs"] == 2  # what the live lines showed, not 0
    assert s["failure"].startswith("not done after 8s while waiting for every Pod to get a "
                                   "machine and be bound: ")
    # stderr: the shard's shortfall warnings, then the one line that says why
    assert captured.err.splitlines()[-1] == f"demo: did not converge: {s['failure']}"


def test_bad_workload_manifest_is_one_line_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ok.yaml").write_text(DEPLOYMENT % "100m")
    (tmp_path / "bad.yaml").write_text("kind: Pod\nmetadata: {name: x\nspec: {}\n")
    assert cli.main(["demo", "--workloads", str(tmp_path), "--quiet"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"demo: {tmp_path / 'bad.yaml'}:3:5: invalid YAML: ")
    assert len(captured.err.splitlines()) == 1
    (tmp_path / "bad.yaml").write_text("- a\n")
    assert demo.check_workloads(str(tmp_path)) == (
        f"{tmp_path / 'bad.yaml'}: document is not an object: ['a']")



@pytest.mark.slow
@pytest.mark.parametrize("phase", ["start-up", "scale-up", "reclaim"])
async def test_ctrl_c_in_any_phase_is_one_line_and_exit_130(phase: str) -> None:
    """SIGINT to a real ``bigfleet-trio demo`` process once it prints the phase's first line:
    exit 130 and one line on stderr, no traceback."""
    import os
    import signal
    import sys

    import trio

    marker = {"start-up": "apiserver ", "scale-up": "] scale-up", "reclaim": "] reclaim"}[phase]
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "bigfleet_trio", "demo"], stdout=-1, stderr=-1,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None and proc.stderr is not None
    err = bytearray()

    async def drain_stderr() -> None:
        assert proc.stderr is not None
        async for chunk in proc.stderr:
            err.extend(chunk)

    try:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(drain_stderr)
                seen = b""
                async for chunk in proc.stdout:
                    seen += chunk
                    if marker.encode() in seen:
                        proc.send_signal(signal.SIGINT)
                        break
                async for _ in proc.stdout:
                    pass
                rc = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = err.decode()
    assert rc == 130, text
    assert "Traceback" not in text, text
    assert text.splitlines()[-1] == "demo: interrupted by SIGINT; everything it started has stopped"
    assert len([ln for ln in text.splitlines() if ln.strip()]) == 1, text


def test_workloads_that_are_not_kubernetes_objects_name_file_and_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ok.yaml").write_text(DEPLOYMENT % "100m")
    (tmp_path / "values.yaml").write_text("---\nreplicaCount: 3\nimage: {tag: x}\n")
    assert cli.main(["demo", "--workloads", str(tmp_path), "--quiet"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (f"demo: {tmp_path / 'values.yaml'}: document 1 of 1: not a Kubernetes "
                    "object (no apiVersion or kind; top-level keys: image, replicaCount)")
    (tmp_path / "values.yaml").write_text(DEPLOYMENT % "1" + "---\nkind: Pod\napiVersion: v1\n")
    assert demo.check_workloads(str(tmp_path)) == (
        f"{tmp_path / 'values.yaml'}: document 2 of 2: Pod without metadata.name")


def test_an_empty_workloads_directory_fails_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "README.md").write_text("not a manifest")
    assert cli.main(["demo", "--workloads", str(tmp_path), "--quiet"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"demo: --workloads: {tmp_path}: no Kubernetes manifests there")


def test_summary_explains_idle_machines_and_recreated_pods() -> None:
    from bigfleet_trio.sim.demo_render import render_summary
    from bigfleet_trio.sim.demo_world import DemoSummary

    text = render_summary(DemoSummary(ok=True, pods_replaced=2))
    assert "2 (the drain evicted them; their controllers made new ones" in text
    assert "idle = warm in the shard's pool, bound to no cluster" in text
    zero = render_summary(DemoSummary(ok=True, pods_replaced=0))
    assert "0 (the drained machines held no Pods" in zero
    assert "the drain evicted them" not in zero


def test_summary_names_the_diagnostics_urls_only_while_they_serve() -> None:
    from bigfleet_trio.sim.demo_render import render_summary
    from bigfleet_trio.sim.demo_world import DemoSummary

    s = DemoSummary(ok=True, diagnostics="127.0.0.1:9")
    assert "http://127.0.0.1:9/metrics" not in render_summary(s)  # the run is over
    assert "http://127.0.0.1:9/metrics" in render_summary(s, live=True)  # --keep-running


def test_the_demo_binder_reports_a_running_pod_as_kubelet_does() -> None:
    from bigfleet_trio.sim.binder import PodAddresses, running_status

    ips = PodAddresses()
    host, pod_ip = ips.next("n1")
    status = running_status([("c", "busybox")], host, pod_ip, "2026-11-28T00:00:00Z")
    assert status["podIP"] == pod_ip and status["hostIP"] == host
    assert [c["ready"] for c in status["containerStatuses"]] == [True]  # READY 1/1
    assert ips.next("n1")[1] != pod_ip and ips.next("n2")[0] != host


@pytest.mark.slow
def test_json_summary_has_no_kubeconfig_that_is_gone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "web.yaml").write_text(DEPLOYMENT % "100m")
    assert cli.main(["demo", "--workloads", str(tmp_path), "--json", "--quiet",
                     "--timeout", "60s"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["kubeconfig"] is None  # its temporary directory was removed at exit


def test_a_quantity_kube_apiserver_refuses_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "web.yaml").write_text(DEPLOYMENT % "100m" + "---\n" + DEPLOYMENT % "lots")
    assert cli.main(["demo", "--workloads", str(tmp_path), "--quiet"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line == (
        f"demo: {tmp_path / 'web.yaml'}: document 2 of 2: Deployment web: "
        "spec.template.spec.containers[0].resources.requests[cpu]: quantities must match the "
        "regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' (kube-apiserver "
        "refuses it: 400 BadRequest)")
    (tmp_path / "web.yaml").write_text(DEPLOYMENT % "-1")
    assert demo.check_workloads(str(tmp_path)) == (
        f"{tmp_path / 'web.yaml'}: document 1 of 1: Deployment web: "
        "spec.template.spec.containers[0].resources.requests[cpu]: Invalid value: \"-1\": must "
        "be greater than or equal to 0 (kube-apiserver refuses it: 422 Invalid)")
