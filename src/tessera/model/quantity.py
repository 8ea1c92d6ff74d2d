"""Kubernetes resource quantities ("500m", "1.5", "512Mi", "1G", "1e3") read exactly.

The grammar is Kubernetes' own (k8s.io/apimachinery ``resource.Quantity``)::

    quantity  ::= sign? number suffix?
    number    ::= digits | digits "." digits? | "." digits
    suffix    ::= binarySI | decimalSI | ("e" | "E") sign? digits
    binarySI  ::= Ki | Mi | Gi | Ti | Pi | Ei          (powers of 1024)
    decimalSI ::= m | k | M | G | T | P | E            (powers of 1000; m = 1/1000)

Values are kept as exact fractions; conversions round up, as Kubernetes does when it
reads a quantity at a coarser scale (``MilliValue``, ``Value``). Every error is a
``SpecError`` naming the field it came from.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

from tessera.errors import SpecError

__all__ = ["Quantity", "cpu_milli", "memory_mib", "parse_quantity"]

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"m": -1, "k": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}
_SYNTAX = re.compile(
    r"(?P<sign>[+-]?)(?P<number>\d+(?:\.\d*)?|\.\d+)"
    r"(?:(?P<exp>[eE][+-]?\d+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E))?"
)
# Bounds that keep exact arithmetic cheap; far beyond any real request.
_MAX_TEXT = 64
_MAX_EXPONENT = 30
_MIB = 1 << 20

RULE = "must be a Kubernetes quantity such as 500m, 2, 1.5, 512Mi, 1G or 1e3"


@dataclass(frozen=True, slots=True)
class Quantity:
    """An exact quantity and the suffix it was written with (``""`` if none)."""

    value: Fraction
    suffix: str = ""

    @property
    def binary(self) -> bool:
        """Whether it was written with a binary suffix (Ki, Mi, ...)."""
        return self.suffix in _BINARY

    @property
    def is_integer(self) -> bool:
        return self.value.denominator == 1

    def ceil(self) -> int:
        return math.ceil(self.value)


def parse_quantity(raw: object, field: str) -> Quantity:
    """Read ``raw`` (a quantity string, or an int from a YAML-loaded manifest)."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise SpecError(field, RULE, raw)
    if isinstance(raw, float) and not math.isfinite(raw):
        raise SpecError(field, RULE, raw)
    text = str(raw).strip()
    m = _SYNTAX.fullmatch(text) if len(text) <= _MAX_TEXT else None
    if m is None:
        raise SpecError(field, RULE, raw)
    value = Fraction(m["number"])
    suffix = ""
    if m["exp"] is not None:
        exponent = int(m["exp"][1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise SpecError(field, f"exponent must be within ±{_MAX_EXPONENT}", raw)
        value *= Fraction(10) ** exponent
        suffix = m["exp"]
    elif m["suffix"] is not None:
        suffix = m["suffix"]
        if suffix in _BINARY:
            value *= 1024 ** _BINARY[suffix]
        else:
            value *= Fraction(1000) ** _DECIMAL[suffix]
    if m["sign"] == "-":
        value = -value
    return Quantity(value, suffix)


def _non_negative(raw: object, field: str) -> Quantity:
    q = parse_quantity(raw, field)
    if q.value < 0:
        raise SpecError(field, "must not be negative", raw)
    return q


def cpu_milli(raw: object, field: str) -> int:
    """CPU in millicores, rounded up ("1.5" -> 1500, "100m" -> 100, "0.0001" -> 1)."""
    return math.ceil(_non_negative(raw, field).value * 1000)


def memory_mib(raw: object, field: str) -> int:
    """Memory in MiB, rounded up to a whole MiB ("1Gi" -> 1024, "1G" -> 954)."""
    return math.ceil(_non_negative(raw, field).value / _MIB)
