from __future__ import annotations

from pathlib import Path

import pytest

from tessera.errors import SpecError
from tessera.model.types import GpuRequest
from tessera.simulate.trace import TraceTask, parse_tasks_csv, read_tasks_csv, to_pod_request

HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos"


def test_reads_rows_and_ignores_other_columns() -> None:
    rows = ["a,12000,16384,1,1000,,LS", "b,6000,12288,1,460,V100M16|V100M32,BE", "c,8,1,0,0,,"]
    tasks = parse_tasks_csv([HEADER, *rows, "d,0,0,1,10,,"])
    assert tasks == [
        TraceTask("a", 12000, 16384, 1, 1000),
        TraceTask("b", 6000, 12288, 1, 460, frozenset({"V100M16", "V100M32"})),
        TraceTask("c", 8, 1, 0, 0),
        TraceTask("d", 0, 0, 1, 10),  # no CPU or memory asked: allowed
    ]
    assert [t.gpu_milli_total for t in tasks] == [1000, 460, 0, 10]


def test_gpu_spec_column_is_optional() -> None:
    (task,) = parse_tasks_csv(["name,cpu_milli,memory_mib,num_gpu,gpu_milli", "a,1,1,8,1000"])
    assert (task.gpu_spec, task.gpu_milli_total) == (frozenset(), 8000)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("a,x,1,1,1000,,", "tasks line 2: column cpu_milli: must be an integer (got 'x')"),
        ("a,1,-5,1,1000,,", "tasks line 2: column memory_mib: must be >= 0 (got -5)"),
        ("a,1,1,-1,1000,,", "tasks line 2: column num_gpu: must be >= 0 (got -1)"),
        ("a,1,1,1,1001,,", "tasks line 2: column gpu_milli: must be <= 1000 (got 1001)"),
        ("a,1,1,1,0,,", "tasks line 2: column gpu_milli: must be > 0 when num_gpu > 0 (got 0)"),
        ("a,1,1,0,500,,", "tasks line 2: column gpu_milli: must be 0 when num_gpu is 0 (got 500)"),
        (
            "a,1,1,2,500,,",
            "tasks line 2: column gpu_milli: must be 1000 when num_gpu > 1 (whole cards) (got 500)",
        ),
        (
            "a,1,1,1,455,,",
            "tasks line 2: column gpu_milli: must be a multiple of 10 (cards are shared in "
            "whole percent) (got 455)",
        ),
        (",1,1,1,500,,", "tasks line 2: column name: must not be empty"),
    ],
)
def test_bad_rows_name_line_and_column(row: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_tasks_csv([HEADER, row])
    assert str(err.value).startswith(message)


def test_missing_columns_and_duplicate_names() -> None:
    with pytest.raises(SpecError, match="missing column"):
        parse_tasks_csv(["name,cpu_milli", "a,1"])
    with pytest.raises(SpecError) as err:
        parse_tasks_csv([HEADER, "a,1,1,0,0,,", "a,1,1,0,0,,"])
    assert str(err.value) == "tasks line 3: column name: duplicate task name (got 'a')"


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(HEADER + "\na,1,1,0,0,,\nb,1,1,1,abc,,\n")
    with pytest.raises(SpecError, match=r"^pods.csv line 3: column gpu_milli"):
        read_tasks_csv(path)


def test_mapping_to_pods() -> None:
    cpu = to_pod_request(TraceTask("c", 8000, 1024))
    assert cpu.key == "trace/c"
    assert (cpu.cpu_milli, cpu.memory_mib, cpu.gpu_containers()) == (8000, 1024, ())

    shared = to_pod_request(TraceTask("s", 1, 2, 1, 470, frozenset({"T4", "P100"})))
    assert shared.containers[0].gpu == GpuRequest(
        count=1, memory_percent=47, cores_percent=47, models=frozenset({"T4", "P100"})
    )

    whole = to_pod_request(TraceTask("w", 1, 2, 4, 1000), name="w-copy-3")
    assert whole.key == "trace/w-copy-3"
    assert whole.containers[0].gpu == GpuRequest(count=4, exclusive=True)
    # Each pod is one container, "main".
    assert [c.name for p in (cpu, shared, whole) for c in p.containers] == ["main"] * 3


def test_reads_the_real_trace(openb_dir: Path) -> None:
    tasks = read_tasks_csv(openb_dir / "openb_pod_list_default.csv")
    assert len(tasks) == 8152
    assert sum(t.gpu_milli_total for t in tasks) == 6_086_800
