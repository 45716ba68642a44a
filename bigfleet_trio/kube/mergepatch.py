"""JSON merge-patch (RFC 7386) diffs for the operator's writes.

:func:`merge_diff` computes the body of a ``patch_type="merge"`` PATCH that carries only the
changed fields (UpcomingNode and AvailableCapacity spec refreshes, CapacityRequest updates by the
pod controller). Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["merge_diff"]


def merge_diff(old: object, new: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge-patch turning ``old`` into ``new`` (like Go's ``client.MergeFrom``).

    Keys of ``new`` that differ are set (nested mappings recursively), keys only in ``old`` become
    ``None`` (JSON null); lists are replaced wholesale. Equal inputs give ``{}``; an ``old`` that
    is not a mapping (None, or a malformed stored value) counts as ``{}``, so every key of ``new``
    is set. ``new`` must not contain ``None`` values (in a merge patch they mean "delete").
    """
    if not isinstance(old, Mapping):
        old = {}
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
            continue
        before = old[key]
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_diff(before, value)
            if sub:
                patch[key] = sub
        elif before != value:
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch
