"""spread: the idlest node, and on it the emptiest card that fits.

Lowers contention for compute and memory bandwidth at the cost of fragmenting capacity.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera.cluster.snapshot import Snapshot
from tessera.model.types import GpuRequest
from tessera.placement.base import (
    CardView,
    Demand,
    FloatArray,
    cpu_used_fraction,
    gpu_used_fraction,
)

__all__ = ["SpreadCards", "SpreadNodes"]


class SpreadNodes:
    def score_rows(self, snap: Snapshot, demand: Demand) -> FloatArray:
        rows = demand.rows
        return -(gpu_used_fraction(snap, rows) + 0.01 * cpu_used_fraction(snap, rows))


class SpreadCards:
    def pick(
        self, view: CardView, gpu: GpuRequest, candidates: Sequence[int], count: int
    ) -> list[int]:
        return sorted(candidates, key=lambda col: (-view.free_fraction(col), col))[:count]
