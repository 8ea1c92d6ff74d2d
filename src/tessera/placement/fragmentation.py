"""GPU fragmentation: the FGD paper's measure, Tessera's packing variant, and growth.

The published measure (Weng et al., ATC'23), ``PublishedMeasure``. For a node and a
class of request: the idle GPU the class cannot use. That is every idle card share when
the class cannot run on the node at all (CPU, memory, too few usable cards, another
model), else the idle share of each card the class does not fit on. The node's
fragmentation is that amount averaged over the workload mix (weights from WorkloadMix);
the cluster's fragmentation rate is the sum over nodes divided by all idle GPU. A card's
idle share is the scarcer of its free memory and free cores (0 when unhealthy or held
whole); "fits" is the exact test the filter applies. The simulator reports this one.

The policy (fragmentation_policy.py) descends ``PackingMeasure`` by default, a stricter
variant that also counts how many copies of a class fit and what the node's CPU and
memory allow (see its docstring and docs/placement.md): each pod goes where the expected
fragmentation grows least, Δ = F(after) - F(before), over every feasible node and, on
it, every fitting card. ``growth`` computes Δ for many rows at once: per-card features
that add up over a node's cards, so taking one card changes the node's sums by one term.
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
    FloatArray,
    IntArray,
)
from tessera.placement.mix import RequestClass, WorkloadMix

__all__ = [
    "CardState",
    "Measure",
    "MixArrays",
    "PackingMeasure",
    "PublishedMeasure",
    "frag_rows",
    "fragmentation_rate",
    "growth",
    "node_fragmentation",
]


# What the per-card functions index the tables with: rows ([R] -> [R, cols] results), or
# (row, column) pairs shaped [P, 1] each (-> [P, 1] results), one fitting card per pair.
Cells = IntArray | tuple[IntArray, IntArray]


@dataclass(frozen=True, eq=False, slots=True)
class MixArrays:
    """The frozen mix as arrays over classes [M] (and models [K + 1], last = no card)."""

    weight: FloatArray
    cpu: IntArray
    mem: IntArray
    count: IntArray
    mem_fixed: IntArray  # MiB per card for memory_mib requests, else 0
    mem_percent: IntArray  # percent of the card for percent requests, 100 for whole cards
    cores: IntArray
    cores_f_share: npt.NDArray[np.float32]  # cores / 100
    whole: BoolArray
    allowed: BoolArray  # [K + 1, M]

    @staticmethod
    def build(weights: Sequence[tuple[RequestClass, float]], models: Sequence[str]) -> MixArrays:
        m = len(weights)

        def ints(values: list[int]) -> IntArray:
            return np.asarray(values, dtype=np.int64).reshape(m)

        gpus = [rc.gpu for rc, _ in weights]
        allowed = np.zeros((len(models) + 1, m), dtype=np.bool_)
        for j, g in enumerate(gpus):
            for k, model in enumerate(models):
                allowed[k, j] = g is None or g.allows_model(model)
        return MixArrays(
            weight=np.asarray([w for _, w in weights], dtype=np.float64).reshape(m),
            cpu=ints([rc.cpu_milli for rc, _ in weights]),
            mem=ints([rc.memory_mib for rc, _ in weights]),
            count=ints([g.count if g else 0 for g in gpus]),
            mem_fixed=ints([(g.memory_mib or 0) if g and not g.exclusive else 0 for g in gpus]),
            mem_percent=ints(
                [100 if g and g.exclusive else (g.memory_percent or 0) if g else 0 for g in gpus]
            ),
            cores=ints([g.cores() if g else 0 for g in gpus]),
            cores_f_share=np.asarray(
                [g.cores() / 100 if g else 0 for g in gpus], dtype=np.float32
            ).reshape(m),
            whole=np.asarray([bool(g and g.exclusive) for g in gpus], dtype=np.bool_).reshape(m),
            allowed=allowed,
        )


@dataclass(slots=True)
class CardState:
    """[rows, cols] card state the measure reads (a snapshot's, or a hypothetical one)."""

    free_mem: IntArray
    free_cores: IntArray
    tenants: IntArray
    held_whole: BoolArray

    @staticmethod
    def of(t: Tables, rows: Cells) -> CardState:
        return CardState(t.free_mem[rows], t.free_cores[rows], t.tenants[rows], t.exclusive[rows])


def _idle(t: Tables, rows: Cells, s: CardState) -> FloatArray:
    """[rows, cols] idle share of each card: the scarcer of free memory and free cores."""
    mem = np.maximum(t.card_mem[rows], 1)
    share = np.minimum(s.free_cores / 100.0, s.free_mem / mem)
    usable = t.card_valid[rows] & t.healthy[rows] & ~s.held_whole
    return np.where(usable, np.maximum(share, 0.0), 0.0)


def _need_mem(t: Tables, rows: Cells, k: MixArrays) -> IntArray:
    """[rows, cols, classes]: MiB class m takes on card c."""
    return k.mem_fixed + t.card_mem[rows][:, :, None] * k.mem_percent // 100


def _fits(
    t: Tables, rows: Cells, s: CardState, k: MixArrays, need: IntArray | None = None
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

    def card_features(self, t: Tables, rows: Cells, s: CardState, k: MixArrays) -> FloatArray:
        """[rows, cols, classes, features]."""
        ...

    def node_terms(
        self, sums: FloatArray, idle: FloatArray, cpu: IntArray, mem: IntArray, k: MixArrays
    ) -> FloatArray:
        """Per class, before weighting by the mix: ``sums``: [..., classes, features];
        ``idle``, ``cpu``, ``mem``: [...] -> [..., classes]. Element by element."""
        ...


def _node_value(
    measure: Measure, sums: FloatArray, idle: FloatArray, cpu: IntArray, mem: IntArray, k: MixArrays
) -> FloatArray:
    """[...]: the node's measure, its classes' terms weighted by the mix."""
    return np.asarray(measure.node_terms(sums, idle, cpu, mem, k) @ k.weight)


class PublishedMeasure:
    """FGD's measure (module docstring): per class, the idle share of the cards it does not
    fit, or all idle GPU when the node cannot run it at all; weighted by the mix."""

    def card_features(self, t: Tables, rows: Cells, s: CardState, k: MixArrays) -> FloatArray:
        ok = _fits(t, rows, s, k) | (k.count == 0)  # CPU-only work leaves no share unusable
        idle = _idle(t, rows, s)[:, :, None]
        return np.stack([idle * ~ok, ok.astype(np.float64)], axis=-1)

    def node_terms(
        self, sums: FloatArray, idle: FloatArray, cpu: IntArray, mem: IntArray, k: MixArrays
    ) -> FloatArray:
        fits = (cpu[..., None] >= k.cpu) & (mem[..., None] >= k.mem) & (sums[..., 1] >= k.count)
        return np.asarray(np.where(fits, sums[..., 0], idle[..., None]))


class PackingMeasure:
    """Tessera's variant: per class, the idle GPU the class's next tasks would leave, one
    task on each card it fits, as many as the node's CPU and memory allow (a node with
    eight idle cards and CPU for one whole-card task strands seven), and for multi-card
    classes whole groups of ``count`` cards. What a task leaves beside itself on its card
    counts as unusable for its class: a second copy is not assumed to come (counting it
    made an empty card look as good a home for a small task as a half-used one, which
    left empty cards to tasks that strand a sliver; docs/placement.md)."""

    def card_features(self, t: Tables, rows: Cells, s: CardState, k: MixArrays) -> FloatArray:
        need = np.maximum(_need_mem(t, rows, k), 1)
        copies = _fits(t, rows, s, k, need).astype(np.float32)  # one per card it fits
        needf = need.astype(np.float32)
        out = np.empty((*copies.shape, 2), dtype=np.float32)
        mem = np.maximum(t.card_mem[rows], 1)[:, :, None].astype(np.float32)
        out[..., 0] = copies * np.maximum(k.cores_f_share, needf / mem)
        out[..., 1] = copies
        return out

    def node_terms(
        self, sums: FloatArray, idle: FloatArray, cpu: IntArray, mem: IntArray, k: MixArrays
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
        return np.asarray(np.where(k.count > 0, unusable, 0.0))  # CPU-only work uses no GPU


def frag_rows(
    t: Tables, rows: IntArray, k: MixArrays, measure: Measure
) -> tuple[FloatArray, FloatArray]:
    """Per row: (fragmentation, idle GPU) as the snapshot stands."""
    s = CardState.of(t, rows)
    idle = _idle(t, rows, s).sum(axis=1)
    sums = measure.card_features(t, rows, s, k).sum(axis=1)
    cpu, mem = _node_room(t, rows, 0, 0)
    return _node_value(measure, sums, idle, cpu, mem, k), idle


def _request_after(t: Tables, rows: Cells, gpu: GpuRequest) -> CardState:
    """Every card of ``rows`` as it would be if ``gpu`` took one slice of it."""
    s = CardState.of(t, rows)
    if gpu.exclusive:
        return CardState(
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
    return CardState(s.free_mem - need, s.free_cores - gpu.cores(), s.tenants + 1, s.held_whole)


def growth(
    t: Tables,
    rows: IntArray,
    card_ok: BoolArray,
    cpu_milli: int,
    memory_mib: int,
    gpu: GpuRequest | None,
    k: MixArrays,
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
    before = CardState.of(t, rows)
    idle = _idle(t, rows, before)
    feats = (  # [R, C, M, F]
        measure.card_features(t, rows, before, k) if before_feats is None else before_feats
    )
    sums = feats.sum(axis=1)
    total = idle.sum(axis=1)
    cpu, mem = _node_room(t, rows, 0, 0)
    f_before = _node_value(measure, sums, total, cpu, mem, k)
    cpu, mem = _node_room(t, rows, cpu_milli, memory_mib)
    no_col = np.full(rows.shape[0], -1, dtype=np.int64)
    if gpu is None:
        return _node_value(measure, sums, total, cpu, mem, k) - f_before, no_col
    if gpu.count == 1:
        # Only the fitting (row, card) pairs: the others would be masked out anyway. Each
        # pair is indexed as a [P, 1] "row" so the per-card functions run unchanged.
        ri, ci = np.nonzero(card_ok)
        at = (rows[ri][:, None], ci[:, None].astype(np.int64))
        after = _request_after(t, at, gpu)
        d_feats = measure.card_features(t, at, after, k)[:, 0] - feats[ri, ci]  # [P, M, F]
        d_idle = _idle(t, at, after)[:, 0] - idle[ri, ci]
        terms = np.zeros((*card_ok.shape, k.weight.shape[0]))
        terms[ri, ci] = measure.node_terms(
            sums[ri] + d_feats, total[ri] + d_idle, cpu[ri], mem[ri], k
        )
        # Weighted over the [R, C] grid, not the pairs: a BLAS product's rounding depends
        # on the shape, and the choice between equal cards on the last bit.
        f_after = terms @ k.weight  # [R, C]
        delta = np.where(card_ok, f_after - f_before[:, None], np.inf)
        # Equal growth: the tighter card, so that big free shares stay whole.
        col = np.argmin(delta - 1e-9 * (1.0 - idle), axis=1)
        return delta[np.arange(rows.shape[0]), col], col
    # Several cards: the ``count`` tightest fitting ones.
    after = _request_after(t, rows, gpu)
    d_feats = measure.card_features(t, rows, after, k) - feats  # change if card c is taken
    d_idle = _idle(t, rows, after) - idle
    order = np.argsort(np.where(card_ok, idle, np.inf), axis=1, kind="stable")
    taken = np.zeros_like(card_ok)
    np.put_along_axis(taken, order[:, : gpu.count], True, axis=1)
    taken &= card_ok
    f_after = _node_value(
        measure,
        sums + np.einsum("rc,rcmf->rmf", taken.astype(np.float64), d_feats),
        total + (taken * d_idle).sum(axis=1),
        cpu,
        mem,
        k,
    )
    return f_after - f_before, no_col


def node_fragmentation(snap: Snapshot, mix: WorkloadMix) -> dict[str, float]:
    """Per node: expected unusable idle GPU (in cards) under ``mix``'s frozen weights."""
    weights = mix.weights()
    rows = np.flatnonzero(snap.tables.present).astype(np.int64)
    if not weights:
        return {snap.names[r]: 0.0 for r in rows.tolist()}
    frag, _ = frag_rows(
        snap.tables, rows, MixArrays.build(weights, snap.models), PublishedMeasure()
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
    frag, idle = frag_rows(
        snap.tables, rows, MixArrays.build(weights, snap.models), PublishedMeasure()
    )
    total = float(idle.sum())
    return float(frag.sum()) / total if total > 0 else 0.0
