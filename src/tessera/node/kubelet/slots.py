"""Slot devices: what the device plugin advertises to kubelet.

Each card is advertised as ``slots_per_card`` devices with IDs ``<card UUID>::<k>``
(``k`` = 0..slots-1, decimal). A container asking for ``tessera.io/gpu: N`` receives N
slots, one on each of its N cards; the slot count bounds how many containers share a
card. kubelet never gives one slot to two live containers, so a set of slot IDs names
one container's allocation for as long as that container lives (docs/node-agent.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from tessera.errors import FormatError

__all__ = ["MAX_ID_LEN", "SEPARATOR", "cards_of", "parse_slot", "slot_id", "slot_ids"]

SEPARATOR = "::"
MAX_ID_LEN = 63  # Device.ID's limit, as v1beta1/api.proto states it (kubelet does not check)


def slot_id(uuid: str, k: int) -> str:
    sid = f"{uuid}{SEPARATOR}{k}"
    if len(sid) > MAX_ID_LEN:
        raise FormatError("slot id", f"{sid!r} is longer than {MAX_ID_LEN} characters")
    return sid


def slot_ids(uuid: str, slots: int) -> list[str]:
    return [slot_id(uuid, k) for k in range(slots)]


def parse_slot(sid: str) -> tuple[str, int]:
    """``(card UUID, k)`` of a slot ID; FormatError when it is not one of ours."""
    uuid, sep, k = sid.rpartition(SEPARATOR)
    if not sep or not uuid or not k.isdigit():
        raise FormatError("device id", f"{sid!r} is not a Tessera slot (<card-uuid>::<n>)")
    return uuid, int(k)


def cards_of(ids: Iterable[str]) -> list[str]:
    """The card UUIDs of slot ``ids`` in first-seen order (FormatError on a foreign ID)."""
    seen: dict[str, None] = {}
    for sid in ids:
        seen.setdefault(parse_slot(sid)[0], None)
    return list(seen)
