"""Kubernetes' quantity and semver CEL functions, evaluated by the CEL library the way
kube-scheduler's DRA allocator evaluates them (k8s.io/apiserver pkg/cel/library)."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.view.cel_kube import QUANTITY, SEMVER, quantity_value, semver_value
from tessera.view.claim_cel import Selector, device_variable

DRIVER = "gpu.tessera.io"
DEVICE = device_variable(
    {
        "name": "gpu-0",
        "allowMultipleAllocations": True,
        "attributes": {
            "model": {"string": "A100"},
            "driverVersion": {"version": "535.104.5"},
            "example.com/rack": {"string": "r1"},
            "odd": {"version": "535.104.05"},  # no semver: left out, as Kubernetes refuses it
        },
        "capacity": {"memory": {"value": "40Gi"}, "compute": {"value": "100"}},
    },
    DRIVER,
)


def _literal(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('quantity("1Gi") == quantity("1024Mi")', True),  # equal values, however written
        ('quantity("1") == quantity("1000m")', True),
        ('quantity("1k") == quantity("1Ki")', False),
        ('quantity("500m").isLessThan(quantity("1"))', True),
        ('quantity("2G").isGreaterThan(quantity("1Gi"))', True),
        ('quantity("1Gi").compareTo(quantity("1G"))', 1),
        ('quantity("1e3").compareTo(quantity("1k"))', 0),
        ('quantity("1.5").isInteger()', False),
        ('quantity("2k").isInteger()', True),
        ('quantity("1").isLessThan(quantity("1000m"))', False),  # equal is neither
        ('quantity("1").isGreaterThan(quantity("1000m"))', False),
        ('quantity("2").isLessThan(quantity("1"))', False),
        ('quantity("500m").sign()', 1),
        ('quantity("1.5k").asInteger()', 1500),
        ('quantity("250m").asApproximateFloat()', 0.25),
        ('quantity("-3").sign()', -1),
        ('quantity("0").sign()', 0),
        ('quantity("1Gi").add(quantity("1Gi")) == quantity("2Gi")', True),
        ('quantity("1").add(2).asInteger()', 3),
        ('quantity("1").sub(quantity("1500m")).sign()', -1),
        ('isQuantity("12Mi")', True),
        ('isQuantity("12MB")', False),
        ('semver("1.2.3").major()', 1),
        ('semver("1.2.3").minor()', 2),
        ('semver("1.2.3").patch()', 3),
        ('semver("1.10.0").isGreaterThan(semver("1.9.9"))', True),  # numbers, not text
        ('semver("1.0.0-alpha").isLessThan(semver("1.0.0"))', True),  # a release is above
        ('semver("1.0.0-alpha.1").isLessThan(semver("1.0.0-alpha.beta"))', True),
        ('semver("1.0.0-alpha").isLessThan(semver("1.0.0-alpha.1"))', True),
        ('semver("1.0.0-2").isLessThan(semver("1.0.0-11"))', True),
        ('semver("1.0.0+build.1") == semver("1.0.0+build.2")', True),  # build ignored
        ('semver("1.2.3").compareTo(semver("1.2.3"))', 0),
        ('isSemver("1.2.3")', True),
        ('isSemver("v1.2.3")', False),
        ('isSemver("01.2.3")', False),
        ('isSemver("1.2")', False),
        ('isSemver("v1.2", true)', True),
        ('semver("v535.104.05", true) == semver("535.104.5")', True),
        ('semver("v1", true) == semver("1.0.0")', True),  # missing parts are 0
        ('semver("1.9.9").isLessThan(semver("1.10.0"))', True),
        ('semver("1.2.4").compareTo(semver("1.2.3"))', 1),
        ('semver("1.0.0").isGreaterThan(semver("1.0.0-rc.1"))', True),
        # int64's last values (shifted, as the test compares one past the answer too)
        ('quantity("9223372036854775807").asInteger() - 9223372036854775806', 1),
        ('quantity("-9223372036854775808").asInteger() + 9223372036854775807', -1),
    ],
)
def test_functions_give_what_kubernetes_gives(expression: str, expected: Any) -> None:
    selector = Selector(f"({expression}) == {_literal(expected)}")
    assert selector.test(DEVICE) is True, selector.problem
    other = not expected if isinstance(expected, bool) else expected + 1
    wrong = Selector(f"({expression}) == {_literal(other)}")
    assert wrong.test(DEVICE) is False, wrong.problem


def test_a_devices_capacities_and_versions_are_typed() -> None:
    assert DEVICE["capacity"][DRIVER] == {
        "memory": quantity_value("40Gi"),
        "compute": quantity_value("100"),
    }
    assert DEVICE["attributes"][DRIVER]["driverVersion"] == semver_value("535.104.5")
    assert "odd" not in DEVICE["attributes"][DRIVER]
    assert DEVICE["attributes"]["example.com"] == {"rack": "r1"}
    assert DEVICE["allowMultipleAllocations"] is True
    memory = f'device.capacity["{DRIVER}"].memory'
    version = f'device.attributes["{DRIVER}"].driverVersion'
    assert Selector(f'{memory}.compareTo(quantity("40960Mi")) == 0').test(DEVICE) is True
    assert Selector(f'{version}.isGreaterThan(semver("535.54.3"))').test(DEVICE) is True
    assert Selector(f"{version}.major() >= 550").test(DEVICE) is False


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ('quantity("lots")', "must be a Kubernetes quantity"),
        ('semver("1.2")', "not a semantic version"),
        ('quantity("1.5").asInteger()', "asInteger: cannot convert value to integer"),
        ('quantity("1") < quantity("2")', "No such overload"),  # no ordering operators
        ('quantity("1").compareTo(semver("1.0.0"))', "compareTo: no overload for semver"),
        ("quantity(1)", "quantity: no overload for int"),
        ('quantity("1").major()', "major: no overload for quantity"),
        ('quantity("9223372036854775808").asInteger()', "cannot convert value to integer"),
        ('quantity("-9223372036854775809").asInteger()', "cannot convert value to integer"),
        (f'device.capacity["{DRIVER}"].slots.sign() == 1', ""),  # no such capacity
        # Each function names itself, for either operand.
        ('semver("1.0.0").compareTo(quantity("1"))', "compareTo: no overload for quantity"),
        ('quantity("1").isLessThan("2")', "isLessThan: no overload for str"),
        ('"1".isGreaterThan(quantity("2"))', "isGreaterThan: no overload for str"),
        ('"1".asInteger() == 1', "asInteger: no overload for str"),
        ('"1".sign() == 1', "sign: no overload for str"),
        ('quantity("1").add("1") == quantity("2")', "add: no overload for str"),
        ('"1".sub(1) == quantity("0")', "sub: no overload for str"),
        ("semver(1).major() == 1", "semver: no overload for int"),
    ],
)
def test_what_kubernetes_refuses_does_not_evaluate(expression: str, problem: str) -> None:
    selector = Selector(f"({expression}) == true")
    assert selector.test(DEVICE) is None
    assert problem in selector.problem and selector.problem


def test_the_values_are_exact_and_canonical() -> None:
    assert quantity_value("1.5Ki") == {QUANTITY: "1536/1"}
    assert quantity_value("100m") == {QUANTITY: "1/10"}
    assert semver_value("1.2.3-rc.1+sha") == {SEMVER: "1.2.3-rc.1"}


# Semantic Versioning 2.0.0, item 11: the precedence example, lowest first.
PRECEDENCE = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
              "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1", "1.1.0", "2.0.0"]  # fmt: skip


@pytest.mark.parametrize("i", range(len(PRECEDENCE)))
def test_versions_compare_in_semantic_versioning_precedence(i: int) -> None:
    for j, other in enumerate(PRECEDENCE):
        expression = f'semver("{PRECEDENCE[i]}").compareTo(semver("{other}"))'
        want = (i > j) - (i < j)
        selector = Selector(f"({expression}) == {want}")
        assert selector.test(DEVICE) is True, (expression, want, selector.problem)


def test_a_device_is_read_past_what_kubernetes_would_not_read() -> None:
    """Built here rather than at import, so a mutation run reaches it: an attribute or a
    capacity that is not an object, or a capacity that is not a quantity's text, is left
    out and the rest still read; a capacity's domain is its name's."""
    device = device_variable(
        {
            "attributes": {"broken": "A100", "model": {"string": "A100"}},
            "capacity": {"flat": "40Gi", "count": {"value": 3}, "example.com/links": {"value": "4"},
                         "memory": {"value": "40Gi"}},
        },
        DRIVER,
    )  # fmt: skip
    assert device["attributes"] == {DRIVER: {"model": "A100"}}
    assert device["capacity"] == {
        "example.com": {"links": quantity_value("4")},
        DRIVER: {"memory": quantity_value("40Gi")},
    }


def test_a_selector_that_gives_no_boolean_says_what_it_gives() -> None:
    for expression, kind in (("1 + 1", "int"), (f'device.attributes["{DRIVER}"].model', "str")):
        selector = Selector(expression)
        assert selector.test(DEVICE) is None
        assert selector.problem == f"gives {kind}, not a boolean"
