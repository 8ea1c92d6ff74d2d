"""The fragmentation policy: place where expected fragmentation grows least.

The measures and the growth computation live in fragmentation.py; this module holds the
node scorer and card picker built on them, and the caches that make them cheap: the
growth per (request class, row), valid while the row's generation and the mix's frozen
version stand, and the card features of each row as it stands, shared by all classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tessera.cluster.snapshot import Snapshot
from tessera.model.types import GpuRequest
from tessera.placement.base import CardView, Demand, FloatArray, IntArray, gpu_used_fraction
from tessera.placement.binpack import BinpackCards
from tessera.placement.fragmentation import (
    CardState,
    Measure,
    MixArrays,
    PackingMeasure,
    growth,
)
from tessera.placement.mix import RequestClass, WorkloadMix

__all__ = ["FragmentationCards", "FragmentationNodes"]


@dataclass(slots=True)
class _Cache:
    generation: IntArray  # row generation the entry was computed at; 0 = never
    delta: FloatArray
    col: IntArray


class FragmentationNodes:
    """Node scorer: minus the growth of expected fragmentation; the busier node breaks ties."""

    def __init__(
        self,
        mix: WorkloadMix,
        measure: Measure | None = None,
        tie_break: float = 1e-3,
        max_refresh: int | None = 256,
    ) -> None:
        self.mix = mix
        self.max_refresh = max_refresh
        self.measure: Measure = measure if measure is not None else PackingMeasure()
        self.tie_break = tie_break
        self._version = -1
        self._models: tuple[str, ...] = ()
        self._classes: MixArrays | None = None
        self._cache: dict[RequestClass, _Cache] = {}
        # Card features of each row as it stands: shared by every request class.
        self._feats_generation = np.zeros(0, dtype=np.int64)
        self._feats: FloatArray = np.zeros((0, 0, 0, 0), dtype=np.float32)

    def classes(self, snap: Snapshot) -> MixArrays | None:
        """The mix as arrays for ``snap``'s models; rebuilt when the mix's version or the
        model list changes (and then every cached growth is dropped)."""
        if self.mix.version != self._version or snap.models != self._models:
            weights = self.mix.weights()
            self._classes = MixArrays.build(weights, snap.models) if weights else None
            self._version, self._models = self.mix.version, snap.models
            self._cache.clear()
            self._feats_generation = np.zeros(0, dtype=np.int64)
        return self._classes

    def _features(self, snap: Snapshot, rows: IntArray, k: MixArrays) -> FloatArray:
        """Card features of ``rows`` as they stand, recomputed only for changed rows."""
        t = snap.tables
        size, cols = t.card_valid.shape
        stale = (
            rows[self._feats_generation[rows] != t.generation[rows]]
            if (self._feats_generation.shape[0] == size and self._feats.shape[1] == cols)
            else rows
        )
        if stale.shape[0]:
            fresh = self.measure.card_features(t, stale, CardState.of(t, stale), k)
            if stale is rows:  # first use, or the table was resized: start over
                self._feats_generation = np.zeros(size, dtype=np.int64)
                self._feats = np.zeros((size, *fresh.shape[1:]), dtype=np.float32)
            self._feats[stale] = fresh
            self._feats_generation[stale] = t.generation[stale]
        return self._feats[rows]

    def growth_rows(self, snap: Snapshot, demand: Demand) -> tuple[FloatArray, IntArray]:
        """Per candidate row: growth of fragmentation and the card that gives it."""
        k = self.classes(snap)
        n = demand.rows.shape[0]
        if k is None:
            return np.zeros(n), np.full(n, -1, dtype=np.int64)
        t = snap.tables
        pod, gpu = demand.pod, demand.primary
        key = RequestClass.of(pod)
        if gpu is not None and (gpu.uuids or gpu.uuids_exclude):  # per-pod: not cacheable
            return growth(
                t, demand.rows, demand.card_ok, pod.cpu_milli, pod.memory_mib, gpu, k, self.measure
            )
        size = t.present.shape[0]
        entry = self._cache.get(key)
        if entry is None or entry.generation.shape[0] != size:
            entry = _Cache(
                np.zeros(size, dtype=np.int64), np.zeros(size), np.zeros(size, dtype=np.int64)
            )
            self._cache[key] = entry
        stale = np.flatnonzero(entry.generation[demand.rows] != t.generation[demand.rows])
        skipped = stale[:0]
        if self.max_refresh is not None and stale.shape[0] > self.max_refresh:
            # Bound the work of one decision (kube-scheduler scores a share of the nodes
            # for the same reason): refresh the busiest stale rows; the rest sit this
            # decision out and are refreshed when next chosen.
            # The max_refresh busiest, the earlier row first among equals (what a stable
            # sort would keep), found by a partition instead of sorting every stale row.
            m = self.max_refresh
            idle = -gpu_used_fraction(snap, demand.rows[stale])
            cut = np.partition(idle, m - 1)[m - 1]
            chosen = np.flatnonzero(idle < cut)
            ties = np.flatnonzero(idle == cut)[: m - chosen.shape[0]]
            keep = np.zeros(stale.shape[0], dtype=np.bool_)
            keep[chosen] = keep[ties] = True
            skipped = stale[~keep]
            stale = stale[keep]
        if stale.shape[0]:
            rows = demand.rows[stale]
            feats = self._features(snap, rows, k)
            d, c = growth(
                t,
                rows,
                demand.card_ok[stale],
                pod.cpu_milli,
                pod.memory_mib,
                gpu,
                k,
                self.measure,
                feats,
            )
            entry.delta[rows], entry.col[rows] = d, c
            entry.generation[rows] = t.generation[rows]
        delta, col = entry.delta[demand.rows], entry.col[demand.rows]
        if skipped.shape[0]:
            considered = np.ones(n, dtype=np.bool_)
            considered[skipped] = False
            finite = delta[considered & np.isfinite(delta)]
            delta[skipped] = (finite.max() if finite.shape[0] else 0.0) + 1.0  # last
        return delta, col

    def score_rows(self, snap: Snapshot, demand: Demand) -> FloatArray:
        delta, _ = self.growth_rows(snap, demand)
        return -delta + self.tie_break * gpu_used_fraction(snap, demand.rows)


class FragmentationCards:
    """Card picker: the card whose use grows the node's fragmentation least."""

    def __init__(self, nodes: FragmentationNodes) -> None:
        self._nodes = nodes

    def pick(
        self, view: CardView, gpu: GpuRequest, candidates: Sequence[int], count: int
    ) -> list[int]:
        snap = view.snapshot
        k = self._nodes.classes(snap)
        if count != 1 or k is None or len(candidates) == 1:
            return BinpackCards().pick(view, gpu, candidates, count)
        t = snap.tables
        rows = np.asarray([snap.rows[view.node]], dtype=np.int64)
        card_ok = np.zeros((1, t.card_valid.shape[1]), dtype=np.bool_)
        card_ok[0, list(candidates)] = True
        # The pod's CPU and memory do not change which card is best: they are the same
        # for every card of the node. The row's card features as it stands are the ones
        # the node scorer cached (the same values, not computed again).
        feats = self._nodes._features(snap, rows, k)
        _, col = growth(t, rows, card_ok, 0, 0, gpu, k, self._nodes.measure, feats)
        return [int(col[0])]
