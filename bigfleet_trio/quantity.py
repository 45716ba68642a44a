"""Kubernetes resource quantities with Go-exact parsing and canonical formatting.

What the roll-up (``docs/rules.md#roll-up-capacityneed-shape``) needs from Go's
``resource.Quantity``: an exact (``Decimal``-based) parser for
the Kubernetes quantity grammar, the canonical string ``Quantity.String()`` prints, ``Add``,
``Sub``, ``Cmp`` and ``AsApproximateFloat64``, plus small helpers over resource maps.

Grammar (k8s.io/apimachinery ``parseQuantityString`` + suffixer)::

    <quantity>  ::= <sign>? <digits>? ("." <digits>?)? <suffix>
    <suffix>    ::= "" | n | u | m | k | M | G | T | P | E      (DecimalSI)
                  | Ki | Mi | Gi | Ti | Pi | Ei                 (BinarySI)
                  | (e | E) <sign>? <digits>                    (DecimalExponent)

Go behaviour reproduced on purpose:

* values finer than 1n are rounded *up* (away from zero) to the next nano
  (``0.1n`` -> ``1n``, ``-1.5n`` -> ``-2n``);
* BinarySI values are capped at 2^63-1 (Go's ``maxAllowed``); a BinarySI value with
  0 < |v| < 1 becomes DecimalSI;
* Go's lenient corners of the scanner: ``"5."``, ``".5"``, ``"1.G"``, ``"+"``/``"-"``/``"."``
  (all zero) parse;
* canonical form: the largest exponent that is a multiple of 3 (DecimalSI,
  DecimalExponent) or of 1024 (BinarySI) leaving an integer mantissa; BinarySI values in
  (-1024, 1024) or with a fraction print as DecimalSI; zero prints ``0``;
* ``a + b`` / ``a - b`` keep the format of ``a`` unless ``a`` is zero, then take ``b``'s;
* comparisons are numeric (``1000m == 1``), ``hash`` agrees with ``==``;
* :meth:`Quantity.as_float` is ``AsApproximateFloat64``: float(unscaled) * Pow10(exp) on the
  same (unscaled, scale) representation Go holds after parsing.

Deviations (each keeps the *value* identical; only printing differs):

* ``str(q)`` is always canonical. Go caches the input string when it looks canonical, so a
  few non-canonical spellings print verbatim there (``"+1"``, ``"01"``, ``"1E3"``); we print
  ``1``, ``1``, ``1e3``.
* Go drops the suffix altogether when the canonical exponent is outside its suffix table
  (DecimalSI >= 10^21, BinarySI >= 2^70), printing a wrong number (``1000E`` -> ``1``). We keep
  the largest suffix and a bigger mantissa (``1000E``, ``1024Ei``), which round-trips.
* Inputs whose magnitude is >= 10^100, or whose exponent does not fit int32, raise
  :class:`QuantityError` (Go accepts them or wraps the exponent); no real resource is that big.
"""

from __future__ import annotations

import decimal
import functools
from collections.abc import Mapping
from decimal import Decimal
from typing import Final, Literal

__all__ = [
    "BINARY_SI",
    "EXACT_CONTEXT",
    "DECIMAL_EXPONENT",
    "DECIMAL_SI",
    "Format",
    "Quantity",
    "QuantityError",
    "canonical_map",
    "max_resources",
    "sum_resources",
]

Format = Literal["DecimalSI", "BinarySI", "DecimalExponent"]
DECIMAL_SI: Final = "DecimalSI"
BINARY_SI: Final = "BinarySI"
DECIMAL_EXPONENT: Final = "DecimalExponent"

# Exact arithmetic (use EXACT_CONTEXT.add / .subtract on Quantity.value): inputs are bounded
# to < 10^100 at nano granularity (<= ~110 digits), and
# sums of up to millions of them stay far below 400 digits.
EXACT_CONTEXT: Final = decimal.Context(
    prec=400,
    rounding=decimal.ROUND_HALF_EVEN,
    Emax=decimal.MAX_EMAX,
    Emin=decimal.MIN_EMIN,
    traps=[decimal.InvalidOperation, decimal.Inexact, decimal.DivisionByZero, decimal.Overflow],
)
_ROUND_CTX: Final = decimal.Context(
    prec=400, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN, traps=[decimal.InvalidOperation]
)
_NANO: Final = Decimal("1e-9")
_MAX_BINARY: Final = Decimal(2**63 - 1)
_MAX_ADJUSTED: Final = 99  # |value| < 10^100
_DIGITS: Final = frozenset("0123456789")
_SUFFIX_CHARS: Final = frozenset("eEinumkKMGTP")

_DEC_SUFFIXES: Final[dict[str, int]] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_BIN_SUFFIXES: Final[dict[str, int]] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DEC_BY_EXP: Final[dict[int, str]] = {v: k for k, v in _DEC_SUFFIXES.items()}
_BIN_BY_POW: Final[dict[int, str]] = {v // 10: k for k, v in _BIN_SUFFIXES.items()}
# Go's float32(exponent)*3/10 for each binary exponent: digits of decimal precision eaten.
_BIN_PRECISION: Final[dict[int, int]] = {10: 3, 20: 6, 30: 9, 40: 12, 50: 15, 60: 18}

# math.Pow10 tables (Go): pow10tab = 1e0..1e31, pow10postab32/negtab32 = 1e(32*i) / 1e-(32*i).
_POW10TAB: Final = tuple(float(f"1e{i}") for i in range(32))
_POW10POS32: Final = tuple(float(f"1e{32 * i}") for i in range(10))
_POW10NEG32: Final = tuple(float(f"1e-{32 * i}") for i in range(11))


class QuantityError(ValueError):
    """A string that is not a valid Kubernetes quantity (message names the text)."""


def _go_pow10(n: int) -> float:
    """Go's ``math.Pow10``: the same table lookups, so the same float."""
    if 0 <= n <= 308:
        return _POW10POS32[n // 32] * _POW10TAB[n % 32]
    if -323 <= n < 0:
        return _POW10NEG32[(-n) // 32] / _POW10TAB[(-n) % 32]
    return float("inf") if n > 0 else 0.0


def _strip_factors(mantissa: int, base: int) -> tuple[int, int]:
    """Divide |mantissa| by base while it divides exactly; return (mantissa, times)."""
    neg = mantissa < 0
    m = -mantissa if neg else mantissa
    times = 0
    if base == 10:
        s = str(m)
        t = s.rstrip("0")
        if t and len(t) < len(s):
            times = len(s) - len(t)
            m = int(t)
    else:
        while m >= base and m % base == 0:
            m //= base
            times += 1
    return (-m if neg else m), times


@functools.total_ordering
class Quantity:
    """An immutable, hashable Kubernetes ``resource.Quantity``.

    Build with :meth:`parse` (or :meth:`zero`); combine with ``+``, ``-``, comparisons and the
    builtin ``max`` (ties keep the first argument, as Go's ``Cmp``-based max does).
    ``str(q)`` is the canonical form Go's ``Quantity.String()`` prints.

    Attributes:
        format: ``"DecimalSI"``, ``"BinarySI"`` or ``"DecimalExponent"``.
    """

    __slots__ = ("_d", "_fmt", "_s")

    _d: Decimal
    _fmt: Format
    _s: str | None

    def __init__(self, value: Decimal, fmt: Format = DECIMAL_SI) -> None:
        """Low-level constructor: ``value`` must be exact; prefer :meth:`parse`."""
        object.__setattr__(self, "_d", value)
        object.__setattr__(self, "_fmt", fmt)
        object.__setattr__(self, "_s", None)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Quantity is immutable")

    # ------------------------------------------------------------------ construction
    @staticmethod
    def parse(s: str | int | float) -> Quantity:
        """Parse a Kubernetes quantity exactly.

        Args:
            s: a quantity string (``"500m"``, ``"1Gi"``, ``"1e3"``), or an int / finite float
               (formatted with ``str`` first, as a JSON int-or-string would be).

        Returns:
            The Quantity.

        Raises:
            QuantityError: the text is not a quantity (message quotes it), or is out of range.
        """
        if isinstance(s, bool) or not isinstance(s, (str, int, float)):
            raise QuantityError(
                f"quantity must be a string or number, got {type(s).__name__}: {s!r}"
            )
        if not isinstance(s, str):
            s = str(s)
        return _parse_cached(s)

    @staticmethod
    def zero() -> Quantity:
        """The zero quantity (DecimalSI)."""
        return _ZERO

    # ------------------------------------------------------------------ accessors
    @property
    def format(self) -> Format:
        """``"DecimalSI"`` | ``"BinarySI"`` | ``"DecimalExponent"``."""
        return self._fmt

    @property
    def value(self) -> Decimal:
        """The exact numeric value."""
        return self._d

    def is_zero(self) -> bool:
        """True when the value is 0."""
        return not self._d

    def sign(self) -> int:
        """-1, 0 or 1."""
        return (self._d > 0) - (self._d < 0)

    def as_float(self) -> float:
        """Go's ``AsApproximateFloat64``: float(unscaled) * Pow10(exponent), +-Inf on overflow."""
        sign, digits, exp = self._d.as_tuple()
        assert isinstance(exp, int)
        unscaled = int("".join(map(str, digits))) if digits else 0
        try:
            base = float(unscaled)
        except OverflowError:
            base = float("inf")
        if sign:
            base = -base
        if exp == 0:
            return base
        return base * _go_pow10(exp)

    # ------------------------------------------------------------------ arithmetic
    def __add__(self, other: object) -> Quantity:
        if not isinstance(other, Quantity):
            return NotImplemented
        fmt = other._fmt if not self._d else self._fmt
        return Quantity(EXACT_CONTEXT.add(self._d, other._d), fmt)

    def __sub__(self, other: object) -> Quantity:
        if not isinstance(other, Quantity):
            return NotImplemented
        fmt = other._fmt if not self._d else self._fmt
        return Quantity(EXACT_CONTEXT.subtract(self._d, other._d), fmt)

    def __neg__(self) -> Quantity:
        return Quantity(EXACT_CONTEXT.minus(self._d), self._fmt)

    # ------------------------------------------------------------------ comparison
    # __ne__ is Python's inverse of __eq__; __le__, __gt__, __ge__ come from total_ordering.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self._d == other._d

    def __lt__(self, other: Quantity) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self._d < other._d

    def __hash__(self) -> int:
        return hash(self._d)

    def cmp(self, other: Quantity) -> int:
        """Go's ``Cmp``: -1, 0 or 1."""
        return (self._d > other._d) - (self._d < other._d)

    # ------------------------------------------------------------------ formatting
    def __str__(self) -> str:
        s = self._s
        if s is None:
            s = _canonical(self._d, self._fmt)
            object.__setattr__(self, "_s", s)
        return s

    def __repr__(self) -> str:
        return f"Quantity({str(self)!r}, {self._fmt})"

    def __reduce__(self) -> tuple[object, ...]:
        return (Quantity, (self._d, self._fmt))


_ZERO: Final = Quantity(Decimal(0), DECIMAL_SI)


@functools.lru_cache(maxsize=16384)
def _canonical(d: Decimal, fmt: Format) -> str:
    """Go's ``CanonicalizeBytes`` + suffix (see module docstring for the one deviation)."""
    if not d:
        return "0"
    if fmt == BINARY_SI:
        if -1024 < d < 1024 or d != d.to_integral_value(rounding=decimal.ROUND_UP):
            fmt = DECIMAL_SI
        else:
            mantissa, times = _strip_factors(int(d), 1024)
            if times > 6:  # beyond Ei: keep Ei with a bigger mantissa (Go drops the suffix)
                mantissa *= 1024 ** (times - 6)
                times = 6
            return f"{mantissa}{_BIN_BY_POW.get(times, '')}"
    sign, digits, exp = d.as_tuple()
    assert isinstance(exp, int)
    mantissa = int("".join(map(str, digits)))
    mantissa, times = _strip_factors(mantissa, 10)
    exp += times
    rem = exp % 3  # Python's floor mod: 1 -> *10, 2 -> *100 (same as Go's case split)
    if rem:
        mantissa *= 10**rem
        exp -= rem
    if sign:
        mantissa = -mantissa
    if fmt == DECIMAL_EXPONENT:
        return f"{mantissa}" if exp == 0 else f"{mantissa}e{exp}"
    if exp > 18:  # beyond E: keep E with a bigger mantissa (Go drops the suffix)
        mantissa *= 10 ** (exp - 18)
        exp = 18
    return f"{mantissa}{_DEC_BY_EXP[exp]}"


def _scan(text: str) -> tuple[bool, str, str, str, str]:
    """Go's ``parseQuantityString``: (positive, value, num, denom, suffix)."""
    end = len(text)
    pos = 0
    positive = True
    if end and text[0] in "+-":
        positive = text[0] == "+"
        pos = 1
    while pos < end and text[pos] == "0":
        pos += 1
    if pos >= end:
        return positive, "0", "0", "", ""
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    num = text[start:pos] or "0"
    if pos >= end:
        return positive, text, num, "", ""
    denom = ""
    if text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        denom = text[start:pos]
        if pos >= end:
            return positive, text, num, denom, ""
    value = text[:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos < end:
        raise QuantityError(f"invalid quantity {text!r}: unexpected character {text[pos]!r}")
    return positive, value, num, denom, text[suffix_start:]


def _interpret(text: str, suffix: str) -> tuple[int, int, Format]:
    """Go's suffixer ``interpret``: (base, exponent, format)."""
    if suffix in _DEC_SUFFIXES:
        return 10, _DEC_SUFFIXES[suffix], DECIMAL_SI
    if suffix in _BIN_SUFFIXES:
        return 2, _BIN_SUFFIXES[suffix], BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE":
        rest = suffix[1:]
        body = rest[1:] if rest[0] in "+-" else rest
        if body and all(c in _DIGITS for c in body):
            exp = int(rest)
            if -(2**31) <= exp < 2**31:
                return 10, exp, DECIMAL_EXPONENT
            raise QuantityError(f"invalid quantity {text!r}: exponent out of range")
    raise QuantityError(f"invalid quantity {text!r}: unknown suffix {suffix!r}")


@functools.lru_cache(maxsize=8192)
def _parse_cached(text: str) -> Quantity:
    if not text:
        raise QuantityError("invalid quantity '': empty string")
    if text == "0":
        return _ZERO
    positive, value, num, denom, suffix = _scan(text)
    base, exponent, fmt = _interpret(text, suffix)

    # Go's fast path (int64Amount): its (unscaled, scale) is what AsApproximateFloat64 sees.
    if base == 10:
        precision = 18 - (len(num) + len(denom))
        scale = exponent - len(denom)
        if precision >= 0 and scale >= -9:
            unscaled = int(num + denom)
            digits = tuple(int(c) for c in str(unscaled))
            if len(digits) + scale - 1 > _MAX_ADJUSTED:
                raise QuantityError(f"invalid quantity {text!r}: out of supported range (>= 1e100)")
            return Quantity(Decimal((0 if positive else 1, digits, scale)), fmt)
    elif not denom:
        precision = 15 - len(num) - _BIN_PRECISION[exponent] - 1
        if precision >= 0:
            unscaled = int(num) << exponent
            if unscaled < 2**63:
                return Quantity(Decimal(unscaled if positive else -unscaled), fmt)

    # Go's slow path (inf.Dec).
    try:
        amount = Decimal(value)
    except decimal.InvalidOperation:
        raise QuantityError(f"invalid quantity {text!r}: unable to parse numeric part") from None
    if amount:
        if amount.adjusted() + (exponent if base == 10 else exponent // 3 + 1) > _MAX_ADJUSTED:
            raise QuantityError(f"invalid quantity {text!r}: out of supported range (>= 1e100)")
        sign, digits, exp = amount.as_tuple()
        assert isinstance(exp, int)
        if base == 10:
            if amount.adjusted() + exponent < -12:  # anything this small rounds up to 1n
                amount = Decimal((sign, (1,), -12))
            else:
                amount = Decimal((sign, digits, exp + exponent))
        else:
            amount = Decimal(
                (sign, tuple(int(c) for c in str(int("".join(map(str, digits))) << exponent)), exp)
            )
        amount = amount.quantize(_NANO, rounding=decimal.ROUND_UP, context=_ROUND_CTX)
        if fmt == BINARY_SI:
            if amount.copy_abs() > _MAX_BINARY:
                amount = _MAX_BINARY.copy_sign(amount)
            if amount.copy_abs() < 1:
                fmt = DECIMAL_SI
    elif not positive:
        amount = amount.copy_abs()
    return Quantity(amount, fmt)


# ---------------------------------------------------------------------- resource maps
def sum_resources(a: Mapping[str, Quantity], b: Mapping[str, Quantity]) -> dict[str, Quantity]:
    """Per-resource sum over the union of names (missing = 0), Go ``Add`` formats.

    Args:
        a: name -> Quantity (left operand: its formats win where non-zero).
        b: name -> Quantity.

    Returns:
        A new dict name -> Quantity, sorted by name.
    """
    out: dict[str, Quantity] = {}
    for name in sorted(a.keys() | b.keys()):
        out[name] = a.get(name, _ZERO) + b.get(name, _ZERO)
    return out


def max_resources(a: Mapping[str, Quantity], b: Mapping[str, Quantity]) -> dict[str, Quantity]:
    """Per-resource maximum over the union of names (missing = 0); ties keep ``a``'s.

    Returns:
        A new dict name -> Quantity, sorted by name.
    """
    out: dict[str, Quantity] = {}
    for name in sorted(a.keys() | b.keys()):
        x = a.get(name)
        y = b.get(name)
        if x is None:
            out[name] = max(_ZERO, y) if y is not None else _ZERO
        elif y is None:
            out[name] = max(x, _ZERO)
        else:
            out[name] = y if y > x else x
    return out


def canonical_map(m: Mapping[str, Quantity]) -> dict[str, str]:
    """name -> canonical quantity string, in name order (the wire form of a resource map)."""
    return {name: str(m[name]) for name in sorted(m)}
