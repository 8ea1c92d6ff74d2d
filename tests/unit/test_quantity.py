from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.errors import SpecError
from tessera.model.quantity import cpu_milli, memory_mib, parse_quantity


@pytest.mark.parametrize(
    ("raw", "value", "suffix"),
    [
        ("2", Fraction(2), ""),
        ("1.5", Fraction(3, 2), ""),
        ("500m", Fraction(1, 2), "m"),
        ("1Gi", Fraction(1 << 30), "Gi"),
        ("512Mi", Fraction(512 << 20), "Mi"),
        ("1Ki", Fraction(1024), "Ki"),
        ("1G", Fraction(10**9), "G"),
        ("100k", Fraction(100_000), "k"),
        ("3M", Fraction(3 * 10**6), "M"),
        ("1E", Fraction(10**18), "E"),
        ("4T", Fraction(4 * 10**12), "T"),
        ("2P", Fraction(2 * 10**15), "P"),
        ("1Ti", Fraction(1 << 40), "Ti"),
        ("3Pi", Fraction(3 << 50), "Pi"),
        ("2Ei", Fraction(2 << 60), "Ei"),
        ("1e30", Fraction(10**30), "e30"),
        ("1e-30", Fraction(1, 10**30), "e-30"),
        ("1" * 64, Fraction(int("1" * 64)), ""),  # the longest text read
        ("1e3", Fraction(1000), "e3"),
        ("1E3", Fraction(1000), "E3"),
        ("15e-1", Fraction(3, 2), "e-1"),
        ("+4", Fraction(4), ""),
        ("-4", Fraction(-4), ""),
        (".5", Fraction(1, 2), ""),
        ("5.", Fraction(5), ""),
        (" 7 ", Fraction(7), ""),
        (3, Fraction(3), ""),
        (0.25, Fraction(1, 4), ""),
    ],
)
def test_parse(raw: object, value: Fraction, suffix: str) -> None:
    q = parse_quantity(raw, "f")
    assert (q.value, q.suffix) == (value, suffix)


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "abc",
        "1.2.3",
        "1 Gi",
        "1gi",
        "1KB",
        "Mi",
        "1e",
        "1e1.5",
        "--1",
        "1mi",
        "0x10",
        "1_000",
        None,
        True,
        [1],
        {"a": 1},
        float("nan"),
        float("inf"),
        "1" * 65,
    ],
)
def test_malformed(raw: object) -> None:
    with pytest.raises(SpecError) as exc:
        parse_quantity(raw, "spec.x")
    assert exc.value.field == "spec.x"
    assert "must be a Kubernetes quantity" in str(exc.value)
    assert exc.value.value is raw  # shown as written


def test_huge_exponent_refused_cheaply() -> None:
    for raw in ("1e999999999", "1e31", "1e-31"):
        with pytest.raises(SpecError) as exc:
            parse_quantity(raw, "f")
        assert (exc.value.field, exc.value.rule, exc.value.value) == (
            "f", "exponent must be within ±30", raw)  # fmt: skip


def test_integer_flag() -> None:
    assert parse_quantity("2", "f").is_integer and parse_quantity("1k", "f").is_integer
    assert not parse_quantity("1.5", "f").is_integer
    assert not parse_quantity("500m", "f").is_integer


def test_binary_flag() -> None:
    assert parse_quantity("1Gi", "f").binary
    assert not parse_quantity("1G", "f").binary
    assert not parse_quantity("1e3", "f").binary


@pytest.mark.parametrize(
    ("raw", "milli"),
    [
        ("500m", 500),
        ("2", 2000),
        ("1.5", 1500),
        ("0.0001", 1),
        ("1e3", 1_000_000),
        ("0", 0),
        ("100k", 100_000_000),
        (1, 1000),
    ],
)
def test_cpu_milli_rounds_up(raw: object, milli: int) -> None:
    assert cpu_milli(raw, "f") == milli


@pytest.mark.parametrize(
    ("raw", "mib"),
    [
        ("1Gi", 1024),
        ("512Mi", 512),
        ("1G", 954),
        ("1", 1),
        ("0", 0),
        ("1048576", 1),
        ("1048577", 2),
        ("1.5Gi", 1536),
        ("100k", 1),
        ("1e9", 954),
        ("1Ti", 1 << 20),
    ],
)
def test_memory_mib_rounds_up(raw: object, mib: int) -> None:
    assert memory_mib(raw, "f") == mib


@pytest.mark.parametrize("convert", [cpu_milli, memory_mib])
def test_negative_refused_with_field(convert: Callable[[object, str], int]) -> None:
    with pytest.raises(SpecError) as exc:
        convert("-1", "spec.containers[0].resources.requests[cpu]")
    assert exc.value.field == "spec.containers[0].resources.requests[cpu]"
    assert exc.value.rule == "must not be negative"
    assert exc.value.value == "-1"


@given(
    st.integers(min_value=0, max_value=10**12),
    st.sampled_from(["", "k", "M", "G", "Ki", "Mi", "Gi", "m"]),
)
def test_integer_with_suffix(n: int, suffix: str) -> None:
    scale = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 1 << 10, "Mi": 1 << 20}
    scale |= {"Gi": 1 << 30, "m": Fraction(1, 1000)}
    assert parse_quantity(f"{n}{suffix}", "f").value == n * scale[suffix]


@given(st.decimals(min_value=0, max_value=10**9, allow_nan=False, places=3))
def test_decimal_text_is_exact(d: Decimal) -> None:
    assert parse_quantity(str(d), "f").value == Fraction(d)
    assert cpu_milli(str(d), "f") == int(d * 1000)
