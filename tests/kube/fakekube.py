"""A tiny in-memory apiserver behind ``httpx.MockTransport`` for the kube layer's tests.

Semantics follow a real apiserver (and bigfleet_trio.sim.apiserver) closely enough for the client:
one global integer resourceVersion, list pagination with opaque continue tokens, watches that
replay retained history after ``resourceVersion`` then stream live events one JSON line at a
time (bodies fed from Trio memory channels), ERROR 410 for a compacted history, Status bodies
for errors, merge patches, delete preconditions. Faults are injected explicitly:
``inject()`` canned answers, ``drop_watches()`` (connection reset), ``end_watches()`` (clean
end), ``bookmark()``, ``compact()``, ``partition(client_id)``.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import trio

_PATH = re.compile(
    r"^/(?:api/(?P<cv>v1)|apis/(?P<g>[^/]+)/(?P<v>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)


def status(code: int, reason: str, message: str, **details: Any) -> httpx.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return httpx.Response(code, json=body)


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


class _WatchBody(httpx.AsyncByteStream):
    def __init__(self, recv: trio.MemoryReceiveChannel[Any]):
        self._recv = recv

    async def __aiter__(self):  # type: ignore[override]
        async for item in self._recv:
            if isinstance(item, BaseException):
                raise item
            yield item

    async def aclose(self) -> None:
        self._recv.close()


@dataclass
class _Watcher:
    plural: str
    ns: str | None
    bookmarks: bool
    send: trio.MemorySendChannel[Any]
    kind: str
    api_version: str


@dataclass
class _Injected:
    method: str
    pattern: str
    make: Callable[[httpx.Request], httpx.Response]
    times: int


@dataclass
class FakeKube:
    """The fake apiserver. ``transport()`` gives an httpx transport bound to it."""

    rv: int = 100
    objects: dict[tuple[str, str | None, str], dict[str, Any]] = field(default_factory=dict)
    history: list[tuple[int, str, str | None, str, dict[str, Any]]] = field(default_factory=list)
    oldest_rv: int = 0
    watchers: list[_Watcher] = field(default_factory=list)
    requests: list[httpx.Request] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    injected: list[_Injected] = field(default_factory=list)
    partitioned: set[str] = field(default_factory=set)
    expire_continue: bool = False
    kinds: dict[str, tuple[str, str]] = field(default_factory=dict)

    # -- test controls -----------------------------------------------------------------------

    def transport(self, client_id: str = "default") -> httpx.MockTransport:
        async def handler(request: httpx.Request) -> httpx.Response:
            if client_id in self.partitioned:
                raise httpx.ConnectError("partitioned", request=request)
            return self.handle(request)

        return httpx.MockTransport(handler)

    def partition(self, client_id: str, on: bool = True) -> None:
        (self.partitioned.add if on else self.partitioned.discard)(client_id)

    def inject(
        self,
        method: str,
        pattern: str,
        make: Callable[[httpx.Request], httpx.Response] | httpx.Response,
        times: int = 1,
    ) -> None:
        """Answer the next ``times`` requests whose method matches and path contains ``pattern``."""
        fn = make if callable(make) else (lambda _r, resp=make: resp)
        self.injected.append(_Injected(method, pattern, fn, times))

    def seed(self, plural: str, obj: dict[str, Any], *, record: bool = True) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        ns = meta.get("namespace")
        return self._put(plural, ns, meta["name"], obj, "ADDED", record=record)

    def remove(self, plural: str, ns: str | None, name: str) -> None:
        obj = self.objects.pop((plural, ns, name))
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._emit(plural, ns, "DELETED", obj)

    def modify(
        self, plural: str, ns: str | None, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        cur = self.objects[(plural, ns, name)]
        return self._put(plural, ns, name, merge_patch(cur, patch), "MODIFIED")

    def compact(self) -> None:
        """Forget all history: any watch from an older RV now gets ERROR 410."""
        self.history.clear()
        self.oldest_rv = self.rv

    def bookmark(self) -> None:
        for w in list(self.watchers):
            if w.bookmarks:
                self._send(
                    w,
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": w.kind,
                            "apiVersion": w.api_version,
                            "metadata": {"resourceVersion": str(self.rv)},
                        },
                    },
                )

    def drop_watches(self) -> None:
        for w in self.watchers:
            try:
                w.send.send_nowait(httpx.ReadError("connection reset by peer"))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            w.send.close()
        self.watchers.clear()

    def end_watches(self) -> None:
        for w in self.watchers:
            w.send.close()
        self.watchers.clear()

    def watch_requests(self) -> list[httpx.Request]:
        return [r for r in self.requests if r.url.params.get("watch") == "1"]

    def watch_times(self) -> list[float]:
        pairs = zip(self.requests, self.times, strict=True)
        return [t for r, t in pairs if r.url.params.get("watch") == "1"]

    # -- internals ---------------------------------------------------------------------------

    def _send(self, w: _Watcher, doc: dict[str, Any]) -> None:
        try:
            w.send.send_nowait((json.dumps(doc) + "\n").encode())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            if w in self.watchers:
                self.watchers.remove(w)

    def _emit(self, plural: str, ns: str | None, etype: str, obj: dict[str, Any]) -> None:
        self.history.append((self.rv, plural, ns, etype, copy.deepcopy(obj)))
        for w in list(self.watchers):
            if w.plural == plural and (w.ns is None or w.ns == ns):
                self._send(w, {"type": etype, "object": obj})

    def _put(
        self,
        plural: str,
        ns: str | None,
        name: str,
        obj: dict[str, Any],
        etype: str,
        record: bool = True,
    ) -> dict[str, Any]:
        self.rv += 1
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta["name"] = name
        if ns:
            meta["namespace"] = ns
        meta["resourceVersion"] = str(self.rv)
        meta.setdefault("uid", f"uid-{name}-{self.rv}")
        self.objects[(plural, ns, name)] = obj
        if record:
            self._emit(plural, ns, etype, obj)
        return copy.deepcopy(obj)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.times.append(trio.current_time())
        path = request.url.path
        for inj in list(self.injected):
            if inj.method == request.method and inj.pattern in path:
                inj.times -= 1
                if inj.times <= 0:
                    self.injected.remove(inj)
                return inj.make(request)
        m = _PATH.match(path)
        if not m:
            return status(404, "NotFound", f"the server could not find {path}")
        plural, ns, name, sub = m["plural"], m["ns"], m["name"], m["sub"]
        api_version = m["cv"] or f"{m['g']}/{m['v']}"
        params = request.url.params
        method = request.method
        if name is None:
            if method == "GET" and params.get("watch") == "1":
                return self._watch(plural, ns, params, api_version)
            if method == "GET":
                return self._list(plural, ns, params)
            if method == "POST":
                body = json.loads(request.content)
                bname = body.get("metadata", {}).get("name")
                if (plural, ns, bname) in self.objects:
                    return status(
                        409,
                        "AlreadyExists",
                        f'{plural} "{bname}" already exists',
                        name=bname,
                        kind=plural,
                    )
                self.kinds.setdefault(plural, (body.get("kind", ""), api_version))
                return httpx.Response(201, json=self._put(plural, ns, bname, body, "ADDED"))
            if method == "DELETE":
                for p, n, nm in list(self.objects):
                    if p == plural and (ns is None or n == ns):
                        self.remove(p, n, nm)
                return httpx.Response(200, json={"kind": "Status", "status": "Success"})
            return status(405, "MethodNotAllowed", "method not allowed")
        key = (plural, ns, name)
        cur = self.objects.get(key)
        if method == "POST" and sub == "eviction":
            if cur is None:
                return status(404, "NotFound", f'pods "{name}" not found')
            self.remove(plural, ns, name)
            return httpx.Response(201, json={"kind": "Status", "status": "Success"})
        if cur is None:
            return status(404, "NotFound", f'{plural} "{name}" not found', name=name, kind=plural)
        if method == "GET":
            return httpx.Response(200, json=cur)
        if method == "PUT":
            body = json.loads(request.content)
            want = body.get("metadata", {}).get("resourceVersion")
            if want and want != cur["metadata"]["resourceVersion"]:
                return status(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {plural} "{name}": '
                    "the object has been modified; please apply your changes to the "
                    "latest version and try again",
                )
            if sub == "status":
                body = {**cur, "status": body.get("status")}
            return httpx.Response(200, json=self._put(plural, ns, name, body, "MODIFIED"))
        if method == "PATCH":
            body = json.loads(request.content)
            return httpx.Response(
                200, json=self._put(plural, ns, name, merge_patch(cur, body), "MODIFIED")
            )
        if method == "DELETE":
            opts = json.loads(request.content) if request.content else {}
            pre = opts.get("preconditions") or {}
            if (
                pre.get("resourceVersion")
                and pre["resourceVersion"] != cur["metadata"]["resourceVersion"]
            ) or (pre.get("uid") and pre["uid"] != cur["metadata"].get("uid")):
                return status(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {plural} "{name}": precondition failed',
                )
            self.remove(plural, ns, name)
            return httpx.Response(200, json=cur)
        return status(405, "MethodNotAllowed", "method not allowed")

    def _list(self, plural: str, ns: str | None, params: httpx.QueryParams) -> httpx.Response:
        limit = int(params.get("limit", "0") or 0)
        token = params.get("continue")
        if token:
            if self.expire_continue:
                self.expire_continue = False
                return status(410, "Expired", "The provided continue parameter is too old")
            snap_rv, offset = token.split(":")
            snap_rv_i, start = int(snap_rv), int(offset)
        else:
            snap_rv_i, start = self.rv, 0
        items = sorted(
            (
                (k, v)
                for k, v in self.objects.items()
                if k[0] == plural and (ns is None or k[1] == ns)
            ),
            key=lambda kv: (kv[0][1] or "", kv[0][2]),
        )
        chunk = items[start : start + limit] if limit else items[start:]
        end = start + len(chunk)
        meta: dict[str, Any] = {"resourceVersion": str(snap_rv_i)}
        if limit and end < len(items):
            meta["continue"] = f"{snap_rv_i}:{end}"
            meta["remainingItemCount"] = len(items) - end
        return httpx.Response(
            200,
            json={
                "kind": "List",
                "apiVersion": "v1",
                "metadata": meta,
                "items": [copy.deepcopy(v) for _, v in chunk],
            },
        )

    def _watch(
        self, plural: str, ns: str | None, params: httpx.QueryParams, api_version: str
    ) -> httpx.Response:
        send, recv = trio.open_memory_channel[Any](math.inf)
        kind = self.kinds.get(plural, (plural, api_version))[0]
        w = _Watcher(
            plural, ns, params.get("allowWatchBookmarks") == "true", send, kind, api_version
        )
        since = int(params.get("resourceVersion") or 0)
        if since and since < self.oldest_rv:
            self._send(
                w,
                {
                    "type": "ERROR",
                    "object": {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Failure",
                        "message": f"too old resource version: {since} ({self.oldest_rv})",
                        "reason": "Expired",
                        "code": 410,
                    },
                },
            )
            send.close()
            return httpx.Response(200, stream=_WatchBody(recv))
        for rv, p, n, etype, obj in self.history:
            if rv > since and p == plural and (ns is None or n == ns):
                self._send(w, {"type": etype, "object": obj})
        self.watchers.append(w)
        return httpx.Response(200, stream=_WatchBody(recv))
