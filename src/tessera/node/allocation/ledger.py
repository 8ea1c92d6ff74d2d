"""The agent's allocations in memory: who holds which slots, which containers are taken.

Rebuilt at start from the ``meta.json`` of each allocation folder (``Layout``). A short
mutex guards the dicts and is never held across I/O; every method is one step under it,
so two concurrent calls can never claim the same container.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from tessera.node.formats.layout import AllocRecord

__all__ = ["Claim", "Ledger"]

Claim = tuple[str, str]  # (pod UID, container name)


class Ledger:
    def __init__(self, records: Iterable[AllocRecord] = ()) -> None:
        self._mu = threading.Lock()
        self._records: dict[str, AllocRecord] = {}
        self._by_slots: dict[frozenset[str], str] = {}  # the slot set's current holder
        self._claimed: dict[Claim, str] = {}  # container -> its allocation ID
        self._reserved: dict[frozenset[str], tuple[Claim, float]] = {}  # preferred sets
        for rec in records:
            self.record(rec)
            self._claimed[(rec.pod_uid, rec.container)] = rec.alloc_id

    # --- reads -------------------------------------------------------------------------

    def records(self) -> list[AllocRecord]:
        with self._mu:
            return list(self._records.values())

    def get(self, alloc_id: str) -> AllocRecord:
        with self._mu:
            return self._records[alloc_id]

    def holder_of(self, slots: frozenset[str]) -> AllocRecord | None:
        """The allocation that holds exactly ``slots`` now (None: none, or retired)."""
        with self._mu:
            alloc_id = self._by_slots.get(slots)
            return self._records.get(alloc_id) if alloc_id is not None else None

    def claimed(self) -> set[Claim]:
        with self._mu:
            return set(self._claimed)

    def alloc_ids(self) -> set[str]:
        """Every allocation the ledger knows, those Allocate is still writing included
        (claimed before their folder is made, recorded after it is written)."""
        with self._mu:
            return set(self._records) | set(self._claimed.values())

    def lib_versions(self) -> set[str]:
        with self._mu:
            return {r.lib_version for r in self._records.values()}

    # --- writes ------------------------------------------------------------------------

    def claim(self, claim: Claim, alloc_id: str) -> bool:
        """Take container ``claim`` for ``alloc_id``; False when another call has it."""
        with self._mu:
            if claim in self._claimed:
                return False
            self._claimed[claim] = alloc_id
            return True

    def release(self, claim: Claim, alloc_id: str) -> None:
        """Give ``claim`` up, if ``alloc_id`` still holds it."""
        with self._mu:
            if self._claimed.get(claim) == alloc_id:
                del self._claimed[claim]

    def move_claim(self, old: Claim, new: Claim, alloc_id: str) -> None:
        with self._mu:
            if self._claimed.get(old) == alloc_id:
                del self._claimed[old]
            self._claimed[new] = alloc_id

    def record(self, rec: AllocRecord) -> None:
        """``rec`` holds its slots from now on (a new allocation)."""
        with self._mu:
            self._records[rec.alloc_id] = rec
            self._by_slots[frozenset(rec.slots)] = rec.alloc_id

    def update(self, rec: AllocRecord) -> None:
        """A new version of a known record (confirmed, corrected, limits restored)."""
        with self._mu:
            self._records[rec.alloc_id] = rec

    def retire(self, alloc_id: str, slots: frozenset[str]) -> None:
        """``alloc_id`` no longer holds ``slots`` (its container is gone); its record and
        claim stay until cleanup removes its folder."""
        with self._mu:
            if self._by_slots.get(slots) == alloc_id:
                del self._by_slots[slots]

    def forget(self, rec: AllocRecord) -> None:
        """Cleanup removed ``rec``'s folder: nothing of it is left."""
        with self._mu:
            self._records.pop(rec.alloc_id, None)
            key = frozenset(rec.slots)
            if self._by_slots.get(key) == rec.alloc_id:
                del self._by_slots[key]
            if self._claimed.get((rec.pod_uid, rec.container)) == rec.alloc_id:
                del self._claimed[(rec.pod_uid, rec.container)]

    # --- GetPreferredAllocation's answers ----------------------------------------------

    def reserve(self, slots: frozenset[str], claim: Claim, now: float) -> None:
        with self._mu:
            self._reserved[slots] = (claim, now)

    def take_reservation(self, slots: frozenset[str]) -> Claim | None:
        with self._mu:
            got = self._reserved.pop(slots, None)
            return got[0] if got is not None else None

    def expire_reservations(self, now: float, ttl_s: float) -> None:
        with self._mu:
            for k, (_, at) in list(self._reserved.items()):
                if now - at > ttl_s:
                    del self._reserved[k]
