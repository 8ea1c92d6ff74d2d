"""Kubernetes' CEL libraries for quantities and versions, as far as DRA selectors use
them (pure; for ``claim_cel.py``).

kube-scheduler evaluates a device selector with Kubernetes' own CEL functions:
``quantity("40Gi")``, ``isQuantity``, and on a quantity ``compareTo``, ``isLessThan``,
``isGreaterThan``, ``isInteger``, ``asInteger``, ``asApproximateFloat``, ``sign``,
``add`` and ``sub`` (k8s.io/apiserver pkg/cel/library/quantity.go); ``semver("1.2.3")``,
``isSemver``, and on a version ``major``, ``minor``, ``patch`` and the three
comparisons (semverlib.go). A device's capacities are quantities and its ``version``
attributes are versions.

The CEL library here takes Python functions, called with the receiver first for a
member call, and carries only CEL's own types. So a quantity travels as the one-entry
map ``{QUANTITY: "n/d"}`` (its exact value, reduced) and a version as ``{SEMVER:
"1.2.3-rc.1"}`` (build metadata dropped). Equal values are equal maps, so ``==`` agrees
with Kubernetes, and ``<`` on them is refused as it is there. A function given something
else raises, and the selector is not weighed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from tessera.errors import SpecError
from tessera.model.quantity import parse_quantity

__all__ = ["FUNCTIONS", "QUANTITY", "SEMVER", "CelArgumentError", "quantity_value", "semver_value"]

QUANTITY = "k8s.io/quantity"
SEMVER = "k8s.io/semver"

_INT64 = (-(1 << 63), (1 << 63) - 1)

# Semantic Versioning 2.0.0 as blang/semver parses it: no leading zeros, no "v".
_NUMBER = r"(?:0|[1-9]\d*)"
_IDENT = r"(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)"
_STRICT = re.compile(
    rf"(?P<major>{_NUMBER})\.(?P<minor>{_NUMBER})\.(?P<patch>{_NUMBER})"
    rf"(?:-(?P<pre>{_IDENT}(?:\.{_IDENT})*))?(?:\+(?P<build>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)
# semver(s, true): a leading "v", missing minor or patch, and leading zeros are allowed.
_LOOSE = re.compile(
    r"v?(?P<major>\d+)(?:\.(?P<minor>\d+))?(?:\.(?P<patch>\d+))?"
    rf"(?:-(?P<pre>{_IDENT}(?:\.{_IDENT})*))?(?:\+(?P<build>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)


class CelArgumentError(TypeError):
    """A function was given a value it has no overload for, or one it cannot take."""


def quantity_value(text: str) -> dict[str, str]:
    """The CEL value of a quantity string (a device's capacity, or ``quantity(s)``)."""
    try:
        value = parse_quantity(text, "quantity").value
    except SpecError as exc:
        raise CelArgumentError(f"quantity({text!r}): {exc.rule}") from exc
    return _quantity(value)


def semver_value(text: str, normalize: bool = False) -> dict[str, str]:
    """The CEL value of a version string (a ``version`` attribute, or ``semver(s)``)."""
    m = (_LOOSE if normalize else _STRICT).fullmatch(text)
    if m is None:
        raise CelArgumentError(f"semver({text!r}): not a semantic version")
    core = ".".join(str(int(m[k] or 0)) for k in ("major", "minor", "patch"))
    return {SEMVER: core + (f"-{m['pre']}" if m["pre"] else "")}


def _quantity(value: Fraction) -> dict[str, str]:
    return {QUANTITY: f"{value.numerator}/{value.denominator}"}


def _q(arg: object, name: str) -> Fraction:
    if isinstance(arg, Mapping) and set(arg) == {QUANTITY}:
        return Fraction(str(arg[QUANTITY]))
    raise CelArgumentError(f"{name}: no overload for {_kind(arg)}")


def _v(arg: object, name: str) -> tuple[int, int, int, list[int | str] | None]:
    if isinstance(arg, Mapping) and set(arg) == {SEMVER}:
        core, _, pre = str(arg[SEMVER]).partition("-")
        major, minor, patch = (int(p) for p in core.split("."))
        ids = [int(i) if i.isdigit() else i for i in pre.split(".")] if pre else None
        return major, minor, patch, ids
    raise CelArgumentError(f"{name}: no overload for {_kind(arg)}")


def _kind(arg: object) -> str:
    if isinstance(arg, Mapping) and len(arg) == 1:
        key = str(next(iter(arg)))
        if key in (QUANTITY, SEMVER):
            return key.rpartition("/")[2]
    return type(arg).__name__


def _semver_order(a: object, b: object, name: str) -> int:
    """-1, 0 or 1 as Semantic Versioning orders them (precedence 11)."""
    x, y = _v(a, name), _v(b, name)
    if x[:3] != y[:3]:
        return -1 if x[:3] < y[:3] else 1
    px, py = x[3], y[3]
    if px is None or py is None:  # a release is above its pre-releases
        return 0 if px is py else (1 if px is None else -1)
    for i, j in zip(px, py, strict=False):
        if i == j:
            continue
        if isinstance(i, int) != isinstance(j, int):
            return -1 if isinstance(i, int) else 1  # numeric identifiers sort first
        return -1 if i < j else 1  # type: ignore[operator]  # same type here
    return (len(px) > len(py)) - (len(px) < len(py))


def _order(a: object, b: object, name: str) -> int:
    if isinstance(a, Mapping) and SEMVER in a:
        return _semver_order(a, b, name)
    x, y = _q(a, name), _q(b, name)
    return (x > y) - (x < y)


def _as_integer(a: object) -> int:
    value = _q(a, "asInteger")
    if value.denominator != 1 or not _INT64[0] <= value <= _INT64[1]:
        raise CelArgumentError("asInteger: cannot convert value to integer")
    return int(value)


def _plus(a: object, b: object, name: str, sign: int) -> dict[str, str]:
    right = Fraction(b) if isinstance(b, int) and not isinstance(b, bool) else _q(b, name)
    return _quantity(_q(a, name) + sign * right)


def _sign(a: object) -> int:
    value = _q(a, "sign")
    return (value > 0) - (value < 0)


def _part(index: int, name: str) -> Callable[[object], int]:
    def part(a: object) -> int:
        return _v(a, name)[index]  # type: ignore[return-value]  # 0-2 are ints

    return part


def _string(arg: object, name: str) -> str:
    if not isinstance(arg, str):
        raise CelArgumentError(f"{name}: no overload for {_kind(arg)}")
    return arg


def _is(parse: Callable[[str], object], arg: object, name: str) -> bool:
    try:
        parse(_string(arg, name))
    except CelArgumentError:
        return False
    return True


def _semver(text: object, normalize: object = False) -> dict[str, str]:
    return semver_value(_string(text, "semver"), normalize is True)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": lambda s: quantity_value(_string(s, "quantity")),
    "isQuantity": lambda s: _is(quantity_value, s, "isQuantity"),
    "semver": _semver,
    "isSemver": lambda s, normalize=False: _is(
        lambda t: semver_value(t, normalize is True), s, "isSemver"
    ),
    "compareTo": lambda a, b: _order(a, b, "compareTo"),
    "isLessThan": lambda a, b: _order(a, b, "isLessThan") < 0,
    "isGreaterThan": lambda a, b: _order(a, b, "isGreaterThan") > 0,
    "isInteger": lambda a: _q(a, "isInteger").denominator == 1,
    "asInteger": _as_integer,
    "asApproximateFloat": lambda a: float(_q(a, "asApproximateFloat")),
    "sign": _sign,
    "add": lambda a, b: _plus(a, b, "add", 1),
    "sub": lambda a, b: _plus(a, b, "sub", -1),
    "major": _part(0, "major"),
    "minor": _part(1, "minor"),
    "patch": _part(2, "patch"),
}
