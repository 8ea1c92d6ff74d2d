"""Label selectors (``metav1.LabelSelector``, and the ``labelSelector`` query string of a
list or watch) as the API server reads them."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["parse_label_selector", "selects"]

LabelQuery = Callable[[Mapping[str, str]], bool]

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
# ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, and the numeric ``k>n``, ``k<n``.
_REQUIREMENT = re.compile(
    r"(?P<absent>!)?\s*(?P<key>[A-Za-z0-9][-A-Za-z0-9_./]*)\s*"
    r"(?:(?P<op>==|!=|=|>|<)\s*(?P<value>[-+A-Za-z0-9_.]*)"
    r"|\s(?P<set>in|notin)\s*\((?P<values>[^()]*)\))?"
)
_INT64 = re.compile(r"[+-]?[0-9]+")  # Go's strconv.ParseInt(s, 10, 64), range aside
# What the API server validates in a requirement: a label value (at most 63 characters,
# alphanumeric at both ends, or empty) and a key (a name like that, not empty, after an
# optional DNS subdomain and "/").
_NAME = re.compile(r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_SUBDOMAIN = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")


def _checked(term: str, key: str, values: list[str]) -> None:
    prefix, slash, name = key.rpartition("/")
    if (
        len(name) > 63
        or not _NAME.fullmatch(name)
        or (slash and (len(prefix) > 253 or not _SUBDOMAIN.fullmatch(prefix)))
    ):
        raise ValueError(f"unable to parse requirement: {term!r}: invalid label key {key!r}")
    for value in values:
        if len(value) > 63 or (value and not _NAME.fullmatch(value)):
            raise ValueError(
                f"unable to parse requirement: {term!r}: invalid label value {value!r}"
            )


def _int64(text: str) -> int | None:
    if _INT64.fullmatch(text) is None or not -(2**63) <= int(text) < 2**63:
        return None
    return int(text)


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


def parse_label_selector(text: str) -> LabelQuery:
    """A ``labelSelector`` query string as what it selects (a function of an object's
    labels). ValueError names the requirement it cannot read. The set-based terms read
    as the ``metav1.LabelSelector`` they mean; ``k>n``/``k<n`` select an object whose
    label ``k`` is an integer above/below ``n`` (a form the object's selectors lack)."""
    expressions: list[dict[str, Any]] = []
    numeric: list[tuple[str, str, int]] = []
    for term in _requirements(text):
        m = _REQUIREMENT.fullmatch(term)
        if m is None or (m["absent"] and (m["op"] or m["set"])):
            raise ValueError(f"unable to parse requirement: {term!r}")
        key = m["key"]
        if m["set"]:
            _checked(term, key, [v.strip() for v in m["values"].split(",")])
        else:
            _checked(term, key, [m["value"]] if m["op"] in ("=", "==", "!=") else [])
        if m["absent"]:
            expressions.append({"key": key, "operator": "DoesNotExist"})
        elif m["set"]:
            values = sorted({v.strip() for v in m["values"].split(",")})
            operator = "In" if m["set"] == "in" else "NotIn"
            expressions.append({"key": key, "operator": operator, "values": values})
        elif m["op"] in (">", "<"):
            bound = _int64(m["value"])
            if bound is None:
                raise ValueError(f"unable to parse requirement: {term!r}: for 'Gt', 'Lt' "
                                 "operators, the value must be an integer")  # fmt: skip
            numeric.append((key, m["op"], bound))
        elif m["op"]:  # k=v is k in (v), k!=v is k notin (v): as labels.Parse has them
            operator = "NotIn" if m["op"] == "!=" else "In"
            expressions.append({"key": key, "operator": operator, "values": [m["value"]]})
        else:
            expressions.append({"key": key, "operator": "Exists"})
    selector = {"matchExpressions": expressions}

    def query(labels: Mapping[str, str]) -> bool:
        return selects(selector, labels) and all(
            _compares(labels.get(key), op, bound) for key, op, bound in numeric
        )

    return query


def _compares(value: str | None, op: str, bound: int) -> bool:
    """A label that is missing or not an integer is neither above nor below."""
    number = None if value is None else _int64(value)
    if number is None:
        return False
    return number > bound if op == ">" else number < bound
