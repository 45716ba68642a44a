"""A minimal HTTP/1.1 server for the ASGI app on plain Trio sockets.

Hypercorn costs ~2.5 ms of CPU per request; scale benchmarks need the server to cost less than
the agent, so ``serve(..., engine="fast")`` uses this instead. It supports exactly what
Kubernetes clients send: keep-alive, Content-Length or chunked request bodies,
``Expect: 100-continue``, and responses with Content-Length (one ``send``) or chunked streaming
(watches). Anything else malformed closes the connection with 400.
"""

from __future__ import annotations

import logging
from functools import partial
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote_to_bytes

import trio

log = logging.getLogger(__name__)

_MAX_HEAD = 64 * 1024
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


class _BadRequest(Exception):
    pass


async def _read_until(stream: trio.SocketStream, buf: bytearray, marker: bytes) -> int | None:
    while True:
        idx = buf.find(marker)
        if idx >= 0:
            return idx
        if len(buf) > _MAX_HEAD:
            raise _BadRequest("header too large")
        data = await stream.receive_some(65536)
        if not data:
            return None
        buf += data


async def _read_exact(stream: trio.SocketStream, buf: bytearray, n: int) -> bytes:
    while len(buf) < n:
        data = await stream.receive_some(max(65536, n - len(buf)))
        if not data:
            raise _BadRequest("connection closed mid-body")
        buf += data
    out = bytes(buf[:n])
    del buf[:n]
    return out


async def _read_chunked(stream: trio.SocketStream, buf: bytearray) -> bytes:
    parts: list[bytes] = []
    while True:
        idx = await _read_until(stream, buf, b"\r\n")
        if idx is None:
            raise _BadRequest("connection closed in chunked body")
        size_line = bytes(buf[:idx]).split(b";")[0].strip()
        del buf[: idx + 2]
        try:
            size = int(size_line, 16)
        except ValueError:
            raise _BadRequest("bad chunk size") from None
        if size == 0:
            # trailers until empty line
            while True:
                idx = await _read_until(stream, buf, b"\r\n")
                if idx is None:
                    raise _BadRequest("connection closed in trailers")
                line = bytes(buf[:idx])
                del buf[: idx + 2]
                if not line:
                    return b"".join(parts)
        parts.append(await _read_exact(stream, buf, size))
        await _read_exact(stream, buf, 2)


async def _handle_conn(app: Any, stream: trio.SocketStream) -> None:
    buf = bytearray()
    try:
        sockname = stream.socket.getsockname()
        peername = stream.socket.getpeername()
    except OSError:
        sockname = peername = ("127.0.0.1", 0)
    try:
        while True:
            idx = await _read_until(stream, buf, b"\r\n\r\n")
            if idx is None:
                return
            head = bytes(buf[:idx])
            del buf[: idx + 4]
            lines = head.split(b"\r\n")
            try:
                method, target, version = lines[0].split(b" ", 2)
            except ValueError:
                raise _BadRequest("bad request line") from None
            headers: list[tuple[bytes, bytes]] = []
            hmap: dict[bytes, bytes] = {}
            for line in lines[1:]:
                k, sep, v = line.partition(b":")
                if not sep:
                    raise _BadRequest("bad header line")
                k = k.strip().lower()
                v = v.strip()
                headers.append((k, v))
                hmap[k] = v
            if hmap.get(b"expect", b"").lower() == b"100-continue":
                await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            if b"chunked" in hmap.get(b"transfer-encoding", b"").lower():
                body = await _read_chunked(stream, buf)
            else:
                try:
                    clen = int(hmap.get(b"content-length", b"0"))
                except ValueError:
                    raise _BadRequest("bad content-length") from None
                body = await _read_exact(stream, buf, clen) if clen else b""
            conn_hdr = hmap.get(b"connection", b"").lower()
            keep_alive = (
                version == b"HTTP/1.1" and conn_hdr != b"close"
            ) or conn_hdr == b"keep-alive"
            raw_path, _, query = target.partition(b"?")
            scope = {
                "type": "http",
                "asgi": {"version": "3.0", "spec_version": "2.3"},
                "http_version": version[5:].decode("latin-1")
                if version.startswith(b"HTTP/")
                else "1.1",
                "method": method.decode("latin-1"),
                "scheme": "http",
                "path": unquote_to_bytes(raw_path).decode("utf-8", "replace"),
                "raw_path": raw_path,
                "query_string": query,
                "root_path": "",
                "headers": headers,
                "client": peername[:2],
                "server": sockname[:2],
            }
            ok = await _run_app(app, scope, body, stream, buf, keep_alive)
            if not ok or not keep_alive:
                return
    except _BadRequest as exc:
        log.debug("fasthttp: bad request: %s", exc)
        try:
            await stream.send_all(
                b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            )
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
    except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError, OSError):
        pass
    finally:
        with trio.move_on_after(1) as cs:
            cs.shield = True
            try:
                await stream.aclose()
            except Exception:
                pass


async def _run_app(
    app: Any,
    scope: dict[str, Any],
    body: bytes,
    stream: trio.SocketStream,
    buf: bytearray,
    keep_alive: bool,
) -> bool:
    """Run one request; returns False when the connection must close."""
    body_sent = False
    state: dict[str, Any] = {"started": False, "chunked": False, "done": False, "head": b""}

    async def receive() -> dict[str, Any]:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        while True:
            data = await stream.receive_some(65536)
            if not data:
                return {"type": "http.disconnect"}
            buf.extend(data)

    async def send(msg: dict[str, Any]) -> None:
        typ = msg["type"]
        try:
            if typ == "http.response.start":
                status = msg["status"]
                hdrs = msg.get("headers", [])
                lines = [b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b"Unknown"))]
                has_len = False
                for k, v in hdrs:
                    if k.lower() == b"content-length":
                        has_len = True
                    lines.append(k + b": " + v)
                if not has_len:
                    lines.append(b"transfer-encoding: chunked")
                    state["chunked"] = True
                if not keep_alive:
                    lines.append(b"connection: close")
                state["head"] = b"\r\n".join(lines) + b"\r\n\r\n"
                state["started"] = True
            elif typ == "http.response.body":
                data = msg.get("body", b"")
                more = msg.get("more_body", False)
                out = state["head"]
                state["head"] = b""
                if state["chunked"]:
                    if data:
                        out += b"%x\r\n" % len(data) + data + b"\r\n"
                    if not more:
                        out += b"0\r\n\r\n"
                else:
                    out += data
                if out:
                    await stream.send_all(out)
                if not more:
                    state["done"] = True
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise OSError("client disconnected") from exc

    try:
        await app(scope, receive, send)
    except OSError:
        return False
    if not state["started"]:
        await stream.send_all(
            b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        )
        return False
    return bool(state["done"])


async def serve_fast(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` until cancelled; ``task_status.started`` gets ``http://HOST:PORT``."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()
    url = f"http://{host}:{bound[1]}"
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(trio.serve_listeners, partial(_handle_conn, app), listeners))
        task_status.started(url)
