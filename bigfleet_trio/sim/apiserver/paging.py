"""List pagination of the embedded apiserver: ``limit`` / ``continue`` over a snapshot, so
every page of one list shows the same resourceVersion and items, as etcd-backed lists do.
"""

from __future__ import annotations

import base64
import secrets
from collections import OrderedDict
from typing import Any

from . import errors as E
from .objects import ListResult

KEPT_SNAPSHOTS = 32  # older continue tokens answer 410 Expired


class Pager:
    """Snapshots of paginated lists, keyed by an id carried in the continue token."""

    def __init__(self) -> None:
        self._snapshots: OrderedDict[str, tuple[int, list[dict[str, Any]]]] = OrderedDict()

    def expire_all(self) -> None:
        """Forget every snapshot: each outstanding continue token now answers 410."""
        self._snapshots.clear()

    def resume(self, continue_: str) -> tuple[int, list[dict[str, Any]], int, str]:
        """(rv, matched items, start index, snapshot id) of a continue token.

        Raises:
            ApiError: 400 a malformed token; 410 a snapshot no longer kept.
        """
        try:
            tok = base64.urlsafe_b64decode(continue_.encode() + b"==").decode()
            snap_id, _, start_s = tok.partition(":")
            start = int(start_s)
        except Exception:
            raise E.bad_request(f"invalid continue token: {continue_!r}") from None
        snap = self._snapshots.get(snap_id)
        if snap is None:
            raise E.expired(
                "The provided continue parameter is too old to display a consistent list "
                "result. You can start a new list without the continue parameter."
            )
        return snap[0], snap[1], start, snap_id

    def page(
        self,
        rv: int,
        matched: list[dict[str, Any]],
        limit: int | None,
        start: int = 0,
        snap_id: str | None = None,
    ) -> ListResult:
        """The page of ``matched`` from ``start`` (a new snapshot when ``snap_id`` is None
        and more pages follow)."""
        if limit is None or limit <= 0 or start + limit >= len(matched):
            items = matched[start:] if start else matched
            return ListResult(items, str(rv), "", None)
        end = start + limit
        if snap_id is None:
            snap_id = secrets.token_hex(6)
            self._snapshots[snap_id] = (rv, matched)
            while len(self._snapshots) > KEPT_SNAPSHOTS:
                self._snapshots.popitem(last=False)
        token = base64.urlsafe_b64encode(f"{snap_id}:{end}".encode()).decode().rstrip("=")
        return ListResult(matched[start:end], str(rv), token, len(matched) - end)
