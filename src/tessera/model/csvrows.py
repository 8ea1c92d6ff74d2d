"""Reading Tessera's CSV inputs (node lists, task lists) with errors that name the
source, the line and the column."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator

from tessera.errors import SpecError

__all__ = ["int_column", "rows", "text_column"]


def rows(
    lines: Iterable[str], source: str, required: Iterable[str]
) -> Iterator[tuple[str, dict[str, str]]]:
    """Each data row with its place (``"{source} line N"``); refuses a header that lacks
    a ``required`` column before reading any row."""
    reader = csv.DictReader(lines)
    missing = [c for c in required if c not in (reader.fieldnames or [])]
    if missing:
        raise SpecError(source, f"missing column(s) {', '.join(missing)}")
    for row in reader:
        yield f"{source} line {reader.line_num}", row


def int_column(
    row: dict[str, str], column: str, where: str, minimum: int, maximum: int | None = None
) -> int:
    """The integer in ``column``, within [minimum, maximum]."""
    raw = (row.get(column) or "").strip()
    try:
        value = int(raw)
    except ValueError:
        raise SpecError(f"{where}: column {column}", "must be an integer", raw) from None
    if value < minimum:
        raise SpecError(f"{where}: column {column}", f"must be >= {minimum}", value)
    if maximum is not None and value > maximum:
        raise SpecError(f"{where}: column {column}", f"must be <= {maximum}", value)
    return value


def text_column(row: dict[str, str], column: str, where: str) -> str:
    """The text in ``column``, stripped; refused when that leaves nothing."""
    value = (row.get(column) or "").strip()
    if not value:
        raise SpecError(f"{where}: column {column}", "must not be empty")
    return value
