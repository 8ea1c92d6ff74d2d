from __future__ import annotations

import pytest

from tessera.errors import FormatError
from tessera.model.clusterspec import card_uuid
from tessera.node.kubelet.slots import MAX_ID_LEN, cards_of, parse_slot, slot_id, slot_ids

U = card_uuid("n", 0)


def test_slot_ids_round_trip_and_fit_the_api_limit() -> None:
    ids = slot_ids(U, 100)
    assert ids[0] == f"{U}::0" and ids[99] == f"{U}::99"
    assert all(len(i) <= MAX_ID_LEN for i in ids)
    assert [parse_slot(i) for i in ids[:3]] == [(U, 0), (U, 1), (U, 2)]


@pytest.mark.parametrize("bad", ["nvidia0", f"{U}::", f"{U}::x", "::3", f"{U}:3"])
def test_foreign_ids_are_refused_with_their_name(bad: str) -> None:
    with pytest.raises(FormatError) as refused:
        parse_slot(bad)
    assert str(refused.value) == f"device id: {bad!r} is not a Tessera slot (<card-uuid>::<n>)"


def test_cards_of_keeps_first_seen_order() -> None:
    v = card_uuid("n", 1)
    assert cards_of([f"{v}::2", f"{U}::0", f"{v}::3"]) == [v, U]


def test_too_long_id_is_refused() -> None:
    with pytest.raises(FormatError) as refused:
        slot_id("GPU-" + "x" * 60, 1)
    assert (
        str(refused.value) == f"slot id: {'GPU-' + 'x' * 60 + '::1'!r} is longer than 63 characters"
    )
    assert len(slot_id("GPU-" + "x" * 56, 1)) == 63  # at the limit: taken
