"""Kubernetes quantities (``bigfleet_trio/quantity.py``).

Expected values worked out by hand from Go's rules.
"""

from __future__ import annotations

import math
from decimal import Decimal

import pytest

from bigfleet_trio.quantity import (
    Quantity,
    QuantityError,
    canonical_map,
    max_resources,
    sum_resources,
)

Q = Quantity.parse


@pytest.mark.parametrize(
    ("text", "canonical", "fmt"),
    [
        # canonical forms Go prints (suffix chosen so the mantissa is an integer)
        ("8000", "8k", "DecimalSI"),
        ("8192", "8192", "DecimalSI"),
        ("65536", "65536", "DecimalSI"),
        ("16", "16", "DecimalSI"),
        ("1000m", "1", "DecimalSI"),
        ("1500", "1500", "DecimalSI"),
        ("0.5", "500m", "DecimalSI"),
        ("1024Mi", "1Gi", "BinarySI"),
        ("33280Mi", "33280Mi", "BinarySI"),
        # every decimal SI suffix
        ("1n", "1n", "DecimalSI"),
        ("1u", "1u", "DecimalSI"),
        ("1m", "1m", "DecimalSI"),
        ("1", "1", "DecimalSI"),
        ("1k", "1k", "DecimalSI"),
        ("1M", "1M", "DecimalSI"),
        ("1G", "1G", "DecimalSI"),
        ("1T", "1T", "DecimalSI"),
        ("1P", "1P", "DecimalSI"),
        ("1E", "1E", "DecimalSI"),
        # every binary suffix
        ("1Ki", "1Ki", "BinarySI"),
        ("1Mi", "1Mi", "BinarySI"),
        ("1Gi", "1Gi", "BinarySI"),
        ("1Ti", "1Ti", "BinarySI"),
        ("1Pi", "1Pi", "BinarySI"),
        ("1Ei", "1Ei", "BinarySI"),
        # carrying up / down to the next multiple-of-3 exponent
        ("1000n", "1u", "DecimalSI"),
        ("1000u", "1m", "DecimalSI"),
        ("1000k", "1M", "DecimalSI"),
        ("1000M", "1G", "DecimalSI"),
        ("1000G", "1T", "DecimalSI"),
        ("1000T", "1P", "DecimalSI"),
        ("1000P", "1E", "DecimalSI"),
        ("1500m", "1500m", "DecimalSI"),  # 15e2 * 1e-3 = 15e-1 -> 1500e-3
        ("1.5", "1500m", "DecimalSI"),
        ("2.5k", "2500", "DecimalSI"),  # 25e2 -> exp 2 -> 2500e0
        ("12.5M", "12500k", "DecimalSI"),  # 125e5 -> 12500e3
        ("0.001", "1m", "DecimalSI"),
        ("0.0001", "100u", "DecimalSI"),  # 1e-4 -> 100e-6
        ("100m", "100m", "DecimalSI"),
        ("10k", "10k", "DecimalSI"),
        ("1.000", "1", "DecimalSI"),
        ("1024", "1024", "DecimalSI"),
        ("1Gi", "1Gi", "BinarySI"),
        ("2048Mi", "2Gi", "BinarySI"),
        ("1536Mi", "1536Mi", "BinarySI"),
        ("1.5Gi", "1536Mi", "BinarySI"),
        ("1.5Ki", "1536", "BinarySI"),  # 1536 = 1.5 * 1024: no whole Ki
        ("0.5Ki", "512", "BinarySI"),  # |v| < 1024 prints as DecimalSI
        ("1000Ki", "1000Ki", "BinarySI"),
        ("1048576Ki", "1Gi", "BinarySI"),
        ("-1Ki", "-1Ki", "BinarySI"),
        ("1023Ki", "1023Ki", "BinarySI"),
        ("100Ti", "100Ti", "BinarySI"),
        # decimal exponent forms keep exponent notation
        ("1e3", "1e3", "DecimalExponent"),
        ("1E3", "1e3", "DecimalExponent"),  # Go prints the cached "1E3"; value equal
        ("1e+3", "1e3", "DecimalExponent"),
        ("1e0", "1", "DecimalExponent"),
        ("1.5e3", "1500", "DecimalExponent"),  # 15e2 -> 1500e0, exponent 0 prints bare
        ("12e6", "12e6", "DecimalExponent"),
        ("1e-3", "1e-3", "DecimalExponent"),
        ("100e-3", "100e-3", "DecimalExponent"),
        ("1e4", "10e3", "DecimalExponent"),
        ("5e-1", "500e-3", "DecimalExponent"),
        # signs and zeros
        ("-1", "-1", "DecimalSI"),
        ("-500m", "-500m", "DecimalSI"),
        ("-8000", "-8k", "DecimalSI"),
        ("+1", "1", "DecimalSI"),
        ("01", "1", "DecimalSI"),
        ("007k", "7k", "DecimalSI"),
        ("0", "0", "DecimalSI"),
        ("0m", "0", "DecimalSI"),
        ("-0", "0", "DecimalSI"),
        ("0.0", "0", "DecimalSI"),
        ("0Mi", "0", "BinarySI"),
        # Go's lenient scanner corners
        ("5.", "5", "DecimalSI"),
        (".5", "500m", "DecimalSI"),
        ("1.G", "1G", "DecimalSI"),
        (".", "0", "DecimalSI"),
        ("+", "0", "DecimalSI"),
        ("-", "0", "DecimalSI"),
        # sub-nano values round UP (away from zero) to the next nano
        ("0.1n", "1n", "DecimalSI"),
        ("1.5n", "2n", "DecimalSI"),
        ("-1.5n", "-2n", "DecimalSI"),
        ("1.0000000001", "1000000001n", "DecimalSI"),
        ("0.0000000001", "1n", "DecimalSI"),
        ("1e-20", "1e-9", "DecimalExponent"),
        ("1e-12", "1e-9", "DecimalExponent"),
        # BinarySI cap at 2^63-1 (Go's maxAllowed)
        ("8Ei", "9223372036854775807", "BinarySI"),
        ("1024Ei", "9223372036854775807", "BinarySI"),
        # large decimal values beyond E keep E (Go drops the suffix: documented deviation)
        ("1000E", "1000E", "DecimalSI"),
        ("123456789012345678901234", "123456789012345678901234", "DecimalSI"),
        ("1e21", "1e21", "DecimalExponent"),
    ],
)
def test_parse_canonical(text: str, canonical: str, fmt: str) -> None:
    q = Q(text)
    assert str(q) == canonical
    assert q.format == fmt
    # the canonical form parses back to the same value
    assert Q(canonical) == q


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1n", Decimal("1e-9")),
        ("1u", Decimal("1e-6")),
        ("1m", Decimal("0.001")),
        ("1k", Decimal(1000)),
        ("1M", Decimal(10**6)),
        ("1G", Decimal(10**9)),
        ("1T", Decimal(10**12)),
        ("1P", Decimal(10**15)),
        ("1E", Decimal(10**18)),
        ("1Ki", Decimal(1024)),
        ("1Mi", Decimal(1048576)),
        ("1Gi", Decimal(1073741824)),
        ("1Ti", Decimal(1099511627776)),
        ("1Pi", Decimal(1125899906842624)),
        ("1Ei", Decimal(1152921504606846976)),
        ("3.5Gi", Decimal(3758096384)),
        ("2e2", Decimal(200)),
        ("-2.5", Decimal("-2.5")),
    ],
)
def test_exact_values(text: str, value: Decimal) -> None:
    assert Q(text).value == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        " 1",
        "1 ",
        "abc",
        "1K",  # upper-case K is not a suffix
        "1ki",
        "1mi",
        "1e",
        "1ee3",
        "1e3.5",
        "1.5.5",
        "1Mi3",
        "1m5",
        "--1",
        "1-1",
        "0x10",
        "1b",
        "1 Gi",
        "１",  # full-width digit is not an ASCII digit
        "1e99999999999",  # exponent does not fit int32
        "1e100",  # out of supported range
        "1_000",
        "nan",
        "inf",
    ],
)
def test_parse_errors_name_the_text(text: str) -> None:
    with pytest.raises(QuantityError) as exc:
        Q(text)
    assert repr(text) in str(exc.value)
    assert isinstance(exc.value, ValueError)


@pytest.mark.parametrize("bad", [None, [], True, float("nan"), float("inf")])
def test_parse_rejects_non_quantities(bad: object) -> None:
    with pytest.raises(QuantityError):
        Q(bad)  # type: ignore[arg-type]


def test_parse_numbers() -> None:
    assert str(Q(8)) == "8"
    assert str(Q(8000)) == "8k"
    assert str(Q(0.5)) == "500m"
    assert str(Q(1.5)) == "1500m"


@pytest.mark.parametrize(
    ("a", "b", "total", "fmt"),
    [
        ("500m", "500m", "1", "DecimalSI"),
        ("2", "2500m", "4500m", "DecimalSI"),
        ("1Gi", "1Gi", "2Gi", "BinarySI"),
        ("1Gi", "512Mi", "1536Mi", "BinarySI"),
        ("8", "8", "16", "DecimalSI"),
        ("4k", "4k", "8k", "DecimalSI"),
        # the left operand's format is kept
        ("1Ki", "1024", "2Ki", "BinarySI"),
        ("1024", "1Ki", "2048", "DecimalSI"),
        ("1e3", "1k", "2e3", "DecimalExponent"),
        ("1k", "1e3", "2k", "DecimalSI"),
        # ... unless the left operand is zero: then the right one's
        ("0", "1Gi", "1Gi", "BinarySI"),
        ("0Mi", "1k", "1k", "DecimalSI"),
        # BinarySI with a fraction prints DecimalSI
        ("1Ki", "500m", "1024500m", "BinarySI"),
        ("1", "-1", "0", "DecimalSI"),
    ],
)
def test_add(a: str, b: str, total: str, fmt: str) -> None:
    s = Q(a) + Q(b)
    assert str(s) == total
    assert s.format == fmt


def test_add_chain_and_sub() -> None:
    assert str(Q("1") + Q("1") + Q("3")) == "5"
    assert str(Q("1Gi") - Q("512Mi")) == "512Mi"
    assert str(Q("1") - Q("250m")) == "750m"
    assert str(Q("0") - Q("1Gi")) == "-1Gi"
    assert (Q("0") - Q("1Gi")).format == "BinarySI"
    assert str(-Q("1Gi")) == "-1Gi"


def test_compare_numeric() -> None:
    assert Q("1000m") == Q("1")
    assert hash(Q("1000m")) == hash(Q("1"))
    assert Q("1Ki") == Q("1024")
    assert Q("1e3") == Q("1k")
    assert Q("999m") < Q("1")
    assert Q("1Gi") > Q("1G")
    assert Q("1") <= Q("1000m") and Q("1") >= Q("1000m")
    assert Q("-1") < Q("0")
    assert Q("1").cmp(Q("2")) == -1 and Q("2").cmp(Q("2000m")) == 0 and Q("3").cmp(Q("2")) == 1
    assert Q("1") != Q("2")
    assert len({Q("1"), Q("1000m"), Q("1e0")}) == 1
    assert Q("1") != "1"


def test_max() -> None:
    m = max(Q("3"), Q("4500m"))
    assert str(m) == "4500m"
    # ties keep the first argument (Go keeps the accumulator)
    tie = max(Q("1Ki"), Q("1024"))
    assert tie.format == "BinarySI" and str(tie) == "1Ki"


def test_zero_and_helpers() -> None:
    z = Quantity.zero()
    assert z.is_zero() and str(z) == "0" and z.format == "DecimalSI"
    assert Q("0m").is_zero() and not Q("1n").is_zero()
    assert Q("-1").sign() == -1 and Q("0").sign() == 0 and Q("2").sign() == 1


def test_immutable() -> None:
    q = Q("1")
    with pytest.raises(AttributeError):
        q.foo = 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "f"),
    [
        ("500m", 0.5),
        ("1500m", 1.5),
        ("1", 1.0),
        ("0", 0.0),
        ("8k", 8000.0),
        ("1Gi", 1073741824.0),
        ("0.5", 0.5),
        ("8388608", 8388608.0),
        ("-2", -2.0),
        ("1e3", 1000.0),
        ("2.5", 2.5),
    ],
)
def test_as_float(text: str, f: float) -> None:
    assert Q(text).as_float() == f


def test_as_float_tiny_and_huge() -> None:
    assert Q("1n").as_float() == 1e-9
    assert Q("9E").as_float() == 9e18
    assert math.isclose(Q("1000E").as_float(), 1e21)


def test_resource_maps() -> None:
    a = {"cpu": Q("500m"), "memory": Q("1Gi")}
    b = {"cpu": Q("500m"), "nvidia.com/gpu": Q("8")}
    s = sum_resources(a, b)
    assert canonical_map(s) == {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "8"}
    assert list(s) == ["cpu", "memory", "nvidia.com/gpu"]
    m = max_resources({"cpu": Q("3")}, {"cpu": Q("4500m"), "memory": Q("2Gi")})
    assert canonical_map(m) == {"cpu": "4500m", "memory": "2Gi"}
    # missing counts as zero: a negative value loses to the missing side's 0
    assert canonical_map(max_resources({"x": Q("-1")}, {})) == {"x": "0"}
    assert canonical_map(max_resources({}, {"x": Q("-1")})) == {"x": "0"}
    assert list(canonical_map({"b": Q("1"), "a": Q("2")})) == ["a", "b"]
    assert canonical_map({}) == {}
