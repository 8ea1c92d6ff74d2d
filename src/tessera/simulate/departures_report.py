"""How replays with departures are shown: a summary per policy, a table, JSON, a plot."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from tessera.simulate.departures import DeparturesResult
from tessera.simulate.metrics import Spread, by_policy
from tessera.simulate.report import over_seeds, pyplot

__all__ = [
    "DeparturesSummary",
    "PolicyCurves",
    "departures_curves",
    "departures_json",
    "departures_table",
    "plot_departures",
    "summarize_departures",
    "write_departures_json",
]


@dataclass(frozen=True, slots=True)
class DeparturesSummary:
    """A policy over all its seeds."""

    policy: str
    seeds: tuple[int, ...]
    allocation: Spread  # time-weighted, over the window
    demand: Spread  # time-weighted allocated + waiting, over the window
    mean_waiting: Spread
    peak_waiting: Spread
    wait_p50: Spread
    wait_p99: Spread
    never_placed: Spread
    cpu_seconds: Spread


def summarize_departures(results: Iterable[DeparturesResult]) -> list[DeparturesSummary]:
    """One summary per policy, in the order the policies first appear."""
    return [
        DeparturesSummary(
            policy=policy,
            seeds=tuple(r.seed for r in runs),
            allocation=Spread.of([r.time_weighted_allocation for r in runs]),
            demand=Spread.of([r.time_weighted_demand for r in runs]),
            mean_waiting=Spread.of([r.mean_waiting for r in runs]),
            peak_waiting=Spread.of([r.peak_waiting for r in runs]),
            wait_p50=Spread.of([r.wait_quantile(0.5) for r in runs]),
            wait_p99=Spread.of([r.wait_quantile(0.99) for r in runs]),
            never_placed=Spread.of([r.never_placed for r in runs]),
            cpu_seconds=Spread.of([r.cpu_seconds for r in runs]),
        )
        for policy, runs in by_policy(results).items()
    ]


def departures_table(
    summaries: Sequence[DeparturesSummary], arrival: float, speedup: float
) -> Table:
    """Per policy: time-weighted allocation and demand, waiting tasks, waits."""
    table = Table(
        box=box.SIMPLE_HEAD,
        title=(
            f"With departures: arrivals {speedup:g}x the trace's pace, {100 * arrival:g}% of "
            "capacity requested in all; mean ±std over "
            f"{over_seeds(len(s.seeds) for s in summaries)}"
        ),
        caption="GPU %: allocated, time-weighted over the window from the 1st to the 99th "
        "percentile arrival; demand %: allocated + waiting, the same way; queue: tasks "
        "waiting, time-weighted mean, and peak; wait: seconds from arrival to placement; "
        "unplaced: still waiting at the end.",
    )
    table.add_column("policy", no_wrap=True)
    for name in ("GPU %", "demand %", "queue", "peak", "wait p50", "wait p99", "unplaced"):
        table.add_column(name, justify="right", no_wrap=True)
    for s in summaries:
        table.add_row(
            s.policy,
            f"{100 * s.allocation.mean:.2f} ±{100 * s.allocation.std:.2f}",
            f"{100 * s.demand.mean:.1f}",
            f"{s.mean_waiting.mean:.0f}",
            f"{s.peak_waiting.mean:.0f}",
            f"{s.wait_p50.mean:.0f}",
            f"{s.wait_p99.mean:.0f}",
            f"{s.never_placed.mean:.0f}",
        )
    return table


def departures_json(results: Sequence[DeparturesResult], meta: Mapping[str, Any]) -> dict[str, Any]:
    """``{"results": [...], **meta}``: one flat record per (policy, seed)."""
    records = [
        {
            "policy": r.policy,
            "seed": r.seed,
            "arrival": r.arrival,
            "speedup": r.speedup,
            "tasks": r.tasks,
            "placed_tasks": r.placed_tasks,
            "never_placed": r.never_placed,
            "capacity_milli": r.capacity_milli,
            "window_seconds": [round(r.window[0], 3), round(r.window[1], 3)],
            "time_weighted_allocation": r.time_weighted_allocation,
            "time_weighted_demand": r.time_weighted_demand,
            "mean_waiting_tasks": r.mean_waiting,
            "peak_waiting_tasks": r.peak_waiting,
            "wait_p50_seconds": r.wait_quantile(0.5),
            "wait_p99_seconds": r.wait_quantile(0.99),
            "mean_wait_seconds": sum(r.waits) / len(r.waits) if r.waits else 0.0,
            "seconds": round(r.seconds, 3),
            "cpu_seconds": round(r.cpu_seconds, 3),
            "allocation_curve": [round(x, 6) for x in r.allocation_curve],
            "waiting_curve": list(r.waiting_curve),
        }
        for r in results
    ]
    return {"results": records, **meta}


def write_departures_json(
    path: Path, results: Sequence[DeparturesResult], meta: Mapping[str, Any]
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(departures_json(results, meta), indent=1) + "\n")


@dataclass(frozen=True, slots=True)
class PolicyCurves:
    """What the plot draws of one policy: means over its seeds at each curve point."""

    label: str  # with the time-weighted allocation
    hours: tuple[float, ...]  # from the window's start (the seeds' mean span)
    allocated_pct: tuple[float, ...]
    waiting: tuple[float, ...]


def departures_curves(results: Sequence[DeparturesResult]) -> dict[str, PolicyCurves]:
    """Per policy, the curves ``plot_departures`` draws."""
    curves = {}
    for policy, runs in by_policy(results).items():
        points = len(runs[0].allocation_curve)
        hours = sum(r.span for r in runs) / len(runs) / 3600
        mean = 100 * sum(r.time_weighted_allocation for r in runs) / len(runs)
        curves[policy] = PolicyCurves(
            label=f"{policy} ({mean:.2f}% time-weighted)",
            hours=tuple(hours * k / (points - 1) for k in range(points)),
            allocated_pct=tuple(
                100 * sum(r.allocation_curve[k] for r in runs) / len(runs) for k in range(points)
            ),
            waiting=tuple(sum(r.waiting_curve[k] for r in runs) / len(runs) for k in range(points)),
        )
    return curves


def plot_departures(path: Path, results: Sequence[DeparturesResult], title: str) -> None:
    """Allocation and waiting tasks across the window, mean over seeds per policy."""
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), dpi=120, sharex=True)
    for policy, c in departures_curves(results).items():
        top.plot(c.hours, c.allocated_pct, lw=1.4, label=c.label)
        bottom.plot(c.hours, c.waiting, lw=1.4, label=policy)
    top.set_ylabel("GPU allocated (% of capacity)")
    top.set_ylim(0, 102)
    top.set_title(title)
    top.legend(loc="lower right", fontsize=9)
    bottom.set_ylabel("tasks waiting")
    bottom.set_xlabel("hours from the window's start (replay time)")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
