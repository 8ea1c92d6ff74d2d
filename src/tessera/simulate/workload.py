"""The built-in default: a cluster and a workload shaped like the Alibaba 2023 trace.

The project does not ship the trace. Instead it ships figures measured on it (node shapes
and task shapes with their counts, below) and builds a cluster and a task list from them.
``tests/unit/test_simulate_workload.py`` re-measures the figures from the trace whenever
the trace sits beside the checkout, so the constants cannot drift from the data silently;
``python -m tessera.simulate.workload NODES.csv TASKS.csv`` prints them afresh.

* Nodes: every (model, cards, CPU, memory) combination in ``openb_node_list_gpu_node.csv``
  with its count; 15 shapes, 1,213 nodes, 6,212 cards. The synthetic cluster is exactly
  these shapes (``scale`` multiplies the counts).
* Tasks: every (num_gpu, gpu_milli, cpu_milli, memory_mib, gpu_spec) combination seen at
  least ``MIN_SHAPE_COUNT`` times in ``openb_pod_list_default.csv``: 84 of its 151 shapes,
  covering 98.4% of its 8,152 tasks and 97.4% of its GPU request. Every request class
  (CPU-only, shared card, 1/2/4/8 whole cards) stays represented. The synthetic task list
  holds each shape in proportion to its count; the replay shuffles it by seed, as it does
  the real list.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tessera.model.clusterspec import make_cards
from tessera.model.types import NodeInventory
from tessera.simulate.trace import MILLI_PER_CARD, TraceTask

__all__ = [
    "MIN_SHAPE_COUNT",
    "OPENB_NODE_SHAPES",
    "OPENB_TASK_SHAPES",
    "NodeShape",
    "TaskShape",
    "measure_node_shapes",
    "measure_task_shapes",
    "request_class",
    "synthetic_cluster",
    "synthetic_tasks",
]

MIN_SHAPE_COUNT = 5


@dataclass(frozen=True, slots=True)
class NodeShape:
    model: str
    gpus: int
    cpu_milli: int
    memory_mib: int
    count: int


@dataclass(frozen=True, slots=True)
class TaskShape:
    num_gpu: int
    gpu_milli: int
    cpu_milli: int
    memory_mib: int
    gpu_spec: str  # allowed models joined by "|", sorted; "" = any
    count: int


def request_class(num_gpu: int, gpu_milli: int) -> str:
    """The coarse class of a GPU request: ``cpu-only``, ``shared`` or ``N-gpu`` whole cards."""
    if num_gpu == 0:
        return "cpu-only"
    if gpu_milli < MILLI_PER_CARD:
        return "shared"
    return f"{num_gpu}-gpu"


# Measured on openb_node_list_gpu_node.csv (sorted by model, cards, CPU, memory).
OPENB_NODE_SHAPES: tuple[NodeShape, ...] = (
    NodeShape("A10", 1, 128000, 1048576, 2),
    NodeShape("G2", 8, 96000, 393216, 549),
    NodeShape("G3", 8, 128000, 786432, 39),
    NodeShape("P100", 1, 8000, 61440, 3),
    NodeShape("P100", 2, 8000, 61440, 2),
    NodeShape("P100", 2, 16000, 122880, 107),
    NodeShape("P100", 2, 64000, 262144, 22),
    NodeShape("T4", 2, 104000, 524288, 387),
    NodeShape("T4", 4, 96000, 393216, 17),
    NodeShape("V100M16", 1, 8000, 32768, 19),
    NodeShape("V100M16", 4, 32000, 131072, 28),
    NodeShape("V100M16", 8, 64000, 262144, 7),
    NodeShape("V100M16", 8, 82000, 344064, 1),
    NodeShape("V100M32", 4, 48000, 376832, 9),
    NodeShape("V100M32", 8, 96000, 786432, 21),
)

# Measured on openb_pod_list_default.csv: shapes seen >= MIN_SHAPE_COUNT times, most
# common first (ties by the shape itself).
OPENB_TASK_SHAPES: tuple[TaskShape, ...] = (
    TaskShape(1, 810, 3152, 5600, "", 1047),
    TaskShape(1, 1000, 11300, 49152, "", 857),
    TaskShape(1, 1000, 11400, 48128, "", 534),
    TaskShape(1, 1000, 3152, 5600, "", 470),
    TaskShape(1, 470, 11908, 47104, "", 388),
    TaskShape(0, 0, 12500, 57344, "", 364),
    TaskShape(1, 470, 8000, 30517, "", 360),
    TaskShape(0, 0, 32000, 49152, "", 284),
    TaskShape(1, 1000, 18708, 64512, "", 255),
    TaskShape(1, 650, 11908, 47104, "", 237),
    TaskShape(1, 1000, 9810, 41560, "", 195),
    TaskShape(0, 0, 8000, 30517, "", 163),
    TaskShape(1, 1000, 12000, 24576, "", 158),
    TaskShape(1, 1000, 15700, 58368, "", 158),
    TaskShape(1, 1000, 11908, 47104, "", 153),
    TaskShape(0, 0, 15400, 51200, "", 120),
    TaskShape(1, 320, 4000, 22888, "", 111),
    TaskShape(1, 1000, 16000, 32768, "", 108),
    TaskShape(1, 1000, 4000, 24576, "", 104),
    TaskShape(1, 1000, 8000, 16384, "", 104),
    TaskShape(1, 1000, 12000, 16384, "", 99),
    TaskShape(0, 0, 16500, 51200, "", 95),
    TaskShape(1, 1000, 14200, 58368, "", 93),
    TaskShape(1, 230, 4000, 30517, "", 84),
    TaskShape(1, 1000, 24200, 93184, "", 84),
    TaskShape(1, 320, 4000, 15258, "", 78),
    TaskShape(1, 590, 3152, 5600, "", 75),
    TaskShape(1, 320, 8000, 30517, "", 72),
    TaskShape(1, 550, 4152, 10600, "", 72),
    TaskShape(1, 1000, 11400, 77824, "", 65),
    TaskShape(1, 1000, 8000, 32768, "", 55),
    TaskShape(1, 160, 4000, 15258, "", 53),
    TaskShape(1, 460, 6000, 6144, "", 51),
    TaskShape(1, 1000, 11900, 77824, "", 51),
    TaskShape(1, 370, 4152, 10600, "", 45),
    TaskShape(1, 1000, 12000, 15360, "", 44),
    TaskShape(1, 320, 4000, 30517, "", 43),
    TaskShape(1, 1000, 8200, 33792, "", 41),
    TaskShape(1, 1000, 4000, 31250, "", 40),
    TaskShape(1, 1000, 15200, 80896, "", 36),
    TaskShape(1, 1000, 16000, 65536, "", 33),
    TaskShape(1, 810, 4152, 10600, "", 31),
    TaskShape(1, 460, 6000, 12288, "", 29),
    TaskShape(1, 1000, 16400, 125952, "", 27),
    TaskShape(1, 230, 4000, 22888, "", 26),
    TaskShape(1, 220, 4000, 15258, "", 24),
    TaskShape(1, 320, 1000, 2048, "", 22),
    TaskShape(1, 160, 6000, 22888, "", 20),
    TaskShape(1, 220, 8000, 30517, "", 19),
    TaskShape(1, 230, 8000, 30517, "", 18),
    TaskShape(1, 460, 6000, 18432, "", 18),
    TaskShape(1, 480, 4000, 22888, "", 18),
    TaskShape(8, 1000, 64200, 263168, "", 18),
    TaskShape(8, 1000, 88000, 327680, "", 18),
    TaskShape(1, 1000, 11300, 37888, "", 16),
    TaskShape(1, 1000, 1000, 6144, "", 15),
    TaskShape(1, 230, 4000, 15258, "", 12),
    TaskShape(1, 650, 8000, 30517, "", 12),
    TaskShape(0, 0, 8000, 15625, "", 11),
    TaskShape(0, 0, 11400, 57344, "", 11),
    TaskShape(1, 220, 4000, 22888, "", 11),
    TaskShape(1, 1000, 7000, 30000, "", 11),
    TaskShape(1, 110, 4000, 22888, "", 9),
    TaskShape(1, 460, 6000, 8192, "", 9),
    TaskShape(1, 1000, 15400, 90112, "", 9),
    TaskShape(4, 1000, 32200, 132096, "", 9),
    TaskShape(0, 0, 16000, 31250, "", 8),
    TaskShape(1, 110, 4000, 15258, "", 8),
    TaskShape(1, 220, 4000, 30517, "", 8),
    TaskShape(1, 1000, 4000, 16384, "", 8),
    TaskShape(1, 1000, 12000, 32768, "", 8),
    TaskShape(1, 1000, 12000, 47104, "", 8),
    TaskShape(1, 1000, 14900, 73728, "", 8),
    TaskShape(1, 330, 4000, 22888, "", 7),
    TaskShape(1, 460, 6000, 16384, "", 7),
    TaskShape(2, 1000, 16200, 66560, "", 7),
    TaskShape(1, 350, 4000, 22888, "", 6),
    TaskShape(1, 460, 6000, 23552, "", 6),
    TaskShape(1, 460, 12000, 18432, "", 6),
    TaskShape(1, 1000, 6000, 32768, "", 6),
    TaskShape(1, 1000, 9400, 52224, "", 6),
    TaskShape(0, 0, 8000, 31250, "", 5),
    TaskShape(1, 1000, 2000, 16384, "", 5),
    TaskShape(1, 1000, 4000, 32768, "", 5),
)


def measure_node_shapes(nodes: Iterable[NodeInventory]) -> tuple[NodeShape, ...]:
    """Node shapes and their counts; a node's model is its first card's."""
    counts: Counter[tuple[str, int, int, int]] = Counter(
        (n.cards[0].model if n.cards else "", len(n.cards), n.cpu_milli, n.memory_mib)
        for n in nodes
    )
    return tuple(NodeShape(*key, count) for key, count in sorted(counts.items()))


def measure_task_shapes(
    tasks: Iterable[TraceTask], min_count: int = MIN_SHAPE_COUNT
) -> tuple[TaskShape, ...]:
    """Task shapes seen at least ``min_count`` times, most common first."""
    counts: Counter[tuple[int, int, int, int, str]] = Counter(
        (t.num_gpu, t.gpu_milli, t.cpu_milli, t.memory_mib, "|".join(sorted(t.gpu_spec)))
        for t in tasks
    )
    kept = [(key, n) for key, n in counts.items() if n >= min_count]
    kept.sort(key=lambda kn: (-kn[1], kn[0]))
    return tuple(TaskShape(*key, n) for key, n in kept)


def synthetic_cluster(
    shapes: Sequence[NodeShape] = OPENB_NODE_SHAPES, scale: float = 1.0
) -> list[NodeInventory]:
    """Nodes built from ``shapes`` (each count times ``scale``, at least one per shape)."""
    nodes: list[NodeInventory] = []
    for shape in shapes:
        for _ in range(max(1, round(shape.count * scale))):
            name = f"synth-node-{len(nodes):04d}"
            nodes.append(
                NodeInventory(
                    name=name,
                    cards=make_cards(name, shape.gpus, shape.model),
                    cpu_milli=shape.cpu_milli,
                    memory_mib=shape.memory_mib,
                )
            )
    return nodes


def _apportion(weights: Sequence[int], total: int) -> list[int]:
    """Split ``total`` in proportion to ``weights`` (largest remainder, ties to the first)."""
    whole = sum(weights)
    exact = [w * total / whole for w in weights]
    counts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (counts[i] - exact[i], i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def synthetic_tasks(
    shapes: Sequence[TaskShape] = OPENB_TASK_SHAPES, count: int | None = None
) -> list[TraceTask]:
    """A task list holding each shape in proportion to its count (default: the counts)."""
    if not shapes:
        return []
    weights = [s.count for s in shapes]
    per_shape = weights if count is None else _apportion(weights, count)
    tasks: list[TraceTask] = []
    for shape, n in zip(shapes, per_shape, strict=True):
        spec = frozenset(m for m in shape.gpu_spec.split("|") if m)
        for _ in range(n):
            tasks.append(
                TraceTask(
                    name=f"synth-task-{len(tasks):05d}",
                    cpu_milli=shape.cpu_milli,
                    memory_mib=shape.memory_mib,
                    num_gpu=shape.num_gpu,
                    gpu_milli=shape.gpu_milli,
                    gpu_spec=spec,
                )
            )
    return tasks


def _print_constants(nodes_csv: str, tasks_csv: str) -> None:
    from tessera.model.clusterspec import read_nodes_csv
    from tessera.simulate.trace import read_tasks_csv

    print("OPENB_NODE_SHAPES: tuple[NodeShape, ...] = (")
    for n in measure_node_shapes(read_nodes_csv(nodes_csv)):
        print(f"    NodeShape({n.model!r}, {n.gpus}, {n.cpu_milli}, {n.memory_mib}, {n.count}),")
    print(")")
    print("OPENB_TASK_SHAPES: tuple[TaskShape, ...] = (")
    for t in measure_task_shapes(read_tasks_csv(tasks_csv)):
        print(
            f"    TaskShape({t.num_gpu}, {t.gpu_milli}, {t.cpu_milli}, {t.memory_mib},"
            f" {t.gpu_spec!r}, {t.count}),"
        )
    print(")")


if __name__ == "__main__":
    _print_constants(*sys.argv[1:3])
