"""GPU fragmentation, as measured by the FGD paper, and the policy that descends it.

The published measure (Weng et al., ATC'23), ``PublishedMeasure``. For a node and a
class of request: the idle GPU the class cannot use. That is every idle card share when
the class cannot run on the node at all (CPU, memory, too few usable cards, another
model), else the idle share of each card the class does not fit on. The node's
fragmentation is that amount averaged over the workload mix (weights from WorkloadMix);
the cluster's fragmentation rate is the sum over nodes divided by all idle GPU. A card's
idle share is the scarcer of its free memory and free cores (0 when unhealthy or held
whole); "fits" is the exact test the filter applies. The simulator reports this one.

The policy descends ``PackingMeasure`` by default, a stricter variant that also counts
how many copies of a class fit and what the node's CPU and memory allow (see its
docstring and docs/placement.md). Place each pod where the expected fragmentation grows
least: for every feasible node, and on it every fitting card, the growth
Δ = F(after) - F(before); the node with the smallest Δ wins and the card with the
smallest Δ is picked. Ties, common when whole nodes are empty, go to the busier node.

Speed. Δ for one row depends only on that row and the request's class, so it is cached
per class and row and recomputed only for rows whose generation changed (after a
placement: one row) or when the mix's frozen weights change version. Recomputing is array
work over [rows, cards, classes]; the features of a row as it stands are cached once for
all classes; one decision refreshes at most ``max_refresh`` rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from tessera.cluster.snapshot import Snapshot, Tables
from tessera.model.types import GpuRequest
from tessera.placement.base import (
    BoolArray,
    CardView,
    Demand,
    FloatArray,
    IntArray,
    gpu_used_fraction,
)
from tessera.placement.binpack import BinpackCards
from tessera.placement.mix import RequestClass, WorkloadMix

__all__ = [
    "FragmentationCards",
    "FragmentationNodes",
    "Measure",
    "PackingMeasure",
    "PublishedMeasure",
    "fragmentation_rate",
    "growth",
    "node_fragmentation",
]


@dataclass(frozen=True, eq=False, slots=True)
class _Classes:
    """The frozen mix as arrays over classes [M] (and models [K + 1], last = no card)."""

    weight: FloatArray
    cpu: IntArray
    mem: IntArray
    count: IntArray
    mem_fixed: IntArray  # MiB per card for memory_mib requests, else 0
    mem_percent: IntArray  # percent of the card for percent requests, 100 for whole cards
    cores: IntArray
    cores_f: npt.NDArray[np.float32]  # cores as a divisor
    cores_f_share: npt.NDArray[np.float32]  # cores / 100
    whole: BoolArray
    allowed: BoolArray  # [K + 1, M]

    @staticmethod
    def build(weights: Sequence[tuple[RequestClass, float]], models: Sequence[str]) -> _Classes:
        m = len(weights)

        def ints(values: list[int]) -> IntArray:
            return np.asarray(values, dtype=np.int64).reshape(m)

        gpus = [rc.gpu for rc, _ in weights]
        allowed = np.zeros((len(models) + 1, m), dtype=np.bool_)
        for j, g in enumerate(gpus):
            for k, model in enumerate(models):
                allowed[k, j] = g is None or (
                    (not g.models or model in g.models) and model not in g.models_exclude
                )
        return _Classes(
            weight=np.asarray([w for _, w in weights], dtype=np.float64).reshape(m),
            cpu=ints([rc.cpu_milli for rc, _ in weights]),
            mem=ints([rc.memory_mib for rc, _ in weights]),
            count=ints([g.count if g else 0 for g in gpus]),
            mem_fixed=ints([(g.memory_mib or 0) if g and not g.exclusive else 0 for g in gpus]),
            mem_percent=ints(
                [100 if g and g.exclusive else (g.memory_percent or 0) if g else 0 for g in gpus]
            ),
            cores=ints([g.cores() if g else 0 for g in gpus]),
            # 0 cores (best effort): a tiny divisor, so memory alone bounds the copies.
            cores_f=np.asarray(
                [max(g.cores() if g else 0, 1e-6) for g in gpus], dtype=np.float32
            ).reshape(m),
            cores_f_share=np.asarray(
                [g.cores() / 100 if g else 0 for g in gpus], dtype=np.float32
            ).reshape(m),
            whole=np.asarray([bool(g and g.exclusive) for g in gpus], dtype=np.bool_).reshape(m),
            allowed=allowed,
        )


@dataclass(slots=True)
class _CardState:
    """[rows, cols] card state the measure reads (a snapshot's, or a hypothetical one)."""

    free_mem: IntArray
    free_cores: IntArray
    tenants: IntArray
    held_whole: BoolArray

    @staticmethod
    def of(t: Tables, rows: IntArray) -> _CardState:
        return _CardState(t.free_mem[rows], t.free_cores[rows], t.tenants[rows], t.exclusive[rows])


def _idle(t: Tables, rows: IntArray, s: _CardState) -> FloatArray:
    """[rows, cols] idle share of each card: the scarcer of free memory and free cores."""
    mem = np.maximum(t.card_mem[rows], 1)
    share = np.minimum(s.free_cores / 100.0, s.free_mem / mem)
    usable = t.card_valid[rows] & t.healthy[rows] & ~s.held_whole
    return np.where(usable, np.maximum(share, 0.0), 0.0)


def _need_mem(t: Tables, rows: IntArray, k: _Classes) -> IntArray:
    """[rows, cols, classes]: MiB class m takes on card c."""
    return k.mem_fixed + t.card_mem[rows][:, :, None] * k.mem_percent // 100


def _fits(
    t: Tables, rows: IntArray, s: _CardState, k: _Classes, need: IntArray | None = None
) -> BoolArray:
    """[rows, cols, classes]: class m fits card c as it stands in ``s``."""
    ok = k.allowed[t.model[rows]]  # model -1 picks the last row: never allowed
    ok &= (t.healthy[rows] & ~s.held_whole)[:, :, None]
    ok &= s.free_mem[:, :, None] >= (_need_mem(t, rows, k) if need is None else need)
    ok &= s.free_cores[:, :, None] >= k.cores
    ok &= ~k.whole | (s.tenants[:, :, None] == 0)
    return ok


def _node_room(
    t: Tables, rows: IntArray, cpu_less: int, mem_less: int
) -> tuple[IntArray, IntArray]:
    """[rows]: CPU and memory left on the node once ``*_less`` is taken off."""
    return t.cpu_free[rows] - cpu_less, t.mem_free[rows] - mem_less


class Measure(Protocol):
    """A per-node fragmentation measure in the shape growth() needs: per-card features
    that add up over a node's cards, and the node's value from their sums."""

    def card_features(self, t: Tables, rows: IntArray, s: _CardState, k: _Classes) -> FloatArray:
        """[rows, cols, classes, features]."""
        ...

    def node_value(
        self, sums: FloatArray, idle: FloatArray, cpu: IntArray, mem: IntArray, k: _Classes
    ) -> FloatArray:
        """``sums``: [..., classes, features]; ``idle``, ``cpu``, ``mem``: [...] -> [...]."""
        ...


class PublishedMeasure:
    """FGD's measure (module docstring): per class, the idle share of the cards it does not
    fit, or all idle GPU when the node cannot run it at all; weighted by the mix."""

    def card_features(self, t: Tables, rows: IntArray, s: _CardState, k: _Classes) -> FloatArray:
        ok = _fits(t, rows, s, k) | (k.count == 0)  # CPU-only work leaves no share unusable
        idle = _idle(t, rows, s)[:, :, None]
        return np.stack([idle * ~ok, ok.astype(np.float64)], axis=-1)

    def node_value(
        self, sums: FloatArray, idle: FloatArray, cpu: IntArray, mem: IntArray, k: _Classes
    ) -> FloatArray:
        fits = (cpu[..., None] >= k.cpu) & (mem[..., None] >= k.mem) & (sums[..., 1] >= k.count)
        return np.asarray(np.where(fits, sums[..., 0], idle[..., None]) @ k.weight)


class PackingMeasure:
    """Tessera's variant: per class, the idle GPU left over once as many copies of the class
    as the node can still hold are packed in, counting every resource: copies per card
    (a card with room for two copies counts twice), the node's CPU and memory (a node
    with eight idle cards and CPU for one whole-card task strands seven), and for
    multi-card classes whole groups of ``count`` cards."""

    def card_features(self, t: Tables, rows: IntArray, s: _CardState, k: _Classes) -> FloatArray:
        need = np.maximum(_need_mem(t, rows, k), 1)
        ok = _fits(t, rows, s, k, need)
        needf = need.astype(np.float32)
        by_mem = np.floor(s.free_mem[:, :, None].astype(np.float32) / needf)
        by_cores = np.floor(s.free_cores[:, :, None].astype(np.float32) / k.cores_f)
        copies = np.minimum(by_mem, by_cores)
        copies = np.where(ok, np.where(k.count > 1, 1.0, copies), 0.0)  # multi-card: 1 per card
        out = np.empty((*copies.shape, 2), dtype=np.float32)
        mem = np.maximum(t.card_mem[rows], 1)[:, :, None].astype(np.float32)
        out[..., 0] = copies * np.maximum(k.cores_f_share, needf / mem)
        out[..., 1] = copies
        return out

    def node_value(
        self, sums: FloatArray, idle: FloatArray, cpu: IntArray, mem: IntArray, k: _Classes
    ) -> FloatArray:
        usable_gpu, copies = sums[..., 0], sums[..., 1]
        per_copy = np.divide(usable_gpu, copies, out=np.zeros_like(usable_gpu), where=copies > 0)
        count = np.maximum(k.count, 1)
        groups = np.floor(copies / count)
        groups = np.minimum(
            groups, np.where(k.cpu > 0, cpu[..., None] // np.maximum(k.cpu, 1), groups)
        )
        groups = np.minimum(
            groups, np.where(k.mem > 0, mem[..., None] // np.maximum(k.mem, 1), groups)
        )
        unusable = np.maximum(idle[..., None] - groups * count * per_copy, 0.0)
        unusable = np.where(k.count > 0, unusable, 0.0)  # CPU-only work uses no GPU
        return np.asarray(unusable @ k.weight)


def _frag_rows(
    t: Tables, rows: IntArray, k: _Classes, measure: Measure
) -> tuple[FloatArray, FloatArray]:
    """Per row: (fragmentation, idle GPU) as the snapshot stands."""
    s = _CardState.of(t, rows)
    idle = _idle(t, rows, s).sum(axis=1)
    sums = measure.card_features(t, rows, s, k).sum(axis=1)
    cpu, mem = _node_room(t, rows, 0, 0)
    return measure.node_value(sums, idle, cpu, mem, k), idle


def _request_after(t: Tables, rows: IntArray, gpu: GpuRequest) -> _CardState:
    """Every card of ``rows`` as it would be if ``gpu`` took one slice of it."""
    s = _CardState.of(t, rows)
    if gpu.exclusive:
        return _CardState(
            np.zeros_like(s.free_mem),
            np.zeros_like(s.free_cores),
            s.tenants + 1,
            np.ones_like(s.held_whole),
        )
    card_mem = t.card_mem[rows]
    need = (
        np.full_like(card_mem, gpu.memory_mib)
        if gpu.memory_mib is not None
        else card_mem * (gpu.memory_percent or 0) // 100
    )
    return _CardState(s.free_mem - need, s.free_cores - gpu.cores(), s.tenants + 1, s.held_whole)


def growth(
    t: Tables,
    rows: IntArray,
    card_ok: BoolArray,
    cpu_milli: int,
    memory_mib: int,
    gpu: GpuRequest | None,
    k: _Classes,
    measure: Measure,
    before_feats: FloatArray | None = None,
) -> tuple[FloatArray, IntArray]:
    """Per row: the smallest growth of fragmentation placing the request can cause, and
    the card column that achieves it (-1 when the request takes no single card).

    ``card_ok[i, c]``: the request fits card c of rows[i]. A request for one card tries
    each fitting card; a multi-card request takes its ``count`` tightest fitting cards.
    Only the taken cards change, so the node's sums are updated, not recomputed.
    ``before_feats``: the rows' card features as they stand, when the caller keeps them.
    """
    before = _CardState.of(t, rows)
    idle = _idle(t, rows, before)
    feats = (  # [R, C, M, F]
        measure.card_features(t, rows, before, k) if before_feats is None else before_feats
    )
    sums = feats.sum(axis=1)
    total = idle.sum(axis=1)
    cpu, mem = _node_room(t, rows, 0, 0)
    f_before = measure.node_value(sums, total, cpu, mem, k)
    cpu, mem = _node_room(t, rows, cpu_milli, memory_mib)
    no_col = np.full(rows.shape[0], -1, dtype=np.int64)
    if gpu is None:
        return measure.node_value(sums, total, cpu, mem, k) - f_before, no_col
    after = _request_after(t, rows, gpu)
    idle_a = _idle(t, rows, after)
    d_feats = measure.card_features(t, rows, after, k) - feats  # change if card c is taken
    d_idle = idle_a - idle
    if gpu.count == 1:
        f_after = measure.node_value(
            sums[:, None] + d_feats, total[:, None] + d_idle, cpu[:, None], mem[:, None], k
        )  # [R, C]
        delta = np.where(card_ok, f_after - f_before[:, None], np.inf)
        # Equal growth: the tighter card, so that big free shares stay whole.
        col = np.argmin(delta - 1e-9 * (1.0 - idle), axis=1)
        return delta[np.arange(rows.shape[0]), col], col
    # Several cards: the ``count`` tightest fitting ones.
    order = np.argsort(np.where(card_ok, idle, np.inf), axis=1, kind="stable")
    taken = np.zeros_like(card_ok)
    np.put_along_axis(taken, order[:, : gpu.count], True, axis=1)
    taken &= card_ok
    f_after = measure.node_value(
        sums + np.einsum("rc,rcmf->rmf", taken.astype(np.float64), d_feats),
        total + (taken * d_idle).sum(axis=1),
        cpu,
        mem,
        k,
    )
    return f_after - f_before, no_col


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
        self._classes: _Classes | None = None
        self._cache: dict[RequestClass, _Cache] = {}
        # Card features of each row as it stands: shared by every request class.
        self._feats_generation = np.zeros(0, dtype=np.int64)
        self._feats: FloatArray = np.zeros((0, 0, 0, 0), dtype=np.float32)

    def classes(self, snap: Snapshot) -> _Classes | None:
        """The mix as arrays for ``snap``'s models; rebuilt when the mix's version or the
        model list changes (and then every cached growth is dropped)."""
        if self.mix.version != self._version or snap.models != self._models:
            weights = self.mix.weights()
            self._classes = _Classes.build(weights, snap.models) if weights else None
            self._version, self._models = self.mix.version, snap.models
            self._cache.clear()
            self._feats_generation = np.zeros(0, dtype=np.int64)
        return self._classes

    def _features(self, snap: Snapshot, rows: IntArray, k: _Classes) -> FloatArray:
        """Card features of ``rows`` as they stand, recomputed only for changed rows."""
        t = snap.tables
        size, cols = t.card_valid.shape
        stale = (
            rows[self._feats_generation[rows] != t.generation[rows]]
            if (self._feats_generation.shape[0] == size and self._feats.shape[1] == cols)
            else rows
        )
        if stale.shape[0]:
            fresh = self.measure.card_features(t, stale, _CardState.of(t, stale), k)
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
            busy = gpu_used_fraction(snap, demand.rows[stale])
            order = np.argsort(-busy, kind="stable")
            skipped = stale[order[self.max_refresh :]]
            stale = np.sort(stale[order[: self.max_refresh]])
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
        # for every card of the node.
        _, col = growth(t, rows, card_ok, 0, 0, gpu, k, self._nodes.measure)
        return [int(col[0])]


def node_fragmentation(snap: Snapshot, mix: WorkloadMix) -> dict[str, float]:
    """Per node: expected unusable idle GPU (in cards) under ``mix``'s frozen weights."""
    weights = mix.weights()
    rows = np.flatnonzero(snap.tables.present).astype(np.int64)
    if not weights:
        return {snap.names[r]: 0.0 for r in rows.tolist()}
    frag, _ = _frag_rows(
        snap.tables, rows, _Classes.build(weights, snap.models), PublishedMeasure()
    )
    return {snap.names[r]: float(f) for r, f in zip(rows.tolist(), frag.tolist(), strict=True)}


def fragmentation_rate(snap: Snapshot, mix: WorkloadMix) -> float:
    """Fragmented idle GPU over all idle GPU (0 when nothing is idle or nothing was seen).

    Uses the mix's frozen weights; call ``mix.freeze()`` first to measure against every
    observation so far.
    """
    weights = mix.weights()
    rows = np.flatnonzero(snap.tables.present).astype(np.int64)
    if not weights or rows.shape[0] == 0:
        return 0.0
    frag, idle = _frag_rows(
        snap.tables, rows, _Classes.build(weights, snap.models), PublishedMeasure()
    )
    total = float(idle.sum())
    return float(frag.sum()) / total if total > 0 else 0.0
