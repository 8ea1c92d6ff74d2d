"""An immutable view of the cluster for one scheduling cycle.

The free resources live in numpy arrays over rows (nodes) × columns (cards), so filter
and score run as a few array operations instead of a Python loop per node. A row may be
empty (a removed node whose slot waits for reuse): ``present`` is False there.

Every row carries a generation number that changes whenever anything on the row changes,
drawn from one process-wide counter, so a cache keyed by (row, generation) is never
fooled by a reused row or by another ClusterState.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tessera.model.types import Card, NodeInventory

__all__ = ["CardFree", "Snapshot", "Tables"]

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(eq=False, slots=True)
class Tables:
    """The mutable arrays a ClusterState owns; a Snapshot holds read-only views of them."""

    present: BoolArray  # [rows]
    cpu_free: IntArray  # [rows] millicores
    mem_free: IntArray  # [rows] MiB
    cpu_total: IntArray  # [rows]
    mem_total: IntArray  # [rows]
    generation: IntArray  # [rows]
    gpu_free: FloatArray  # [rows] Σ free share of the usable cards (scarcer of memory, cores)
    gpu_cards: IntArray  # [rows] healthy cards
    card_valid: BoolArray  # [rows, cols] a card exists in this slot
    healthy: BoolArray  # [rows, cols]
    model: IntArray  # [rows, cols] index into Snapshot.models, -1 where no card
    card_mem: IntArray  # [rows, cols] total MiB
    free_mem: IntArray  # [rows, cols] MiB
    free_cores: IntArray  # [rows, cols] percent
    tenants: IntArray  # [rows, cols] pods holding a slice
    free_slots: IntArray  # [rows, cols] containers the card can still be given to
    exclusive: BoolArray  # [rows, cols] held whole by one pod
    numa: IntArray  # [rows, cols] NUMA node, -1 unknown
    nvlink: IntArray  # [rows, cols] bit j set: NVLink to the card in column j

    @staticmethod
    def empty(rows: int, cols: int) -> Tables:
        def ints(*shape: int, fill: int = 0) -> IntArray:
            return np.full(shape, fill, dtype=np.int64)

        return Tables(
            present=np.zeros(rows, dtype=np.bool_),
            cpu_free=ints(rows),
            mem_free=ints(rows),
            cpu_total=ints(rows),
            mem_total=ints(rows),
            generation=ints(rows),
            gpu_free=np.zeros(rows, dtype=np.float64),
            gpu_cards=ints(rows),
            card_valid=np.zeros((rows, cols), dtype=np.bool_),
            healthy=np.zeros((rows, cols), dtype=np.bool_),
            model=ints(rows, cols, fill=-1),
            card_mem=ints(rows, cols),
            free_mem=ints(rows, cols),
            free_cores=ints(rows, cols),
            tenants=ints(rows, cols),
            free_slots=ints(rows, cols),
            exclusive=np.zeros((rows, cols), dtype=np.bool_),
            numa=ints(rows, cols, fill=-1),
            nvlink=ints(rows, cols),
        )

    def fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def copy(self) -> Tables:
        return Tables(**{k: v.copy() for k, v in self.fields().items()})

    def same_shape(self, other: Tables) -> bool:
        return self.card_valid.shape == other.card_valid.shape

    def unreferenced(self) -> bool:
        """Whether no view of these arrays is alive (no snapshot, nor a slice of one, can
        see a write to them). Every view of an array holds a reference to it; the
        attribute and ``getrefcount``'s own argument are the two references left when
        there is none."""
        return all(sys.getrefcount(getattr(self, f.name)) <= 2 for f in dataclasses.fields(self))

    def copy_rows_from(self, other: Tables, rows: IntArray) -> None:
        """Make ``rows`` of every array equal to ``other``'s (same shapes)."""
        if rows.shape[0]:
            for f in dataclasses.fields(self):
                getattr(self, f.name)[rows] = getattr(other, f.name)[rows]

    def resized(self, rows: int, cols: int) -> Tables:
        """A copy with at least ``rows`` rows and ``cols`` columns; new slots are empty."""
        out = Tables.empty(rows, cols)
        for name, old in self.fields().items():
            new = getattr(out, name)
            if old.ndim == 1:
                new[: old.shape[0]] = old
            else:
                new[: old.shape[0], : old.shape[1]] = old
        return out

    def frozen(self) -> Tables:
        """Read-only views (O(1)); the owner copies before its next write."""
        views = {}
        for name, arr in self.fields().items():
            view = arr.view()
            view.flags.writeable = False
            views[name] = view
        return Tables(**views)


@dataclass(frozen=True, slots=True)
class CardFree:
    """What is left on one card."""

    card: Card
    memory_mib: int
    cores_percent: int
    tenants: int
    exclusive: bool
    slots: int  # slots (containers) left on the card


@dataclass(frozen=True, eq=False, slots=True)
class Snapshot:
    """The cluster as one scheduling cycle sees it. Never changes after it is taken."""

    tables: Tables
    names: tuple[str, ...]  # row -> node name, "" for an empty row
    rows: Mapping[str, int]  # node name -> row
    inventories: tuple[NodeInventory | None, ...]  # row -> inventory
    cards: Mapping[str, tuple[int, int]]  # card uuid -> (row, column)
    models: tuple[str, ...]  # model index -> model name
    generation: int  # the cluster's generation when taken

    def node_names(self) -> list[str]:
        """Names of the nodes present, in row order."""
        return [n for n in self.names if n]

    def __len__(self) -> int:
        return len(self.rows)

    def __contains__(self, name: object) -> bool:
        return name in self.rows

    def node(self, name: str) -> NodeInventory:
        inv = self.inventories[self.rows[name]]
        assert inv is not None
        return inv

    def cards_free(self, name: str) -> list[CardFree]:
        """Per card of ``name``, in inventory order: what is free."""
        row = self.rows[name]
        t = self.tables
        return [
            CardFree(
                card=card,
                memory_mib=int(t.free_mem[row, col]),
                cores_percent=int(t.free_cores[row, col]),
                tenants=int(t.tenants[row, col]),
                exclusive=bool(t.exclusive[row, col]),
                slots=int(t.free_slots[row, col]),
            )
            for col, card in enumerate(self.node(name).cards)
        ]

    def cpu_free(self, name: str) -> int:
        return int(self.tables.cpu_free[self.rows[name]])

    def memory_free(self, name: str) -> int:
        return int(self.tables.mem_free[self.rows[name]])
