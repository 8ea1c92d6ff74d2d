"""How replays are shown: a table for people, a JSON file for machines, a PNG plot."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from tessera.simulate.metrics import (
    PUBLISHED,
    PUBLISHED_FGD,
    PolicySummary,
    ReplayResult,
    Spread,
)

__all__ = ["plot_allocation", "results_json", "summary_table", "write_json"]


def _pct(s: Spread) -> str:
    if s.n == 0:
        return "—"
    return f"{100 * s.mean:.2f}% ± {100 * s.std:.2f}"


def _ratio(s: Spread, anchor: float | None) -> str:
    if s.n == 0 or anchor is None:
        return "—"
    return f"{s.mean / anchor:.4f}"


def _anchor(policy: str, arrival: float) -> str:
    published = PUBLISHED.get(policy, {}).get(round(arrival, 6))
    return "—" if published is None else f"{100 * published:.2f}%"


def summary_table(summaries: Sequence[PolicySummary], arrival: float) -> Table:
    """Per policy: allocation at the target and at 100%, the ratio to FGD's published
    figure at each, fragmentation rate, and failed tasks by reason (mean per run)."""
    target = f"{100 * arrival:g}%"
    fgd_target = PUBLISHED_FGD.get(round(arrival, 6))
    table = Table(title=f"GPU allocation, arrivals to {target} of GPU capacity (mean ± std)")
    table.add_column("policy")
    table.add_column("seeds", justify="right")
    table.add_column(f"alloc @{target}", justify="right")
    table.add_column(
        "÷ FGD" + ("" if fgd_target is None else f" {100 * fgd_target:.2f}%"), justify="right"
    )
    table.add_column("published", justify="right")
    table.add_column("alloc @100%", justify="right")
    table.add_column(f"÷ FGD {100 * PUBLISHED_FGD[1.0]:.2f}%", justify="right")
    table.add_column("frag rate", justify="right")
    table.add_column("failed", justify="right")
    table.add_column("failed by reason")
    for s in summaries:
        reasons = ", ".join(f"{k} {v:.0f}" for k, v in s.failed_by_reason.items()) or "—"
        table.add_row(
            s.policy,
            str(len(s.seeds)),
            _pct(s.allocation),
            _ratio(s.allocation, fgd_target),
            _anchor(s.policy, arrival),
            _pct(s.allocation_at_100),
            _ratio(s.allocation_at_100, PUBLISHED_FGD[1.0]),
            _pct(s.fragmentation_rate),
            f"{s.failed_tasks.mean:.0f}",
            reasons,
        )
    return table


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else x


def results_json(results: Sequence[ReplayResult], meta: Mapping[str, Any]) -> dict[str, Any]:
    """``{"results": [...], **meta}``: one flat record per (policy, seed)."""
    records = [
        {
            "policy": r.policy,
            "seed": r.seed,
            "arrival": r.arrival,
            "gpu_allocation_ratio": r.gpu_allocation_ratio,
            "gpu_allocation_ratio_at_100": _finite(r.allocation_at(100)),
            "arrived_ratio": r.arrived_ratio,
            "fragmentation_rate": _finite(r.fragmentation_rate),
            "arrived_tasks": r.arrived_tasks,
            "placed_tasks": r.placed_tasks,
            "failed_tasks": r.failed_tasks,
            "failed_by_reason": dict(r.failed_by_reason),
            "failed_by_class": dict(r.failed_by_class),
            "capacity_milli": r.capacity_milli,
            "allocated_milli": r.allocated_milli,
            "arrived_milli": r.arrived_milli,
            "seconds": round(r.seconds, 3),
            "allocation_curve": [round(x, 6) for x in r.curve],
        }
        for r in results
    ]
    return {"results": records, **meta}


def write_json(path: Path, results: Sequence[ReplayResult], meta: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results_json(results, meta), indent=1) + "\n")


def plot_allocation(path: Path, results: Sequence[ReplayResult], title: str) -> None:
    """Allocation ratio vs arrived workload, mean over seeds per policy, with FGD's
    published points and the ideal (everything that arrives is placed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_policy: dict[str, list[tuple[float, ...]]] = {}
    for r in results:
        by_policy.setdefault(r.policy, []).append(r.curve)
    means: dict[str, list[float]] = {}
    for policy, curves in by_policy.items():
        n = min(len(c) for c in curves)  # the points every seed reached
        means[policy] = [100 * sum(c[k] for c in curves) / len(curves) for k in range(n)]
    top = max((len(m) for m in means.values()), default=1) - 1
    lo = max(0, top - 40)

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    inset = ax.inset_axes((0.07, 0.6, 0.34, 0.33))
    ax.plot([0, min(top, 100)], [0, min(top, 100)], color="0.75", lw=1, ls="--", label="ideal")
    ax.axhline(100, color="0.85", lw=0.8)
    for policy, mean in means.items():
        ax.plot(range(len(mean)), mean, lw=1.6, label=f"{policy} ({mean[-1]:.2f}%)")
        inset.plot(range(lo, len(mean)), mean[lo:], lw=1.4)
    for arrived, published in PUBLISHED_FGD.items():
        if 100 * arrived <= top + 1:
            ax.plot(100 * arrived, 100 * published, "k*", ms=10)
            inset.plot(100 * arrived, 100 * published, "k*", ms=8)
    ax.plot([], [], "k*", ms=8, label="FGD, published")
    ax.set_xlabel("arrived GPU requests (% of cluster GPU capacity)")
    ax.set_ylabel("GPU allocation ratio (%)")
    ax.set_title(title)
    ax.set_xlim(0, top + 1)
    ax.set_ylim(0, 102)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    inset.set_xlim(lo, top + 1)
    inset.set_title(f"arrivals {lo}% to {top}%", fontsize=8)
    inset.tick_params(labelsize=7)
    inset.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
