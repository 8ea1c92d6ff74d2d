from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from tessera.model.clusterspec import make_cards
from tessera.model.types import NodeInventory
from tessera.simulate.metrics import (
    ReplayResult,
    Spread,
    gpu_capacity_milli,
    retry_summary,
    summarize,
)
from tessera.simulate.report import (
    failures_table,
    plot_allocation,
    results_json,
    summary_table,
    write_json,
)


def result(policy: str, seed: int, allocated: int, curve: tuple[float, ...]) -> ReplayResult:
    return ReplayResult(
        policy=policy,
        seed=seed,
        arrival=1.3,
        capacity_milli=10_000,
        arrived_tasks=20,
        arrived_milli=12_900,
        placed_tasks=17,
        allocated_milli=allocated,
        fragmentation_rate=0.25,
        curve=curve,
        failed_by_reason={"insufficient gpu": 2, "insufficient cpu": 1},
        failed_by_class={"shared": 3},
        seconds=1.5,
    )


CURVE = tuple(min(k, 90) / 100 for k in range(130))
RUNS = [result("binpack", 42, 9_000, CURVE), result("binpack", 43, 9_400, CURVE)]


def test_result_ratios() -> None:
    r = RUNS[0]
    assert (r.gpu_allocation_ratio, r.arrived_ratio, r.failed_tasks) == (0.9, 1.29, 3)
    assert (r.allocation_at(100), r.allocation_at(50), r.allocation_at(130)) == (0.9, 0.5, None)
    assert (r.allocation_at(0), r.allocation_at(129), r.allocation_at(-1)) == (0.0, 0.9, None)


def test_summary_is_mean_and_sample_std() -> None:
    (s,) = summarize(RUNS)
    assert s.seeds == (42, 43)
    assert s.allocation.mean == pytest.approx(0.92)
    assert s.allocation.std == pytest.approx(math.sqrt(2 * 0.02**2))
    assert s.failed_by_reason == {"insufficient gpu": 2.0, "insufficient cpu": 1.0}
    assert Spread.of([0.5]) == Spread(0.5, 0.0, 1)
    empty = Spread.of([])
    assert math.isnan(empty.mean) and math.isnan(empty.std) and empty.n == 0
    # At 100 % of arrivals: only the runs whose stream got there count.
    short = result("binpack", 44, 5_000, CURVE[:80])
    (s,) = summarize([*RUNS, short])
    assert (s.allocation_at_100.mean, s.allocation_at_100.n) == (0.9, 2)


def test_capacity_counts_healthy_cards_and_retries_are_summed_per_policy() -> None:
    sick = NodeInventory("b", tuple(replace(c, healthy=False) for c in make_cards("b", 1, "T4")),
                         8000, 65536)  # fmt: skip
    nodes = [NodeInventory("a", make_cards("a", 3, "T4"), 8000, 65536), sick]
    assert gpu_capacity_milli(nodes) == 3000
    assert retry_summary([]) == (0.0, 1)
    assert retry_summary(RUNS) == (0.0, 1)  # none waited: one cycle each
    first, second = RUNS
    waited = [replace(first, retried_cycles={2: 3, 4: 1}), replace(second, retried_cycles={3: 2})]
    assert retry_summary(waited) == (3.0, 4)


def test_table_shows_ratio_to_fgd() -> None:
    console = Console(width=80, record=True)
    console.print(summary_table(summarize(RUNS), 1.3))
    console.print(failures_table(summarize(RUNS)))
    text = console.export_text()
    assert "92.00 ±2.83" in text
    assert f"{0.92 / 0.9539:.4f}" in text  # ratio to FGD's published 95.39%
    assert f"{0.90 / 0.9523:.4f}" in text  # and to 95.23% at 100%
    header = next(line for line in text.splitlines() if "failed" in line and "policy" in line)
    assert header.split() == [
        "policy",
        "failed",
        "insufficient",
        "gpu",
        "insufficient",
        "cpu",
        "shared",
    ]


def test_table_without_a_published_figure_or_a_run_at_100() -> None:
    """Arrivals to 110 % have no published FGD figure; a stream that stopped short of
    100 % has no figure there; policies run over unequal seed counts are not counted."""
    short = replace(result("spread", 7, 5_000, CURVE[:80]), arrival=1.1)
    console = Console(width=100, record=True)
    console.print(summary_table(summarize([*RUNS, short]), 1.1))
    lines = console.export_text().splitlines()
    words = " ".join(" ".join(lines).split())  # the title and the caption wrap
    assert "arrivals to 110% of capacity, mean ±std over seeds" in words
    spread = next(line for line in lines if line.split()[:1] == ["spread"])
    assert spread.split() == ["spread", "50.00", "±0.00", "—", "—", "—", "25.00", "±0.00"]
    binpack = next(line for line in lines if line.split()[:1] == ["binpack"])
    assert binpack.split()[3] == "—" and binpack.split()[6] == f"{0.90 / 0.9523:.4f}"
    assert "(Weng et al., ATC'23), 95.23% at 100%" in words and "at 130%" not in words
    console = Console(width=100, record=True)
    console.print(summary_table(summarize(RUNS[:1]), 1.3))
    assert "over 1 seed " in " ".join(console.export_text().split()) + " "


def test_json_shape(tmp_path: Path) -> None:
    path = tmp_path / "out" / "sim.json"
    write_json(path, RUNS, {"arrival": 1.3})
    doc = json.loads(path.read_text())
    assert doc["arrival"] == 1.3
    assert [(r["policy"], r["seed"]) for r in doc["results"]] == [("binpack", 42), ("binpack", 43)]
    first = doc["results"][0]
    assert {
        "policy",
        "seed",
        "gpu_allocation_ratio",
        "gpu_allocation_ratio_at_100",
        "arrived_ratio",
        "failed_tasks",
        "failed_by_reason",
        "fragmentation_rate",
        "allocation_curve",
    } <= set(first)
    assert (first["gpu_allocation_ratio"], first["arrived_ratio"], first["failed_tasks"]) == (
        0.9,
        1.29,
        3,
    )
    assert first["gpu_allocation_ratio_at_100"] == 0.9


def _strict(text: str) -> object:
    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_json_is_strict_and_rounded(tmp_path: Path) -> None:
    """No NaN reaches the file (other tools refuse it): what is unknown is null."""
    rising = tuple(k / 3000 for k in range(130))
    timed = replace(result("spread", 1, 5_000, rising), seconds=1.23456, cpu_seconds=0.98765)
    unknown = replace(result("spread", 2, 5_000, CURVE[:80]), fragmentation_rate=math.nan)
    path = tmp_path / "sim.json"
    write_json(path, [timed, unknown], {})
    text = path.read_text()
    assert text.endswith("}\n")
    first, second = _strict(text)["results"]  # type: ignore[index]
    assert math.isclose(first["gpu_allocation_ratio_at_100"], 100 / 3000)
    assert (first["seconds"], first["cpu_seconds"]) == (1.235, 0.988)
    assert first["allocation_curve"][1] == 0.000333
    assert (second["gpu_allocation_ratio_at_100"], second["fragmentation_rate"]) == (None, None)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    path = tmp_path / "plot.png"
    plot_allocation(path, RUNS, "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_spread_of_three_is_the_sample_deviation_and_at_100_reads_that_point() -> None:
    assert Spread.of([1.0, 2.0, 3.0]) == Spread(2.0, 1.0, 3)  # sum of squares 2, over n - 1
    bent = tuple(0.5 if k == 101 else 0.9 for k in range(130))  # differs just past 100
    (s,) = summarize([result("binpack", 42, 9_000, bent)])
    assert s.allocation_at_100 == Spread(0.9, 0.0, 1)
    assert (s.seconds, s.cpu_seconds) == (Spread(1.5, 0.0, 1), Spread(0.0, 0.0, 1))


def _table_words(*tables: object, width: int = 100) -> tuple[list[str], str]:
    console = Console(width=width, record=True)
    for t in tables:
        console.print(t)
    lines = console.export_text().splitlines()
    return lines, " ".join(" ".join(lines).split())


def test_the_caption_names_each_published_figure_at_its_own_arrival() -> None:
    _, words = _table_words(summary_table(summarize(RUNS), 1.3))
    assert words.endswith("(Weng et al., ATC'23), 95.39% at 130% and 95.23% at 100%")
    # An arrival computed as 13/10 of something reads the same figure.
    _, near = _table_words(summary_table(summarize(RUNS), 1.3000004))
    assert near.endswith("95.39% at 130% and 95.23% at 100%")
    # At 100 % the one figure is named once, not as 130 %'s.
    _, words = _table_words(summary_table(summarize(RUNS), 1.0))
    assert words.endswith("(Weng et al., ATC'23), 95.23% at 100%") and "and" not in words[-40:]
    row = words.split(" binpack ")[1].split()
    assert row[:3] == ["92.00", "±2.83", f"{0.92 / 0.9523:.4f}"]  # the target's ratio: 100 %'s


def test_the_failures_table_has_a_row_per_policy_and_zero_where_a_reason_is_missing() -> None:
    other = replace(
        result("spread", 42, 5_000, CURVE),
        failed_by_reason={"insufficient cpu": 4, "no card model": 1},
        failed_by_class={"whole": 5},
    )
    lines, _ = _table_words(failures_table(summarize([*RUNS, other])), width=140)
    header = next(line for line in lines if line.split()[:2] == ["policy", "failed"])
    # Policy means summed, most first: reasons cpu 1 + 4, gpu 2, no card model 1; then
    # classes whole 5, shared 3.
    assert " ".join(header.split()) == (
        "policy failed insufficient cpu insufficient gpu no card model whole shared"
    )
    rows = {line.split()[0]: line.split()[1:] for line in lines if line.split()[:1]
            in (["binpack"], ["spread"])}  # fmt: skip
    assert rows == {"binpack": ["3", "1", "2", "0", "0", "3"],
                    "spread": ["3", "4", "0", "1", "5", "0"]}  # fmt: skip
    _, words = _table_words(failures_table(summarize(RUNS)))
    assert words.startswith("Failed tasks per run (mean): by reason, then by request class")


def test_json_record_names_every_figure() -> None:
    waited = replace(RUNS[0], retried_cycles={2: 3}, nodes_to_score=50, seconds=2.0)
    (record,) = results_json([waited], {"arrival": 1.3})["results"]
    assert record == {
        "policy": "binpack",
        "seed": 42,
        "arrival": 1.3,
        "gpu_allocation_ratio": 0.9,
        "gpu_allocation_ratio_at_100": 0.9,
        "arrived_ratio": 1.29,
        "fragmentation_rate": 0.25,
        "arrived_tasks": 20,
        "placed_tasks": 17,
        "failed_tasks": 3,
        "failed_by_reason": {"insufficient gpu": 2, "insufficient cpu": 1},
        "failed_by_class": {"shared": 3},
        "nodes_to_score": 50,
        "retried_tasks": 3,
        "retried_cycles": {"2": 3},
        "capacity_milli": 10_000,
        "allocated_milli": 9_000,
        "arrived_milli": 12_900,
        "seconds": 2.0,
        "cpu_seconds": 0.0,
        "allocation_curve": [round(x, 6) for x in CURVE],
    }


def test_the_json_file_makes_its_folders_and_is_indented_by_one(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "sim.json"
    write_json(path, RUNS[:1], {})
    assert path.read_text().startswith('{\n "results": [\n  {\n   "policy": "binpack",\n')
