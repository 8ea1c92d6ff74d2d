"""ClusterState: the nodes, their cards and what each placed pod holds.

Updated incrementally by events (node added, pod bound, pod gone). ``snapshot()`` is O(1):
the snapshot shares the arrays, and the state takes a private copy before its next write
(copy-on-write), so a scheduling cycle reads a view that never moves under it. The copy
reuses the arrays of an earlier snapshot nobody holds any more and copies only the rows
written since (each row carries a generation), so it costs O(rows changed), not O(R·C).

Every write either succeeds whole or raises and changes nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable
from types import MappingProxyType

import numpy as np

from tessera.cluster.booking import Booking
from tessera.cluster.invariants import check
from tessera.cluster.snapshot import Snapshot, Tables
from tessera.errors import PlacementError, SpecError
from tessera.model.types import Assignment, NodeInventory, PodRequest

__all__ = ["Booking", "ClusterState"]

# One counter for every row of every ClusterState in the process: a (row, generation)
# pair is never reused, so caches keyed by it stay sound across states and row reuse.
_GENERATIONS = itertools.count(1)


_Meta = tuple[
    tuple[str, ...],
    MappingProxyType[str, int],
    tuple[NodeInventory | None, ...],
    MappingProxyType[str, tuple[int, int]],
]


class ClusterState:
    """Nodes, cards and bookings. Not thread-safe: one writer (the event loop)."""

    def __init__(self, nodes: Iterable[NodeInventory] = ()) -> None:
        self._t = Tables.empty(0, 0)
        self._shared = False  # a snapshot holds views of self._t: copy before writing
        self._spares: list[Tables] = []  # tables of earlier snapshots, reused when free
        self._names: list[str] = []
        self._rows: dict[str, int] = {}
        self._inventories: list[NodeInventory | None] = []
        self._free_rows: list[int] = []
        self._models: list[str] = []
        self._model_ids: dict[str, int] = {}
        self._card_at: dict[str, tuple[str, int]] = {}  # uuid -> (node, column)
        self._bookings: dict[str, Booking] = {}
        self._pods_on: dict[str, set[str]] = {}  # node -> pod keys
        self._generation = 0
        self._snapshot: Snapshot | None = None
        self._meta: _Meta | None = None  # the snapshot's name tables, rebuilt on node changes
        for inv in nodes:
            self.add_node(inv)

    # ---- reading -------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """An immutable view for one scheduling cycle; O(1) when nothing changed."""
        if self._snapshot is not None and self._snapshot.generation == self._generation:
            return self._snapshot
        if self._meta is None:
            self._meta = (
                tuple(self._names),
                MappingProxyType(dict(self._rows)),
                tuple(self._inventories),
                MappingProxyType(
                    {u: (self._rows[n], col) for u, (n, col) in self._card_at.items()}
                ),
            )
        names, rows, inventories, cards = self._meta
        self._snapshot = Snapshot(
            tables=self._t.frozen(),
            names=names,
            rows=rows,
            inventories=inventories,
            cards=cards,
            models=tuple(self._models),
            generation=self._generation,
        )
        self._shared = True
        return self._snapshot

    def node(self, name: str) -> NodeInventory:
        inv = self._inventories[self._rows[name]]
        assert inv is not None
        return inv

    def node_names(self) -> list[str]:
        return [n for n in self._names if n]

    def bookings(self) -> dict[str, Booking]:
        """Pod key -> booking (a copy of the index; the bookings themselves are frozen)."""
        return dict(self._bookings)

    def booking(self, pod_key: str) -> Booking | None:
        return self._bookings.get(pod_key)

    def pods_on(self, node: str) -> list[str]:
        """The keys of the pods booked on ``node``, sorted (none for an unknown node)."""
        return sorted(self._pods_on.get(node, ()))

    def node_without(self, node: str, gone: Collection[str]) -> ClusterState:
        """A private state of ``node`` alone with its bookings but those of ``gone``: the
        node as it will be once they have left. Raises as ``assign`` does if its bookings
        do not add up on their own."""
        copy = ClusterState([self.node(node)])
        for key in self.pods_on(node):
            booking = self._bookings[key]
            if key not in gone:
                copy.assign(booking.pod, booking.assignment, placing=False)
        return copy

    def __contains__(self, name: object) -> bool:
        return name in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    # ---- nodes ---------------------------------------------------------------------

    def add_node(self, inv: NodeInventory) -> None:
        """Add a node; raises SpecError if the name or a card UUID is already known."""
        if inv.name in self._rows:
            raise SpecError("node", "already in the cluster state; use update_node", inv.name)
        self._check_inventory(inv)
        self._write()
        row = self._free_rows.pop() if self._free_rows else self._grow_rows()
        self._ensure_cols(len(inv.cards))
        self._rows[inv.name] = row
        self._names[row] = inv.name
        self._inventories[row] = inv
        self._pods_on[inv.name] = set()
        self._fill_row(row, inv)

    def update_node(self, inv: NodeInventory) -> None:
        """Replace a node's inventory, keeping its pods' bookings on the cards still there.

        A booking on a card that left the node stays recorded (the pod still runs until it
        is released); check_invariants() reports it.
        """
        if inv.name not in self._rows:
            raise SpecError("node", "not in the cluster state; use add_node", inv.name)
        self._check_inventory(inv)
        self._write()
        row = self._rows[inv.name]
        old = self._inventories[row]
        assert old is not None
        for card in old.cards:
            del self._card_at[card.uuid]
        self._ensure_cols(len(inv.cards))
        self._inventories[row] = inv
        self._fill_row(row, inv)
        for key in sorted(self._pods_on[inv.name]):
            self._apply(self._bookings[key], inv.name, sign=+1, strict=False)
        self._apply_totals(row, self._pods_on[inv.name], sign=+1)

    def remove_node(self, name: str) -> None:
        """Remove a node; the pods booked on it go with it."""
        if name not in self._rows:
            raise SpecError("node", "not in the cluster state", name)
        self._write()
        row = self._rows.pop(name)
        inv = self._inventories[row]
        assert inv is not None
        for card in inv.cards:
            del self._card_at[card.uuid]
        for key in self._pods_on.pop(name):
            del self._bookings[key]
        self._names[row] = ""
        self._inventories[row] = None
        self._meta = None
        t = self._t
        t.present[row] = False
        t.cpu_free[row] = t.mem_free[row] = t.cpu_total[row] = t.mem_total[row] = 0
        self._clear_cards(row)
        t.gpu_free[row] = t.gpu_cards[row] = 0
        t.generation[row] = next(_GENERATIONS)
        self._free_rows.append(row)

    # ---- pods ----------------------------------------------------------------------

    def assign(self, pod: PodRequest, assignment: Assignment, *, placing: bool = True) -> None:
        """Book ``pod`` where ``assignment`` says.

        Raises PlacementError (reasons keyed by the node) and changes nothing when the
        booking would break an invariant: unknown node or card, a card on another node,
        over a card's memory, cores or slots (containers), an exclusivity conflict, a
        model or UUID the container refused, the wrong number of cards, or the node's CPU
        or memory exceeded; and, when ``placing`` (a new placement, not a pod already
        running there), a card out of service (unhealthy or cordoned). A pod already
        booked raises SpecError.
        """
        if pod.key in self._bookings:
            raise SpecError("pod", "already assigned; release it first", pod.key)
        node = assignment.node
        booking = Booking(
            pod=pod,
            assignment=assignment,
            footprint=assignment.footprint(),
            slots=assignment.slots(),
        )
        problem = self._refuse(booking, placing)
        if problem:
            raise PlacementError(
                f"pod {pod.key} cannot be booked on {node}: {problem}", {node: problem}
            )
        self._write()
        self._bookings[pod.key] = booking
        self._pods_on[node].add(pod.key)
        self._apply(booking, node, sign=+1, strict=True)
        self._apply_totals(self._rows[node], {pod.key}, sign=+1)

    def release(self, pod_key: str) -> bool:
        """Give back what ``pod_key`` holds. Returns False when it held nothing."""
        booking = self._bookings.get(pod_key)
        if booking is None:
            return False
        self._write()
        node = booking.assignment.node
        self._apply(booking, node, sign=-1, strict=False)
        self._apply_totals(self._rows[node], {pod_key}, sign=-1)
        del self._bookings[pod_key]
        self._pods_on[node].discard(pod_key)
        return True

    def check_invariants(self) -> list[str]:
        """Every broken invariant as a sentence; empty when the state is sound."""
        return check(self.snapshot(), self._bookings)

    # ---- internals -----------------------------------------------------------------

    def _check_inventory(self, inv: NodeInventory) -> None:
        seen: set[str] = set()
        for card in inv.cards:
            if card.uuid in seen:
                raise SpecError(f"node {inv.name}: card uuid", "must be unique", card.uuid)
            seen.add(card.uuid)
            owner = self._card_at.get(card.uuid)
            if owner is not None and owner[0] != inv.name:
                raise SpecError(
                    f"node {inv.name}: card uuid", f"already on node {owner[0]}", card.uuid
                )
            if card.memory_mib <= 0:
                raise SpecError(
                    f"node {inv.name}: card {card.uuid} memory", "must be > 0", card.memory_mib
                )

    def _write(self) -> None:
        """Called before every mutation: un-share the arrays and bump the generation."""
        if self._shared:
            self._t = self._unshared()
            self._shared = False
        self._generation += 1

    def _unshared(self) -> Tables:
        """A private copy of the tables a snapshot holds, for the writes to come.

        The tables of an earlier snapshot that nobody holds any more are brought up to
        date and reused: only the rows whose generation differs are copied (every write
        to a row gives it a generation never used before, so equal generations mean
        equal rows). A full copy only when no such tables are free.
        """
        current = self._t
        spare = None
        while self._spares:
            candidate = self._spares.pop()
            if candidate.same_shape(current) and candidate.unreferenced():
                spare = candidate
                break
        self._spares.append(current)  # reusable once its snapshots are gone
        del self._spares[:-2]
        if spare is None:
            return current.copy()
        spare.copy_rows_from(current, np.flatnonzero(spare.generation != current.generation))
        return spare

    def _grow_rows(self) -> int:
        row = len(self._names)
        rows, cols = self._t.present.shape[0], self._t.card_valid.shape[1]
        if row >= rows:
            self._t = self._t.resized(max(16, rows * 2), cols)
        self._names.append("")
        self._inventories.append(None)
        self._meta = None
        return row

    def _ensure_cols(self, cols: int) -> None:
        if cols > self._t.card_valid.shape[1]:
            self._t = self._t.resized(self._t.present.shape[0], cols)

    def _model_id(self, model: str) -> int:
        if model not in self._model_ids:
            self._model_ids[model] = len(self._models)
            self._models.append(model)
        return self._model_ids[model]

    def _clear_cards(self, row: int) -> None:
        """Every card column of ``row`` empty: no card, nothing free, nothing held."""
        t = self._t
        t.card_valid[row] = t.healthy[row] = t.exclusive[row] = False
        t.model[row] = t.numa[row] = -1
        t.card_mem[row] = t.free_mem[row] = t.free_cores[row] = t.tenants[row] = 0
        t.free_slots[row] = t.nvlink[row] = 0

    def _fill_row(self, row: int, inv: NodeInventory) -> None:
        t = self._t
        self._meta = None
        t.present[row] = True
        t.cpu_total[row] = t.cpu_free[row] = inv.cpu_milli
        t.mem_total[row] = t.mem_free[row] = inv.memory_mib
        self._clear_cards(row)
        column_of = {card.index: col for col, card in enumerate(inv.cards)}
        for col, card in enumerate(inv.cards):
            t.numa[row, col] = card.numa_node
            t.nvlink[row, col] = sum(
                1 << column_of[p]
                for p in set(card.nvlink_peers)
                if p in column_of and column_of[p] < 63  # a bitmask in an int64
            )
            self._card_at[card.uuid] = (inv.name, col)
            t.card_valid[row, col] = True
            t.healthy[row, col] = card.in_service  # what placement may use
            t.model[row, col] = self._model_id(card.model)
            t.card_mem[row, col] = t.free_mem[row, col] = card.memory_mib
            t.free_cores[row, col] = 100
            t.free_slots[row, col] = card.slots
        self._row_totals(row)

    def _apply(self, booking: Booking, node: str, sign: int, strict: bool) -> None:
        t = self._t
        row = self._rows[node]
        for uuid, (mem, cores, exclusive) in booking.footprint.items():
            where = self._card_at.get(uuid)
            if where is None or where[0] != node:
                assert not strict, uuid
                continue
            col = where[1]
            if exclusive:  # a whole card: all of it, whatever the slice says
                mem, cores = int(t.card_mem[row, col]), 100
                t.exclusive[row, col] = sign > 0
            t.free_mem[row, col] -= sign * mem
            t.free_cores[row, col] -= sign * cores
            t.tenants[row, col] += sign
            t.free_slots[row, col] -= sign * booking.slots[uuid]
        self._row_totals(row)

    def _row_totals(self, row: int) -> None:
        """Refresh the row's aggregates the scorers read, and its generation."""
        t = self._t
        healthy = t.card_valid[row] & t.healthy[row]
        share = np.minimum(
            t.free_cores[row] / 100.0, t.free_mem[row] / np.maximum(t.card_mem[row], 1)
        )
        t.gpu_free[row] = float(np.where(healthy & ~t.exclusive[row], share, 0.0).sum())
        t.gpu_cards[row] = int(healthy.sum())
        t.generation[row] = next(_GENERATIONS)

    def _apply_totals(self, row: int, keys: Iterable[str], sign: int) -> None:
        t = self._t
        for key in keys:
            pod = self._bookings[key].pod
            t.cpu_free[row] -= sign * pod.cpu_milli
            t.mem_free[row] -= sign * pod.memory_mib

    def _refuse(self, booking: Booking, placing: bool) -> str:
        """Why ``booking`` would break an invariant; "" when it would not."""
        pod, assignment = booking.pod, booking.assignment
        node = assignment.node
        if node not in self._rows:
            return "node not in the cluster state"
        row = self._rows[node]
        t = self._t
        if pod.cpu_milli > t.cpu_free[row]:
            return "insufficient cpu"
        if pod.memory_mib > t.mem_free[row]:
            return "insufficient memory"
        wanted = {c.name: c for c in pod.gpu_containers()}
        given = {c.name: c for c in assignment.containers}
        if set(wanted) != set(given):
            return (
                f"assignment covers containers {sorted(given)}, "
                f"pod has GPU containers {sorted(wanted)}"
            )
        inv = self._inventories[row]
        assert inv is not None
        for name, ca in given.items():
            gpu = wanted[name].gpu
            assert gpu is not None
            uuids = [s.uuid for s in ca.slices]
            if len(set(uuids)) != len(uuids):
                return f"container {name}: a card appears twice"
            if len(uuids) != gpu.count:
                return f"container {name}: {len(uuids)} cards given, {gpu.count} requested"
            if ca.exclusive != gpu.exclusive or ca.init != wanted[name].init:
                return f"container {name}: exclusive/init flags differ from the request"
            for s in ca.slices:
                where = self._card_at.get(s.uuid)
                if where is None or where[0] != node:
                    return f"card {s.uuid} is not on this node"
                card = inv.cards[where[1]]
                if not gpu.allows(card):
                    return f"container {name}: card {s.uuid} (model {card.model}) not allowed"
        slots = booking.slots
        for uuid, (mem, cores, exclusive) in booking.footprint.items():
            col = self._card_at[uuid][1]
            if placing and not t.healthy[row, col]:
                return f"card {uuid} is {'unhealthy' if not inv.cards[col].healthy else 'cordoned'}"
            if slots[uuid] > t.free_slots[row, col]:
                return f"card {uuid} has {t.free_slots[row, col]} slot(s) free, needs {slots[uuid]}"
            if t.exclusive[row, col]:
                return f"card {uuid} is held whole by another pod"
            if exclusive:
                if t.tenants[row, col]:
                    return f"card {uuid} has tenants; a whole card needs none"
                continue
            if mem > t.free_mem[row, col]:
                return f"card {uuid} has {t.free_mem[row, col]} MiB free, needs {mem}"
            if cores > t.free_cores[row, col]:
                return f"card {uuid} has {t.free_cores[row, col]}% cores free, needs {cores}"
        return ""
