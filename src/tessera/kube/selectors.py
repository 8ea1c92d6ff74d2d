"""Label selectors (``metav1.LabelSelector``, and the ``labelSelector`` query string of a
list or watch) as the API server reads them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["parse_label_selector", "selects"]

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


# One requirement of the string form (apimachinery labels.Parse): ``k``, ``!k``, ``k=v``,
# ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``.
_REQUIREMENT = re.compile(
    r"(?P<absent>!)?\s*(?P<key>[A-Za-z0-9][-A-Za-z0-9_./]*)\s*"
    r"(?:(?P<op>==|!=|=)\s*(?P<value>[-A-Za-z0-9_.]*)"
    r"|\s(?P<set>in|notin)\s*\((?P<values>[^()]*)\))?"
)


def _requirements(text: str) -> list[str]:
    """The comma-separated requirements, a comma inside ``( )`` being part of a set."""
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return [t.strip() for t in terms if t.strip()]


def parse_label_selector(text: str) -> dict[str, Any]:
    """A ``labelSelector`` query string as the ``metav1.LabelSelector`` it means (so
    ``selects`` reads both forms). ValueError names the requirement it cannot read; the
    numeric ``k>1``/``k<1`` forms are not read (nothing in Tessera sends them)."""
    expressions: list[dict[str, Any]] = []
    for term in _requirements(text):
        m = _REQUIREMENT.fullmatch(term)
        if m is None or (m["absent"] and (m["op"] or m["set"])):
            raise ValueError(f"unable to parse requirement: {term!r}")
        key = m["key"]
        if m["absent"]:
            expressions.append({"key": key, "operator": "DoesNotExist"})
        elif m["set"]:
            values = sorted({v.strip() for v in m["values"].split(",")})
            operator = "In" if m["set"] == "in" else "NotIn"
            expressions.append({"key": key, "operator": operator, "values": values})
        elif m["op"]:  # k=v is k in (v), k!=v is k notin (v): as labels.Parse has them
            operator = "NotIn" if m["op"] == "!=" else "In"
            expressions.append({"key": key, "operator": operator, "values": [m["value"]]})
        else:
            expressions.append({"key": key, "operator": "Exists"})
    return {"matchExpressions": expressions}
