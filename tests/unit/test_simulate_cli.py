from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tessera.cli import app
from tessera.simulate.cli import _footer, _load, _published, run_all, with_departures
from tessera.simulate.departures import Lifetime

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,2,T4\nn1,32000,131072,4,T4\n"
TASKS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
    "a,4000,8192,1,500,\nb,4000,8192,1,1000,\nc,4000,8192,2,1000,\nd,2000,4096,0,0,\n"
)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    nodes, tasks = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    tasks.write_text(TASKS)
    return nodes, tasks


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner(env={"COLUMNS": "120"}).invoke(app, ["simulate", *args])
    return result.exit_code, result.stdout, result.stderr


def test_runs_writes_json_and_plot(files: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, tasks = files
    out_json, out_png = tmp_path / "o" / "sim.json", tmp_path / "o" / "sim.png"
    code, out, err = run(
        "--cluster", str(nodes), "--workload", str(tasks), "--policy", "binpack",
        "--policy", "spread", "--seeds", "2", "--json", str(out_json), "--plot", str(out_png),
    )  # fmt: skip
    assert code == 0, err
    assert err == ""  # no bar where stderr is no terminal (rich left a blank line there)
    assert "binpack" in out and "spread" in out and "@130%" in out and "÷FGD" in out
    assert "kube-scheduler's window" not in out  # every node scored: the published protocol
    doc = json.loads(out_json.read_text())
    assert [(r["policy"], r["seed"]) for r in doc["results"]] == [
        ("binpack", 42),
        ("binpack", 43),
        ("spread", 42),
        ("spread", 43),
    ]
    for r in doc["results"]:
        assert r["arrived_ratio"] <= 1.3
        assert 0 < r["gpu_allocation_ratio"] <= 1
        assert isinstance(r["failed_tasks"], int)
    assert (doc["cluster"], doc["workload"], doc["arrival"]) == ("nodes.csv", "pods.csv", 1.3)
    assert out_png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "nope"], "--policy: must be one of best-fit, binpack, fragmentation"),
        (["--arrival", "0"], "--arrival: must be > 0 (got 0.0)"),
        (["--arrival", "-1.5"], "--arrival: must be > 0 (got -1.5)"),
        (["--seeds", "0"], "--seeds: must be >= 1 (got 0)"),
        (["--jobs", "0"], "--jobs: must be >= 1 (got 0)"),
        (["--nodes-to-score", "101"], "--nodes-to-score: must be 0 (adaptive) to 100 (got 101)"),
        (["--nodes-to-score", "-1"], "--nodes-to-score: must be 0 (adaptive) to 100 (got -1)"),
        (
            ["--departures", "--nodes-to-score", "0"],
            "--nodes-to-score: applies only to the published protocol, not with --departures",
        ),
        (["--cluster", "missing.csv"], "--cluster: file not found: missing.csv"),
        (["--workload", "missing.csv"], "--workload: file not found: missing.csv"),
    ],
)
def test_bad_options_one_line_exit_2(args: list[str], message: str) -> None:
    code, out, err = run(*args)
    assert code == 2
    assert err.startswith(f"tessera simulate: error: {message}")
    assert err.count("\n") == 1 and "Traceback" not in err and out == ""


def test_bad_csv_row_names_file_line_and_column(files: tuple[Path, Path]) -> None:
    nodes, tasks = files
    tasks.write_text(TASKS + "e,1,1,1,half,\n")
    code, _, err = run("--cluster", str(nodes), "--workload", str(tasks))
    assert code == 2
    assert err == (
        "tessera simulate: error: --workload: pods.csv line 6: column gpu_milli: "
        "must be an integer (got 'half')\n"
    )
    nodes.write_text(NODES + "n2,1,1,2,NOPE\n")
    code, _, err = run("--cluster", str(nodes))
    assert code == 2
    assert err.startswith("tessera simulate: error: --cluster: nodes.csv line 4: column model:")


def test_cluster_without_gpus_is_refused(tmp_path: Path) -> None:
    nodes = tmp_path / "cpu.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nc0,1000,1000,0,\n")
    code, _, err = run("--cluster", str(nodes))
    assert (code, err) == (
        2,
        "tessera simulate: error: --cluster: must hold at least one healthy GPU\n",
    )


TIMED = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time\n"
    "a,4000,8192,1,500,,0,600\nb,4000,8192,1,1000,,300,3000\nc,4000,8192,2,1000,,900,1500\n"
    "d,2000,4096,0,0,,1200,\n"
)


def test_departures_mode_runs_writes_json_and_plot(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    nodes, tasks = files
    tasks.write_text(TIMED)
    out_json, out_png = tmp_path / "dep.json", tmp_path / "dep.png"
    code, out, err = run(
        "--departures", "--speedup", "2", "--cluster", str(nodes), "--workload", str(tasks),
        "--policy", "binpack", "--policy", "fragmentation", "--seeds", "2",
        "--json", str(out_json), "--plot", str(out_png),
    )  # fmt: skip
    assert code == 0, err
    assert "With departures: arrivals 2x the trace's pace, 300% of capacity" in out
    assert "mean ±std over 2 seeds" in " ".join(out.split())
    assert "binpack" in out and "fragmentation" in out and "wait p99" in out
    doc = json.loads(out_json.read_text())
    assert (doc["mode"], doc["arrival"], doc["speedup"]) == ("departures", 3.0, 2.0)
    assert [(r["policy"], r["seed"]) for r in doc["results"]] == [
        ("binpack", 42), ("binpack", 43), ("fragmentation", 42), ("fragmentation", 43)
    ]  # fmt: skip
    for r in doc["results"]:
        # 6 cards x 3 = 18 GPUs requested by the list and its copies.
        assert r["tasks"] > 4 and 0 < r["time_weighted_allocation"] <= 1
        assert r["time_weighted_demand"] >= r["time_weighted_allocation"]
        assert len(r["allocation_curve"]) == len(r["waiting_curve"]) == 101
        start, end = r["window_seconds"]
        assert 0 <= start < end
    assert out_png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--speedup", "10"], "--speedup: applies only with --departures"),
        (
            ["--departures"],
            "--departures: needs --workload, a task list with creation_time and "
            "deletion_time columns (the built-in workload has no times)\n",
        ),
        (["--departures", "--speedup", "0", "--workload", "{tasks}"], "--speedup: must be > 0"),
        (
            ["--departures", "--workload", "{untimed}"],
            "--workload: pods.csv: missing column(s) creation_time, deletion_time",
        ),
    ],
)
def test_departures_bad_options_one_line_exit_2(
    files: tuple[Path, Path], tmp_path: Path, args: list[str], message: str
) -> None:
    untimed = files[1]
    timed = tmp_path / "timed.csv"
    timed.write_text(TIMED)
    args = [a.format(tasks=timed, untimed=untimed) for a in args]
    code, out, err = run(*args)
    assert code == 2, out
    assert err.startswith(f"tessera simulate: error: {message}"), err
    assert err.count("\n") == 1 and out == ""


def test_variant_replays_the_reshaped_list_and_bad_variants_are_refused(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    nodes, tasks = files
    out_json = tmp_path / "v.json"
    code, _, err = run(
        "--cluster", str(nodes), "--workload", str(tasks), "--policy", "binpack",
        "--variant", "shared:0.4", "--json", str(out_json),
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out_json.read_text())["workload"] == "pods.csv (shared:0.4)"
    code, _, err = run("--variant", "shared:0.01")
    assert code == 2 and err.startswith(
        "tessera simulate: error: --variant: must be between 0.290 (the list's)"
    ), err
    code, _, err = run("--variant", "gpu:0.5")
    assert code == 2 and "--variant: must be KIND:SHARE" in err


def test_departures_in_worker_processes_give_the_same_results(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    nodes, tasks = files
    tasks.write_text(TIMED)
    docs = []
    for jobs in ("1", "2"):
        out_json = tmp_path / f"jobs{jobs}.json"
        code, _, err = run(
            "--departures", "--speedup", "2", "--cluster", str(nodes), "--workload", str(tasks),
            "--policy", "binpack", "--policy", "spread", "--seeds", "2", "--jobs", jobs,
            "--json", str(out_json),
        )  # fmt: skip
        assert code == 0, err
        records = json.loads(out_json.read_text())["results"]
        timing = ("seconds", "cpu_seconds")
        docs.append([{k: v for k, v in r.items() if k not in timing} for r in records])
    assert docs[0] == docs[1]


@pytest.mark.parametrize(
    ("percentage", "window"),
    [(10, "100 of 300 nodes (percentageOfNodesToScore 10 %)"),
     # kube-scheduler's adaptive share: 50 % less 1 % per 125 nodes, so 48 % of 300
     (0, "144 of 300 nodes (percentageOfNodesToScore adaptive)")],
)  # fmt: skip
def test_nodes_to_score_replays_kube_schedulers_window_and_says_so(
    tmp_path: Path, percentage: int, window: str
) -> None:
    nodes, tasks, out_json = tmp_path / "nodes.csv", tmp_path / "pods.csv", tmp_path / "o.json"
    rows = "".join(f"n{i},8000,32768,1,T4\n" for i in range(300))
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + rows)
    tasks.write_text(TASKS)
    code, out, err = run(
        "--cluster", str(nodes), "--workload", str(tasks), "--policy", "binpack",
        "--policy", "spread", "--nodes-to-score", str(percentage), "--json", str(out_json),
    )  # fmt: skip
    assert code == 0, err
    line = " ".join(out.split())
    assert f"kube-scheduler's window: {window}; tasks placed only on a later window: " in line
    assert re.search(r"window: binpack \d+ \(longest backoff \d+ s\), spread \d+ \(", line)
    doc = json.loads(out_json.read_text())
    assert doc["nodes_to_score"] == percentage
    for result in doc["results"]:
        assert result["nodes_to_score"] == percentage
        assert isinstance(result["retried_tasks"], int)
        assert sum(result["retried_cycles"].values()) == result["retried_tasks"]


def test_an_arrival_or_a_speedup_under_one_is_taken(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    nodes, tasks = files
    out_json = tmp_path / "half.json"
    common = ["--cluster", str(nodes), "--policy", "binpack", "--json", str(out_json)]
    code, _, err = run(*common, "--workload", str(tasks), "--arrival", "0.5")
    assert code == 0, err
    doc = json.loads(out_json.read_text())
    assert doc["arrival"] == 0.5
    # The other defaults: one seed, every node scored, the published protocol.
    assert (doc["seeds"], doc["nodes_to_score"], "mode" in doc) == ([42], 100, False)
    tasks.write_text(TIMED)
    code, _, err = run(*common, "--workload", str(tasks), "--departures", "--speedup", "0.5")
    assert code == 0, err
    assert json.loads(out_json.read_text())["speedup"] == 0.5


def test_the_command_list_gives_simulate_one_line() -> None:
    """The docstring's hard line breaks used to cut its summary mid-phrase in the list."""
    listing = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["--help"]).output
    [line] = [x for x in listing.splitlines() if " simulate " in x]
    assert line.rstrip(" │").endswith("report GPU allocation."), listing


def test_the_default_run_reads_the_built_in_cluster_and_workload() -> None:
    nodes, tasks, sources = _load(None, None)
    assert (len(nodes), sum(len(n.cards) for n in nodes), len(tasks)) == (1213, 6212, 8024)
    assert sources == {
        "cluster": "built-in (openb node shapes)",
        "workload": "built-in (openb default task shapes)",
    }


def test_an_empty_task_list_is_refused(files: tuple[Path, Path]) -> None:
    nodes, tasks = files
    tasks.write_text(TASKS.splitlines()[0] + "\n")
    code, out, err = run("--cluster", str(nodes), "--workload", str(tasks))
    assert (code, out, err) == (
        2,
        "",
        "tessera simulate: error: --workload: must hold at least one task\n",
    )


def test_the_footer_gives_sizes_and_the_mean_time_per_experiment() -> None:
    nodes, tasks, _ = _load(None, None)
    sources = {"cluster": "n.csv", "workload": "t.csv"}
    assert _footer(nodes[:3], tasks[:5], sources, 7, [1.0, 3.0], [0.5, 2.5]) == (
        f"n.csv: 3 nodes, {sum(len(n.cards) for n in nodes[:3])} GPUs; t.csv: 5 tasks; "
        "7 arrivals per run; 2.0 s per experiment (1.5 s CPU)"
    )


@pytest.mark.parametrize("departures", [False, True])
def test_both_modes_print_every_table_and_record_seeds_policies_and_titles(
    files: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    departures: bool,
) -> None:
    from tessera.simulate import departures_report, report

    nodes, tasks = files
    titles: list[str] = []
    monkeypatch.setattr(report, "plot_allocation", lambda _p, _r, title: titles.append(title))
    monkeypatch.setattr(departures_report, "plot_departures",
                        lambda _p, _r, title: titles.append(title))  # fmt: skip
    mode = ["--departures", "--speedup", "2"] if departures else []
    if departures:
        tasks.write_text(TIMED)
    out_json = tmp_path / "o.json"
    for seeds in ("1", "2"):
        code, out, err = run(
            *mode, "--cluster", str(nodes), "--workload", str(tasks), "--policy", "spread",
            "--policy", "binpack", "--seeds", seeds, "--json", str(out_json),
            "--plot", str(tmp_path / "o.png"),
        )  # fmt: skip
        assert code == 0, err
    doc = json.loads(out_json.read_text())
    assert (doc["seeds"], doc["policies"]) == ([42, 43], ["spread", "binpack"])
    tail = ", with departures" if departures else ""
    assert titles == [
        f"pods.csv on nodes.csv, 1 seed{tail}",
        f"pods.csv on nodes.csv, 2 seeds{tail}",
    ]
    text = " ".join(out.split())
    arrivals = doc["results"][0]["tasks" if departures else "arrived_tasks"]
    assert f"nodes.csv: 2 nodes, 6 GPUs; pods.csv: 4 tasks; {arrivals} arrivals per run; " in text
    if not departures:
        assert "Failed tasks per run (mean): by reason, then by request class" in text


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_an_output_that_cannot_be_written_is_one_line_naming_the_option(
    files: tuple[Path, Path], tmp_path: Path, option: str
) -> None:
    nodes, tasks = files
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = blocker / "out"
    code, _, err = run("--cluster", str(nodes), "--workload", str(tasks), "--policy",
                       "binpack", option, str(target))  # fmt: skip
    assert (code, err) == (
        2,
        f"tessera simulate: error: {option}: cannot write {target}: File exists\n",
    )


def _pid_of_worker(policy: str, seed: int) -> tuple[str, int, int]:
    return policy, seed, os.getpid()


def test_run_all_shows_progress_on_stderr_and_hands_experiments_a_progress_callback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import rich.console

    frames, made = io.StringIO(), []
    real = rich.console.Console

    def console(**kwargs: Any) -> rich.console.Console:
        made.append(kwargs)
        return real(file=frames, force_terminal=True, width=100)

    monkeypatch.setattr(rich.console, "Console", console)

    def experiment(policy: str, seed: int, progress: Callable[[int, int], None]) -> str:
        for i in range(401):
            progress(i, 400)
        return f"{policy}/{seed}"

    assert run_all(experiment, ["a", "b"], [42, 43], jobs=1) == ["a/42", "a/43", "b/42", "b/43"]
    assert made == [{"stderr": True}]
    assert "experiments" in frames.getvalue() and "4/4" in frames.getvalue()
    # More than one job: each experiment in a worker process, results in the same order.
    got = run_all(_pid_of_worker, ["a"], [42, 43], jobs=2)
    assert [(p, s) for p, s, _ in got] == [("a", 42), ("a", 43)]
    assert all(pid != os.getpid() for _, _, pid in got)


def test_the_replays_report_their_progress() -> None:
    all_nodes, all_tasks, _ = _load(None, None)
    nodes, tasks = all_nodes[:20], all_tasks[:30]
    calls: list[tuple[int, int]] = []
    _published(nodes, tasks, 1.3, "binpack", 42, progress=lambda i, n: calls.append((i, n)))
    assert calls and calls[-1][0] == calls[-1][1] > 0
    calls.clear()
    lifetimes = {t.name: Lifetime(i, i + 10) for i, t in enumerate(tasks)}
    got = with_departures(nodes, tasks, lifetimes, 2.0, 5.0, "binpack", 42,
                          progress=lambda i, n: calls.append((i, n)))  # fmt: skip
    assert calls and calls[-1][0] == calls[-1][1] > 0
    assert (got.policy, got.seed, got.arrival, got.speedup) == ("binpack", 42, 2.0, 5.0)
