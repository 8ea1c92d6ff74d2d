"""How replays are shown: a table for people, a JSON file for machines, a PNG plot."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from rich import box
from rich.table import Table

from tessera.simulate.metrics import (
    PUBLISHED_FGD,
    PolicySummary,
    ReplayResult,
    Spread,
    by_policy,
)

__all__ = [
    "failures_table",
    "over_seeds",
    "plot_allocation",
    "pyplot",
    "results_json",
    "summary_table",
    "write_json",
]


def over_seeds(seed_counts: Iterable[int]) -> str:
    """The seed count a title names: 2 seeds, 1 seed, or just seeds when the policies
    ran over unequal counts."""
    counts = set(seed_counts)
    n = counts.pop() if len(counts) == 1 else 0
    return f"{n} seed{'s' * (n > 1)}" if n else "seeds"


def pyplot() -> ModuleType:
    """matplotlib's pyplot drawing to files, or a one-line exit naming the extra."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(
            "--plot needs matplotlib, an optional dependency: pip install 'tessera[plot]'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _pct(s: Spread) -> str:
    if s.n == 0:
        return "—"
    return f"{100 * s.mean:.2f} ±{100 * s.std:.2f}"


def _ratio(s: Spread, anchor: float | None) -> str:
    if s.n == 0 or anchor is None:
        return "—"
    return f"{s.mean / anchor:.4f}"


def summary_table(summaries: Sequence[PolicySummary], arrival: float) -> Table:
    """Per policy: allocation at the target and at 100%, each with the ratio to FGD's
    published figure beside it, and the fragmentation rate at the end."""
    target = f"{100 * arrival:g}%"
    fgd_target = PUBLISHED_FGD.get(round(arrival, 6))
    fgd_100 = PUBLISHED_FGD[1.0]
    published = f"{100 * fgd_100:.2f}% at 100%"
    if fgd_target is not None and target != "100%":
        published = f"{100 * fgd_target:.2f}% at {target} and {published}"
    seeds = over_seeds(len(s.seeds) for s in summaries)
    table = Table(
        box=box.SIMPLE_HEAD,
        title=f"GPU allocation (%), arrivals to {target} of capacity, mean ±std over {seeds}",
        caption=f"÷FGD: our mean over FGD's published mean (Weng et al., ATC'23), {published}",
    )
    table.add_column("policy", no_wrap=True)
    table.add_column(f"@{target}", justify="right", no_wrap=True)
    table.add_column("÷FGD", justify="right", no_wrap=True)
    table.add_column("@100%", justify="right", no_wrap=True)
    table.add_column("÷FGD", justify="right", no_wrap=True)
    table.add_column("frag. %", justify="right", no_wrap=True)
    for s in summaries:
        table.add_row(
            s.policy,
            _pct(s.allocation),
            _ratio(s.allocation, fgd_target),
            _pct(s.allocation_at_100),
            _ratio(s.allocation_at_100, fgd_100),
            _pct(s.fragmentation_rate),
        )
    return table


def failures_table(summaries: Sequence[PolicySummary]) -> Table:
    """Per policy: failed tasks per run (mean), by reason and by request class."""
    reasons = _keys(s.failed_by_reason for s in summaries)
    classes = _keys(s.failed_by_class for s in summaries)
    table = Table(
        box=box.SIMPLE_HEAD,
        title="Failed tasks per run (mean): by reason, then by request class",
    )
    table.add_column("policy", no_wrap=True)
    table.add_column("failed", justify="right", no_wrap=True)
    for k in reasons:
        table.add_column(k, justify="right", no_wrap=True)
    for k in classes:
        table.add_column(k, justify="right", style="dim", no_wrap=True)
    for s in summaries:
        table.add_row(
            s.policy,
            f"{s.failed_tasks.mean:.0f}",
            *(f"{s.failed_by_reason.get(k, 0):.0f}" for k in reasons),
            *(f"{s.failed_by_class.get(k, 0):.0f}" for k in classes),
        )
    return table


def _keys(counts: Iterable[Mapping[str, float]]) -> list[str]:
    """Keys of all ``counts``, most frequent overall first."""
    total: dict[str, float] = {}
    for c in counts:
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return sorted(total, key=lambda k: (-total[k], k))


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
            "nodes_to_score": r.nodes_to_score,
            "retried_tasks": r.retried_tasks,
            "retried_cycles": {str(k): v for k, v in r.retried_cycles.items()},
            "capacity_milli": r.capacity_milli,
            "allocated_milli": r.allocated_milli,
            "arrived_milli": r.arrived_milli,
            "seconds": round(r.seconds, 3),
            "cpu_seconds": round(r.cpu_seconds, 3),
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
    plt = pyplot()
    # Per policy, the mean curve over seeds at each whole percent every seed reached,
    # then the mean end of the stream (just under the arrival target).
    means: dict[str, tuple[list[float], list[float]]] = {}
    for policy, runs in by_policy(results).items():
        n = min(len(r.curve) for r in runs)
        xs = [float(k) for k in range(n)] + [100 * sum(r.arrived_ratio for r in runs) / len(runs)]
        ys = [100 * sum(r.curve[k] for r in runs) / len(runs) for k in range(n)]
        ys.append(100 * sum(r.gpu_allocation_ratio for r in runs) / len(runs))
        means[policy] = (xs, ys)
    top = max((xs[-1] for xs, _ in means.values()), default=1.0)
    lo = max(0.0, round(top) - 40.0)

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    inset = ax.inset_axes((0.07, 0.6, 0.34, 0.33))
    ax.plot([0, min(top, 100)], [0, min(top, 100)], color="0.75", lw=1, ls="--", label="ideal")
    ax.axhline(100, color="0.85", lw=0.8)
    for policy, (xs, ys) in means.items():
        ax.plot(xs, ys, lw=1.6, label=f"{policy} ({ys[-1]:.2f}%)")
        tail = [i for i, x in enumerate(xs) if x >= lo]
        inset.plot([xs[i] for i in tail], [ys[i] for i in tail], lw=1.4)
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
    inset.set_title(f"arrivals {lo:.0f}% to {top:.0f}%", fontsize=8)
    inset.tick_params(labelsize=7)
    inset.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
