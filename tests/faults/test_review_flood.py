"""A flood of unseen bearer tokens on /metrics, while the apiserver answers every TokenReview
with 429 and a long Retry-After, does not delay the pod controller's Lease renewals: leader
election has a client of its own, and the authn/authz reviews are bounded
(docs/crds.md#diagnostics-access, docs/rules.md#leadership-loss).

A real pod-controller process against the embedded apiserver over real sockets, with short
leader-election timings (lease 3 s, renew deadline 2 s, retry 0.5 s); real time under
``trio.fail_after``. With one shared client, the first 429 holds every request of the client,
renewals included, for the Retry-After (3 s): the renewal misses its 2 s deadline and the
controller loses the Lease.
"""

from __future__ import annotations

import datetime as dt
import secrets
import subprocess
import sys
from pathlib import Path

import httpx
import trio

from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig
from tests.support.ports import free_port

LEASE = "bigfleet-unschedulable-pod-controller"
NS = "default"


def _renew_time(server: ApiServer) -> tuple[dt.datetime, int] | None:
    try:
        lease = server.get(server.find("leases"), NS, LEASE)
    except Exception:  # noqa: BLE001 - not created yet
        return None
    spec = lease.get("spec") or {}
    raw = spec.get("renewTime")
    if not raw:
        return None
    when = dt.datetime.strptime(raw, "%Y-%m-%dT%H:%M:%S.%fZ")
    return when, int(spec.get("leaseTransitions") or 0)


async def _flood(port: int, stop: trio.Event, sent: list[int]) -> None:
    async with httpx.AsyncClient(verify=False, timeout=10) as http:  # noqa: S501 - self-signed
        async def one() -> None:
            while not stop.is_set():
                token = secrets.token_hex(16)
                try:
                    await http.get(f"https://127.0.0.1:{port}/metrics",
                                   headers={"Authorization": f"Bearer {token}"})
                except httpx.HTTPError:
                    pass
                sent[0] += 1

        async with trio.open_nursery() as nursery:
            for _ in range(16):
                nursery.start_soon(one)


async def test_token_flood_with_throttled_reviews_keeps_renewals_on_time(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = ApiServer()
    url = await nursery.start(serve, server)
    kc = tmp_path / "kubeconfig"
    write_kubeconfig(url, str(kc))
    server.faults.fail_next(10**6, code=429, verb="create", resource="tokenreviews",
                            retry_after=3)
    port = free_port()
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "bigfleet_trio", "pod-controller", "--kubeconfig", str(kc),
         "--metrics-addr", f"127.0.0.1:{port}", "--metrics-auth", "--leader-elect",
         "--leader-election-namespace", NS, "--leader-elect-lease-duration", "3s",
         "--leader-elect-renew-deadline", "2s", "--leader-elect-retry-period", "500ms",
         "--log-level", "warning"],
        stderr=subprocess.DEVNULL)
    try:
        with trio.fail_after(40):
            while _renew_time(server) is None:  # noqa: ASYNC110 - another process writes it
                await trio.sleep(0.05)
            stop, sent = trio.Event(), [0]
            samples: list[tuple[float, dt.datetime, int]] = []
            async with trio.open_nursery() as inner:
                inner.start_soon(_flood, port, stop, sent)
                end = trio.current_time() + 6.0
                while trio.current_time() < end:
                    got = _renew_time(server)
                    assert got is not None
                    samples.append((trio.current_time(), *got))
                    await trio.sleep(0.1)
                stop.set()
        assert sent[0] > 50, sent  # the flood ran
        assert server.counters.total("create", "tokenreviews") > 0  # and reached the apiserver
        # No leadership change: the one replica never lost its Lease and took it again.
        assert {s[2] for s in samples} == {samples[0][2]}, samples
        # Renewed on time throughout: renewTime never stood still for the renew deadline.
        changes = [samples[0][0]] + [b[0] for a, b in zip(samples, samples[1:], strict=False)
                                     if b[1] != a[1]]
        gaps = [b - a for a, b in zip(changes, changes[1:], strict=False)]
        assert gaps and max(gaps) < 1.9, gaps
        assert samples[-1][0] - changes[-1] < 1.9
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
