"""The ``pod-controller`` process: startup errors are one line + exit 1 (through the CLI, as
the operator's); against the embedded apiserver it turns Pods into CRs, serves /readyz, and
exits 0 on SIGTERM. Real sockets and a real child process, so real time under ``trio.fail_after``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from bigfleet_trio import cli
from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import load_kubeconfig
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, PODS
from bigfleet_trio.podcontroller.app import leader_identity
from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig
from tests.support.ports import free_port


def test_bad_defaults_file_is_one_line_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "defaults.yaml"
    bad.write_text("gold: {interruptionPenalty: 5}\n")
    rc = cli.main(["pod-controller", "--priority-class-defaults", str(bad)])
    err = capsys.readouterr().err.splitlines()
    assert rc == 1
    assert err[-1].startswith("pod-controller: priority-class-defaults:")
    assert not any("Traceback" in ln for ln in err)


def test_missing_kubeconfig_is_one_line_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = cli.main(["pod-controller", "--kubeconfig", str(tmp_path / "nope"),
                   "--metrics-addr", "0"])
    err = capsys.readouterr().err.splitlines()
    assert rc == 1
    assert err[-1].startswith("pod-controller: kubeconfig ")


def test_leader_identity_is_unique(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "upc-7d9f")
    a, b = leader_identity(), leader_identity()
    assert a.startswith("upc-7d9f_") and b.startswith("upc-7d9f_") and a != b




def _cmd(kubeconfig: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "bigfleet_trio", "pod-controller", "--kubeconfig",
            str(kubeconfig), *extra]


async def test_process_end_to_end_and_sigterm(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = ApiServer()
    url = await nursery.start(serve, server)
    kc = tmp_path / "kubeconfig"
    write_kubeconfig(url, str(kc))
    port = free_port()
    proc = await trio.lowlevel.open_process(
        _cmd(kc, "--metrics-addr", f"127.0.0.1:{port}", "--log-level", "warning"),
        stderr=subprocess.PIPE)
    try:
        with trio.fail_after(30):
            async with KubeClient(load_kubeconfig(str(kc), env={})) as client, \
                    httpx.AsyncClient() as http:
                created = await client.create(PODS, {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "p", "namespace": "default"},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
                name = "cr-" + created["metadata"]["uid"]
                while True:
                    try:
                        r = await http.get(f"http://127.0.0.1:{port}/readyz")
                        if r.status_code == 200:
                            # no --leader-elect: nothing says "leader"
                            assert r.json()["detail"] == ["synced, workers running"]
                            break
                    except httpx.TransportError:
                        pass
                    await trio.sleep(0.05)
                while True:
                    items = (await client.list(CAPACITY_REQUESTS, "default")).items
                    if items and (items[0].get("status") or {}).get("phase") == "Pending":
                        break
                    await trio.sleep(0.05)
                assert [i["metadata"]["name"] for i in items] == [name]
                metrics = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
                assert ('bigfleet_unschedulable_pod_controller_reconciles_total'
                        '{outcome="cr_created"} 1.0') in metrics
                assert "bigfleet_operator_" not in metrics  # only this binary's families
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_process_dead_apiserver_exit_1(tmp_path: Path) -> None:
    # nothing listens there: the reachability check, bounded by --sync-timeout, says so
    server = f"http://127.0.0.1:{free_port()}"
    kc = tmp_path / "kubeconfig"
    write_kubeconfig(server, str(kc))
    with trio.fail_after(30):
        result = await trio.run_process(
            _cmd(kc, "--metrics-addr", "0", "--sync-timeout", "1s", "--log-level", "error"),
            capture_stderr=True, check=False)
    assert result.returncode == 1
    err = result.stderr.decode()
    (line,) = err.splitlines()
    assert line == (f"pod-controller: cannot reach the Kubernetes API server at {server}: "
                    "connection refused; check --kubeconfig and that the server is up")


def test_pod_controller_readiness_says_leader_only_with_a_lease() -> None:
    from bigfleet_trio.podcontroller.app import pod_controller_readiness

    class Ctl:
        def readiness(self) -> tuple[bool, str]:
            return True, "leader"

    ctl: object = Ctl()
    assert pod_controller_readiness(ctl, leader_elect=False) == (  # type: ignore[arg-type]
        True, "synced, workers running")
    assert pod_controller_readiness(ctl, leader_elect=True) == (True, "leader")  # type: ignore[arg-type]
