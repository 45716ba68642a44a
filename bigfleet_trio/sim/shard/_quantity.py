"""Minimal Kubernetes quantity parsing for the simulated shard (exact, via ``Fraction``).

A shard parses every quantity in a roll-up's ``aggregate_resources`` and ``min_unit`` and rejects
the whole roll-up if one fails. The sim only
needs to *compare and add* quantities, never to print them canonically, so a small exact parser is
enough here (the project's Go-exact formatter lives elsewhere).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction

_SUFFIX: dict[str, Fraction] = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}

_RE = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)


def parse_quantity(text: str) -> Fraction:
    """Parse a Kubernetes quantity string (``"500m"``, ``"1Gi"``, ``"1e3"``, ``"2"``) exactly.

    Raises:
        ValueError: the text is not a Kubernetes quantity.
    """
    m = _RE.match(text.strip()) if isinstance(text, str) else None
    if m is None or text.strip() != text or text == "":
        raise ValueError(f"invalid quantity {text!r}")
    value = Fraction(m.group("num"))
    if m.group("exp"):
        value *= Fraction(10) ** int(m.group("exp")[1:])
    else:
        value *= _SUFFIX[m.group("suffix") or ""]
    return -value if m.group("sign") == "-" else value


def parse_resources(resources: Mapping[str, str]) -> dict[str, Fraction]:
    """Parse a name -> quantity-string map. Raises ValueError naming the bad entry."""
    out: dict[str, Fraction] = {}
    for name, text in resources.items():
        try:
            out[name] = parse_quantity(text)
        except ValueError as exc:
            raise ValueError(f"resource {name!r}: {exc}") from None
    return out


def covers(have: Mapping[str, Fraction], want: Mapping[str, Fraction]) -> bool:
    """True when ``have[d] >= want[d]`` for every dimension of ``want`` (missing counts as 0)."""
    return all(have.get(d, Fraction(0)) >= v for d, v in want.items())


def add_into(acc: dict[str, Fraction], more: Mapping[str, Fraction]) -> None:
    """Per-dimension in-place sum ``acc += more``."""
    for d, v in more.items():
        acc[d] = acc.get(d, Fraction(0)) + v
