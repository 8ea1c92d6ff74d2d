"""The Alibaba 2023 GPU trace's task list (``openb_pod_list_*.csv``) and its mapping to pods.

Columns Tessera reads (others, such as qos or the timestamps, are ignored):

    name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec]

``gpu_milli`` is the share of *one* card in thousandths; a task with ``num_gpu`` > 1 takes
whole cards (gpu_milli 1000). ``gpu_spec`` lists the allowed card models joined by ``|``;
empty means any model. The mapping to a :class:`PodRequest` is:

* num_gpu 0                     -> one container without a GPU (CPU and memory only)
* num_gpu 1, gpu_milli < 1000   -> one card, memory and compute both gpu_milli / 10 percent
* gpu_milli 1000                -> ``num_gpu`` whole cards, exclusive
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tessera.errors import SpecError
from tessera.model.csvrows import int_column, rows, text_column
from tessera.model.types import ContainerRequest, GpuRequest, PodRequest

__all__ = [
    "MILLI_PER_CARD",
    "TRACE_NAMESPACE",
    "TraceTask",
    "parse_tasks_csv",
    "read_tasks_csv",
    "to_pod_request",
]

MILLI_PER_CARD = 1000
TRACE_NAMESPACE = "trace"
REQUIRED_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


@dataclass(frozen=True, slots=True)
class TraceTask:
    """One row of the task list: what the task asks for, nothing about when it ran."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int = 0
    gpu_milli: int = 0  # per card, thousandths of one card
    gpu_spec: frozenset[str] = frozenset()  # allowed models; empty = any

    @property
    def gpu_milli_total(self) -> int:
        """Milli-GPU the task requests over all its cards (what the protocol counts)."""
        return self.num_gpu * self.gpu_milli


def _task(row: dict[str, str], where: str) -> TraceTask:
    name = text_column(row, "name", where)
    num_gpu = int_column(row, "num_gpu", where, 0)
    gpu_milli = int_column(row, "gpu_milli", where, 0, MILLI_PER_CARD)
    column = f"{where}: column gpu_milli"
    if num_gpu == 0 and gpu_milli != 0:
        raise SpecError(column, "must be 0 when num_gpu is 0", gpu_milli)
    if num_gpu > 0 and gpu_milli == 0:
        raise SpecError(column, "must be > 0 when num_gpu > 0", gpu_milli)
    if num_gpu > 1 and gpu_milli != MILLI_PER_CARD:
        raise SpecError(column, "must be 1000 when num_gpu > 1 (whole cards)", gpu_milli)
    if gpu_milli % 10:
        raise SpecError(
            column, "must be a multiple of 10 (cards are shared in whole percent)", gpu_milli
        )
    spec = frozenset(m.strip() for m in (row.get("gpu_spec") or "").split("|") if m.strip())
    return TraceTask(
        name=name,
        cpu_milli=int_column(row, "cpu_milli", where, 0),
        memory_mib=int_column(row, "memory_mib", where, 0),
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
        gpu_spec=spec,
    )


def parse_tasks_csv(lines: Iterable[str], source: str = "tasks") -> list[TraceTask]:
    """Parse task-list CSV text; errors name the source, line and column."""
    tasks: list[TraceTask] = []
    seen: set[str] = set()
    for where, row in rows(lines, source, REQUIRED_COLUMNS):
        task = _task(row, where)
        if task.name in seen:
            raise SpecError(f"{where}: column name", "duplicate task name", task.name)
        seen.add(task.name)
        tasks.append(task)
    return tasks


def read_tasks_csv(path: str | Path) -> list[TraceTask]:
    """Read a task-list CSV file (see the module docstring)."""
    p = Path(path)
    with p.open(newline="") as f:
        return parse_tasks_csv(f, source=p.name)


def to_pod_request(task: TraceTask, name: str | None = None) -> PodRequest:
    """The pod a task stands for; ``name`` overrides the task's (copies need their own)."""
    gpu: GpuRequest | None = None
    if task.num_gpu and task.gpu_milli >= MILLI_PER_CARD:
        gpu = GpuRequest(count=task.num_gpu, exclusive=True, models=task.gpu_spec)
    elif task.num_gpu:
        percent = task.gpu_milli // 10
        gpu = GpuRequest(
            count=1, memory_percent=percent, cores_percent=percent, models=task.gpu_spec
        )
    return PodRequest(
        namespace=TRACE_NAMESPACE,
        name=name or task.name,
        containers=(ContainerRequest(name="main", gpu=gpu),),
        cpu_milli=task.cpu_milli,
        memory_mib=task.memory_mib,
    )
