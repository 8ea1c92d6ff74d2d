"""Label selectors read as apimachinery's LabelSelectorAsSelector reads them."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.kube.selectors import selects

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
