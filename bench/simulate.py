"""Placement quality on the Alibaba 2023 trace (openb), against the published anchors.

    .venv/bin/python bench/simulate.py                       # 5 policies x 10 seeds, 130%
    .venv/bin/python bench/simulate.py --seeds 1 --policy fragmentation --jobs 1

Replays the published protocol (README of the data folder; seeds 42..51) through
``tessera simulate``'s own code, then prints per policy the mean ± std allocation ratio
at 130% and 100% of capacity, each policy's published figure where one exists (FGD for
``fragmentation``, best-fit, random) and the ratio of ours to it and to FGD's, the
fragmentation rate, failures, and seconds per experiment: wall time of one replay and
its CPU time (steadier when other work shares the machine; with --jobs > 1 the
experiments also share the cores). Writes every result to out/bench-simulate.json.
Needs the trace beside the checkout (../shared/data/alibaba-gpu-v2023) or --data.

    .venv/bin/python bench/simulate.py --diagnose fragmentation --seeds 1

replays one seed of one policy (on each variant given with --variants) and shows where
the GPU left idle at the end sits: on free cards (and whether their node still has CPU
and memory for a task) or as leftovers on shared cards, grouped by what shares the card.

    .venv/bin/python bench/simulate.py --departures

runs the departures mode instead (``tessera simulate --departures``: trace times, copies to
300% of capacity, arrivals 3,000x the trace's pace) and prints its table; JSON to
out/bench-simulate-departures.json.

    .venv/bin/python bench/simulate.py --variants --seeds 3

replays every policy on the default list and on its workload variants (more of the GPU
demand on shared cards, or in multi-card tasks; ``tessera simulate --variant``) and
prints each allocation beside FGD's published default figure. FGD published no figure for
these mixes, so the table adds an in-run anchor, ``fgd-measure``: FGD's own measure
descended by Tessera's growth search (the published FGD also learns the mix in advance and
breaks ties at random).

    .venv/bin/python bench/simulate.py --nodes-to-score 100 0 --copies 4 --seeds 3

replays each policy as kube-scheduler with that ``percentageOfNodesToScore`` would hand
it nodes (0: kube-scheduler's adaptive default; ``tessera simulate --nodes-to-score``):
each decision sees only a rotating window of the nodes with CPU and memory for the task.
``--copies K`` replays on K copies of the trace's cluster (openb × 4 is ~4,850 nodes).
Prints the allocation per percentage beside the all-nodes figure of the same run, the
tasks that needed a second cycle, and the CPU per experiment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

from _machine import describe
from rich.console import Console
from rich.table import Table

from tessera.cluster import ClusterState
from tessera.model.clusterspec import read_nodes_csv
from tessera.model.types import NodeInventory
from tessera.placement.base import Policy
from tessera.placement.fragmentation import PublishedMeasure
from tessera.placement.fragmentation_policy import FragmentationCards, FragmentationNodes
from tessera.placement.mix import WorkloadMix
from tessera.simulate.arrivals import arrival_stream
from tessera.simulate.cli import (
    DEFAULT_POLICIES,
    FIRST_SEED,
    run_all,
    run_experiments,
    with_departures,
)
from tessera.simulate.departures import DEFAULT_ARRIVAL, DEFAULT_SPEEDUP, read_lifetimes
from tessera.simulate.departures_report import (
    departures_table,
    summarize_departures,
    write_departures_json,
)
from tessera.simulate.metrics import (
    PUBLISHED,
    PUBLISHED_FGD,
    ReplayResult,
    gpu_capacity_milli,
    retry_summary,
    summarize,
)
from tessera.simulate.replay import node_order, replay, replay_stream
from tessera.simulate.report import failures_table, write_json
from tessera.simulate.sampling import backoff_wait_s, nodes_to_find
from tessera.simulate.trace import TraceTask, read_tasks_csv
from tessera.simulate.variants import demand_share, make_variant, parse_variant

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data" / "alibaba-gpu-v2023"


def diagnose(
    nodes: list[NodeInventory],
    tasks: list[TraceTask],
    policy: str,
    seed: int,
    arrival: float,
    label: str = "default",
) -> None:
    """Where the idle GPU sits after one replay (see the module docstring)."""
    order = node_order(nodes, seed)  # exactly what replay() does, keeping the state
    state = ClusterState(order)
    stream = arrival_stream(tasks, gpu_capacity_milli(nodes), arrival, seed)
    r = replay_stream(order, stream, policy, seed, arrival, state=state)
    content: dict[str, list[int]] = {}
    for booking in state.bookings().values():
        for c in booking.assignment.containers:
            for sl in c.slices:
                content.setdefault(sl.uuid, []).append(
                    1000 if c.exclusive else 10 * sl.cores_percent
                )
    smallest_cpu = min(t.cpu_milli for t in tasks if t.num_gpu)
    smallest_mem = min(t.memory_mib for t in tasks if t.num_gpu)
    groups: dict[str, list[float]] = {}
    for inv in nodes:
        left_cpu = inv.cpu_milli - sum(
            b.pod.cpu_milli for b in state.bookings().values() if b.assignment.node == inv.name
        )
        left_mem = inv.memory_mib - sum(
            b.pod.memory_mib for b in state.bookings().values() if b.assignment.node == inv.name
        )
        for card in inv.cards:
            held = content.get(card.uuid, [])
            idle = (1000 - sum(held)) / 1000
            if idle <= 0:
                continue
            if not held:
                room = left_cpu >= smallest_cpu and left_mem >= smallest_mem
                key = (
                    "free card, node has CPU+memory"
                    if room
                    else "free card, node out of CPU/memory"
                )
            else:
                key = "shared: " + "+".join(str(m) for m in sorted(held, reverse=True))
            g = groups.setdefault(key, [0, 0.0])
            g[0] += 1
            g[1] += idle
    total = sum(g[1] for g in groups.values())
    table = Table(
        title=f"{label} list, {policy}, seed {seed}: "
        f"{100 * r.gpu_allocation_ratio:.2f}% allocated, "
        f"{total:.1f} GPUs idle of {r.capacity_milli // 1000}"
    )
    for col in ("idle card holds (milli-GPU of its tenants)", "cards", "idle GPUs", "share"):
        table.add_column(col, justify="left" if col.startswith("idle card") else "right")
    for key, (cards, idle) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:15]:
        table.add_row(key, f"{cards:.0f}", f"{idle:.1f}", f"{100 * idle / total:.1f}%")
    free = sum(g[1] for k, g in groups.items() if k.startswith("free"))
    table.caption = (
        f"{free:.1f} GPUs idle on free cards, {total - free:.1f} as leftovers on shared cards; "
        f"top 15 of {len(groups)} groups"
    )
    Console(width=max(Console().width, 100)).print(table)


def departures(
    nodes: list[NodeInventory],
    tasks: list[TraceTask],
    tasks_csv: Path,
    policies: list[str],
    seeds: list[int],
    args: argparse.Namespace,
) -> int:
    """The departures mode on the default list: its table, the machine, JSON."""
    lifetimes = read_lifetimes(tasks_csv)
    experiment = partial(with_departures, nodes, tasks, lifetimes, args.arrival, args.speedup)
    started = time.perf_counter()
    results = run_all(experiment, policies, seeds, args.jobs)
    wall = time.perf_counter() - started
    console = Console(width=max(Console().width, 120))
    console.print(departures_table(summarize_departures(results), args.arrival, args.speedup))
    console.print(
        f"{len(results)} experiments, {results[0].tasks} tasks each (seed {seeds[0]}), "
        f"{sum(r.cpu_seconds for r in results) / len(results):.1f} s CPU each, "
        f"jobs={args.jobs}, {wall:.0f} s wall; {describe()}"
    )
    meta = {"arrival": args.arrival, "speedup": args.speedup, "seeds": seeds}
    path = args.json.with_name(args.json.stem + "-departures.json")
    write_departures_json(path, results, {**meta, "policies": policies, "machine": describe()})
    return 0


FGD_MEASURE = "fgd-measure"


def published_measure(name: str, seed: int, mix: WorkloadMix) -> Policy:
    """FGD's own measure (``PublishedMeasure``) descended by Tessera's growth search: the
    in-run anchor on mixes FGD published no figure for."""
    nodes = FragmentationNodes(mix, measure=PublishedMeasure())
    return Policy(name, nodes, FragmentationCards(nodes))


def experiment(
    nodes: list[NodeInventory],
    tasks: list[TraceTask],
    policy: str,
    seed: int,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """One experiment at 130%: a Tessera policy, or the anchor."""
    make = published_measure if policy == FGD_MEASURE else None
    return replay(nodes, tasks, policy, seed, 1.3, progress, make=make)


def variant_of(tasks: list[TraceTask], text: str | None) -> list[TraceTask]:
    """The task list, or its variant ``KIND:SHARE``."""
    return tasks if text is None else make_variant(tasks, *parse_variant(text))


VARIANTS = ("shared:0.4", "shared:0.55", "shared:0.7", "multi:0.15", "multi:0.25", "multi:0.35")


def variants(
    nodes: list[NodeInventory],
    tasks: list[TraceTask],
    policies: list[str],
    seeds: list[int],
    args: argparse.Namespace,
) -> int:
    """Each policy and the anchor on the default list and on each variant, against FGD's
    published default figure."""
    fgd = PUBLISHED_FGD[1.3]
    table = Table(
        title=f"Workload variants of the openb default list, arrivals to 130%, seeds "
        f"{seeds[0]}..{seeds[-1]}: allocation (mean) and ÷ FGD's published {100 * fgd:.2f}%"
    )
    table.add_column("variant")
    table.add_column("shared / multi", justify="right")
    for p in [*policies, FGD_MEASURE]:
        table.add_column(p, justify="right")
    records = []
    console = Console(width=max(Console().width, 150))
    for text in [None, *(args.variants or VARIANTS)]:
        mix = variant_of(tasks, text)
        results = run_all(
            partial(experiment, nodes, mix), [*policies, FGD_MEASURE], seeds, args.jobs
        )
        cells = []
        for s in summarize(results):
            cells.append(f"{100 * s.allocation.mean:.2f}% ({s.allocation.mean / fgd:.4f})")
            records.append({"variant": text or "default", "policy": s.policy,
                            "allocation": s.allocation.mean, "std": s.allocation.std,
                            "per_seed": [r.gpu_allocation_ratio for r in results
                                         if r.policy == s.policy]})  # fmt: skip
        shares = f"{demand_share(mix, 'shared'):.2f} / {demand_share(mix, 'multi'):.2f}"
        table.add_row(text or "default", shares, *cells)
        console.print(f"{text or 'default'} ({shares}): {'  '.join(cells)}")  # progress
    console.print(table)
    console.print(describe())
    path = args.json.with_name(args.json.stem + "-variants.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"seeds": seeds, "results": records}, indent=1) + "\n")
    return 0


def cluster_copies(nodes: list[NodeInventory], copies: int) -> list[NodeInventory]:
    """``copies`` of the cluster, each node and card renamed ``-cK`` (the first kept)."""
    out = list(nodes)
    for k in range(1, copies):
        for n in nodes:
            cards = tuple(replace(c, uuid=f"{c.uuid}-c{k}") for c in n.cards)
            out.append(replace(n, name=f"{n.name}-c{k}", cards=cards))
    return out


def sampling(
    nodes: list[NodeInventory],
    tasks: list[TraceTask],
    policies: list[str],
    seeds: list[int],
    args: argparse.Namespace,
) -> int:
    """Each policy under each percentageOfNodesToScore, beside its all-nodes figure."""
    percentages = [100, *(p for p in args.nodes_to_score if p != 100)]
    table = Table(
        title=f"kube-scheduler's percentageOfNodesToScore, {len(nodes)} nodes "
        f"(openb × {args.copies}), arrivals to 130%, seeds {seeds[0]}..{seeds[-1]}: "
        "allocation (mean ± std), ÷ all nodes, tasks placed on a later cycle (the most cycles "
        "one took, and the least backoff that makes), CPU s per experiment"
    )
    table.add_column("nodes to score")
    for p in policies:
        table.add_column(p, justify="right")
    console = Console(width=max(Console().width, 150))
    records, base = [], {}
    for pct in percentages:
        results = run_experiments(nodes, tasks, policies, seeds, 1.3, args.jobs, pct)
        label = f"{pct} % ({nodes_to_find(pct, len(nodes))} nodes)"
        if pct == 0:
            label = f"adaptive ({nodes_to_find(0, len(nodes))} nodes)"
        cells = []
        for s in summarize(results):
            own = [r for r in results if r.policy == s.policy]
            base.setdefault(s.policy, s.allocation.mean)
            retried, most = retry_summary(own)
            cpu = sum(r.cpu_seconds for r in own) / len(own)
            cells.append(
                f"{100 * s.allocation.mean:.2f}% ± {100 * s.allocation.std:.2f} "
                f"({s.allocation.mean / base[s.policy]:.4f}); {retried:.0f} "
                f"(≤ {most} cycles, ≥ {backoff_wait_s(most):.0f} s); {cpu:.1f} s"
            )
            records.append({"nodes_to_score": pct, "policy": s.policy,
                            "per_seed": [r.gpu_allocation_ratio for r in own],
                            "retried_tasks": [r.retried_tasks for r in own],
                            "retried_cycles": [r.retried_cycles for r in own],
                            "cpu_seconds": [r.cpu_seconds for r in own]})  # fmt: skip
        table.add_row(label, *cells)
        console.print(f"{label}: {'  '.join(cells)}")  # progress
    console.print(table)
    console.print(describe())
    path = args.json.with_name(args.json.stem + "-sampling.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"seeds": seeds, "nodes": len(nodes), "copies": args.copies}
    path.write_text(json.dumps({**meta, "results": records}, indent=1) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--policy", action="append", help="repeatable; default: five policies")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--arrival", type=float, help="default 1.3; 3 with --departures")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--json", type=Path, default=REPO / "out" / "bench-simulate.json")
    ap.add_argument("--diagnose", metavar="POLICY", help="where the idle GPU sits, one seed")
    ap.add_argument(
        "--departures",
        action="store_true",
        help="the departures mode (trace times; --arrival defaults to 3) instead",
    )
    ap.add_argument("--speedup", type=float, default=DEFAULT_SPEEDUP)
    ap.add_argument(
        "--variants",
        nargs="*",
        metavar="KIND:SHARE",
        help=f"the workload variants instead (default: {' '.join(VARIANTS)})",
    )
    ap.add_argument(
        "--nodes-to-score",
        nargs="+",
        type=int,
        metavar="PCT",
        help="kube-scheduler's percentageOfNodesToScore to compare with 100 (0: adaptive)",
    )
    ap.add_argument("--copies", type=int, default=1, help="copies of the trace's cluster")
    args = ap.parse_args()
    if args.arrival is None:
        args.arrival = DEFAULT_ARRIVAL if args.departures else 1.3

    nodes_csv = args.data / "openb_node_list_gpu_node.csv"
    tasks_csv = args.data / "openb_pod_list_default.csv"
    if not nodes_csv.exists():
        print(f"bench/simulate.py: no trace at {args.data} (give --data)", file=sys.stderr)
        return 2
    nodes, tasks = read_nodes_csv(nodes_csv), read_tasks_csv(tasks_csv)
    if args.copies < 1:
        print(f"bench/simulate.py: --copies must be >= 1 (got {args.copies})", file=sys.stderr)
        return 2
    nodes = cluster_copies(nodes, args.copies)
    policies = args.policy or list(DEFAULT_POLICIES)
    seeds = list(range(FIRST_SEED, FIRST_SEED + args.seeds))
    if args.diagnose:
        for text in args.variants or [None]:
            mix = variant_of(tasks, text)
            for seed in seeds:
                diagnose(nodes, mix, args.diagnose, seed, args.arrival, text or "default")
        return 0
    if args.departures:
        return departures(nodes, tasks, tasks_csv, policies, seeds, args)
    if args.variants is not None:
        return variants(nodes, tasks, policies, seeds, args)
    if args.nodes_to_score:
        return sampling(nodes, tasks, policies, seeds, args)

    started = time.perf_counter()
    results = run_experiments(nodes, tasks, policies, seeds, args.arrival, args.jobs)
    wall = time.perf_counter() - started
    summaries = summarize(results)

    at = f"{100 * args.arrival:g}%"
    table = Table(
        title=f"openb default list, {len(nodes)} nodes, arrivals to {at}, seeds "
        f"{seeds[0]}..{seeds[-1]} (mean ± std)"
    )
    for col in (
        "policy",
        f"alloc @{at}",
        "published",
        "÷ published",
        f"÷ FGD {100 * PUBLISHED_FGD[1.3]:.2f}%",
        "alloc @100%",
        f"÷ FGD {100 * PUBLISHED_FGD[1.0]:.2f}%",
        "frag. rate",
        "s / exp.",
        "CPU s",
    ):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for s in summaries:
        own = PUBLISHED.get(s.policy, {}).get(round(args.arrival, 6))
        fgd = PUBLISHED_FGD.get(round(args.arrival, 6))
        a, a100 = s.allocation, s.allocation_at_100
        table.add_row(
            s.policy,
            f"{100 * a.mean:.2f}% ± {100 * a.std:.2f}",
            "—" if own is None else f"{100 * own:.2f}%",
            "—" if own is None else f"{a.mean / own:.4f}",
            "—" if fgd is None else f"{a.mean / fgd:.4f}",
            "—" if not a100.n else f"{100 * a100.mean:.2f}% ± {100 * a100.std:.2f}",
            "—" if not a100.n else f"{a100.mean / PUBLISHED_FGD[1.0]:.4f}",
            f"{100 * s.fragmentation_rate.mean:.2f}%",
            f"{s.seconds.mean:.1f}",
            f"{s.cpu_seconds.mean:.1f}",
        )
    console = Console(width=max(Console().width, 150))
    console.print(table)
    console.print(failures_table(summaries))
    console.print(
        f"{len(results)} experiments, {results[0].arrived_tasks} arrivals each (seed "
        f"{seeds[0]}), jobs={args.jobs}, {wall:.0f} s wall; {describe()}"
    )
    meta = {"arrival": args.arrival, "seeds": seeds, "policies": policies, "machine": describe()}
    write_json(args.json, results, {**meta, "cluster": nodes_csv.name, "workload": tasks_csv.name})
    return 0


if __name__ == "__main__":
    sys.exit(main())
