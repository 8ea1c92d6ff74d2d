"""The burst-share coordinator: the pure decision, the allowance file, and ticks over regions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.errors import FormatError
from tessera.model.types import ComputePolicy
from tessera.node.burst.coordinator import Coordinator, Decision, Tenant, TenantCard, decide
from tessera.node.formats.allowance import decode_allowance, encode_allowance, write_allowance
from tessera.node.formats.limits import CardLimit, Limits
from tessera.node.formats.usage import CardTotals, encode_region

BURST = ComputePolicy.BURST_SHARE
FIXED = ComputePolicy.FIXED_SHARE
BEST = ComputePolicy.BEST_EFFORT


def test_alone_on_the_card_a_hungry_tenant_gets_everything() -> None:
    got = decide([TenantCard("a", BURST, 30, used=30, throttled=40, allowance=30, reserved=30)])
    assert got == {"a": Decision(allowance=100, reserved=30)}


def test_an_idle_lender_keeps_headroom_and_lends_the_rest() -> None:
    got = decide(
        [
            TenantCard("a", BURST, 30, used=30, throttled=50, allowance=30, reserved=30),
            TenantCard("b", BURST, 50, used=0, allowance=50, reserved=50),
        ]
    )
    assert got["b"] == Decision(allowance=50, reserved=5)
    assert got["a"] == Decision(allowance=95, reserved=30)


def test_a_lender_that_ramps_up_gets_its_floor_back_in_one_tick() -> None:
    # b was lending (reserved 5) and now uses 20% even though a takes most of the card.
    got = decide(
        [
            TenantCard("a", BURST, 30, used=75, throttled=10, allowance=95, reserved=30),
            TenantCard("b", BURST, 50, used=20, allowance=50, reserved=5),
        ]
    )
    assert got["b"].reserved == 50
    assert got["a"] == Decision(allowance=50, reserved=30)


def test_fixed_tenants_are_reserved_and_best_effort_ignored() -> None:
    got = decide(
        [
            TenantCard("f", FIXED, 40, used=40),
            TenantCard("e", BEST, 0, used=90),
            TenantCard("a", BURST, 20, used=20, throttled=30, allowance=20, reserved=20),
        ]
    )
    assert "e" not in got
    assert got["f"] == Decision(allowance=40, reserved=40)
    assert got["a"] == Decision(allowance=60, reserved=20)


def test_spare_is_split_by_floor_between_hungry_tenants() -> None:
    got = decide(
        [
            TenantCard("a", BURST, 20, used=20, throttled=50, allowance=20, reserved=20),
            TenantCard("b", BURST, 40, used=40, throttled=50, allowance=40, reserved=40),
        ]
    )
    assert got["a"].allowance == 20 + 40 * 20 // 60
    assert got["b"].allowance == 40 + 40 * 40 // 60


def test_a_tenant_using_its_borrowed_allowance_stays_hungry() -> None:
    # Not throttled (its allowance is generous) but using it: keep lending to it.
    got = decide([TenantCard("a", BURST, 30, used=97, throttled=0, allowance=100, reserved=30)])
    assert got["a"].allowance == 100


def test_a_full_card_lends_nothing_and_a_hungry_tenant_with_no_floor_gets_nothing() -> None:
    full = decide(
        [
            TenantCard("f", FIXED, 50, used=50),
            TenantCard("a", BURST, 50, used=50, throttled=30, allowance=50, reserved=50),
        ]
    )
    assert full["a"] == Decision(allowance=50, reserved=50)
    # A burst-share tenant with no guaranteed share: hungry, but with no weight to share by.
    none = decide([TenantCard("z", BURST, 0, used=0, throttled=30, allowance=0, reserved=0)])
    assert none == {"z": Decision(allowance=0, reserved=0)}


def test_a_lender_using_one_percent_of_a_one_percent_reservation_takes_its_floor_back() -> None:
    got = decide([TenantCard("b", BURST, 50, used=1.0, allowance=50, reserved=1)])
    assert got["b"].reserved == 50


def test_a_borrower_that_stops_needing_returns_to_its_floor() -> None:
    got = decide([TenantCard("a", BURST, 30, used=10, throttled=0, allowance=100, reserved=30)])
    assert got["a"] == Decision(allowance=30, reserved=15)


def test_a_borrower_using_half_its_allowance_is_not_hungry() -> None:
    # a borrowed up to 80 and uses 50: not near its allowance, not throttled. It is
    # ramping (above 80 % of its reservation), so it keeps its floor; b, throttled,
    # gets the rest.
    got = decide([
        TenantCard("a", BURST, 30, used=50, throttled=0, allowance=80, reserved=30),
        TenantCard("b", BURST, 30, used=30, throttled=10, allowance=30, reserved=30),
    ])  # fmt: skip
    assert got == {"a": Decision(30, 30), "b": Decision(70, 30)}


@pytest.mark.parametrize(
    ("used", "throttled", "hungry"),
    [
        (10, 2.0, True),  # throttled 2 % of the interval: hungry
        (10, 1.9, False),
        (45, 0, True),  # within the 5 % headroom of its allowance (50): hungry
        (44, 0, False),
    ],
)
def test_where_hunger_starts(used: float, throttled: float, hungry: bool) -> None:
    a = TenantCard("a", BURST, 30, used=used, throttled=throttled, allowance=50, reserved=30)
    assert (decide([a])["a"].allowance == 100) is hungry


@pytest.mark.parametrize(("used", "reserves"), [(24, 40), (23.9, 28)])
def test_a_lender_using_80_percent_of_its_reservation_takes_its_floor_back(
    used: float, reserves: int
) -> None:
    # Reserved 30 of a floor of 40: using 24 (80 %) takes the floor back; 23.9 keeps
    # what it uses plus the headroom (23 + 5).
    got = decide([TenantCard("a", BURST, 40, used=used, allowance=40, reserved=30)])
    assert got["a"].reserved == reserves


policies = st.sampled_from([BURST, FIXED, BEST])


@given(
    st.lists(
        st.tuples(
            policies, st.integers(1, 60), st.floats(0, 100), st.floats(0, 100), st.integers(0, 100)
        ),
        min_size=1,
        max_size=6,
    )
)
def test_allowances_stay_within_floor_and_100_and_reservations_fit(
    rows: list[tuple[ComputePolicy, int, float, float, int]],
) -> None:
    # Placement never puts more than 100% of floors on a card.
    total = 0
    card = []
    for i, (policy, floor, used, throttled, prev) in enumerate(rows):
        if total + floor > 100:
            break
        total += floor
        card.append(TenantCard(f"t{i}", policy, floor, used, throttled, max(prev, floor), floor))
    got = decide(card)
    for t in card:
        if t.policy is BEST:
            assert t.tenant not in got
            continue
        d = got[t.tenant]
        assert t.floor <= d.allowance <= 100
        assert d.reserved <= t.floor
    assert sum(d.reserved for d in got.values()) <= 100
    # What the hungry borrow above their floors fits in what nobody reserved.
    borrowed = sum(got[t.tenant].allowance - t.floor for t in card if t.tenant in got)
    assert borrowed <= max(0, 100 - sum(d.reserved for d in got.values()))


def test_allowance_file_round_trip_and_bytes(tmp_path: Path) -> None:
    text = encode_allowance({1: 30, 0: 95}, 1732180000123)
    assert (
        text == "version=1\nwritten_unix_ms=1732180000123\ncard.0.percent=95\ncard.1.percent=30\n"
    )
    assert decode_allowance(text) == (1732180000123, {0: 95, 1: 30})
    path = tmp_path / "allowance"
    write_allowance(path, {0: 50}, 7)
    assert decode_allowance(path.read_text()) == (7, {0: 50})
    assert [p.name for p in tmp_path.iterdir()] == ["allowance"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version=1\ncard.0.percent=5\n", "missing key 'written_unix_ms'"),
        ("version=1\nwritten_unix_ms=1\ncard.0.percent=101\n",
         "card.0.percent: 101 is outside 0..100"),
        ("version=1\nwritten_unix_ms=1\ncard.16.percent=1\n",
         "card.16.percent: 16 is outside 0..15"),
        ("version=1\nwritten_unix_ms=-1\n", "written_unix_ms: not a decimal integer: '-1'"),
        ("version=2\n", "unknown version"),
    ],
)  # fmt: skip
def test_bad_allowance_files(text: str, message: str) -> None:
    """Each refusal names the file, the key and the rule."""
    with pytest.raises(FormatError) as refused:
        decode_allowance(text)
    assert str(refused.value).startswith("allowance file: ")
    assert message in str(refused.value)


@pytest.mark.parametrize("percent", [{0: 101}, {0: -1}, {16: 50}, {-1: 50}])
def test_encoder_refuses_out_of_range(percent: dict[int, int]) -> None:
    with pytest.raises(FormatError, match="out of range"):
        encode_allowance(percent, 1)


def test_the_allowance_round_trips_at_its_bounds_and_skips_keys_it_does_not_know() -> None:
    bounds = {0: 0, 15: 100}
    assert decode_allowance(encode_allowance(bounds, 0)) == (0, bounds)
    # Keys of a later writer are skipped, as libvgpu skips them (vg_config.c).
    text = "version=1\nwritten_unix_ms=7\ncard.1.percent=40\ncard.1.floor=9\nnode.x.percent=1\n"
    assert decode_allowance(text) == (7, {1: 40})


U = "GPU-00000000-0000-0000-0000-00000000000a"


def _tenant(tmp_path: Path, name: str, floor: int, policy: ComputePolicy = BURST) -> Tenant:
    d = tmp_path / name
    d.mkdir()
    return Tenant(
        name, Limits(cards=(CardLimit(0, U, 1024, floor, policy),)), d / "region", d / "allowance"
    )


def _report(t: Tenant, busy_ns: int, throttled_ns: int) -> None:
    totals = (CardTotals(busy_ns=busy_ns, throttled_ns=throttled_ns),) + (CardTotals(),) * 15
    t.region.write_bytes(encode_region(retired=totals))


def started(tenants: list[Tenant], **kw: Any) -> tuple[Coordinator, list[int]]:
    """A coordinator over ``tenants`` on a clock the test moves (ns; allowances stamped
    1000 ms + that), after a first tick at zero use: the next tick measures from there."""
    clock = [0]
    coord = Coordinator(
        lambda: tenants,
        clock_ns=lambda: clock[0],
        wall_ms=lambda: 1000 + clock[0] // 10**6,
        **kw,
    )
    for t in tenants:
        _report(t, 0, 0)
    coord.tick()
    return coord, clock


def test_ticks_over_regions_lend_and_give_back(tmp_path: Path) -> None:
    a, b = _tenant(tmp_path, "a", 30), _tenant(tmp_path, "b", 50)
    coord, clock = started([a, b])
    # 100 ms: a saturates its 30% and is throttled; b idle.
    clock[0] += 100 * 10**6
    _report(a, 30 * 10**6, 60 * 10**6)
    got = coord.tick()
    assert got == {"a": {0: 95}, "b": {0: 50}}
    assert decode_allowance(a.allowance.read_text()) == (1100, {0: 95})
    # 100 ms later: b starts and gets 20% of the card despite a's burst.
    clock[0] += 100 * 10**6
    _report(a, 105 * 10**6, 60 * 10**6)
    _report(b, 20 * 10**6, 0)
    got = coord.tick()
    assert got["a"][0] <= 50  # within one tick a leaves b its whole floor
    # a keeps bursting into what b does not reserve: 100 - 50.
    clock[0] += 100 * 10**6
    _report(a, 135 * 10**6, 80 * 10**6)
    _report(b, 60 * 10**6, 0)  # b uses 40%: below its floor, not hungry
    assert coord.tick()["a"] == {0: 50}


def test_a_lender_keeps_lending_while_its_use_stays_under_its_reservation(
    tmp_path: Path,
) -> None:
    """What a tick decided is what the next one weighs: b reserved 5 % while idle, uses
    3 % now (under 80 % of that), and keeps lending; a keeps what b does not reserve."""
    a, b = _tenant(tmp_path, "a", 30), _tenant(tmp_path, "b", 50)
    coord, clock = started([a, b])
    clock[0] += 100 * 10**6
    _report(a, 30 * 10**6, 60 * 10**6)
    assert coord.tick()["a"] == {0: 95}
    clock[0] += 100 * 10**6
    _report(a, 120 * 10**6, 120 * 10**6)
    _report(b, 3 * 10**6, 0)
    assert coord.tick()["a"] == {0: 100 - (3 + 5)}
    # a now uses 60 % of the 92 it was lent, unthrottled: it needs no more than that,
    # and is back to its floor (it is throttled, and hungry again, if it needs it).
    clock[0] += 100 * 10**6
    _report(a, 180 * 10**6, 120 * 10**6)
    assert coord.tick()["a"] == {0: 30}


def test_a_tenant_throttled_a_moment_is_not_hungry(tmp_path: Path) -> None:
    """1 % of the interval throttled is under the 2 % that counts as wanting more."""
    a, f = _tenant(tmp_path, "a", 30), _tenant(tmp_path, "f", 40, FIXED)
    coord, clock = started([f, a])
    clock[0] += 100 * 10**6
    _report(a, 10 * 10**6, 1 * 10**6)
    assert coord.tick() == {"a": {0: 30}}  # a fixed-share tenant listed first: still a file


def test_throttling_alone_makes_a_tenant_hungry_for_that_interval(tmp_path: Path) -> None:
    # a uses 10 % of the card, well under its 30, but its bursts were throttled 10 % of
    # the interval: it is lent what b (idle) does not reserve. The next interval it is
    # not throttled again, and returns to its floor.
    a, b = _tenant(tmp_path, "a", 30), _tenant(tmp_path, "b", 50)
    coord, clock = started([a, b])
    clock[0] += 100 * 10**6
    _report(a, 10 * 10**6, 10 * 10**6)
    assert coord.tick()["a"] == {0: 95}
    clock[0] += 100 * 10**6
    _report(a, 20 * 10**6, 10 * 10**6)  # no new throttling
    assert coord.tick()["a"] == {0: 30}


def test_fixed_only_tenants_get_no_file(tmp_path: Path) -> None:
    f = _tenant(tmp_path, "f", 40, FIXED)
    _report(f, 0, 0)
    assert Coordinator(lambda: [f]).tick() == {}
    assert not f.allowance.exists()


def test_overlap_with_the_cards_utilisation_scales_allowances(tmp_path: Path) -> None:
    # Both tenants were charged 100 ms of 100 ms (their windows overlapped), but the card
    # was only 80% busy: k = 200 / 80 = 2.5, smoothed from 1 to 1.75 on the first tick.
    a, b = _tenant(tmp_path, "a", 30), _tenant(tmp_path, "b", 50)
    coord, clock = started([a, b], card_busy=lambda uuid: 80.0)
    clock[0] += 100 * 10**6
    _report(a, 100 * 10**6, 50 * 10**6)
    _report(b, 100 * 10**6, 50 * 10**6)
    got = coord.tick()
    # In real percent: both hungry, spare 20 split 30:50 -> 37 and 62; written times 1.75.
    assert got == {"a": {0: round(37 * 1.75)}, "b": {0: 100}}
    # Next: a charged 100 %, b 60 % and not throttled. k = 160 / 80 = 2, smoothed from
    # 1.75 to 1.875; b's real use, 60 / 1.875 = 32 %, is under its floor: b is not hungry
    # and is written its floor, scaled.
    clock[0] += 100 * 10**6
    _report(a, 200 * 10**6, 100 * 10**6)
    _report(b, 160 * 10**6, 50 * 10**6)
    assert coord.tick() == {"a": {0: 100}, "b": {0: round(50 * 1.875)}}


def test_without_utilisation_nothing_is_scaled(tmp_path: Path) -> None:
    a = _tenant(tmp_path, "a", 30)
    coord, clock = started([a], card_busy=lambda uuid: None)
    clock[0] += 100 * 10**6
    _report(a, 100 * 10**6, 50 * 10**6)
    assert coord.tick() == {"a": {0: 100}}


def test_overlap_asks_discovery_for_the_card_by_its_own_uuid(tmp_path: Path) -> None:
    # The real fake discovery looks cards up by their exact UUID, as NVML does
    # (nvmlDeviceGetHandleByUUID refuses "gpu-..."): a lower-cased lookup finds nothing,
    # k stays 1 and the allowances are not corrected.
    from tessera.model.clusterspec import make_cards
    from tessera.node.cards.fake import FakeDiscovery

    card = make_cards("n", 1, "A100")[0]
    assert card.uuid != card.uuid.lower()
    disc = FakeDiscovery((card,))
    disc.set_utilization(card.uuid, 80.0)
    tenants = []
    for name, floor in (("a", 30), ("b", 50)):
        d = tmp_path / name
        d.mkdir()
        limits = Limits(cards=(CardLimit(0, card.uuid, 1024, floor, BURST),))
        tenants.append(Tenant(name, limits, d / "region", d / "allowance"))
    a, b = tenants
    coord, clock = started([a, b], card_busy=disc.utilization)
    clock[0] += 100 * 10**6
    _report(a, 100 * 10**6, 50 * 10**6)
    _report(b, 100 * 10**6, 50 * 10**6)
    # The same figures as the test above, where card_busy answered 80 for any argument.
    assert coord.tick() == {"a": {0: round(37 * 1.75)}, "b": {0: 100}}
