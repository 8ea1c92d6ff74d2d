from __future__ import annotations

import pytest

from tessera.node.cards.health import HealthTracker

A, B = "GPU-a", "GPU-b"


def ok(_: str) -> bool:
    return True


def test_critical_xid_takes_the_card_out_application_xids_do_not() -> None:
    h = HealthTracker([A, B], recovery_s=10)
    assert not h.on_xid(A, 13, now=0)  # graphics engine exception: the app's fault
    assert not h.on_xid(A, 43, now=0)
    assert h.healthy(A)
    assert h.on_xid(A, 79, now=1)  # fell off the bus
    assert not h.healthy(A) and h.reason(A) == "XID 79"
    assert h.healthy(B)
    assert not h.on_xid(A, 48, now=2)  # already out: not a change


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_each_documented_application_xid_leaves_the_card_in(xid: int) -> None:
    # docs/node-agent.md lists the XIDs an application causes on its own context.
    h = HealthTracker([A], recovery_s=10)
    assert not h.on_xid(A, xid, now=0) and h.healthy(A)


def test_an_unknown_card_is_never_a_change() -> None:
    h = HealthTracker([A], recovery_s=10)
    assert not h.on_xid("GPU-other", 79, now=0)
    assert not h.on_probe_failure("GPU-other", now=0)
    assert h.healthy(A)


def test_recovers_after_a_quiet_period_and_a_good_probe() -> None:
    h = HealthTracker([A], recovery_s=10)
    h.on_xid(A, 48, now=0)
    assert h.tick(5, ok) == set() and not h.healthy(A)  # not quiet long enough
    h.on_xid(A, 48, now=6)  # the quiet period starts again
    assert h.tick(12, ok) == set()
    assert h.tick(16, ok) == {A} and h.healthy(A) and h.reason(A) == ""


def test_a_failing_probe_keeps_the_card_out_and_restarts_the_clock() -> None:
    h = HealthTracker([A], recovery_s=10)
    h.on_xid(A, 79, now=0)
    assert h.tick(20, lambda _: False) == set() and not h.healthy(A)
    assert h.tick(25, ok) == set()  # quiet only since 20
    assert h.tick(30, ok) == {A}


def test_probe_failure_alone_takes_a_healthy_card_out() -> None:
    h = HealthTracker([A, B], recovery_s=1)
    assert h.tick(0, lambda u: u != A) == {A}
    assert h.reason(A) == "probe failed"
    assert h.snapshot() == {A: False, B: True}


def test_unknown_cards_are_ignored() -> None:
    h = HealthTracker([A])
    assert not h.on_xid("GPU-zzz", 79, now=0)
    assert not h.healthy("GPU-zzz")
    assert h.reason("GPU-zzz") == ""


def test_a_card_a_probe_took_out_waits_its_quiet_period_from_that_probe() -> None:
    h = HealthTracker([A], recovery_s=10)
    assert h.tick(100, lambda _: False) == {A}
    assert h.tick(109, ok) == set() and not h.healthy(A)
    assert h.tick(110, ok) == {A}


def test_every_card_is_probed_whatever_the_cards_before_it_did() -> None:
    h = HealthTracker([A, B], recovery_s=10)
    assert h.tick(0, lambda u: u != B) == {B}  # A healthy and answering, then B
    h.on_xid(A, 79, now=0)
    assert h.tick(5, lambda u: u != B) == set()  # A still out, B still failing
    assert h.tick(10, ok) == {A}  # A quiet for 10 s; B failed at 5, so not yet
    assert h.tick(15, ok) == {B}
    h.on_xid(A, 79, now=20)
    assert h.tick(21, lambda _: False) == {B}  # A out and still failing, then B


def test_the_quiet_period_is_thirty_seconds_unless_told_otherwise() -> None:
    h = HealthTracker([A])
    h.on_xid(A, 79, now=0)
    assert h.tick(29.9, ok) == set()
    assert h.tick(30, ok) == {A}
