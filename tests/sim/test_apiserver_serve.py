"""Serving over real sockets: ``serve`` in a nursery, the kubeconfig writer, and the
``python -m bigfleet_trio.sim.apiserver`` process stopping cleanly on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
import yaml

from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig
from bigfleet_trio.sim.apiserver.testing import CR_PATH, cr_body


async def test_serve_returns_url_and_streams_watch() -> None:
    api = ApiServer()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve, api)
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
        async with httpx.AsyncClient(base_url=url) as c:
            rv = (await c.get(CR_PATH)).json()["metadata"]["resourceVersion"]
            await c.post(CR_PATH, json=cr_body("a"))
            lines = []
            async with c.stream(
                "GET", CR_PATH, params={"watch": "1", "resourceVersion": rv}
            ) as resp:
                assert resp.headers["content-type"] == "application/json"
                async for line in resp.aiter_lines():
                    lines.append(json.loads(line))
                    break
            assert lines[0]["type"] == "ADDED"
        nursery.cancel_scope.cancel()


def test_write_kubeconfig(tmp_path: Path) -> None:
    p = tmp_path / "kc.yaml"
    write_kubeconfig("http://127.0.0.1:1234", str(p), token="t0k")
    cfg = yaml.safe_load(p.read_text())
    assert cfg["current-context"] == "bigfleet-sim"
    assert cfg["clusters"][0] == {
        "name": "bigfleet-sim",
        "cluster": {"server": "http://127.0.0.1:1234"},
    }
    assert cfg["users"][0] == {"name": "bigfleet-sim", "user": {"token": "t0k"}}
    assert cfg["contexts"][0]["context"]["cluster"] == "bigfleet-sim"


async def test_cli_process_serves_until_sigterm(tmp_path: Path) -> None:
    kc = tmp_path / "kc.yaml"
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            proc: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    [sys.executable, "-m", "bigfleet_trio.sim.apiserver", "0", str(kc)],
                    stdout=subprocess.PIPE,
                    check=False,
                )
            )
            assert proc.stdout is not None
            line = b""
            while b"\n" not in line:
                line += await proc.stdout.receive_some()
            assert b"kubeconfig written to" in line
            url = yaml.safe_load(kc.read_text())["clusters"][0]["cluster"]["server"]
            assert url in line.decode()
            async with httpx.AsyncClient(base_url=url) as c:
                names = [
                    n["metadata"]["name"]
                    for n in (await c.get("/api/v1/namespaces")).json()["items"]
                ]
                assert "default" in names
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0


async def _raw(url: str, data: bytes, *, until: bytes = b"\r\n\r\n", close: bool = True) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(data)
    out = b""
    with trio.fail_after(5):
        while True:
            chunk = await stream.receive_some()
            if not chunk:
                break
            out += chunk
            if until and until in out and not close:
                break
    await stream.aclose()
    return out


async def test_fast_engine_raw_http() -> None:
    api = ApiServer()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            lambda task_status: serve(api, engine="fast", task_status=task_status)
        )
        # malformed request line -> 400 and close
        assert (await _raw(url, b"GARBAGE\r\n\r\n")).startswith(b"HTTP/1.1 400")
        # chunked request body + Connection: close
        body = json.dumps(cr_body("chunky")).encode()
        req = (
            (
                f"POST {CR_PATH} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                "transfer-encoding: chunked\r\n"
                f"connection: close\r\n\r\n{len(body):x}\r\n"
            ).encode()
            + body
            + b"\r\n0\r\n\r\n"
        )
        out = await _raw(url, req)
        assert out.startswith(b"HTTP/1.1 201 Created") and b'"name":"chunky"' in out
        # two pipelined keep-alive requests, the second closing
        two = (
            b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
            b"GET /version HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        out = await _raw(url, two)
        assert out.count(b"HTTP/1.1 200 OK") == 2 and b"gitVersion" in out
        # Expect: 100-continue
        req = (
            f"POST {CR_PATH} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            "expect: 100-continue\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        ).encode() + body
        out = await _raw(url, req)
        assert out.startswith(b"HTTP/1.1 100 Continue") and b"409 Conflict" in out
        # a client hanging up on a watch unregisters the watcher
        bucket = api.store.bucket(api.find("cr"))
        out = await _raw(
            url,
            f"GET {CR_PATH}?watch=1&resourceVersion=1 HTTP/1.1\r\nhost: x\r\n\r\n".encode(),
            until=b"chunked",
            close=False,
        )
        assert b"transfer-encoding: chunked" in out
        with trio.fail_after(5):
            # The server drops the watcher when it notices the hang-up; it exposes no event.
            while bucket.watchers:  # noqa: ASYNC110
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


async def test_client_hangup_unregisters_watch_on_both_engines() -> None:
    for engine in ("hypercorn", "fast"):
        api = ApiServer()
        bucket = api.store.bucket(api.find("cr"))
        async with trio.open_nursery() as nursery:
            url = await nursery.start(
                lambda task_status, e=engine, a=api: serve(a, engine=e, task_status=task_status)
            )
            async with httpx.AsyncClient(base_url=url) as c:
                async with c.stream(
                    "GET", CR_PATH, params={"watch": "1", "resourceVersion": "1"}
                ) as resp:
                    assert resp.status_code == 200
                    assert len(bucket.watchers) == 1
            with trio.fail_after(5):
                # The server drops the watcher when it notices the hang-up; it exposes no event.
                while bucket.watchers:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()


async def test_cli_rbac_mode_serves_https_with_admin_kubeconfig(tmp_path: Path) -> None:
    from bigfleet_trio.kube.client import KubeClient
    from bigfleet_trio.kube.config import load_kubeconfig
    from bigfleet_trio.kube.errors import ApiError as KubeApiError
    from bigfleet_trio.kube.resources import NAMESPACES

    kc = tmp_path / "kc.yaml"
    argv = [sys.executable, "-m", "bigfleet_trio.cli", "sim", "apiserver", "--port", "0",
            "--kubeconfig-out", str(kc), "--authorization-mode", "RBAC"]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            proc: trio.Process = await nursery.start(
                partial(trio.run_process, argv, stdout=subprocess.PIPE, check=False)
            )
            assert proc.stdout is not None
            line = b""
            while b"\n" not in line:
                line += await proc.stdout.receive_some()
            assert b"(authorization mode RBAC, admin token)" in line
            cfg = load_kubeconfig(str(kc), env={})
            assert cfg.server.startswith("https://127.0.0.1:") and cfg.ca_data and cfg.token
            admin = KubeClient(cfg)
            try:
                names = [n["metadata"]["name"] for n in (await admin.list(NAMESPACES)).items]
                assert "default" in names
            finally:
                await admin.aclose()
            anonymous = KubeClient(load_kubeconfig(str(kc), env={}))
            anonymous.config.token = None
            try:
                await anonymous.list(NAMESPACES)
                raise AssertionError("anonymous list was allowed")
            except KubeApiError as exc:
                assert exc.status == 403
            finally:
                await anonymous.aclose()
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0


def test_rbac_mode_without_trustme_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from bigfleet_trio.sim.apiserver import run_cli

    monkeypatch.setitem(sys.modules, "trustme", None)  # import trustme -> ImportError
    assert run_cli(0, str(tmp_path / "kc.yaml"), authorization_mode="RBAC") == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "sim apiserver: serving TLS (--authorization-mode RBAC) needs trustme: pip install "
        "'bigfleet-trio[test]'"
    ]
    assert run_cli(0, str(tmp_path / "kc.yaml"), authorization_mode="Webhook") == 1
    assert capsys.readouterr().err.splitlines() == [
        "sim apiserver: --authorization-mode must be one of AlwaysAllow, RBAC"
    ]
