"""Leader election on a Lease: one leader; a dead leader is replaced after the lease."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import pytest

from tessera.kube import LEASES, ApiError, FakeKube
from tessera.kube.errors import Conflict, NotFound
from tessera.scheduler.leader import LeaderElector
from tests._logs import logged
from tests.unit._wait import eventually

UNAVAILABLE = ApiError(0, "Unavailable", "connection refused")


def _elector(
    kube: FakeKube, now: list[float], identity: str,
    on_change: Callable[[bool], None] | None = None,
) -> LeaderElector:  # fmt: skip
    return LeaderElector(kube, "ns", "tessera", identity, lease_s=15, renew_deadline_s=10,
                         retry_s=2, clock=lambda: now[0], on_change=on_change)  # fmt: skip


def _pair(kube: FakeKube, now: list[float]) -> tuple[LeaderElector, LeaderElector]:
    return _elector(kube, now, "a"), _elector(kube, now, "b")


def test_one_leader_and_takeover_after_expiry() -> None:
    kube, now = FakeKube(), [0.0]
    a, b = _pair(kube, now)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert b.holder == "a"
    now[0] = 9.0
    assert a.try_acquire_or_renew()  # renewed
    assert not b.try_acquire_or_renew()
    # a dies; b takes over only once the lease has not moved for lease_s by b's clock.
    now[0] = 20.0
    assert not b.try_acquire_or_renew()
    now[0] = 24.5
    assert b.try_acquire_or_renew()
    assert kube.get(LEASES, "tessera", "ns")["spec"]["leaseTransitions"] == 1
    assert not a.is_leader()


def test_renewals_keep_the_acquire_time_and_only_a_new_holder_counts_a_transition() -> None:
    kube, now = FakeKube(), [0.0]
    a, b = _pair(kube, now)

    def spec() -> dict[str, object]:
        return dict(kube.get(LEASES, "tessera", "ns")["spec"])

    assert a.try_acquire_or_renew()
    first = spec()
    now[0] = 9.0
    assert a.try_acquire_or_renew()
    renewed = spec()
    assert renewed["acquireTime"] == first["acquireTime"]
    assert renewed["renewTime"] != first["renewTime"]
    assert renewed["leaseTransitions"] == 0
    now[0] = 30.0
    assert not b.try_acquire_or_renew()  # b sees the lease unchanged from now on
    now[0] = 46.0
    assert b.try_acquire_or_renew()
    taken = spec()
    assert taken["holderIdentity"] == "b"
    assert taken["acquireTime"] != first["acquireTime"]
    assert taken["leaseTransitions"] == 1


def test_timings_out_of_order_are_refused() -> None:
    for lease, renew, retry in ((15, 10, 10), (10, 10, 2), (15, 20, 2)):
        with pytest.raises(ValueError, match=r"^need retry_s < renew_deadline_s < lease_s$"):
            LeaderElector(FakeKube(), "ns", "tessera", "a", lease_s=lease,
                          renew_deadline_s=renew, retry_s=retry)  # fmt: skip


def test_leader_that_cannot_renew_stops_leading_before_the_lease_ends() -> None:
    kube, now = FakeKube(), [0.0]
    a, _ = _pair(kube, now)
    assert a.try_acquire_or_renew()
    now[0] = 8.0
    kube.fail_next("get", ApiError(0, "Unavailable", "connection refused"))
    a.try_acquire_or_renew()
    assert a.is_leader()  # still inside renew_deadline
    now[0] = 10.5
    assert not a.is_leader()


def test_a_round_that_cannot_reach_the_lease_does_not_end_the_lead_before_its_deadline() -> None:
    # What the round answers feeds tessera_scheduler_leader (on_change); it must agree
    # with is_leader(), which gates the writes, and not drop to 0 at one failed read.
    kube, now, told = FakeKube(), [0.0], []
    a = _elector(kube, now, "a", on_change=told.append)
    assert a.try_acquire_or_renew() and told == [True]
    now[0] = 4.0
    kube.fail_next("get", ApiError(0, "Unavailable", "connection refused"))
    assert a.try_acquire_or_renew() is a.is_leader() is True
    kube.delete(LEASES, "tessera", "ns")  # gone, and it cannot be made again for now
    kube.fail_next("create", ApiError(0, "Unavailable", "connection refused"))
    assert a.try_acquire_or_renew() is a.is_leader() is True
    assert told == [True]
    now[0] = 10.5
    kube.fail_next("get", ApiError(0, "Unavailable", "connection refused"))
    assert a.try_acquire_or_renew() is a.is_leader() is False
    assert told == [True, False]


def test_release_on_stop_hands_over_at_once() -> None:
    kube, now = FakeKube(), [0.0]
    a, b = _pair(kube, now)
    assert a.try_acquire_or_renew()
    a.stop(release=True)
    assert b.try_acquire_or_renew()


def test_the_holders_own_lease_duration_decides_when_it_has_expired() -> None:
    """A holder that wrote a longer lease (another version, with another default, during
    an upgrade) is not taken over at the shorter duration of the one reading its Lease."""
    kube, now = FakeKube(), [0.0]
    patient = LeaderElector(kube, "ns", "tessera", "a", lease_s=60, renew_deadline_s=40,
                            retry_s=2, clock=lambda: now[0])  # fmt: skip
    _, b = _pair(kube, now)
    assert patient.try_acquire_or_renew()
    assert kube.get(LEASES, "tessera", "ns")["spec"]["leaseDurationSeconds"] == 60
    assert not b.try_acquire_or_renew()  # b's own lease_s is 15
    now[0] = 30.0
    assert not b.try_acquire_or_renew()
    now[0] = 61.0
    assert b.try_acquire_or_renew()


def test_a_lease_without_a_duration_is_read_with_the_readers_own() -> None:
    kube, now = FakeKube(), [0.0]
    kube.create(LEASES, {"metadata": {"name": "tessera"},
                         "spec": {"holderIdentity": "elsewhere"}}, "ns")  # fmt: skip
    _, b = _pair(kube, now)
    assert not b.try_acquire_or_renew()
    now[0] = 14.0
    assert not b.try_acquire_or_renew()
    now[0] = 15.5
    assert b.try_acquire_or_renew()
    assert kube.get(LEASES, "tessera", "ns")["spec"]["holderIdentity"] == "b"


def test_of_two_replicas_creating_the_lease_at_once_the_second_stands_by() -> None:
    kube, now = FakeKube(), [0.0]
    a, b = _pair(kube, now)
    assert (a.holder, b.holder) == ("", "")
    assert a.try_acquire_or_renew() and a.holder == "a"
    kube.fail_next("get", NotFound(404, "NotFound", 'leases "tessera" not found'))  # b's read
    assert not b.try_acquire_or_renew()  # its create meets a's Lease: 409, not an error
    assert not b.is_leader()
    lease = kube.get(LEASES, "tessera", "ns")
    assert (lease["apiVersion"], lease["kind"]) == ("coordination.k8s.io/v1", "Lease")
    assert lease["metadata"]["namespace"] == "ns" and lease["spec"]["holderIdentity"] == "a"
    stamp = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$"  # a MicroTime, in UTC
    assert re.match(stamp, lease["spec"]["renewTime"])
    assert re.match(stamp, lease["spec"]["acquireTime"])


def test_the_lead_ends_at_the_renew_deadline_and_the_lease_at_its_duration() -> None:
    kube, now = FakeKube(), [0.0]
    a, b = _pair(kube, now)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    now[0] = 9.999
    assert a.is_leader()
    now[0] = 10.0  # renew_deadline_s since the last renewal
    assert not a.is_leader()
    now[0] = 15.0  # lease_s since b saw the record change: expired, as in client-go
    assert b.try_acquire_or_renew() and b.holder == "b"


def test_a_takeover_counts_on_from_the_transitions_the_lease_has() -> None:
    kube, now = FakeKube(), [0.0]
    held = {"holderIdentity": "old", "leaseDurationSeconds": 15, "leaseTransitions": 3}
    kube.create(LEASES, {"metadata": {"name": "tessera"}, "spec": held}, "ns")
    _, b = _pair(kube, now)
    assert not b.try_acquire_or_renew()
    now[0] = 16.0
    assert b.try_acquire_or_renew()
    assert kube.get(LEASES, "tessera", "ns")["spec"]["leaseTransitions"] == 4


def test_leading_and_standing_by_are_said_once_each_time_they_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tessera.scheduler.leader")
    kube, now = FakeKube(), [0.0]
    told: dict[str, list[bool]] = {"a": [], "b": []}
    a = _elector(kube, now, "a", on_change=told["a"].append)
    b = _elector(kube, now, "b", on_change=told["b"].append)
    assert a.try_acquire_or_renew() and a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew() and not b.try_acquire_or_renew()
    now[0] = 16.0  # a is gone quiet; b takes over, and a, back, finds b holding
    assert b.try_acquire_or_renew()
    assert not a.try_acquire_or_renew()
    assert told == {"a": [True, False], "b": [True]}  # a standby from the start is no change
    assert [r.getMessage() for r in caplog.records] == [
        "lease ns/tessera: leading",
        "lease ns/tessera: leading",
        "lease ns/tessera: standing by (holder 'b')",
    ]


def test_each_failed_call_on_the_lease_is_logged_with_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tessera.scheduler.leader")
    kube, now = FakeKube(), [0.0]
    a, _ = _pair(kube, now)
    kube.fail_next("create", UNAVAILABLE)
    a.try_acquire_or_renew()
    assert a.try_acquire_or_renew()
    kube.fail_next("get", UNAVAILABLE)
    a.try_acquire_or_renew()
    kube.fail_next("replace", UNAVAILABLE)
    a.try_acquire_or_renew()
    kube.fail_next("replace", UNAVAILABLE)
    a.stop()
    refused = "0 Unavailable: connection refused"
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"lease ns/tessera: not created ({refused})"),
        ("INFO", "lease ns/tessera: leading"),
        ("WARNING", f"lease ns/tessera: cannot read ({refused})"),
        ("WARNING", f"lease ns/tessera: not renewed this round ({refused})"),
        ("WARNING", f"lease ns/tessera: not released ({refused})"),
        ("INFO", "lease ns/tessera: standing by (holder 'a')"),
    ]
    assert not a.is_leader()


def test_a_lost_race_for_the_lease_is_said_quietly_and_a_refusal_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A Conflict is the protocol working (another replica wrote first); a Forbidden
    (the Role lacks a verb) or a missing namespace keeps the replica from ever leading."""
    caplog.set_level(logging.INFO, logger="tessera.scheduler.leader")
    kube, now = FakeKube(), [0.0]
    a, _ = _pair(kube, now)
    kube.fail_next("create", Conflict(409, "AlreadyExists", "leases.coordination.k8s.io "
                                      '"tessera" already exists'))  # fmt: skip
    kube.fail_next("create", ApiError(403, "Forbidden", "cannot create leases"))
    kube.fail_next("create", NotFound(404, "NotFound", 'namespaces "ns" not found'))
    assert not any(a.try_acquire_or_renew() for _ in range(3))
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", 'lease ns/tessera: not created (409 AlreadyExists: leases.coordination.k8s.io '
                 '"tessera" already exists)'),
        ("WARNING", "lease ns/tessera: not created (403 Forbidden: cannot create leases)"),
        ("WARNING", 'lease ns/tessera: not created (404 NotFound: namespaces "ns" not found)'),
    ]  # fmt: skip


def test_the_election_thread_leads_and_a_plain_stop_hands_the_lease_over() -> None:
    kube = FakeKube()
    a = LeaderElector(kube, "ns", "tessera", "a", lease_s=3, renew_deadline_s=2, retry_s=0.05)
    thread = a.start()
    assert (thread.name, thread.daemon) == ("leader-election", True)
    eventually(a.is_leader)
    renewed = kube.get(LEASES, "tessera", "ns")["spec"]["renewTime"]
    eventually(lambda: kube.get(LEASES, "tessera", "ns")["spec"]["renewTime"] != renewed)
    a.stop()
    thread.join(5)
    assert not thread.is_alive() and not a.is_leader()
    assert kube.get(LEASES, "tessera", "ns")["spec"]["holderIdentity"] == ""


def test_a_stop_without_release_leaves_the_lease_to_expire() -> None:
    kube, now = FakeKube(), [0.0]
    a, b = _pair(kube, now)
    assert a.try_acquire_or_renew()
    a.stop(release=False)
    assert not a.is_leader()
    assert kube.get(LEASES, "tessera", "ns")["spec"]["holderIdentity"] == "a"
    assert not b.try_acquire_or_renew()


def test_a_round_that_fails_unexpectedly_is_logged_and_the_rounds_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def on_change(leading: bool) -> None:
        if leading:
            raise RuntimeError("a callback bug")

    kube = FakeKube()
    a = LeaderElector(kube, "ns", "tessera", "a", lease_s=3, renew_deadline_s=2, retry_s=0.05,
                      on_change=on_change)  # fmt: skip
    thread = a.start()
    try:
        eventually(lambda: logged(caplog, "tessera.scheduler.leader"))
        renewed = kube.get(LEASES, "tessera", "ns")["spec"]["renewTime"]
        eventually(lambda: kube.get(LEASES, "tessera", "ns")["spec"]["renewTime"] != renewed)
        assert thread.is_alive() and a.is_leader()
    finally:
        a.stop()
        thread.join(5)
    assert "lease tessera: election round failed" in logged(caplog, "tessera.scheduler.leader")
