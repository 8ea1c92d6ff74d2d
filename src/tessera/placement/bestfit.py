"""best-fit: the node left with the least free capacity after the pod is placed.

The baseline of the FGD paper: remaining GPU share and remaining CPU share, each over the
node's capacity, summed; the lower, the better. On the node, the tightest card.
"""

from __future__ import annotations

import numpy as np

from tessera.cluster.snapshot import Snapshot
from tessera.placement.base import Demand, FloatArray
from tessera.placement.binpack import BinpackCards

__all__ = ["BestFitCards", "BestFitNodes", "cpu_left_after", "gpu_left_after"]

BestFitCards = BinpackCards  # the tightest card that fits is best-fit at card level


def gpu_left_after(snap: Snapshot, demand: Demand) -> FloatArray:
    """[rows]: GPU the node keeps free, in cards, once the pod takes its share."""
    t = snap.tables
    rows = demand.rows
    gpu_free = t.gpu_free[rows]
    gpu = demand.primary
    if gpu is not None:
        share = np.maximum(gpu.cores() / 100.0, demand.need_mem / np.maximum(t.card_mem[rows], 1))
        share = np.where(demand.card_ok, share, np.inf).min(axis=1)
        gpu_free = gpu_free - gpu.count * np.where(np.isfinite(share), share, 0.0)
    return np.asarray(gpu_free, dtype=np.float64)


def cpu_left_after(snap: Snapshot, demand: Demand) -> FloatArray:
    """[rows]: milli-CPU the node keeps free once the pod is placed."""
    return np.asarray(snap.tables.cpu_free[demand.rows] - demand.pod.cpu_milli, dtype=np.float64)


class BestFitNodes:
    def score_rows(self, snap: Snapshot, demand: Demand) -> FloatArray:
        t = snap.tables
        cards = np.maximum(t.gpu_cards[demand.rows], 1)
        cpu_share = cpu_left_after(snap, demand) / np.maximum(t.cpu_total[demand.rows], 1)
        return np.asarray(-(gpu_left_after(snap, demand) / cards + cpu_share), dtype=np.float64)
