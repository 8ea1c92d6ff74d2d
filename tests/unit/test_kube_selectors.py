"""Label selectors read as apimachinery's LabelSelectorAsSelector reads them."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.kube.selectors import parse_label_selector, selects

LABELS = {"app": "train", "tier": "gpu"}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        (None, False),  # no selector: nothing
        ({}, True),  # empty: everything
        ({"matchLabels": {"app": "train"}}, True),
        ({"matchLabels": {"app": "serve"}}, False),
        ({"matchLabels": {"team": "a"}}, False),
        ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["x", "train"]}]}, True),
        ({"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]}, False),
        ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["serve"]}]}, False),
        ({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["train"]}]}, False),
        ({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}]}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "team", "operator": "Exists"}]}, False),
        ({"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}, True),
        ({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, False),
        # An operator a label selector does not have (Gt is node affinity's): no match.
        ({"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}, False),
        (
            {
                "matchLabels": {"tier": "gpu"},
                "matchExpressions": [{"key": "app", "operator": "In", "values": ["train"]}],
            },
            True,
        ),
    ],
)
def test_selects_as_the_api_server(selector: dict[str, Any] | None, expected: bool) -> None:
    assert selects(selector, LABELS) is expected


LABELS = {"app": "train", "tier": "gpu", "empty": ""}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", True),
        ("app=train", True),
        ("app==train", True),
        ("app=serve", False),
        ("app!=serve", True),
        ("missing!=x", True),  # != selects an object without the label
        ("app in (serve, train)", True),
        ("app in (serve)", False),
        ("missing in (x)", False),
        ("app notin (serve,x)", True),
        ("app notin (train)", False),
        ("missing notin (x)", True),
        ("tier", True),
        ("missing", False),
        ("!missing", True),
        ("!tier", False),
        ("empty=", True),
        ("app=train,tier in (gpu,cpu),!missing", True),
        ("app=train, tier=cpu", False),  # every requirement must hold
        ("app=train,app=serve", False),
        # The numeric forms: the label read as an integer, a missing or non-integer one
        # neither above nor below.
        ("gen>3", True),
        ("gen > 4", False),
        ("gen<5", True),
        ("gen<4", False),
        ("gen>-1,gen<+5", True),
        ("neg<0", True),
        ("app>1", False),
        ("app<1", False),
        ("missing<1", False),
        ("huge>1", False),  # past int64: not an integer
    ],
)
def test_the_query_string_form_reads_as_the_api_server(text: str, expected: bool) -> None:
    labels = {**LABELS, "gen": "4", "neg": "-2", "huge": str(2**63)}
    assert parse_label_selector(text)(labels) is expected


@pytest.mark.parametrize("text", ["app!train", "!app=train", "app in train", "=train",
                                  "app in (train", "a b", "!gen>1"])  # fmt: skip
def test_a_requirement_it_cannot_read_is_named(text: str) -> None:
    with pytest.raises(ValueError, match="unable to parse requirement"):
        parse_label_selector(text)


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("app=-x", "value '-x'"),
        ("app=x-", "value 'x-'"),
        ("app=+1", "value '+1'"),
        ("app in (ok, -bad)", "value '-bad'"),
        ("app==-x", "value '-x'"),
        ("app!=-x", "value '-x'"),
        (f"app={'v' * 64}", f"value '{'v' * 64}'"),
        ("app-=x", "key 'app-'"),
        ("a/b/c=x", "key 'a/b/c'"),
        ("Example.com/app=x", "key 'Example.com/app'"),
        (f"{'k' * 64}", f"key '{'k' * 64}'"),
        (f"{'p' * 254}/app", f"key '{'p' * 254}/app'"),
        (f"{'x' * 64} in (a)", f"key '{'x' * 64}'"),
    ],
)
def test_a_key_or_value_the_api_server_refuses_is_named(text: str, bad: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_label_selector(text)
    assert str(refused.value) == f"unable to parse requirement: {text!r}: invalid label {bad}"


def test_a_key_with_a_prefix_and_the_longest_value_are_read() -> None:
    labels = {"example.com/app": "v" * 63}
    assert parse_label_selector(f"example.com/app={'v' * 63}")(labels) is True
    longest = f"{'p' * 253}/{'k' * 63}"  # the longest prefix and name
    assert parse_label_selector(f"{longest}=v")({longest: "v"}) is True


@pytest.mark.parametrize(
    "text", [f"gen>{-(2**63)}", f"gen<{2**63 - 1}", f"low<{-(2**63) + 1}", f"huge>{2**63 - 2}"]
)
def test_numeric_bounds_take_all_of_int64(text: str) -> None:
    labels = {"gen": "4", "low": str(-(2**63)), "huge": str(2**63 - 1)}
    assert parse_label_selector(text)(labels) is True


@pytest.mark.parametrize(
    "text", ["gen>x", "gen>1.5", "gen<", "gen>1_0", f"gen>{2**63}", f"gen<{-(2**63) - 1}"]
)
def test_a_numeric_requirement_needs_an_integer(text: str) -> None:
    with pytest.raises(ValueError, match="for 'Gt', 'Lt' operators, the value must be an integer"):
        parse_label_selector(text)
