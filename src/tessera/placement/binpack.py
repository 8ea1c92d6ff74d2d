"""binpack: fill the busiest node, and on it the fullest card that fits.

Keeps whole nodes and whole cards free for large requests. Node score: the share of the
node's GPU capacity in use (a hundredth of the CPU share breaks ties).
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

__all__ = ["BinpackCards", "BinpackNodes"]


class BinpackNodes:
    def score_rows(self, snap: Snapshot, demand: Demand) -> FloatArray:
        rows = demand.rows
        return gpu_used_fraction(snap, rows) + 0.01 * cpu_used_fraction(snap, rows)


class BinpackCards:
    def pick(
        self, view: CardView, gpu: GpuRequest, candidates: Sequence[int], count: int
    ) -> list[int]:
        return sorted(candidates, key=lambda col: (view.free_fraction(col), col))[:count]
