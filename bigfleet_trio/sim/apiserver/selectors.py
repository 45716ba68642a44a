"""Label and field selectors with the apiserver's syntax and errors.

Label selector grammar (comma = AND): ``k=v``, ``k==v``, ``k!=v`` (matches an absent key),
``k in (a,b)``, ``k notin (a,b)``, ``k``, ``!k``, ``k>N``, ``k<N``. Field selectors support
``=``, ``==`` and ``!=`` only. Parse errors raise :class:`~.errors.ApiError` (400 BadRequest).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from bigfleet_trio.kube.names import is_dns1123_subdomain, is_label_value, is_qualified_name_part

from .errors import ApiError, bad_request

Requirement = tuple[str, str, tuple[str, ...]]  # (key, op, values)


def _check_key(key: str) -> None:
    prefix, _, name = key.rpartition("/")
    if "/" in key and not (prefix and is_dns1123_subdomain(prefix)):
        raise bad_request(f"unable to parse requirement: invalid label key {key!r}")
    if not is_qualified_name_part(name):
        raise bad_request(
            f'unable to parse requirement: invalid label key "{key}": name part must consist of '
            "alphanumeric characters, '-', '_' or '.', and must start and end with an "
            "alphanumeric character"
        )


def _check_value(value: str) -> None:
    if not is_label_value(value):
        raise bad_request(
            f'unable to parse requirement: invalid label value: "{value}": a valid label must be '
            "an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
            "start and end with an alphanumeric character"
        )


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    out: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise bad_request(
                    f"unable to parse requirement: unbalanced parentheses in {text!r}"
                )
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise bad_request(f"unable to parse requirement: unbalanced parentheses in {text!r}")
    out.append("".join(cur))
    return out


_SET_RE = re.compile(r"^\s*(\S+?)\s+(in|notin)\s*\((.*)\)\s*$")
_CMP_RE = re.compile(r"^\s*([^=!<>\s]+)\s*(==|!=|=|>|<)\s*(\S*)\s*$")


def parse_label_selector(text: str | None) -> list[Requirement]:
    """Parse a label selector string into requirements.

    Args:
        text: selector text as sent in ``labelSelector``; None or blank selects everything.

    Returns:
        A list of ``(key, op, values)`` with op in ``= != in notin exists !exists > <``.

    Raises:
        ApiError: 400 BadRequest for any syntax error.
    """
    if text is None or not text.strip():
        return []
    reqs: list[Requirement] = []
    for raw in _split_top(text):
        part = raw.strip()
        if not part:
            raise bad_request(
                f"unable to parse requirement: found '', expected: identifier in {text!r}"
            )
        m = _SET_RE.match(part)
        if m:
            key, op, inner = m.group(1), m.group(2), m.group(3)
            _check_key(key)
            values = tuple(v.strip() for v in inner.split(",")) if inner.strip() else ()
            if not values:
                raise bad_request(
                    "unable to parse requirement: for 'in', 'notin' operators, "
                    "values set can't be empty"
                )
            for v in values:
                _check_value(v)
            reqs.append((key, op, values))
            continue
        if part.startswith("!"):
            key = part[1:].strip()
            _check_key(key)
            reqs.append((key, "!exists", ()))
            continue
        m = _CMP_RE.match(part)
        if m:
            key, op, value = m.group(1), m.group(2), m.group(3)
            _check_key(key)
            if op in (">", "<"):
                try:
                    int(value)
                except ValueError:
                    raise bad_request(
                        "unable to parse requirement: for 'Gt', 'Lt' operators, "
                        "the value must be an integer"
                    ) from None
            else:
                _check_value(value)
            reqs.append((key, "=" if op == "==" else op, (value,)))
            continue
        if re.match(r"^[^\s=!<>(),]+$", part):
            _check_key(part)
            reqs.append((part, "exists", ()))
            continue
        raise bad_request(f"unable to parse requirement: invalid selector {part!r}")
    return reqs


def match_labels(reqs: list[Requirement], labels: Mapping[str, str] | None) -> bool:
    """True when ``labels`` satisfies every requirement."""
    labels = labels or {}
    for key, op, values in reqs:
        present = key in labels
        val = labels.get(key)
        if op == "=":
            if val != values[0]:
                return False
        elif op == "!=":
            if present and val == values[0]:
                return False
        elif op == "in":
            if not present or val not in values:
                return False
        elif op == "notin":
            if present and val in values:
                return False
        elif op == "exists":
            if not present:
                return False
        elif op == "!exists":
            if present:
                return False
        elif op in (">", "<"):
            if not present:
                return False
            try:
                have = int(val)  # type: ignore[arg-type]
            except ValueError:
                return False
            want = int(values[0])
            if (op == ">" and not have > want) or (op == "<" and not have < want):
                return False
    return True


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
    "match_labels",
    "label_selector_from_object",
    "parse_field_selector",
    "field_value",
    "match_fields",
]
