"""topology: multi-card requests on cards joined by NVLink and sharing a NUMA node.

Node score: binpack's, plus a bonus when the node can give the request ``count`` fitting
cards on one NUMA node, plus one when some fitting card has ``count - 1`` fitting NVLink
peers (the necessary condition for a fully linked set). Both are array operations.

Card pick: greedy growth from each fitting card as a seed: add the card with the most
NVLink links into the set so far, then same NUMA node as the seed, then the fullest
card. The best set wins on (links inside it, cards on the seed's NUMA node, fullness).
O(n² · count) on an n-card node; no enumeration of the C(n, count) sets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tessera.cluster.snapshot import Snapshot
from tessera.model.types import GpuRequest
from tessera.placement.base import CardView, Demand, FloatArray
from tessera.placement.binpack import BinpackCards, BinpackNodes

__all__ = ["TopologyCards", "TopologyNodes"]


class TopologyNodes:
    def score_rows(self, snap: Snapshot, demand: Demand) -> FloatArray:
        base = BinpackNodes().score_rows(snap, demand)
        gpu = demand.primary
        if gpu is None or gpu.count < 2 or demand.rows.shape[0] == 0:
            return base
        t = snap.tables
        ok = demand.card_ok
        numa = t.numa[demand.rows]
        domains = np.unique(numa[ok])
        same_numa = np.zeros(ok.shape[0], dtype=np.bool_)
        for d in domains.tolist():
            if d >= 0:
                same_numa |= (ok & (numa == d)).sum(axis=1) >= gpu.count
        cols = ok.shape[1]
        links = (t.nvlink[demand.rows][:, :, None] >> np.arange(cols)) & 1  # [rows, c, peer]
        fitting_peers = (links.astype(np.bool_) & ok[:, None, :]).sum(axis=2)
        linked = (ok & (fitting_peers >= gpu.count - 1)).any(axis=1)
        bonus: FloatArray = same_numa.astype(np.float64) + linked.astype(np.float64)
        return base + bonus


class TopologyCards:
    def pick(
        self, view: CardView, gpu: GpuRequest, candidates: Sequence[int], count: int
    ) -> list[int]:
        if count < 2:
            return BinpackCards().pick(view, gpu, candidates, count)
        cards = view.cards
        column_of = {card.index: col for col, card in enumerate(cards)}
        peers = [{column_of[p] for p in card.nvlink_peers if p in column_of} for card in cards]
        best: list[int] = []
        best_key: tuple[float, ...] = ()
        for seed in candidates:
            chosen = [seed]
            numa = cards[seed].numa_node
            rest = [c for c in candidates if c != seed]
            while len(chosen) < count:

                def gain(
                    col: int, chosen: list[int] = chosen, numa: int = numa
                ) -> tuple[float, ...]:
                    links = sum(1 for c in chosen if c in peers[col])
                    return (links, cards[col].numa_node == numa, -view.free_fraction(col), -col)

                nxt = max(rest, key=gain)
                chosen.append(nxt)
                rest.remove(nxt)
            links = sum(1 for a in chosen for b in chosen if a < b and b in peers[a])
            local = sum(1 for c in chosen if cards[c].numa_node == numa)
            fullness = -sum(view.free_fraction(c) for c in chosen)
            key = (links, local, fullness)
            if not best or key > best_key:
                best, best_key = chosen, key
        return best
