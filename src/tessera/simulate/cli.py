"""`tessera simulate`: replay the Alibaba 2023 trace (or its built-in look-alike) per policy.

Light at import: numpy, matplotlib and the placement core load inside the command.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from tessera.exits import exit_with_error

if TYPE_CHECKING:
    from tessera.model.types import NodeInventory
    from tessera.simulate.departures import DeparturesResult, Lifetime
    from tessera.simulate.metrics import ReplayResult
    from tessera.simulate.trace import TraceTask

__all__ = [
    "DEFAULT_POLICIES",
    "FIRST_SEED",
    "run_all",
    "run_experiments",
    "simulate",
    "with_departures",
]

R = TypeVar("R")
Progress = Callable[[int, int], None]

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


def _published(
    nodes: list[NodeInventory],
    tasks: list[TraceTask],
    arrival: float,
    policy: str,
    seed: int,
    progress: Progress | None = None,
    nodes_to_score: int = 100,
) -> ReplayResult:
    from tessera.simulate.replay import replay

    return replay(
        nodes, tasks, policy, seed, arrival, progress=progress, nodes_to_score=nodes_to_score
    )


def with_departures(
    nodes: list[NodeInventory],
    tasks: list[TraceTask],
    lifetimes: dict[str, Lifetime],
    arrival: float,
    speedup: float,
    policy: str,
    seed: int,
    progress: Progress | None = None,
) -> DeparturesResult:
    from tessera.simulate.departures import replay_with_departures

    return replay_with_departures(
        nodes, tasks, lifetimes, policy, seed, arrival, speedup, progress=progress
    )


def run_all(
    experiment: Callable[..., R], policies: list[str], seeds: list[int], jobs: int
) -> list[R]:
    """``experiment(policy, seed, progress=...)`` for every (policy, seed), with a progress
    bar on stderr; results in (policy, seed) order. ``experiment`` is a partial of a
    module-level function, so that ``jobs`` > 1 can send it to worker processes."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    runs = [(p, s) for p in policies for s in seeds]
    done: dict[tuple[str, int], R] = {}
    columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    console = Console(stderr=True)
    # Off when stderr is no terminal: a transient bar there leaves only a blank line.
    with Progress(
        *columns, console=console, transient=True, disable=not console.is_terminal
    ) as bar:
        overall = bar.add_task("experiments", total=len(runs))
        if jobs <= 1:
            for policy, seed in runs:
                current = bar.add_task(f"{policy} seed {seed}", total=None)

                def tick(i: int, n: int, current: Any = current) -> None:
                    if i % 200 == 0 or i == n:
                        bar.update(current, completed=i, total=n)

                done[policy, seed] = experiment(policy, seed, progress=tick)
                bar.remove_task(current)
                bar.advance(overall)
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                futures = {pool.submit(experiment, p, s): (p, s) for p, s in runs}
                for future in as_completed(futures):
                    done[futures[future]] = future.result()
                    bar.advance(overall)
    return [done[r] for r in runs]


def run_experiments(
    nodes: list[NodeInventory],
    tasks: list[TraceTask],
    policies: list[str],
    seeds: list[int],
    arrival: float,
    jobs: int,
    nodes_to_score: int = 100,
) -> list[ReplayResult]:
    """The published protocol for every (policy, seed); ``nodes_to_score`` as
    kube-scheduler's percentageOfNodesToScore (tessera.simulate.sampling)."""
    experiment = partial(_published, nodes, tasks, arrival, nodes_to_score=nodes_to_score)
    return run_all(experiment, policies, seeds, jobs)


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
        float | None,
        typer.Option(
            help="Arrived GPU requests to reach, × cluster GPU capacity. "
            "Default: 1.3; 3 with --departures."
        ),
    ] = None,
    departures: Annotated[
        bool,
        typer.Option(
            "--departures",
            help="Tasks arrive at their trace times and leave after their trace lifetimes "
            "(needs --workload with creation_time and deletion_time).",
        ),
    ] = False,
    variant: Annotated[
        str | None,
        typer.Option(
            help="Replay a variant of the task list: KIND:SHARE, e.g. shared:0.6 "
            "(shared-card tasks carry 60% of the GPU demand) or multi:0.25 "
            "(docs/simulator.md)."
        ),
    ] = None,
    speedup: Annotated[
        float | None,
        typer.Option(
            help="With --departures: arrivals this many times the trace's pace "
            "(lifetimes unchanged). Default: 3000."
        ),
    ] = None,
    nodes_to_score: Annotated[
        int,
        typer.Option(
            help="kube-scheduler's percentageOfNodesToScore: each decision sees only the "
            "nodes kube-scheduler would hand the extender (0: its adaptive default; "
            "100: every node, the chart's setting). Published protocol only."
        ),
    ] = 100,
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
    one by one, drop what does not fit, nothing departs; or, with --departures, at the
    trace's own times, with waiting)."""
    try:
        options = _Options(
            seeds, arrival, departures, speedup, jobs, json_path, plot, variant, nodes_to_score
        )
        _simulate(cluster, workload, policy, options)
    except UsageError as err:
        exit_with_error("simulate", str(err), code=2)


@dataclass(frozen=True)
class _Options:
    seeds: int
    arrival: float | None
    departures: bool
    speedup: float | None
    jobs: int
    json_path: Path | None
    plot: Path | None
    variant: str | None = None
    nodes_to_score: int = 100


def _simulate(
    cluster: Path | None, workload: Path | None, policy: list[str] | None, opt: _Options
) -> None:
    from tessera.errors import SpecError
    from tessera.placement import make_policy
    from tessera.simulate.departures import DEFAULT_ARRIVAL, DEFAULT_SPEEDUP

    policies = list(policy or DEFAULT_POLICIES)
    for p in policies:
        try:
            make_policy(p)
        except SpecError as err:
            raise UsageError(f"--policy: {err.rule} (got {p!r})") from None
    arrival = (
        opt.arrival if opt.arrival is not None else (DEFAULT_ARRIVAL if opt.departures else 1.3)
    )
    if not arrival > 0:
        raise UsageError(f"--arrival: must be > 0 (got {arrival})")
    if opt.speedup is not None and not opt.departures:
        raise UsageError("--speedup: applies only with --departures")
    speedup = DEFAULT_SPEEDUP if opt.speedup is None else opt.speedup
    if not speedup > 0:
        raise UsageError(f"--speedup: must be > 0 (got {speedup})")
    if opt.seeds < 1:
        raise UsageError(f"--seeds: must be >= 1 (got {opt.seeds})")
    if opt.jobs < 1:
        raise UsageError(f"--jobs: must be >= 1 (got {opt.jobs})")
    if not 0 <= opt.nodes_to_score <= 100:
        raise UsageError(
            f"--nodes-to-score: must be 0 (adaptive) to 100 (got {opt.nodes_to_score})"
        )
    if opt.nodes_to_score != 100 and opt.departures:
        raise UsageError(
            "--nodes-to-score: applies only to the published protocol, not with --departures"
        )
    if opt.departures and workload is None:
        raise UsageError(
            "--departures: needs --workload, a task list with creation_time and "
            "deletion_time columns (the built-in workload has no times)"
        )
    nodes, tasks, sources = _load(cluster, workload)
    if opt.variant is not None:
        tasks = _variant(tasks, opt.variant)
        sources["workload"] += f" ({opt.variant})"
    seed_list = list(range(FIRST_SEED, FIRST_SEED + opt.seeds))
    if opt.departures:
        assert workload is not None
        _departures(nodes, tasks, workload, policies, seed_list, arrival, speedup, opt, sources)
    else:
        _published_protocol(nodes, tasks, policies, seed_list, arrival, opt, sources)


def _variant(tasks: list[TraceTask], text: str) -> list[TraceTask]:
    from tessera.errors import SpecError
    from tessera.simulate.variants import make_variant, parse_variant

    try:
        kind, share = parse_variant(text)
        return make_variant(tasks, kind, share)
    except SpecError as err:
        raise UsageError(f"--variant: {err.rule} (got {text!r})") from None


def _published_protocol(
    nodes: list[NodeInventory],
    tasks: list[TraceTask],
    policies: list[str],
    seed_list: list[int],
    arrival: float,
    opt: _Options,
    sources: dict[str, Any],
) -> None:
    from rich.console import Console

    from tessera.simulate.metrics import summarize
    from tessera.simulate.report import (
        failures_table,
        plot_allocation,
        summary_table,
        write_json,
    )

    results = run_experiments(
        nodes, tasks, policies, seed_list, arrival, opt.jobs, opt.nodes_to_score
    )
    console = Console()
    summaries = summarize(results)
    console.print(summary_table(summaries, arrival))
    console.print(failures_table(summaries))
    console.print(
        _footer(nodes, tasks, sources, results[0].arrived_tasks, [r.seconds for r in results],
                [r.cpu_seconds for r in results])
    )  # fmt: skip
    if opt.nodes_to_score != 100:
        console.print(_window_line(len(nodes), opt.nodes_to_score, results))
    meta = {"arrival": arrival, "seeds": seed_list, "policies": policies,
            "nodes_to_score": opt.nodes_to_score, **sources}  # fmt: skip
    _outputs(opt, seed_list, sources, lambda p: write_json(p, results, meta),
             lambda p, title: plot_allocation(p, results, title))  # fmt: skip


def _departures(
    nodes: list[NodeInventory],
    tasks: list[TraceTask],
    workload: Path,
    policies: list[str],
    seed_list: list[int],
    arrival: float,
    speedup: float,
    opt: _Options,
    sources: dict[str, Any],
) -> None:
    from rich.console import Console

    from tessera.errors import SpecError
    from tessera.simulate.departures import read_lifetimes
    from tessera.simulate.departures_report import (
        departures_table,
        plot_departures,
        summarize_departures,
        write_departures_json,
    )

    try:
        lifetimes = read_lifetimes(workload)
    except SpecError as err:
        raise UsageError(f"--workload: {err} (--departures reads the trace's times)") from None
    experiment = partial(with_departures, nodes, tasks, lifetimes, arrival, speedup)
    results = run_all(experiment, policies, seed_list, opt.jobs)
    console = Console()
    console.print(departures_table(summarize_departures(results), arrival, speedup))
    console.print(
        _footer(nodes, tasks, sources, results[0].tasks, [r.seconds for r in results],
                [r.cpu_seconds for r in results])
    )  # fmt: skip
    meta = {
        "mode": "departures",
        "arrival": arrival,
        "speedup": speedup,
        "seeds": seed_list,
        "policies": policies,
        **sources,
    }
    _outputs(opt, seed_list, sources, lambda p: write_departures_json(p, results, meta),
             lambda p, title: plot_departures(p, results, f"{title}, with departures"))  # fmt: skip


def _window_line(nodes: int, percentage: int, results: list[ReplayResult]) -> str:
    """What kube-scheduler's window was, and the tasks each policy placed only on a later
    window (mean per experiment)."""
    from tessera.simulate.metrics import by_policy, retry_summary
    from tessera.simulate.sampling import backoff_wait_s, nodes_to_find

    setting = "adaptive" if percentage == 0 else f"{percentage} %"
    parts = []
    for policy, runs in by_policy(results).items():
        mean, most = retry_summary(runs)
        parts.append(f"{policy} {mean:.0f} (longest backoff {backoff_wait_s(most):.0f} s)")
    return (
        f"kube-scheduler's window: {nodes_to_find(percentage, nodes)} of {nodes} nodes "
        f"(percentageOfNodesToScore {setting}); tasks placed only on a later window: "
        f"{', '.join(parts)}"
    )


def _footer(
    nodes: list[NodeInventory],
    tasks: list[TraceTask],
    sources: dict[str, Any],
    arrivals: int,
    seconds: list[float],
    cpu_seconds: list[float],
) -> str:
    per_run, per_run_cpu = sum(seconds) / len(seconds), sum(cpu_seconds) / len(cpu_seconds)
    return (
        f"{sources['cluster']}: {len(nodes)} nodes, {sum(len(n.cards) for n in nodes)} GPUs; "
        f"{sources['workload']}: {len(tasks)} tasks; {arrivals} arrivals per run; "
        f"{per_run:.1f} s per experiment ({per_run_cpu:.1f} s CPU)"
    )


def _outputs(
    opt: _Options,
    seed_list: list[int],
    sources: dict[str, Any],
    write_json: Callable[[Path], None],
    write_plot: Callable[[Path, str], None],
) -> None:
    if opt.json_path is not None:
        json_path = opt.json_path
        _write("--json", json_path, lambda: write_json(json_path))
    if opt.plot is not None:
        plot = opt.plot
        n = len(seed_list)
        title = f"{sources['workload']} on {sources['cluster']}, {n} seed{'s' * (n > 1)}"
        _write("--plot", plot, lambda: write_plot(plot, title))


def _write(option: str, path: Path, write: Callable[[], None]) -> None:
    try:
        write()
    except OSError as err:
        raise UsageError(f"{option}: cannot write {path}: {err.strerror or err}") from None
