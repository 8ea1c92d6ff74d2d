from __future__ import annotations

from collections import Counter
from pathlib import Path

from tessera.model.clusterspec import make_cards, read_nodes_csv
from tessera.model.types import NodeInventory
from tessera.simulate.trace import TraceTask, read_tasks_csv
from tessera.simulate.workload import (
    OPENB_NODE_SHAPES,
    OPENB_TASK_SHAPES,
    NodeShape,
    TaskShape,
    measure_node_shapes,
    measure_task_shapes,
    request_class,
    synthetic_cluster,
    synthetic_tasks,
)


def test_figures_match_the_trace(openb_dir: Path) -> None:
    """The shipped constants are what the trace measures today (skipped without the trace)."""
    nodes = read_nodes_csv(openb_dir / "openb_node_list_gpu_node.csv")
    tasks = read_tasks_csv(openb_dir / "openb_pod_list_default.csv")
    assert measure_node_shapes(nodes) == OPENB_NODE_SHAPES
    assert measure_task_shapes(tasks) == OPENB_TASK_SHAPES


def test_synthetic_cluster_has_the_trace_shape() -> None:
    nodes = synthetic_cluster()
    assert len(nodes) == 1213
    assert sum(len(n.cards) for n in nodes) == 6212
    assert measure_node_shapes(nodes) == OPENB_NODE_SHAPES
    assert len({n.name for n in nodes}) == len(nodes)
    half = synthetic_cluster(scale=0.5)
    assert len(half) == sum(max(1, round(s.count / 2)) for s in OPENB_NODE_SHAPES)


def test_synthetic_tasks_keep_the_request_mix() -> None:
    tasks = synthetic_tasks()
    assert len(tasks) == sum(s.count for s in OPENB_TASK_SHAPES)
    assert measure_task_shapes(tasks) == OPENB_TASK_SHAPES
    classes = Counter(request_class(t.num_gpu, t.gpu_milli) for t in tasks)
    assert set(classes) == {"cpu-only", "shared", "1-gpu", "2-gpu", "4-gpu", "8-gpu"}
    # The trace requests 98.0% of its cluster's GPU capacity; the shapes kept, 95.4%.
    assert 0.95 < sum(t.gpu_milli_total for t in tasks) / 6_212_000 < 0.96


def test_synthetic_tasks_scale_by_largest_remainder() -> None:
    shapes = (TaskShape(1, 500, 1, 1, "", 3), TaskShape(0, 0, 1, 1, "T4|A10", 1))
    tasks = synthetic_tasks(shapes, count=6)
    # 4.5 and 1.5: the tie on the remainder goes to the first shape.
    assert [(t.gpu_milli, t.gpu_spec) for t in tasks] == [(500, frozenset())] * 5 + [
        (0, frozenset({"T4", "A10"}))
    ]
    assert synthetic_tasks(shapes, count=6) == tasks
    assert len(synthetic_tasks(shapes, count=5)) == 5

    # The larger remainder wins even when it is the later shape's: 1.33 and 0.67.
    two = (TaskShape(1, 500, 1, 1, "", 2), TaskShape(1, 1000, 1, 1, "", 1))
    assert [t.gpu_milli for t in synthetic_tasks(two, count=2)] == [500, 1000]


def test_measured_shapes_name_a_cardless_node_and_join_models_sorted() -> None:
    """What the trace's default lists never show: a node without cards, a task allowed
    on two models, two task shapes seen equally often."""
    nodes = [
        NodeInventory("cpu", (), 8000, 1024),
        NodeInventory("g", make_cards("g", 2, "T4"), 8000, 1024),
    ]
    assert measure_node_shapes(nodes) == (
        NodeShape("", 0, 8000, 1024, 1),
        NodeShape("T4", 2, 8000, 1024, 1),
    )
    tasks = [
        TraceTask("a", 1, 1, 1, 1000),
        TraceTask("b", 1, 1, 1, 500, frozenset({"V100", "T4"})),
        TraceTask("c", 1, 1, 1, 500, frozenset({"T4", "V100"})),
        TraceTask("d", 1, 1, 1, 1000),
        TraceTask("e", 2, 2, 0, 0),
    ]
    # Ties in count go by the shape itself (num_gpu, then gpu_milli, ...), not by the
    # order first seen.
    assert measure_task_shapes(tasks, min_count=2) == (
        TaskShape(1, 500, 1, 1, "T4|V100", 2),
        TaskShape(1, 1000, 1, 1, "", 2),
    )
