"""`tessera simulate`: replay the Alibaba 2023 trace (or its built-in look-alike) per policy.

Light at import: numpy, matplotlib and the placement core load inside the command.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from tessera.model.types import NodeInventory
    from tessera.simulate.metrics import ReplayResult
    from tessera.simulate.trace import TraceTask

__all__ = ["DEFAULT_POLICIES", "FIRST_SEED", "simulate"]

DEFAULT_POLICIES = ("fragmentation", "best-fit", "binpack", "spread", "random")
FIRST_SEED = 42  # the published experiment's seeds are 42..51


class UsageError(Exception):
    """A bad option or input file: reported as one line, exit code 2."""


def _load(
    cluster: Path | None, workload: Path | None
) -> tuple[list[NodeInventory], list[TraceTask], dict[str, Any]]:
    from tessera.errors import SpecError
    from tessera.model.clusterspec import read_nodes_csv
    from tessera.simulate import workload as builtin
    from tessera.simulate.trace import read_tasks_csv

    sources: dict[str, Any] = {}
    try:
        if cluster is None:
            nodes = builtin.synthetic_cluster()
            sources["cluster"] = "built-in (openb node shapes)"
        else:
            if not cluster.is_file():
                raise UsageError(f"--cluster: file not found: {cluster}")
            nodes = read_nodes_csv(cluster)
            sources["cluster"] = cluster.name
    except SpecError as err:
        raise UsageError(f"--cluster: {err}") from None
    try:
        if workload is None:
            tasks = builtin.synthetic_tasks()
            sources["workload"] = "built-in (openb default task shapes)"
        else:
            if not workload.is_file():
                raise UsageError(f"--workload: file not found: {workload}")
            tasks = read_tasks_csv(workload)
            sources["workload"] = workload.name
    except SpecError as err:
        raise UsageError(f"--workload: {err}") from None
    if not any(c.healthy for n in nodes for c in n.cards):
        raise UsageError("--cluster: must hold at least one healthy GPU")
    if not tasks:
        raise UsageError("--workload: must hold at least one task")
    return nodes, tasks, sources


def _run_one(
    nodes: list[NodeInventory], tasks: list[TraceTask], policy: str, seed: int, arrival: float
) -> ReplayResult:
    from tessera.simulate.replay import replay

    return replay(nodes, tasks, policy, seed, arrival)


def run_experiments(
    nodes: list[NodeInventory],
    tasks: list[TraceTask],
    policies: list[str],
    seeds: list[int],
    arrival: float,
    jobs: int,
) -> list[ReplayResult]:
    """Every (policy, seed), with a progress bar on stderr; results in (policy, seed) order."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from tessera.simulate.replay import replay

    runs = [(p, s) for p in policies for s in seeds]
    done: dict[tuple[str, int], ReplayResult] = {}
    columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        overall = bar.add_task("experiments", total=len(runs))
        if jobs <= 1:
            for policy, seed in runs:
                current = bar.add_task(f"{policy} seed {seed}", total=None)

                def tick(i: int, n: int, current: Any = current) -> None:
                    if i % 200 == 0 or i == n:
                        bar.update(current, completed=i, total=n)

                done[policy, seed] = replay(nodes, tasks, policy, seed, arrival, progress=tick)
                bar.remove_task(current)
                bar.advance(overall)
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                futures = {
                    pool.submit(_run_one, nodes, tasks, p, s, arrival): (p, s) for p, s in runs
                }
                for future in as_completed(futures):
                    done[futures[future]] = future.result()
                    bar.advance(overall)
    return [done[r] for r in runs]


def simulate(
    cluster: Annotated[
        Path | None, typer.Option(help="Node list CSV (openb format). Default: built-in.")
    ] = None,
    workload: Annotated[
        Path | None, typer.Option(help="Task list CSV (openb format). Default: built-in.")
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(help="Placement policy; repeat for several. Default: five policies."),
    ] = None,
    seeds: Annotated[int, typer.Option(help="Seeds per policy: 42, 43, ...")] = 1,
    arrival: Annotated[
        float, typer.Option(help="Arrived GPU requests to reach, × cluster GPU capacity.")
    ] = 1.3,
    jobs: Annotated[int, typer.Option(help="Experiments run in parallel processes.")] = 1,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write every result to this JSON file.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write allocation vs arrivals to this PNG.")
    ] = None,
) -> None:
    """Replay a GPU trace per placement policy and report GPU allocation (published
    protocol of the Alibaba 2023 trace: shuffle by seed, pad to the arrival target, place
    one by one, drop what does not fit, nothing departs)."""
    try:
        _simulate(cluster, workload, policy, seeds, arrival, jobs, json_path, plot)
    except UsageError as err:
        typer.echo(f"tessera simulate: error: {err}", err=True)
        raise typer.Exit(2) from None


def _simulate(
    cluster: Path | None,
    workload: Path | None,
    policy: list[str] | None,
    seeds: int,
    arrival: float,
    jobs: int,
    json_path: Path | None,
    plot: Path | None,
) -> None:
    from tessera.errors import SpecError
    from tessera.placement import make_policy

    policies = list(policy or DEFAULT_POLICIES)
    for p in policies:
        try:
            make_policy(p)
        except SpecError as err:
            raise UsageError(f"--policy: {err.rule} (got {p!r})") from None
    if not arrival > 0:
        raise UsageError(f"--arrival: must be > 0 (got {arrival})")
    if seeds < 1:
        raise UsageError(f"--seeds: must be >= 1 (got {seeds})")
    if jobs < 1:
        raise UsageError(f"--jobs: must be >= 1 (got {jobs})")
    nodes, tasks, sources = _load(cluster, workload)

    from rich.console import Console

    from tessera.simulate.metrics import summarize
    from tessera.simulate.report import (
        failures_table,
        plot_allocation,
        summary_table,
        write_json,
    )

    seed_list = list(range(FIRST_SEED, FIRST_SEED + seeds))
    results = run_experiments(nodes, tasks, policies, seed_list, arrival, jobs)
    console = Console()
    summaries = summarize(results)
    console.print(summary_table(summaries, arrival))
    console.print(failures_table(summaries))
    per_run = sum(r.seconds for r in results) / len(results)
    per_run_cpu = sum(r.cpu_seconds for r in results) / len(results)
    console.print(
        f"{sources['cluster']}: {len(nodes)} nodes, {sum(len(n.cards) for n in nodes)} GPUs; "
        f"{sources['workload']}: {len(tasks)} tasks; "
        f"{results[0].arrived_tasks} arrivals per run; "
        f"{per_run:.1f} s per experiment ({per_run_cpu:.1f} s CPU)"
    )
    if json_path is not None:
        meta = {"arrival": arrival, "seeds": seed_list, "policies": policies, **sources}
        _write("--json", json_path, lambda: write_json(json_path, results, meta))
    if plot is not None:
        n = len(seed_list)
        title = f"{sources['workload']} on {sources['cluster']}, {n} seed{'s' * (n > 1)}"
        _write("--plot", plot, lambda: plot_allocation(plot, results, title))


def _write(option: str, path: Path, write: Callable[[], None]) -> None:
    try:
        write()
    except OSError as err:
        raise UsageError(f"{option}: cannot write {path}: {err.strerror or err}") from None
