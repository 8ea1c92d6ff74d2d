"""Reading CSV inputs: a missing column is refused before any row, and a bad cell is
named by its source, line and column, with what it held."""

from __future__ import annotations

import pytest

from tessera.errors import SpecError
from tessera.model.csvrows import int_column, rows, text_column


def test_rows_come_with_their_place_and_a_missing_column_is_named_first() -> None:
    lines = ["name,gpus", "a,1", "b,2"]
    assert list(rows(lines, "nodes.csv", ["name"])) == [
        ("nodes.csv line 2", {"name": "a", "gpus": "1"}),
        ("nodes.csv line 3", {"name": "b", "gpus": "2"}),
    ]
    with pytest.raises(SpecError) as missing:
        next(rows(lines, "nodes.csv", ["name", "cpu", "memory"]))
    assert str(missing.value) == "nodes.csv: missing column(s) cpu, memory"


def test_a_cell_is_read_within_its_rule_or_refused_with_what_it_held() -> None:
    row = {"gpus": " 4 ", "blank": "", "name": " a "}
    assert int_column(row, "gpus", "nodes.csv line 2", 0, 8) == 4
    assert text_column(row, "name", "nodes.csv line 2") == "a"
    refusals = {
        "empty": lambda: int_column(row, "blank", "w", 0),
        "absent": lambda: int_column(row, "none", "w", 0),
        "low": lambda: int_column(row, "gpus", "w", 5),
        "high": lambda: int_column(row, "gpus", "w", 0, 3),
        "text": lambda: text_column(row, "blank", "w"),
    }
    said = {}
    for what, read in refusals.items():
        with pytest.raises(SpecError) as refused:
            read()
        said[what] = str(refused.value)
    assert said == {
        "empty": "w: column blank: must be an integer (got '')",
        "absent": "w: column none: must be an integer (got '')",
        "low": "w: column gpus: must be >= 5 (got 4)",
        "high": "w: column gpus: must be <= 3 (got 4)",
        "text": "w: column blank: must not be empty",
    }
