"""Which nodes can take a pod, and for each one that cannot, why.

The test runs over all candidate rows at once: per GPU container, a [rows, cards] mask
of the cards that fit (healthy, allowed, not held whole, a free slot, enough memory and
cores, and no tenant at all for a whole-card request), then "at least ``count`` such cards" per row.
A pod with several GPU containers passes this per-container test first; the nodes that
pass are then checked exactly by picking its cards (containers may share a card).

Reasons are built only for the rows that fail, and only when asked: they are phrases
without node-specific numbers so an operator can group them ("312 nodes: insufficient
cpu").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from tessera.cluster.snapshot import Snapshot
from tessera.model.types import GpuRequest, PodRequest
from tessera.placement.base import BoolArray, Demand, IntArray

__all__ = [
    "FilterResult",
    "allowed_cards",
    "card_fits",
    "feasible",
    "filter_nodes",
    "primary_request",
    "resolve_rows",
]


@dataclass(frozen=True, slots=True)
class FilterResult:
    """Nodes that can take the pod, and a reason for each one that cannot."""

    feasible: list[str]
    reasons: dict[str, str] = field(default_factory=dict)


def primary_request(pod: PodRequest) -> GpuRequest | None:
    """The pod's largest GPU request: the one node scoring reasons about."""
    best: GpuRequest | None = None
    best_key = (-1, -1, -1)
    for c in pod.gpu_containers():
        gpu = c.gpu
        assert gpu is not None
        key = (int(gpu.exclusive), gpu.count, gpu.memory_mib or gpu.memory_percent or 0)
        if key > best_key:
            best, best_key = gpu, key
    return best


def resolve_rows(snap: Snapshot, names: Sequence[str] | None) -> tuple[IntArray, list[str]]:
    """Rows for ``names`` (all present nodes when None) and the names not in the snapshot."""
    if names is None:
        return np.flatnonzero(snap.tables.present).astype(np.int64), []
    rows = [snap.rows[n] for n in names if n in snap.rows]
    unknown = [n for n in names if n not in snap.rows]
    return np.asarray(rows, dtype=np.int64), unknown


def selector(rows: IntArray) -> IntArray | slice:
    """``rows`` as an index: a slice (a view, no copy) when they are 0..n-1 in order, as
    they are for a whole cluster without holes; the hot path indexes every array by it."""
    n = rows.shape[0]
    if n and rows[0] == 0 and rows[-1] == n - 1 and (n < 3 or bool((np.diff(rows) == 1).all())):
        return slice(0, n)
    return rows


def allowed_cards(snap: Snapshot, rows: IntArray, gpu: GpuRequest) -> BoolArray:
    """[rows, cols]: cards that exist and that the model and UUID constraints admit."""
    t = snap.tables
    sel = selector(rows)
    valid = t.card_valid[sel]
    if gpu.models or gpu.models_exclude:
        # One extra False slot so that model -1 (no card) indexes to "not allowed".
        by_model = np.array(
            [gpu.allows_model(m) for m in snap.models] + [False],
            dtype=np.bool_,
        )
        valid = valid & by_model[t.model[sel]]
    if gpu.uuids or gpu.uuids_exclude:
        valid = valid.copy()  # may be a read-only view of the snapshot
        position = np.full(t.present.shape[0], -1, dtype=np.int64)
        position[rows] = np.arange(rows.shape[0])
        if gpu.uuids:
            listed = np.zeros_like(valid)
            for uuid in gpu.uuids:
                rc = snap.cards.get(uuid)
                if rc is not None and position[rc[0]] >= 0:
                    listed[position[rc[0]], rc[1]] = True
            valid = valid & listed
        for uuid in gpu.uuids_exclude:
            rc = snap.cards.get(uuid)
            if rc is not None and position[rc[0]] >= 0:
                valid[position[rc[0]], rc[1]] = False
    return valid


def memory_needed(card_mem: IntArray, gpu: GpuRequest) -> IntArray:
    """MiB ``gpu`` takes on each card (GpuRequest.memory_on, vectorised)."""
    if gpu.exclusive:
        return card_mem
    if gpu.memory_mib is not None:
        return np.full_like(card_mem, gpu.memory_mib)
    assert gpu.memory_percent is not None
    return card_mem * gpu.memory_percent // 100


def card_fits(snap: Snapshot, rows: IntArray, gpu: GpuRequest) -> tuple[BoolArray, IntArray]:
    """[rows, cols] mask of the cards ``gpu`` fits on, and the MiB it would take on each."""
    t = snap.tables
    sel = selector(rows)
    need = memory_needed(t.card_mem[sel], gpu)
    ok = allowed_cards(snap, rows, gpu) & t.healthy[sel]  # a new array: safe to update
    ok &= ~t.exclusive[sel]
    ok &= t.free_slots[sel] > 0  # kubelet gives a card to at most its slots' containers
    ok &= t.free_mem[sel] >= need
    if gpu.cores():
        ok &= t.free_cores[sel] >= gpu.cores()
    if gpu.exclusive:
        ok &= t.tenants[sel] == 0
    return ok, need


def feasible(snap: Snapshot, pod: PodRequest, rows: IntArray) -> tuple[BoolArray, Demand]:
    """[rows] mask of the rows passing the vectorised test, and the pod's Demand on them.

    Exact for a pod with at most one GPU container; a necessary condition otherwise (see
    the module docstring).
    """
    t = snap.tables
    sel = selector(rows)
    ok = (t.cpu_free[sel] >= pod.cpu_milli) & (t.mem_free[sel] >= pod.memory_mib)
    primary = primary_request(pod)
    card_ok = np.zeros((rows.shape[0], t.card_valid.shape[1]), dtype=np.bool_)
    need_mem = np.zeros_like(card_ok, dtype=np.int64)
    for c in pod.gpu_containers():
        gpu = c.gpu
        assert gpu is not None
        fits, need = card_fits(snap, rows, gpu)
        ok &= fits.any(axis=1) if gpu.count == 1 else fits.sum(axis=1) >= gpu.count
        if gpu is primary:
            card_ok, need_mem = fits, need
    return ok, Demand(pod=pod, primary=primary, rows=rows, card_ok=card_ok, need_mem=need_mem)


def _describe(gpu: GpuRequest) -> str:
    if gpu.exclusive:
        return "free whole card"
    what = (
        f"{gpu.memory_mib} MiB" if gpu.memory_mib is not None else f"{gpu.memory_percent}% memory"
    )
    if gpu.cores():
        what += f" and {gpu.cores()}% cores"
    return f"card with {what} free"


def _capacity_reason(gpu: GpuRequest) -> str:
    if gpu.count == 1:
        return f"no {_describe(gpu)}"
    return f"fewer than {gpu.count} {_describe(gpu).replace('card', 'cards', 1)}"


def _slot_reason(gpu: GpuRequest) -> str:
    if gpu.count == 1:
        return "no card with a free slot"
    return f"fewer than {gpu.count} cards with a free slot"


def _service_reason(snap: Snapshot, row: int, *, need: int) -> str:
    """Too few cards in service; the cordoned ones named apart from the unhealthy, since
    an operator took them out on purpose."""
    inv = snap.inventories[row]
    assert inv is not None
    cordoned = sum(1 for c in inv.cards if c.cordoned)
    if not cordoned:
        return "no healthy card" if need == 1 else f"fewer than {need} healthy cards"
    what = "no card in service" if need == 1 else f"fewer than {need} cards in service"
    return f"{what} ({cordoned} cordoned)"


def _model_reason(snap: Snapshot, row: int, *, gpu: GpuRequest) -> str:
    inv = snap.inventories[row]
    assert inv is not None
    pinned = sorted(c.uuid for c in inv.cards if c.cordoned and c.uuid in gpu.uuids)
    if pinned:
        return f"card {','.join(pinned)} cordoned"
    models = sorted({c.model for c in inv.cards if c.in_service})
    excluded = [m for m in models if m in gpu.models_exclude]
    if excluded and len(excluded) == len(models):
        return f"model {','.join(excluded)} excluded"
    if gpu.models and not set(models) & gpu.models:
        return f"model {','.join(models)} not in {','.join(sorted(gpu.models))}"
    if gpu.uuids or gpu.uuids_exclude:
        return "no card with an allowed UUID"
    return f"fewer than {gpu.count} cards of an allowed model"


def reasons(snap: Snapshot, pod: PodRequest, rows: IntArray) -> dict[str, str]:
    """Why each of ``rows`` cannot take ``pod``: the first failing check, in the order
    an operator would fix them (hardware, constraints, CPU/memory, GPU capacity)."""
    t = snap.tables
    out: dict[str, str] = {}
    if rows.shape[0] == 0:
        return out
    gpus = [c.gpu for c in pod.gpu_containers() if c.gpu is not None]
    healthy = t.card_valid[rows] & t.healthy[rows]
    healthy_count = healthy.sum(axis=1)
    # (passes, reason): a fixed phrase, or a function of the row for per-node wording.
    checks: list[tuple[BoolArray, str | Callable[[int], str]]] = []
    if gpus:
        checks.append((np.any(t.card_valid[rows], axis=1), "no GPU on node"))
        checks.append((healthy_count > 0, partial(_service_reason, snap, need=1)))
    for g in gpus:
        checks.append((healthy_count >= g.count, partial(_service_reason, snap, need=g.count)))
        allowed = (allowed_cards(snap, rows, g) & healthy).sum(axis=1) >= g.count
        checks.append((allowed, partial(_model_reason, snap, gpu=g)))
    checks.append((t.cpu_free[rows] >= pod.cpu_milli, "insufficient cpu"))
    checks.append((t.mem_free[rows] >= pod.memory_mib, "insufficient memory"))
    for g in gpus:
        slotted = (allowed_cards(snap, rows, g) & healthy & (t.free_slots[rows] > 0)).sum(axis=1)
        checks.append((slotted >= g.count, _slot_reason(g)))
        checks.append((card_fits(snap, rows, g)[0].sum(axis=1) >= g.count, _capacity_reason(g)))
    undecided = np.ones(rows.shape[0], dtype=np.bool_)
    for passes, reason in checks:
        failing = rows[undecided & ~passes].tolist()
        if isinstance(reason, str):
            out.update(dict.fromkeys((snap.names[r] for r in failing), reason))
        else:
            out.update((snap.names[r], reason(r)) for r in failing)
        undecided &= passes
    together = "cards cannot hold all GPU containers together"
    out.update(dict.fromkeys((snap.names[r] for r in rows[undecided].tolist()), together))
    return out


def filter_nodes(
    snap: Snapshot, pod: PodRequest, names: Sequence[str] | None = None
) -> FilterResult:
    """The nodes among ``names`` (default: all) that can take ``pod``, and why not the rest."""
    from tessera.placement.cards import fits_exactly

    rows, unknown = resolve_rows(snap, names)
    ok, _ = feasible(snap, pod, rows)
    if len(pod.gpu_containers()) > 1:
        for i in np.flatnonzero(ok).tolist():
            ok[i] = fits_exactly(snap, pod, snap.names[int(rows[i])])
    passed = [snap.names[r] for r in rows[ok].tolist()]
    why = reasons(snap, pod, rows[~ok])
    why.update({n: "node not in the cluster state" for n in unknown})
    return FilterResult(feasible=passed, reasons=why)
