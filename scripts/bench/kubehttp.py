"""``bench kubehttp``: client CPU per request on kube-apiserver with TLS, HTTP/1.1 against HTTP/2.

The pod controller's I/O per Pod is two writes (create the CapacityRequest, stamp its status),
and a profile puts most of its CPU in the HTTP stack under them
(docs/benchmarks/kube-protobuf.md). This measures that stack alone, on the real control plane
(``python -m scripts.realkube build``), with the same work per "Pod": POST a ConfigMap of about
1 KiB, then merge-patch it, from ``--workers`` concurrent tasks. Per round, in rotated order:

* ``ours``: :meth:`bigfleet_trio.kube.transport.KeepAlivePool.round_trip`, the agent's path
  (HTTP/1.1, one write per request, our keep-alive pool);
* ``httpcore-h1``: httpcore's own connection pool on its Trio backend, HTTP/1.1 only;
* ``httpcore-h2``: the same pool with HTTP/2 only (the ``h2`` library, installed for grpclib):
  one TLS connection, the workers' requests multiplexed on it. Every answer is checked to be
  HTTP/2.

Figures: process CPU (ours, not the server's) per request and kube-apiserver's CPU per request
over the same interval, each stack against ``ours`` in the same run. Without the binaries the
scenario reports the skip.
"""

from __future__ import annotations

import argparse
import ssl
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.bench import _common as C

NAMESPACE = "bench-kubehttp"
_STACKS = ("ours", "httpcore-h1", "httpcore-h2")


def _configmap(name: str) -> bytes:
    import orjson

    return orjson.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": name, "namespace": NAMESPACE,
                                      "labels": {"app": "bench-kubehttp"}},
                         "data": {"spec": "x" * 900}})


async def _run_stack(stack: str, kubeconfig: str, pods: int, workers: int, prefix: str,
                     ) -> tuple[float, float]:
    """``pods`` (POST + PATCH) pairs on ``stack``; returns (wall seconds, process CPU seconds).

    Raises:
        RuntimeError: an answer other than 201/200, or not HTTP/2 on the HTTP/2 stack.
    """
    import httpcore
    import httpx
    import trio

    from bigfleet_trio.kube.config import load_kubeconfig
    from bigfleet_trio.kube.request import authorization
    from bigfleet_trio.kube.transport import KeepAlivePool

    config = load_kubeconfig(kubeconfig)  # its own TLS context: httpcore sets ALPN on it
    tls: ssl.SSLContext = config.ssl_context()
    base = httpx.URL(config.server)
    auth = authorization(config)
    assert auth is not None
    common = [(b"Authorization", auth.encode()), (b"Accept", b"application/json"),
              (b"User-Agent", b"bench-kubehttp")]
    post_h = [*common, (b"Content-Type", b"application/json")]
    patch_h = [*common, (b"Content-Type", b"application/merge-patch+json")]
    cms = f"/api/v1/namespaces/{NAMESPACE}/configmaps".encode()
    patch = b'{"metadata":{"annotations":{"bench/stamped":"true"}}}'

    ours: KeepAlivePool | None = None
    core: httpcore.AsyncConnectionPool | None = None
    if stack == "ours":
        ours = KeepAlivePool(ssl_context=tls)
    else:
        h2 = stack == "httpcore-h2"
        core = httpcore.AsyncConnectionPool(ssl_context=tls, http1=not h2, http2=h2,
                                            max_connections=workers)

    async def send(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]],
                   body: bytes, want: int) -> None:
        if ours is not None:
            status, _, answer = await ours.round_trip(method, base, target, headers, body)
            version = b"HTTP/1.1"
        else:
            assert core is not None
            url = httpcore.URL(scheme=base.raw_scheme, host=base.raw_host, port=base.port,
                               target=target)
            resp = await core.request(method, url, headers=[(b"Host", base.netloc), *headers],
                                      content=body)
            status, answer = resp.status, resp.content
            version = resp.extensions.get("http_version", b"")
            if stack == "httpcore-h2" and version != b"HTTP/2":
                raise RuntimeError(f"{stack}: answered over {version!r}, not HTTP/2")
        if status != want:
            raise RuntimeError(f"{stack} {method.decode()} {target.decode()}: {status} "
                               f"{answer[:300]!r} ({version!r})")

    async def worker(start: int) -> None:
        for i in range(start, pods, workers):
            name = f"{prefix}-{i}"
            await send(b"POST", cms, post_h, _configmap(name), 201)
            await send(b"PATCH", cms + b"/" + name.encode(), patch_h, patch, 200)

    wall0, cpu0 = time.perf_counter(), time.process_time()
    try:
        async with trio.open_nursery() as nursery:
            for w in range(workers):
                nursery.start_soon(worker, w)
    finally:
        if ours is not None:
            await ours.aclose()
        if core is not None:
            await core.aclose()
    return time.perf_counter() - wall0, time.process_time() - cpu0


def run(args: argparse.Namespace) -> dict[str, Any]:
    import trio

    from scripts.bench._podcontroller_probe import cpu_seconds
    from scripts.bench.podcontroller import rotate

    pods = args.pods or (200 if args.quick else 2000)
    rounds = args.rounds or (1 if args.quick else 3)
    params = {"pods": pods, "workers": args.workers, "rounds": rounds,
              "requests_per_stack_round": 2 * pods}
    try:
        from scripts.bench import _realkube as R

        R.binaries()
    except SystemExit as exc:
        return C.result("kubehttp", params, [], [f"skipped: {exc}"])
    stacks = list(_STACKS)

    with tempfile.TemporaryDirectory(prefix="bench-kubehttp-") as tmp:
        work = Path(tmp)
        cp = R.start(work, without=("kube-scheduler", "kwok", "kube-controller-manager"))
        try:
            kubeconfig = R.agent_kubeconfigs(cp, work)["bigfleet-pod-controller"]
            r = cp.request("POST", "/api/v1/namespaces", {
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
            if r.status_code not in (201, 409):
                raise RuntimeError(f"namespace: {r.status_code} {r.text}")
            server_pid = cp.pids()["kube-apiserver"]
            cpu: dict[str, list[float]] = {s: [] for s in stacks}
            server: dict[str, list[float]] = {s: [] for s in stacks}
            wall: dict[str, list[float]] = {s: [] for s in stacks}
            # a warm-up pass per stack (imports, the first TLS handshakes, the server's caches)
            for stack in stacks:
                trio.run(_run_stack, stack, kubeconfig, 20, args.workers, f"warm-{stack}")
            for rnd in range(rounds):
                for stack in rotate(stacks, rnd):
                    s0 = cpu_seconds(server_pid)
                    secs, used = trio.run(_run_stack, stack, kubeconfig, pods, args.workers,
                                          f"r{rnd}-{stack}")
                    server[stack].append((cpu_seconds(server_pid) - s0) / (2 * pods) * 1e3)
                    cpu[stack].append(used / (2 * pods) * 1e3)
                    wall[stack].append(secs)
        finally:
            cp.stop()

    figures: list[dict[str, Any]] = []
    for stack in stacks:
        figures.append(C.figure(f"{stack} client CPU per request", "ms", cpu[stack],
                                baseline=None if stack == "ours" else cpu["ours"],
                                baseline_label="ours"))
    for stack in stacks:
        figures.append(C.figure(f"{stack} kube-apiserver CPU per request", "ms", server[stack],
                                baseline=None if stack == "ours" else server["ours"],
                                baseline_label="ours"))
    for stack in stacks:
        figures.append(C.figure(f"{stack} wall time for {2 * pods} requests", "s", wall[stack]))
    return C.result("kubehttp", params, figures, [])


def register(sub: Any) -> None:
    p = sub.add_parser("kubehttp", parents=[sub.common],
                       help="client CPU per request on kube-apiserver, HTTP/1.1 vs HTTP/2")
    p.add_argument("--pods", type=int, default=0,
                   help="POST + PATCH pairs per stack per round (default 2000, quick 200)")
    p.add_argument("--workers", type=int, default=8, help="concurrent tasks (default 8)")
    p.add_argument("--rounds", type=int, default=0, help="rounds (default 3, quick 1)")
    p.set_defaults(func=run)
