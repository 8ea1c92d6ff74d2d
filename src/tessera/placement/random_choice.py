"""random: a uniformly random feasible node and random fitting cards (a baseline).

Seeded: the same seed and the same sequence of calls give the same choices.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tessera.cluster.snapshot import Snapshot
from tessera.model.types import GpuRequest
from tessera.placement.base import CardView, Demand, FloatArray

__all__ = ["RandomCards", "RandomNodes"]


class RandomNodes:
    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def score_rows(self, snap: Snapshot, demand: Demand) -> FloatArray:
        return self._rng.random(int(demand.rows.shape[0]))


class RandomCards:
    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def pick(
        self, view: CardView, gpu: GpuRequest, candidates: Sequence[int], count: int
    ) -> list[int]:
        order = self._rng.permutation(len(candidates))[:count]
        return [candidates[i] for i in order.tolist()]
