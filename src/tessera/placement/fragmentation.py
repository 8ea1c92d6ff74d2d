"""GPU fragmentation, as measured by the FGD paper, and the policy that descends it.

The measure (Weng et al., ATC'23). For a node and a class of request: the idle GPU the
class cannot use. That is every idle card share when the class cannot run on the node at
all (CPU, memory, too few usable cards, another model), else the idle share of each card
the class does not fit on. The node's fragmentation is that amount averaged over the
workload mix (weights from WorkloadMix); the cluster's fragmentation rate is the sum over
nodes divided by all idle GPU. A card's idle share is the scarcer of its free memory and
free cores (0 when unhealthy or held whole); "fits" is the exact test the filter applies.

The policy. Place each pod where the expected fragmentation grows least: for every
feasible node, and on it every fitting card, the growth Δ = F(after) - F(before); the node
with the smallest Δ wins and the card with the smallest Δ is picked. Ties, common when
whole nodes are empty, go to the tighter node (best-fit), which keeps big holes whole.

Speed. Δ for one row depends only on that row and the request's class, so it is cached
per class and row and recomputed only for rows whose generation changed (after a
placement: one row) or when the mix's frozen weights change version. Recomputing is array
work over [rows, cards, classes].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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
    "fragmentation_rate",
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


def _fits(t: Tables, rows: IntArray, s: _CardState, k: _Classes) -> BoolArray:
    """[rows, cols, classes]: class m fits card c as it stands in ``s``."""
    card_mem = t.card_mem[rows][:, :, None]
    need = k.mem_fixed + card_mem * k.mem_percent // 100
    ok = k.allowed[t.model[rows]]  # model -1 picks the last row: never allowed
    ok &= (t.healthy[rows] & ~s.held_whole)[:, :, None]
    ok &= s.free_mem[:, :, None] >= need
    ok &= s.free_cores[:, :, None] >= k.cores
    ok &= ~k.whole | (s.tenants[:, :, None] == 0)
    ok |= k.count == 0  # a CPU-only class leaves no card share unusable
    return ok


def _node_frag(
    term: FloatArray, count: IntArray, idle: FloatArray, cpu_ok: BoolArray, k: _Classes
) -> FloatArray:
    """Σ_m w_m · (class fits the node ? idle it cannot use : all idle), over the last axis.

    ``term``, ``count``, ``cpu_ok``: [..., M]; ``idle``: [...]."""
    fits = cpu_ok & (count >= k.count)
    return np.asarray(np.where(fits, term, idle[..., None]) @ k.weight, dtype=np.float64)


def _node_ok(t: Tables, rows: IntArray, cpu_less: int, mem_less: int, k: _Classes) -> BoolArray:
    """[rows, M]: the node's CPU and memory hold class m (after taking ``*_less`` off)."""
    cpu = (t.cpu_free[rows] - cpu_less)[:, None] >= k.cpu
    mem = (t.mem_free[rows] - mem_less)[:, None] >= k.mem
    return cpu & mem


def _frag_rows(t: Tables, rows: IntArray, k: _Classes) -> tuple[FloatArray, FloatArray]:
    """Per row: (fragmentation, idle GPU) as the snapshot stands."""
    s = _CardState.of(t, rows)
    idle = _idle(t, rows, s)
    ok = _fits(t, rows, s, k)
    term = np.einsum("rc,rcm->rm", idle, ~ok)
    count = ok.sum(axis=1)
    total = idle.sum(axis=1)
    return _node_frag(term, count, total, _node_ok(t, rows, 0, 0, k), k), total


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
) -> tuple[FloatArray, IntArray]:
    """Per row: the smallest growth of fragmentation placing the request can cause, and
    the card column that achieves it (-1 when the request takes no single card).

    ``card_ok[i, c]``: the request fits card c of rows[i]. A request for one card tries
    each fitting card; a multi-card request takes its ``count`` tightest fitting cards.
    """
    before = _CardState.of(t, rows)
    idle = _idle(t, rows, before)
    ok = _fits(t, rows, before, k)
    unusable = idle[:, :, None] * ~ok  # [R, C, M]
    term = unusable.sum(axis=1)
    count = ok.sum(axis=1)
    total = idle.sum(axis=1)
    f_before = _node_frag(term, count, total, _node_ok(t, rows, 0, 0, k), k)
    node_ok = _node_ok(t, rows, cpu_milli, memory_mib, k)
    no_col = np.full(rows.shape[0], -1, dtype=np.int64)
    if gpu is None:
        return _node_frag(term, count, total, node_ok, k) - f_before, no_col
    after = _request_after(t, rows, gpu)
    idle_a = _idle(t, rows, after)
    ok_a = _fits(t, rows, after, k)
    d_term = idle_a[:, :, None] * ~ok_a - unusable  # [R, C, M] change if card c is taken
    d_count = ok_a.astype(np.int64) - ok
    d_idle = idle_a - idle
    if gpu.count == 1:
        f_after = _node_frag(
            term[:, None, :] + d_term,
            count[:, None, :] + d_count,
            total[:, None] + d_idle,
            node_ok[:, None, :],
            k,
        )  # [R, C]
        delta = np.where(card_ok, f_after - f_before[:, None], np.inf)
        # Equal growth: the tighter card, so that big free shares stay whole.
        delta_tb = delta - 1e-9 * (1.0 - idle)
        col = np.argmin(delta_tb, axis=1)
        return delta[np.arange(rows.shape[0]), col], col
    # Several cards: the ``count`` tightest fitting ones.
    order = np.argsort(np.where(card_ok, idle, np.inf), axis=1, kind="stable")
    taken = np.zeros_like(card_ok)
    np.put_along_axis(taken, order[:, : gpu.count], True, axis=1)
    taken &= card_ok
    f_after = _node_frag(
        term + np.einsum("rc,rcm->rm", taken, d_term),
        count + np.einsum("rc,rcm->rm", taken.astype(np.int64), d_count),
        total + (taken * d_idle).sum(axis=1),
        node_ok,
        k,
    )
    return f_after - f_before, no_col


@dataclass(slots=True)
class _Cache:
    generation: IntArray  # row generation the entry was computed at; 0 = never
    delta: FloatArray
    col: IntArray


class FragmentationNodes:
    """Node scorer: minus the growth of expected fragmentation, plus a best-fit tie-break."""

    def __init__(self, mix: WorkloadMix, tie_break: float = 1e-3) -> None:
        self.mix = mix
        self.tie_break = tie_break
        self._version = -1
        self._models: tuple[str, ...] = ()
        self._classes: _Classes | None = None
        self._cache: dict[RequestClass, _Cache] = {}

    def classes(self, snap: Snapshot) -> _Classes | None:
        """The mix as arrays for ``snap``'s models; rebuilt when the mix's version or the
        model list changes (and then every cached growth is dropped)."""
        if self.mix.version != self._version or snap.models != self._models:
            weights = self.mix.weights()
            self._classes = _Classes.build(weights, snap.models) if weights else None
            self._version, self._models = self.mix.version, snap.models
            self._cache.clear()
        return self._classes

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
            return growth(t, demand.rows, demand.card_ok, pod.cpu_milli, pod.memory_mib, gpu, k)
        size = t.present.shape[0]
        entry = self._cache.get(key)
        if entry is None or entry.generation.shape[0] != size:
            entry = _Cache(
                np.zeros(size, dtype=np.int64), np.zeros(size), np.zeros(size, dtype=np.int64)
            )
            self._cache[key] = entry
        stale = entry.generation[demand.rows] != t.generation[demand.rows]
        if stale.any():
            rows = demand.rows[stale]
            d, c = growth(t, rows, demand.card_ok[stale], pod.cpu_milli, pod.memory_mib, gpu, k)
            entry.delta[rows], entry.col[rows] = d, c
            entry.generation[rows] = t.generation[rows]
        return entry.delta[demand.rows], entry.col[demand.rows]

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
        _, col = growth(t, rows, card_ok, 0, 0, gpu, k)
        return [int(col[0])]


def node_fragmentation(snap: Snapshot, mix: WorkloadMix) -> dict[str, float]:
    """Per node: expected unusable idle GPU (in cards) under ``mix``'s frozen weights."""
    weights = mix.weights()
    rows = np.flatnonzero(snap.tables.present).astype(np.int64)
    if not weights:
        return {snap.names[r]: 0.0 for r in rows.tolist()}
    frag, _ = _frag_rows(snap.tables, rows, _Classes.build(weights, snap.models))
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
    frag, idle = _frag_rows(snap.tables, rows, _Classes.build(weights, snap.models))
    total = float(idle.sum())
    return float(frag.sum()) / total if total > 0 else 0.0
