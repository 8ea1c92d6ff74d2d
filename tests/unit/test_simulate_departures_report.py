"""How a replay with departures is shown: summaries, the table, the JSON, the plot."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from tessera.simulate.departures import DeparturesResult
from tessera.simulate.departures_report import (
    PolicyCurves,
    departures_curves,
    departures_json,
    departures_table,
    plot_departures,
    summarize_departures,
    write_departures_json,
)
from tessera.simulate.metrics import Spread

# Over a window of 1,000 s on 4 cards: 3.1 of 4 GPUs allocated on average (77.5 %), 3.64
# with what waited (91 %), 2.5 tasks waiting on average.
FIRST = DeparturesResult(
    policy="binpack",
    seed=42,
    speedup=2.0,
    arrival=3.0,
    capacity_milli=4_000,
    tasks=10,
    placed_tasks=8,
    window=(100.0, 1_100.0),
    allocated_milli_seconds=3_100_000.0,
    demand_milli_seconds=3_640_000.0,
    waiting_task_seconds=2_500.0,
    peak_waiting=6,
    waits=(50.0, 0.0, 30.0, 10.0),
    allocation_curve=(0.0, 0.5, 0.75),
    waiting_curve=(0, 3, 1),
    seconds=1.23456,
    cpu_seconds=0.98765,
)
# The second seed: 82.5 %, 93.4 %, 3.5 waiting, a window of 2,600 s.
SECOND = replace(
    FIRST,
    seed=43,
    placed_tasks=9,
    window=(0.0, 2_600.0),
    allocated_milli_seconds=0.825 * 4_000 * 2_600,
    demand_milli_seconds=0.934 * 4_000 * 2_600,
    waiting_task_seconds=3.5 * 2_600,
    peak_waiting=9,
    waits=(40.0, 20.0),
    allocation_curve=(0.0, 0.25, 0.5),
    waiting_curve=(2, 5, 0),
    seconds=2.0,
    cpu_seconds=1.5,
)
OTHER = replace(FIRST, policy="spread", allocated_milli_seconds=2_000_000.0)


def test_a_summary_per_policy_in_the_order_they_first_appear() -> None:
    binpack, spread = summarize_departures([FIRST, OTHER, SECOND])
    assert (binpack.policy, binpack.seeds, spread.policy, spread.seeds) == (
        "binpack", (42, 43), "spread", (42,)
    )  # fmt: skip
    assert binpack.allocation.mean == pytest.approx(0.80)
    assert binpack.allocation.std == pytest.approx(math.sqrt(2 * 0.025**2))
    assert binpack.demand.mean == pytest.approx(0.922)
    assert binpack.mean_waiting.mean == pytest.approx(3.0)
    # Nearest rank: p50 of (0, 10, 30, 50) is 10, of (20, 40) is 20; p99 the largest.
    assert binpack.peak_waiting == Spread(7.5, math.sqrt(4.5), 2)
    assert (binpack.wait_p50, binpack.wait_p99) == (
        Spread(15.0, math.sqrt(50), 2), Spread(45.0, math.sqrt(50), 2)
    )  # fmt: skip
    assert (binpack.never_placed, binpack.cpu_seconds) == (
        Spread(1.5, math.sqrt(0.5), 2), Spread.of([0.98765, 1.5])
    )  # fmt: skip
    assert spread.allocation == Spread(0.5, 0.0, 1)


def _rows(summaries_of: list[DeparturesResult], arrival: float = 3.0) -> list[str]:
    console = Console(width=120, record=True)
    console.print(departures_table(summarize_departures(summaries_of), arrival, 2.0))
    return console.export_text().splitlines()


def test_the_table_shows_each_figure_in_its_column() -> None:
    lines = _rows([FIRST, SECOND, replace(OTHER, seed=43), OTHER])
    words = " ".join(" ".join(lines).split())
    assert (
        "With departures: arrivals 2x the trace's pace, 300% of capacity requested in all; "
        "mean ±std over 2 seeds" in words
    )
    header = next(line for line in lines if line.split()[:1] == ["policy"])
    columns = ("policy", "GPU %", "demand %", "queue", "peak", "wait p50", "wait p99", "unplaced")
    assert header.split() == " ".join(columns).split()
    binpack = next(line for line in lines if line.split()[:1] == ["binpack"])
    # 80.00 ±3.54; demand 92.2 %; 3 waiting, peak 7.5 (to no place: 8, Python rounding
    # half to even), waits 15 and 45 s, 1.5 never placed (2).
    assert binpack.split() == ["binpack", "80.00", "±3.54", "92.2", "3", "8", "15", "45", "2"]
    spread = next(line for line in lines if line.split()[:1] == ["spread"])
    assert spread.split() == ["spread", "50.00", "±0.00", "91.0", "2", "6", "10", "50", "2"]
    assert words.endswith(
        "GPU %: allocated, time-weighted over the window from the 1st to the 99th percentile "
        "arrival; demand %: allocated + waiting, the same way; queue: tasks waiting, "
        "time-weighted mean, and peak; wait: seconds from arrival to placement; unplaced: "
        "still waiting at the end."
    )
    # Figures are right-aligned under their headers.
    for name, figure in [("demand %", "92.2"), ("peak", "8"), ("p50", "15"), ("unplaced", "2")]:
        assert binpack.index(f" {figure} ") + len(figure) + 1 == header.index(name) + len(name)


def _words(results: list[DeparturesResult], arrival: float = 3.0) -> str:
    return " ".join(" ".join(_rows(results, arrival)).split())


def test_the_title_counts_seeds_as_the_published_table_does() -> None:
    one = _words([FIRST], 1.3)
    assert "130% of capacity requested in all; mean ±std over 1 seed policy GPU %" in one
    # Unequal seed counts: no count is claimed.
    assert "mean ±std over seeds policy GPU %" in _words([FIRST, SECOND, OTHER])


def test_json_has_one_flat_record_per_run_with_the_meta_beside() -> None:
    doc = departures_json([FIRST, SECOND], {"mode": "departures", "seeds": [42, 43]})
    assert (doc["mode"], doc["seeds"]) == ("departures", [42, 43])
    first, second = doc["results"]
    assert first == {
        "policy": "binpack",
        "seed": 42,
        "arrival": 3.0,
        "speedup": 2.0,
        "tasks": 10,
        "placed_tasks": 8,
        "never_placed": 2,
        "capacity_milli": 4_000,
        "window_seconds": [100.0, 1_100.0],
        "time_weighted_allocation": pytest.approx(0.775),
        "time_weighted_demand": pytest.approx(0.91),
        "mean_waiting_tasks": 2.5,
        "peak_waiting_tasks": 6,
        "wait_p50_seconds": 10.0,
        "wait_p99_seconds": 50.0,
        "mean_wait_seconds": 22.5,
        "seconds": 1.235,
        "cpu_seconds": 0.988,
        "allocation_curve": [0.0, 0.5, 0.75],
        "waiting_curve": [0, 3, 1],
    }
    assert (second["seed"], second["never_placed"], second["mean_wait_seconds"]) == (43, 1, 30.0)


def test_json_rounds_what_a_reader_needs_no_more_of_and_a_run_that_placed_nothing() -> None:
    ragged = replace(
        FIRST, window=(0.12345, 99.98765), allocation_curve=(0.1234567, 1 / 3), waits=()
    )
    (record,) = departures_json([ragged], {})["results"]
    assert record["window_seconds"] == [0.123, 99.988]
    assert record["allocation_curve"] == [0.123457, 0.333333]
    assert (record["mean_wait_seconds"], record["wait_p50_seconds"]) == (0.0, 0.0)


def test_p99_is_the_nearest_rank_not_the_longest_wait() -> None:
    """200 waits of 1..200 s: p50 is the 100th, p99 the 198th (not the longest, 200)."""
    many = replace(FIRST, waits=tuple(float(k) for k in range(200, 0, -1)))
    (summary,) = summarize_departures([many])
    assert (summary.wait_p50.mean, summary.wait_p99.mean) == (100.0, 198.0)
    (record,) = departures_json([many], {})["results"]
    assert (record["wait_p50_seconds"], record["wait_p99_seconds"]) == (100.0, 198.0)


def test_the_json_file_is_written_indented_with_its_folder(tmp_path: Path) -> None:
    path = tmp_path / "out" / "departures" / "dep.json"
    write_departures_json(path, [FIRST], {"mode": "departures"})
    text = path.read_text()
    assert text.endswith("}\n") and text.startswith('{\n "results": [\n  {\n   "policy"')
    assert json.loads(text) == json.loads(
        json.dumps(departures_json([FIRST], {"mode": "departures"}))
    )


def test_the_curves_are_means_over_seeds_against_the_mean_window_in_hours() -> None:
    curves = departures_curves([FIRST, OTHER, SECOND])
    assert list(curves) == ["binpack", "spread"]
    # Windows of 1,000 s and 2,600 s: 1,800 s on average, half an hour, three points.
    assert curves["binpack"] == PolicyCurves(
        label="binpack (80.00% time-weighted)",
        hours=(0.0, 0.25, 0.5),
        allocated_pct=(0.0, 37.5, 62.5),
        waiting=(1.0, 4.0, 0.5),
    )
    assert curves["spread"].label == "spread (50.00% time-weighted)"
    assert curves["spread"].hours == pytest.approx((0.0, 1_000 / 7_200, 1_000 / 3_600))


def test_the_plot_is_a_png_in_its_folder(tmp_path: Path) -> None:
    path = tmp_path / "plots" / "dep.png"
    plot_departures(path, [FIRST, SECOND, OTHER], "openb, with departures")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_plot_without_matplotlib_is_one_line_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    with pytest.raises(SystemExit) as exit_:
        plot_departures(tmp_path / "dep.png", [FIRST], "t")
    assert str(exit_.value) == (
        "--plot needs matplotlib, an optional dependency: pip install 'tessera[plot]'"
    )
    assert not (tmp_path / "dep.png").exists()
