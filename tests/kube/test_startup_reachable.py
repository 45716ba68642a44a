"""A dead apiserver ends the start in one short line naming the address and the fix, within
about 30 s (``kube.startup.check_reachable``), instead of retrying for the whole
``--sync-timeout``; a slow but alive server is not refused
(docs/operate.md#dead-apiserver-at-start)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio

from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.startup import (
    REACH_BUDGET,
    Unauthenticated,
    Unreachable,
    check_reachable,
)
from tests.support.ports import free_port

SERVER = "https://10.0.0.1:6443"


def _refused(request: httpx.Request) -> httpx.Response:
    try:
        raise ConnectionRefusedError(111, "Connection refused")
    except ConnectionRefusedError as exc:
        raise httpx.ConnectError("all attempts to connect failed", request=request) from exc


async def test_refused_every_time_is_one_line_within_the_budget(
    autojump_clock: trio.abc.Clock,
) -> None:
    start = trio.current_time()
    with pytest.raises(Unreachable) as caught:
        await check_reachable(KubeConfig(server=SERVER), transport=httpx.MockTransport(_refused))
    assert str(caught.value) == (
        f"cannot reach the Kubernetes API server at {SERVER}: connection refused; check "
        "--kubeconfig and that the server is up")
    assert trio.current_time() - start <= REACH_BUDGET


async def test_refused_then_up_returns(autojump_clock: trio.abc.Clock) -> None:
    calls: list[str] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) < 3:
            return _refused(request)
        return httpx.Response(404)  # any answer means the server is up

    await check_reachable(KubeConfig(server=SERVER), transport=httpx.MockTransport(flaky))
    assert calls == ["/version"] * 3


class _Slow(httpx.AsyncBaseTransport):
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await trio.sleep(10 * REACH_BUDGET)
        return httpx.Response(200, json={})


async def test_a_slow_server_is_alive(autojump_clock: trio.abc.Clock) -> None:
    start = trio.current_time()
    await check_reachable(KubeConfig(server=SERVER), transport=_Slow())
    assert trio.current_time() - start == pytest.approx(REACH_BUDGET)


async def test_a_401_is_the_credentials_line(autojump_clock: trio.abc.Clock) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"kind": "Status", "message": "Unauthorized",
                                         "reason": "Unauthorized", "code": 401})

    with pytest.raises(Unauthenticated, match="^401 Unauthorized: .*check the kubeconfig"):
        await check_reachable(KubeConfig(server=SERVER), transport=httpx.MockTransport(refuse))


@pytest.mark.parametrize("binary", ["operator", "pod-controller"])
def test_binary_against_a_closed_port_exits_1_with_one_line(binary: str, tmp_path: Path) -> None:
    port = free_port()  # bound, then closed: nothing listens there
    server = f"https://127.0.0.1:{port}"
    kc = tmp_path / "kc"
    kc.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: '{server}', "
        "insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n")
    extra = ["--cluster-id", "c1", "--shard-addr", "127.0.0.1:1"] if binary == "operator" else []
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "bigfleet_trio", binary, "--kubeconfig", str(kc),
         "--metrics-addr", "0", *extra], capture_output=True, text=True, timeout=50)
    assert time.monotonic() - started < 45
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"{binary}: cannot reach the Kubernetes API server at {server}: connection refused; "
        "check --kubeconfig and that the server is up")
    assert "Traceback" not in proc.stderr
