"""The allocation ledger: one holder per slot set, one claim per container."""

from __future__ import annotations

import dataclasses

from tessera.node.allocation.ledger import Ledger
from tessera.node.formats.layout import AllocRecord

S0 = ("GPU-a::0",)


def rec(alloc_id: str, pod_uid: str, slots: tuple[str, ...] = S0) -> AllocRecord:
    return AllocRecord(
        alloc_id=alloc_id, slots=slots, pod_uid=pod_uid, namespace="ns", pod=pod_uid,
        container="main", cards=("GPU-a",), confirmed=False, lib_version="v1", created=0.0,
    )  # fmt: skip


def test_records_read_at_start_hold_their_slots_and_containers() -> None:
    a = rec("a", "p1")
    ledger = Ledger([a])
    assert ledger.holder_of(frozenset(S0)) == a
    assert ledger.claimed() == {("p1", "main")}
    assert not ledger.claim(("p1", "main"), "other")  # taken


def test_a_container_is_claimed_once() -> None:
    ledger = Ledger()
    assert ledger.claim(("p1", "main"), "a")
    assert not ledger.claim(("p1", "main"), "b")
    ledger.release(("p1", "main"), "b")  # not b's: nothing changes
    assert ledger.claimed() == {("p1", "main")}
    ledger.release(("p1", "main"), "a")
    assert ledger.claim(("p1", "main"), "b")


def test_a_retired_holder_keeps_its_record_until_forgotten() -> None:
    a, b = rec("a", "p1"), rec("b", "p2")
    ledger = Ledger([a])
    ledger.retire("a", frozenset(S0))
    assert ledger.holder_of(frozenset(S0)) is None
    ledger.record(b)
    assert ledger.holder_of(frozenset(S0)) == b
    assert {r.alloc_id for r in ledger.records()} == {"a", "b"}
    ledger.forget(a)  # cleanup of a's folder must not drop b's hold on the slots
    assert ledger.holder_of(frozenset(S0)) == b
    assert ledger.claimed() == set()  # b was recorded without a claim in this test


def test_reservations_are_taken_once_and_expire() -> None:
    ledger = Ledger()
    ledger.reserve(frozenset(S0), ("p1", "main"), now=100.0)
    assert ledger.take_reservation(frozenset(S0)) == ("p1", "main")
    assert ledger.take_reservation(frozenset(S0)) is None
    ledger.reserve(frozenset(S0), ("p2", "main"), now=100.0)
    ledger.expire_reservations(now=161.0, ttl_s=60.0)
    assert ledger.take_reservation(frozenset(S0)) is None
    ledger.reserve(frozenset(S0), ("p3", "main"), now=100.0)
    ledger.expire_reservations(now=159.0, ttl_s=60.0)  # younger than the TTL: kept
    assert ledger.take_reservation(frozenset(S0)) == ("p3", "main")


def test_a_corrected_allocation_moves_its_claim_and_leaves_none_once_forgotten() -> None:
    """pod-resources said the slots are another container's: the claim moves to it, and
    cleanup of the folder later frees that container for an allocation of its own."""
    a = rec("a", "p1")
    ledger = Ledger([a])
    ledger.move_claim(("p1", "main"), ("p2", "main"), "a")
    assert ledger.claimed() == {("p2", "main")}
    moved = dataclasses.replace(a, pod_uid="p2", pod="p2")
    ledger.update(moved)
    ledger.forget(moved)
    assert ledger.claimed() == set()
    assert ledger.claim(("p2", "main"), "b")


def test_alloc_ids_include_claims_still_being_written_until_released_or_forgotten() -> None:
    a = rec("a", "p1")
    ledger = Ledger([a])
    assert ledger.claim(("p2", "main"), "b")  # Allocate is writing b's folder
    assert ledger.alloc_ids() == {"a", "b"}
    ledger.release(("p2", "main"), "b")
    ledger.forget(a)
    assert ledger.alloc_ids() == set()
