"""The usage region reader, on bytes laid out as docs/protocol.md says.

tests/integration/test_libvgpu.py reads a region written by the real C library too.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from tessera.errors import FormatError
from tessera.node.formats.usage import (
    MAGIC,
    REGION_SIZE,
    CardTotals,
    CardUsage,
    ProcessUsage,
    RegionSnapshot,
    decode_region,
    encode_region,
    read_region,
)


def _cards(**by_ordinal: CardUsage) -> tuple[CardUsage, ...]:
    cards = [CardUsage()] * 16
    for k, v in by_ordinal.items():
        cards[int(k[1:])] = v
    return tuple(cards)


def test_size_and_magic_are_the_documented_ones() -> None:
    assert REGION_SIZE == 69632
    assert bytes([0x54, 0x53, 0x56, 0x47, 0x50, 0x55, 0x00, 0x01]) == MAGIC


def test_empty_and_missing_regions_are_empty(tmp_path: Path) -> None:
    assert read_region(tmp_path / "absent") == RegionSnapshot()
    assert decode_region(b"") == RegionSnapshot()
    assert decode_region(bytes(REGION_SIZE)) == RegionSnapshot()


def test_byte_offsets() -> None:
    data = bytearray(encode_region())
    # slot 3, live, pid 77; card 2: 5 MiB used, 9 launches (offsets from the protocol table)
    base = 4096 + 3 * 1024
    struct.pack_into("<Ii", data, base, 1, 77)
    struct.pack_into("<QQ", data, base + 32 + 2 * 48, 5 << 20, 9)
    # card 2's container state: 1 MiB reclaimed, 4 retired launches
    struct.pack_into("<QQ", data, 128 + 2 * 64 + 16, 1 << 20, 4)
    snap = decode_region(bytes(data))
    (p,) = snap.processes
    assert (p.slot, p.pid, p.cards[2].memory_bytes, p.cards[2].launches) == (3, 77, 5 << 20, 9)
    assert snap.cards[2] == CardTotals(memory_bytes=5 << 20, launches=13, reclaimed_bytes=1 << 20)


def test_round_trip_and_totals() -> None:
    procs = (
        ProcessUsage(0, 10, 1234, _cards(c0=CardUsage(100, 5, 7, 1, 50, 200))),
        ProcessUsage(
            9, 11, 1300, _cards(c0=CardUsage(20, 1, 0, 0, 0, 20), c3=CardUsage(1, 2, 3, 4, 5, 6))
        ),
    )
    retired = tuple(
        CardTotals(launches=1000, busy_ns=9, reclaimed_bytes=64) if c == 0 else CardTotals()
        for c in range(16)
    )
    snap = decode_region(encode_region(procs, retired, reclaimed_processes=2))
    assert snap.processes == procs
    assert snap.reclaimed_processes == 2
    assert snap.cards[0] == CardTotals(120, 1006, 7, 1, 59, 64)
    assert snap.cards[3] == CardTotals(1, 2, 3, 4, 5, 0)
    assert snap.cards[1] == CardTotals()


def test_free_slots_are_not_processes() -> None:
    data = bytearray(encode_region((ProcessUsage(5, 42, 1, _cards()),)))
    struct.pack_into("<I", data, 4096 + 5 * 1024, 0)  # the slot was retired
    assert decode_region(bytes(data)).processes == ()


@pytest.mark.parametrize(
    ("mutate", "message", "kind"),
    [
        (lambda d: d.__setitem__(slice(0, 8), b"XXXXXXXX"), "bad magic b'XXXXXXXX'", "bad_magic"),
        (lambda d: struct.pack_into("<I", d, 8, 2),
         "unknown version 2; this Tessera reads v1", "unknown_version"),
        (lambda d: struct.pack_into("<I", d, 20, 32),
         "layout (4096, 16, 32, 1024, 48) is not the v1 layout (4096, 16, 64, 1024, 48)",
         "layout"),
    ],
)  # fmt: skip
def test_bad_regions_are_refused(
    mutate: Callable[[bytearray], object], message: str, kind: str
) -> None:
    data = bytearray(encode_region())
    mutate(data)
    with pytest.raises(FormatError) as refused:
        decode_region(bytes(data))
    # The exporter labels the container with the kind (tessera_container_unreadable).
    assert (str(refused.value), refused.value.kind) == (f"usage region: {message}", kind)


@pytest.mark.parametrize("short", [encode_region()[:1000], b" " * 10, b"X" * 10])
def test_a_short_region_that_is_not_all_zero_is_truncated(short: bytes) -> None:
    with pytest.raises(FormatError) as refused:
        decode_region(short)
    assert (str(refused.value), refused.value.kind) == (
        f"usage region: {len(short)} bytes; a v1 region has 69632", "truncated"
    )  # fmt: skip


def test_a_region_file_reads_as_its_bytes_decode(tmp_path: Path) -> None:
    procs = (ProcessUsage(2, 7, 99, _cards(c0=CardUsage(memory_bytes=1 << 20))),)
    (tmp_path / "region").write_bytes(encode_region(procs))
    assert read_region(tmp_path / "region").processes == procs
    assert decode_region(encode_region()).reclaimed_processes == 0  # the writer's default
