"""Kubernetes label selectors as text, the form ``kubectl -l`` and ``labelSelector`` take.

Grammar (comma = AND): ``k=v``, ``k==v``, ``k!=v`` (matches an absent key), ``k in (a,b)``,
``k notin (a,b)``, ``k``, ``!k``, ``k>N``, ``k<N``. :func:`parse_label_selector` turns the text
into requirements (or raises :class:`LabelSelectorError` worded as the apiserver's 400);
:func:`match_labels` tests a label map against them. The embedded apiserver's ``labelSelector``
and the pod controller's ``--unmanaged-node-selector`` / ``--exclude-pod-selector``
(docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out) share this one parser.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from .names import is_dns1123_subdomain, is_label_value, is_qualified_name_part

__all__ = ["LabelSelectorError", "Requirement", "match_labels", "parse_label_selector"]


class LabelSelectorError(ValueError):
    """A label selector that does not parse; the message is the apiserver's wording."""


Requirement = tuple[str, str, tuple[str, ...]]  # (key, op, values)


def _check_key(key: str) -> None:
    prefix, _, name = key.rpartition("/")
    if "/" in key and not (prefix and is_dns1123_subdomain(prefix)):
        raise LabelSelectorError(f"unable to parse requirement: invalid label key {key!r}")
    if not is_qualified_name_part(name):
        raise LabelSelectorError(
            f'unable to parse requirement: invalid label key "{key}": name part must consist of '
            "alphanumeric characters, '-', '_' or '.', and must start and end with an "
            "alphanumeric character"
        )


def _check_value(value: str) -> None:
    if not is_label_value(value):
        raise LabelSelectorError(
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
                raise LabelSelectorError(
                    f"unable to parse requirement: unbalanced parentheses in {text!r}"
                )
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise LabelSelectorError(f"unable to parse requirement: unbalanced parentheses in {text!r}")
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
        LabelSelectorError: any syntax error, with the apiserver's wording.
    """
    if text is None or not text.strip():
        return []
    reqs: list[Requirement] = []
    for raw in _split_top(text):
        part = raw.strip()
        if not part:
            raise LabelSelectorError(
                f"unable to parse requirement: found '', expected: identifier in {text!r}"
            )
        m = _SET_RE.match(part)
        if m:
            key, op, inner = m.group(1), m.group(2), m.group(3)
            _check_key(key)
            values = tuple(v.strip() for v in inner.split(",")) if inner.strip() else ()
            if not values:
                raise LabelSelectorError(
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
                    raise LabelSelectorError(
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
        raise LabelSelectorError(f"unable to parse requirement: invalid selector {part!r}")
    return reqs


def match_labels(reqs: Sequence[Requirement], labels: Mapping[str, str] | None) -> bool:
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
