"""``kubectl tessera capacity``'s arithmetic: whole free cards per model and per node,
cards out of service, memory and compute allocated."""

from __future__ import annotations

from tessera.view.capacity import ALL, capacity
from tessera.view.gpumap import CardView, GpuMap, Holder, NodeView

MIB = 40960


def _card(i: int, model: str = "A100", held_mib: int = 0, healthy: bool = True,
          cordoned: bool = False) -> CardView:  # fmt: skip
    holders = ()
    if held_mib:
        holders = (Holder("ns", f"p{i}", "main", held_mib, 25, "fixed-share", False),)
    return CardView(f"GPU-{model}-{i}", i, model, MIB, healthy, 16, holders, cordoned)


def _nodes() -> GpuMap:
    # a: 4 A100, one shared, one unhealthy, one cordoned -> 1 free
    a = NodeView("a", (_card(0, held_mib=8000), _card(1, healthy=False), _card(2, cordoned=True),
                       _card(3)))  # fmt: skip
    # b: 4 A100 free; c: 2 T4, one shared
    b = NodeView("b", tuple(_card(i) for i in range(4)))
    c = NodeView("c", (_card(0, "T4", held_mib=4000), _card(1, "T4")))
    broken = NodeView("d", problem="inventory refused: ...")
    return GpuMap((a, b, c, broken))


def test_per_model_and_the_sum() -> None:
    rows = {r.model: r for r in capacity(_nodes())}
    assert list(rows) == ["A100", "T4", ALL]
    a100, t4, every = rows["A100"], rows["T4"], rows[ALL]
    assert (a100.nodes, a100.cards, a100.unhealthy, a100.cordoned) == (2, 8, 1, 1)
    assert (a100.free, a100.most_free_on_a_node) == (5, 4)
    assert a100.nodes_with_free == {1: 2, 2: 1, 4: 1, 8: 0}
    assert (a100.allocated_mib, a100.memory_mib) == (8000, 8 * MIB)
    assert (a100.allocated_cores, a100.cores_percent) == (25, 800)
    assert (t4.nodes, t4.cards, t4.free, t4.most_free_on_a_node) == (1, 2, 1, 1)
    assert (every.nodes, every.cards, every.free, every.allocated_mib) == (3, 10, 6, 12000)
    assert every.nodes_with_free == {1: 3, 2: 1, 4: 1, 8: 0}
    assert every.json()["nodesWithFreeCards"] == {"1": 3, "2": 1, "4": 1, "8": 0}
    # What `-o json` prints for a model: the keys scripts read.
    assert a100.json() == {
        "model": "A100", "nodes": 2, "cards": 8, "unhealthy": 1, "cordoned": 1,
        "freeCards": 5, "mostFreeCardsOnANode": 4,
        "nodesWithFreeCards": {"1": 2, "2": 1, "4": 1, "8": 0},
        "memoryMiB": 8 * MIB, "allocatedMiB": 8000, "allocatedCoresPercent": 25,
        "coresPercent": 800,
    }  # fmt: skip


def test_one_model_only() -> None:
    rows = capacity(_nodes(), "T4")
    assert [r.model for r in rows] == ["T4", ALL]
    assert rows[-1].cards == 2 and rows[-1].nodes == 1
    assert [r.model for r in capacity(_nodes(), "B200")] == [ALL]
    assert capacity(_nodes(), "B200")[0].cards == 0
