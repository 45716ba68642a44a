"""Duration flags: Go ``time.ParseDuration`` syntax or plain seconds.

Design "Fixed points" (CLI contract): durations accept Go style (``10s``, ``500ms``, ``1m30s``,
``2h``, ``1.5s``) or plain seconds (``10``, ``0.5``), so existing charts and habits carry over.
"""

from __future__ import annotations

import math
import re

__all__ = ["parse_duration", "parse_go_duration", "format_duration"]

# Seconds per unit, as in Go's time package (``µs`` and ``μs`` are both micro).
_UNITS: dict[str, float] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,  # U+00B5 micro sign
    "μs": 1e-6,  # U+03BC greek mu
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}

_PLAIN = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_COMPONENT = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([a-zA-Zµμ]+)")


def parse_duration(text: str) -> float:
    """Parse a duration flag value into seconds.

    Accepts Go ``time.ParseDuration`` strings (a sequence of decimal numbers each with a unit
    among ns, us/µs, ms, s, m, h, optionally signed, e.g. ``1h2m3.5s``) and plain decimal
    seconds (``10``, ``0.5``). ``"0"`` is zero, as in Go.

    Args:
        text: the flag value.

    Returns:
        The duration in seconds (float; may be negative if the value is signed negative).

    Raises:
        ValueError: empty input, unknown unit, missing unit between components, or garbage,
            with a message naming the offending value.
    """
    if not isinstance(text, str):
        raise ValueError(f"invalid duration {text!r}: not a string")
    s = text.strip()
    if not s:
        raise ValueError("invalid duration \"\": empty")
    if _PLAIN.fullmatch(s):
        value = float(s)
        if not math.isfinite(value):  # pragma: no cover - regex excludes inf/nan
            raise ValueError(f"invalid duration {text!r}")
        return value
    sign = 1.0
    rest = s
    if rest[0] in "+-":
        sign = -1.0 if rest[0] == "-" else 1.0
        rest = rest[1:]
    if not rest:
        raise ValueError(f"invalid duration {text!r}")
    total = 0.0
    pos = 0
    while pos < len(rest):
        m = _COMPONENT.match(rest, pos)
        if m is None:
            raise ValueError(
                f"invalid duration {text!r}: expected a number followed by a unit "
                "(ns, us, ms, s, m, h) or plain seconds"
            )
        number, unit = m.group(1), m.group(2)
        if unit not in _UNITS:
            raise ValueError(
                f"invalid duration {text!r}: unknown unit {unit!r} (use ns, us, ms, s, m, h)"
            )
        total += float(number) * _UNITS[unit]
        pos = m.end()
    return sign * total


_GO_MAX_SECONDS = 9223372036.854775807
"""The longest ``time.Duration`` (int64 nanoseconds); Go refuses a longer one as an overflow."""


def parse_go_duration(text: str) -> float:
    """Parse exactly what Go's ``time.ParseDuration`` accepts, into seconds: a value another
    Go program reads (an annotation such as ``karpenter.sh/do-not-disrupt: "30m"``) means here
    what it means there.

    Stricter than :func:`parse_duration`: no plain seconds (but ``0``, signed or not), no
    surrounding blanks, nothing past the int64-nanosecond range.

    Raises:
        ValueError: anything Go refuses, with a message naming the value.
    """
    if not isinstance(text, str) or text != text.strip() or not text:
        raise ValueError(f"invalid duration {text!r}")
    if text.lstrip("+-") == "0" and len(text) <= 2:
        return 0.0
    if _PLAIN.fullmatch(text):
        raise ValueError(f"invalid duration {text!r}: missing unit")
    seconds = parse_duration(text)
    if abs(seconds) > _GO_MAX_SECONDS:
        raise ValueError(f"invalid duration {text!r}: overflow")
    return seconds


def format_duration(seconds: float) -> str:
    """Format seconds the way Go prints a ``time.Duration`` for common values (help text, logs).

    Examples: ``10.0 -> "10s"``, ``0.5 -> "500ms"``, ``90 -> "1m30s"``, ``0 -> "0s"``.

    Args:
        seconds: a non-negative duration in seconds.

    Returns:
        A compact Go-style string.
    """
    if seconds == 0:
        return "0s"
    neg = seconds < 0
    seconds = abs(seconds)
    if seconds < 1:
        ms = seconds * 1000
        out = f"{ms:g}ms"
    else:
        h, rem = divmod(seconds, 3600)
        m, s = divmod(rem, 60)
        out = ""
        if h:
            out += f"{int(h)}h"
        if h or m:
            out += f"{int(m)}m"
        out += f"{round(s, 9):g}s"
    return ("-" if neg else "") + out
