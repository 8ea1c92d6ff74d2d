"""Label selectors (``metav1.LabelSelector``) as the API server reads them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["selects"]

_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether ``selector`` selects an object with ``labels``. As apimachinery's
    ``LabelSelectorAsSelector``: no selector selects nothing, an empty one everything,
    and one with an operator it does not know selects nothing (the API server skips a
    PodDisruptionBudget whose selector does not parse)."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        op = expr.get("operator")
        if op not in _OPERATORS:
            return False
        value = labels.get(str(expr.get("key", "")))
        values = {str(v) for v in expr.get("values") or []}
        if op == "In" and (value is None or value not in values):
            return False
        if op == "NotIn" and value is not None and value in values:
            return False
        if op == "Exists" and value is None:
            return False
        if op == "DoesNotExist" and value is not None:
            return False
    return True
