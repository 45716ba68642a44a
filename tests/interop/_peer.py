"""The interop tier's harness: the Go shard peer (``interop/goshard``, grpc-go + protobuf-go),
the ``sim apiserver`` and the real ``bigfleet-trio operator`` process, each a real process on
loopback (docs/wire.md#go-interop).

The peer writes one JSON object per line to its record file: every uplink frame as protobuf-go
decoded it (``t: "up"``: kind, ``frame`` in protobuf JSON, raw bytes and whether protobuf-go's
re-encoding is byte-identical), the frames it sent (``t: "down"``), HTTP/2 PINGs and GOAWAYs
seen on the connection, session opens and ends with their gRPC status.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import load_kubeconfig
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
BIN = str(Path(sys.executable).parent / "bigfleet-trio")
GO = shutil.which("go")
#: CI sets this: a missing Go toolchain fails the tier instead of skipping it.
REQUIRE_GO = bool(os.environ.get("BIGFLEET_REQUIRE_GO"))
NO_GO = "no Go toolchain (`go` not on PATH; BIGFLEET_REQUIRE_GO=1 fails instead)"
BUILDING = "interop tier: building the Go shard peer (scripts/build-goshard) into"

Record = dict[str, Any]


def build_goshard(announce: Callable[[str], None] = print) -> str:
    """Build (or reuse) the peer with ``scripts/build-goshard``; returns the binary's path.

    ``BIGFLEET_GOSHARD_BIN`` names a prebuilt binary instead (``.ci/run`` builds it first). A
    build (nothing cached for this toolchain and source) is announced with one line through
    ``announce`` first: it takes a minute or more, into a cache outside the repository.
    """
    prebuilt = os.environ.get("BIGFLEET_GOSHARD_BIN")
    if prebuilt:
        return prebuilt
    script = str(REPO / "scripts" / "build-goshard")
    path = subprocess.run([script, "--path"], capture_output=True, text=True, timeout=120,
                          check=False).stdout.strip()
    if not (path and os.access(path, os.X_OK)):
        announce(f"{BUILDING} {path or 'the cache'} (set BIGFLEET_GOSHARD_BIN to use a built one)")
    out = subprocess.run([script], capture_output=True, text=True, timeout=1200)
    if out.returncode != 0:
        pytest.fail(f"scripts/build-goshard failed:\n{out.stderr}")
    return out.stdout.strip().splitlines()[-1]


class Procs:
    """Real processes of one test, each logging to ``<tmp>/<name>.log``."""

    def __init__(self, tmp: Path, nursery: trio.Nursery) -> None:
        self.tmp = tmp
        self.nursery = nursery
        self.procs: list[trio.Process] = []

    async def start(self, name: str, *argv: str) -> trio.Process:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115, ASYNC230 - a local file
        proc: trio.Process = await self.nursery.start(
            partial(trio.run_process, list(argv), stdout=log, stderr=log, check=False)
        )
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""  # noqa: ASYNC240

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted(self.tmp.glob("*.log"))
        )

    async def stop(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                proc.terminate()
        with trio.move_on_after(15):
            for proc in self.procs:
                await proc.wait()
        for proc in self.procs:
            if proc.returncode is None:
                proc.kill()


class GoPeer:
    """The running Go peer: its address and its record file."""

    def __init__(self, procs: Procs, name: str, record: Path) -> None:
        self.procs = procs
        self.name = name
        self.record = record
        self.addr = ""

    def records(self, t: str | None = None, **match: Any) -> list[Record]:
        out = []
        if not self.record.exists():
            return out
        for line in self.record.read_text().splitlines():  # noqa: ASYNC240 - a local file
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line still being written
            if (t is None or rec.get("t") == t) and all(rec.get(k) == v for k, v in match.items()):
                out.append(rec)
        return out

    def uplink(self, kind: str | None = None, session: int | None = None) -> list[Record]:
        return [
            r for r in self.records("up")
            if (kind is None or r["kind"] == kind) and (session is None or r["session"] == session)
        ]


async def until(procs: Procs, what: str, check: Callable[[], Any], seconds: float = 60.0) -> None:
    """Poll ``check`` (plain or async) until true; fail with every process's log tail."""
    with trio.move_on_after(seconds):
        while True:
            got = check()
            if hasattr(got, "__await__"):
                got = await got
            if got:
                return
            await trio.sleep(0.2)
    pytest.fail(f"timed out after {seconds}s waiting for {what}\n{procs.logs()}")


async def start_peer(
    procs: Procs, binary: str, script: dict[str, Any] | None = None, *flags: str,
    name: str = "goshard",
) -> GoPeer:
    """Start the peer in server mode with ``script``; returns once it listens."""
    record = procs.tmp / f"{name}.jsonl"
    ready = procs.tmp / f"{name}.addr"
    argv = [binary, "-listen", "127.0.0.1:0", "-ready-file", str(ready), "-record", str(record)]
    if script is not None:
        path = procs.tmp / f"{name}.script.json"
        path.write_text(json.dumps(script))  # noqa: ASYNC240 - a local file
        argv += ["-script", str(path)]
    peer = GoPeer(procs, name, record)
    await procs.start(name, *argv, *flags)
    await until(procs, "the Go peer listening", ready.exists, 60)
    peer.addr = ready.read_text().strip()  # noqa: ASYNC240 - a local file
    return peer


class World:
    """``sim apiserver`` + the Go peer + the real operator, with a client for the apiserver."""

    def __init__(self, procs: Procs, peer: GoPeer, client: KubeClient, kubeconfig: str) -> None:
        self.procs = procs
        self.peer = peer
        self.client = client
        self.kubeconfig = kubeconfig
        self.operator: trio.Process | None = None

    async def start_operator(self, cluster_id: str = "c1", *flags: str) -> trio.Process:
        self.operator = await self.procs.start(
            "operator", *operator_argv(self.kubeconfig, self.peer.addr, cluster_id, *flags)
        )
        return self.operator

    def operator_log(self) -> str:
        return self.procs.log("operator")

    async def until(self, what: str, check: Callable[[], Any], seconds: float = 60.0) -> None:
        await until(self.procs, what, check, seconds)


def operator_argv(kubeconfig: str, shard_addr: str, cluster_id: str, *flags: str) -> list[str]:
    """The real operator binary, diagnostics on free ports, fast roll-ups and redials."""
    return [BIN, "operator", "--kubeconfig", kubeconfig, "--cluster-id", cluster_id,
            "--shard-addr", shard_addr, "--metrics-addr", f"127.0.0.1:{free_port()}",
            "--rollup-interval", "1s", "--reconnect-initial-backoff", "200ms",
            "--reconnect-max-backoff", "1s", *flags]


@asynccontextmanager
async def world(
    tmp: Path, binary: str, script: dict[str, Any] | None = None, *,
    peer_flags: tuple[str, ...] = (), operator_flags: tuple[str, ...] = (),
    cluster_id: str = "c1", start_operator: bool = True,
) -> AsyncIterator[World]:
    """Start the apiserver and the peer (and the operator unless ``start_operator`` is False);
    stop every process on the way out."""
    kubeconfig = str(tmp / "sim.kubeconfig")
    async with trio.open_nursery() as nursery:
        procs = Procs(tmp, nursery)
        try:
            await procs.start("apiserver", BIN, "sim", "apiserver", "--port", "0",
                              "--kubeconfig-out", kubeconfig)
            await until(procs, "the apiserver's kubeconfig", lambda: os.path.exists(kubeconfig))
            peer = await start_peer(procs, binary, script, *peer_flags)
            async with KubeClient(load_kubeconfig(kubeconfig, env={})) as client:
                w = World(procs, peer, client, kubeconfig)
                if start_operator:
                    await w.start_operator(cluster_id, *operator_flags)
                yield w
        finally:
            await procs.stop()
            nursery.cancel_scope.cancel()
