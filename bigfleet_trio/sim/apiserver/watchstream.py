"""Watch responses: planning a watch from its query (initial events, resume, watch-list) and
streaming its events as newline-delimited JSON, Tables or PartialObjectMetadata.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from . import discovery as D
from . import errors as E
from .httpio import JSON_CT, Receive, Request, Send
from .resources import ResourceType
from .store import dumps

if TYPE_CHECKING:
    from .state import ApiState


PARTIAL_CT = b"application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


def partial_object(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj["metadata"],
    }


class WatchPlan:
    """A watch ready to stream: what to send first, the live watcher and the options."""

    __slots__ = ("res", "initial", "watcher", "timeout", "bookmarks", "as_table", "partial",
                 "include_object")

    def __init__(
        self,
        res: ResourceType,
        initial: list[Any],
        watcher: Any,
        timeout: float | None,
        bookmarks: bool,
        as_table: bool,
    ) -> None:
        self.res = res
        self.initial = initial
        self.watcher = watcher
        self.timeout = timeout
        self.bookmarks = bookmarks
        self.as_table = as_table
        self.partial = False
        self.include_object = "Metadata"


def plan_watch(
    server: ApiState, res: ResourceType, namespace: str | None, req: Request, as_table: bool
) -> WatchPlan:
    send_initial = req.flag("sendInitialEvents")
    bookmarks = req.flag("allowWatchBookmarks")
    if send_initial:
        if req.q("resourceVersionMatch") != "NotOlderThan" or not bookmarks:
            raise E.invalid(
                res.kind,
                res.group,
                "",
                [
                    E.field_cause(
                        "FieldValueForbidden",
                        "sendInitialEvents",
                        "Forbidden: sendInitialEvents requires setting resourceVersionMatch to "
                        "NotOlderThan and allowWatchBookmarks=true",
                    )
                ],
            )
    timeout_s = req.q("timeoutSeconds")
    try:
        timeout = float(timeout_s) if timeout_s else None
    except ValueError:
        raise E.bad_request(f"invalid timeoutSeconds: {timeout_s!r}") from None
    initial, watcher = server.open_watch(
        res,
        namespace,
        resource_version=req.q("resourceVersion"),
        label_selector=req.q("labelSelector"),
        field_selector=req.q("fieldSelector"),
        send_initial_events=send_initial,
    )
    return WatchPlan(res, initial, watcher, timeout, bookmarks, as_table)


def _encode_item(
    res: ResourceType,
    item: tuple[str, Any, bytes | None],
    table_state: list[bool] | None,
    partial: bool = False,
    include: str = "Metadata",
) -> bytes:
    typ, obj, cached = item
    if typ == "BOOKMARK":
        meta: dict[str, Any] = {"resourceVersion": obj}
        if cached == b"initial-events-end":
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return (
            dumps(
                {
                    "type": "BOOKMARK",
                    "object": {"kind": res.kind, "apiVersion": res.api_version, "metadata": meta},
                }
            )
            + b"\n"
        )
    if table_state is not None:
        first = not table_state[0]
        table_state[0] = True
        t = D.table(res, [obj], rv=obj["metadata"].get("resourceVersion", ""), with_columns=first,
                    include=include)
        return dumps({"type": typ, "object": t}) + b"\n"
    if partial:
        return dumps({"type": typ, "object": partial_object(obj)}) + b"\n"
    if cached is not None:
        return cached
    return dumps({"type": typ, "object": obj}) + b"\n"


async def stream_watch(server: ApiState, plan: WatchPlan, receive: Receive, send: Send) -> None:
    watcher = plan.watcher
    res = plan.res
    table_state = [False] if plan.as_table else None
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", JSON_CT), (b"cache-control", b"no-cache, private")],
        }
    )
    try:
        async with trio.open_nursery() as nursery:

            async def wait_disconnect() -> None:
                while True:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        nursery.cancel_scope.cancel()
                        return

            async def bookmarks() -> None:
                while True:
                    await trio.sleep(server.bookmark_interval)
                    watcher.push(("BOOKMARK", str(server.store.rv), None))

            nursery.start_soon(wait_disconnect)
            if plan.bookmarks:
                nursery.start_soon(bookmarks)
            with trio.move_on_after(plan.timeout if plan.timeout is not None else float("inf")):
                if plan.initial:
                    # encoded 1,000 at a time, as sent: a streaming list of N objects never
                    # holds N encoded events (kube-apiserver streams from its watch cache)
                    initial = plan.initial
                    for i in range(0, len(initial), 1000):
                        part = [_encode_item(res, it, table_state, plan.partial,
                                             plan.include_object)
                                for it in initial[i : i + 1000]]
                        await send(
                            {"type": "http.response.body", "body": b"".join(part),
                             "more_body": True}
                        )
                else:
                    await send({"type": "http.response.body", "body": b"", "more_body": True})
                recv = watcher.receive
                while True:
                    try:
                        item = await recv.receive()
                    except trio.EndOfChannel:
                        break
                    out = [_encode_item(res, item, table_state, plan.partial, plan.include_object)]
                    while len(out) < 1000:
                        try:
                            out.append(
                                _encode_item(res, recv.receive_nowait(), table_state, plan.partial,
                                         plan.include_object)
                            )
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    await send(
                        {"type": "http.response.body", "body": b"".join(out), "more_body": True}
                    )
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            nursery.cancel_scope.cancel()
    except* OSError:
        # the client went away mid-stream (raised by ``send`` in the nursery body, so it
        # arrives wrapped in the nursery's exception group): the watch simply ends
        pass
    finally:
        watcher.close("ended")
