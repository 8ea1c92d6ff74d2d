"""What the cluster's cards can still take, per model (pure, over a ``GpuMap``).

``kubectl tessera top`` lists every card; at thousands of nodes an operator asks a
shorter question first: can an 8-card job start anywhere, how much is allocated, how
many cards are out of service. Whole free cards are counted per node because a
multi-card pod needs them on one node: 40 free cards spread one a node take no 2-card
pod, and ``most_free_on_a_node`` says so.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tessera.view.gpumap import CardView, GpuMap

__all__ = ["ALL", "ModelCapacity", "capacity"]

ALL = "all"  # the row that sums every model
BLOCKS = (1, 2, 4, 8)  # "nodes with at least N whole free cards", the sizes jobs ask for


@dataclass(slots=True)
class ModelCapacity:
    model: str
    nodes: int = 0  # nodes with at least one card of the model
    cards: int = 0
    unhealthy: int = 0
    cordoned: int = 0  # an unhealthy card may be cordoned too: counted in both
    free: int = 0  # in service, no tenant: what a whole-card pod can take
    most_free_on_a_node: int = 0
    nodes_with_free: dict[int, int] = field(default_factory=lambda: dict.fromkeys(BLOCKS, 0))
    memory_mib: int = 0
    allocated_mib: int = 0
    cores_percent: int = 0  # 100 a card
    allocated_cores: int = 0

    def json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "nodes": self.nodes,
            "cards": self.cards,
            "unhealthy": self.unhealthy,
            "cordoned": self.cordoned,
            "freeCards": self.free,
            "mostFreeCardsOnANode": self.most_free_on_a_node,
            "nodesWithFreeCards": {str(k): v for k, v in self.nodes_with_free.items()},
            "memoryMiB": self.memory_mib,
            "allocatedMiB": self.allocated_mib,
            "allocatedCoresPercent": self.allocated_cores,
            "coresPercent": self.cores_percent,
        }


def _add_node(row: ModelCapacity, cards: Iterable[CardView]) -> None:
    free_here = 0
    row.nodes += 1
    for c in cards:
        row.cards += 1
        row.unhealthy += not c.healthy
        row.cordoned += c.cordoned
        free = c.healthy and not c.cordoned and not c.holders
        free_here += free
        row.free += free
        row.memory_mib += c.memory_mib
        row.allocated_mib += c.allocated_mib
        row.cores_percent += 100
        row.allocated_cores += c.allocated_cores
    row.most_free_on_a_node = max(row.most_free_on_a_node, free_here)
    for k in BLOCKS:
        row.nodes_with_free[k] += free_here >= k


def capacity(gmap: GpuMap, model: str | None = None) -> list[ModelCapacity]:
    """One row per card model (sorted), then the ``all`` row; only ``model`` if given."""
    rows: dict[str, ModelCapacity] = {}
    total = ModelCapacity(ALL)
    for node in gmap.nodes:
        by_model: dict[str, list[CardView]] = defaultdict(list)
        for c in node.cards:
            if model is None or c.model == model:
                by_model[c.model].append(c)
        for m, cards in by_model.items():
            _add_node(rows.setdefault(m, ModelCapacity(m)), cards)
        if by_model:
            _add_node(total, [c for cards in by_model.values() for c in cards])
    return [rows[m] for m in sorted(rows)] + [total]
