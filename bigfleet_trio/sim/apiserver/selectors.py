"""Label and field selectors with the apiserver's syntax and errors.

Label selector grammar (comma = AND): ``k=v``, ``k==v``, ``k!=v`` (matches an absent key),
``k in (a,b)``, ``k notin (a,b)``, ``k``, ``!k``, ``k>N``, ``k<N``. Field selectors support
``=``, ``==`` and ``!=`` only. Parse errors raise :class:`~.errors.ApiError` (400 BadRequest).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from bigfleet_trio.kube import labelselector
from bigfleet_trio.kube.labelselector import Requirement

from .errors import ApiError, bad_request


def parse_label_selector(text: str | None) -> list[Requirement]:
    """Parse a ``labelSelector`` (:func:`bigfleet_trio.kube.labelselector.parse_label_selector`).

    Raises:
        ApiError: 400 BadRequest for any syntax error.
    """
    try:
        return labelselector.parse_label_selector(text)
    except labelselector.LabelSelectorError as exc:
        raise bad_request(str(exc)) from None


def label_selector_from_object(sel: Mapping[str, Any] | None) -> list[Requirement] | None:
    """Convert a metav1.LabelSelector dict into requirements.

    Returns None for a null selector (matches nothing); ``[]`` for ``{}`` (matches everything).
    """
    if not isinstance(sel, Mapping):
        return None
    reqs: list[Requirement] = []
    ml = sel.get("matchLabels") or {}
    me = sel.get("matchExpressions") or []
    if not isinstance(ml, Mapping) or not isinstance(me, list):
        return None
    for k, v in ml.items():
        reqs.append((str(k), "=", (str(v),)))
    opmap = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
    for expr in me:
        if not isinstance(expr, Mapping) or not isinstance(expr.get("values") or [], list):
            return None
        op = opmap.get(str(expr.get("operator", "")))
        if op is None:
            return None
        reqs.append((expr.get("key", ""), op, tuple(expr.get("values") or ())))
    return reqs


FieldRequirement = tuple[str, str, str]  # (field, op "=" | "!=", value)


def parse_field_selector(
    text: str | None, supported: Callable[[str], bool]
) -> list[FieldRequirement]:
    """Parse a field selector; unsupported field labels raise 400 like the apiserver.

    Args:
        text: ``fieldSelector`` query value.
        supported: predicate telling whether a field path is selectable for the resource.
    """
    if text is None or not text.strip():
        return []
    out: list[FieldRequirement] = []
    for raw in text.split(","):
        part = raw.strip()
        m = re.match(r"^([^=!]+?)\s*(==|!=|=)\s*(.*)$", part)
        if not m:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        field, op, value = m.group(1).strip(), m.group(2), m.group(3).strip()
        if not supported(field):
            raise bad_request(f"field label not supported: {field}")
        out.append((field, "=" if op == "==" else op, value))
    return out


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The selectable string value of a dotted ``path`` in ``obj`` ("" when absent).

    Booleans render as ``true``/``false`` like the apiserver's field sets.
    """
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
        if cur is None:
            return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    if isinstance(cur, (dict, list)):
        return ""
    return str(cur)


def match_fields(reqs: list[FieldRequirement], obj: Mapping[str, Any]) -> bool:
    """True when ``obj`` satisfies every field requirement."""
    for field, op, value in reqs:
        have = field_value(obj, field)
        if (op == "=") != (have == value):
            return False
    return True


__all__ = [
    "ApiError",
    "parse_label_selector",
    "label_selector_from_object",
    "parse_field_selector",
    "field_value",
    "match_fields",
]
