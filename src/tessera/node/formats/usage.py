"""Reader of libvgpu's shared usage region (docs/protocol.md, "## libvgpu").

Every process of a container maps the region and writes its usage there; the node agent
and the burst-share coordinator read it without taking its lock (each field is an aligned
64-bit value written atomically, so it is read whole). ``encode_region`` writes the same
layout for fakes and tests; libvgpu is the only real writer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from tessera.errors import FormatError

__all__ = [
    "HEADER_SIZE",
    "MAGIC",
    "MAX_CARDS",
    "MAX_SLOTS",
    "REGION_SIZE",
    "SLOT_SIZE",
    "CardTotals",
    "CardUsage",
    "ProcessUsage",
    "RegionSnapshot",
    "decode_region",
    "encode_region",
    "read_region",
]

MAGIC = b"TSVGPU\x00\x01"
VERSION = 1
HEADER_SIZE = 4096
MAX_CARDS = 16
MAX_SLOTS = 64
SLOT_SIZE = 1024
REGION_SIZE = HEADER_SIZE + MAX_SLOTS * SLOT_SIZE  # 69,632 bytes

_HEADER = struct.Struct("<8s6IQ")  # magic, version, sizes..., reclaimed processes
_CARD_STATE = struct.Struct("<qQQQQQQQ")  # 64 bytes at 128 + 64 c
_SLOT_HEAD = struct.Struct("<IiQ")  # state, pid, start time
_CARD_REC = struct.Struct("<6Q")  # 48 bytes at slot + 32 + 48 c
_SLOT_LIVE = 1
_WHAT = "usage region"


@dataclass(frozen=True, slots=True)
class CardUsage:
    """One process's use of one card."""

    memory_bytes: int = 0
    launches: int = 0
    throttled_ns: int = 0
    refused_allocs: int = 0
    busy_ns: int = 0
    peak_memory_bytes: int = 0


_UNUSED = CardUsage()


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """A live process of the container (pid as seen inside the container)."""

    slot: int
    pid: int
    start_time: int
    cards: tuple[CardUsage, ...]


@dataclass(frozen=True, slots=True)
class CardTotals:
    """The container's use of one card: memory of live processes; counters since start
    (processes that exited or died included)."""

    memory_bytes: int = 0
    launches: int = 0
    throttled_ns: int = 0
    refused_allocs: int = 0
    busy_ns: int = 0
    reclaimed_bytes: int = 0


@dataclass(frozen=True, slots=True)
class RegionSnapshot:
    """What the region said when read. ``cards`` has MAX_CARDS entries, by ordinal."""

    processes: tuple[ProcessUsage, ...] = ()
    cards: tuple[CardTotals, ...] = field(default=tuple(CardTotals() for _ in range(MAX_CARDS)))
    reclaimed_processes: int = 0


def decode_region(data: bytes) -> RegionSnapshot:
    """Decode a region's bytes. All-zero (not yet initialised) is an empty snapshot."""
    if len(data) < REGION_SIZE:
        if not data.strip(b"\x00"):
            return RegionSnapshot()
        raise FormatError(
            _WHAT, f"{len(data)} bytes; a v{VERSION} region has {REGION_SIZE}", "truncated"
        )
    magic, version, header_size, max_cards, max_slots, slot_size, rec_size, reclaimed = (
        _HEADER.unpack_from(data, 0)
    )
    if magic == b"\x00" * 8:
        return RegionSnapshot()
    if magic != MAGIC:
        raise FormatError(_WHAT, f"bad magic {magic!r}", "bad_magic")
    if version != VERSION:
        raise FormatError(
            _WHAT,
            f"unknown version {version}; this Tessera reads v{VERSION}",
            "unknown_version",
        )
    got = (header_size, max_cards, max_slots, slot_size, rec_size)
    want = (HEADER_SIZE, MAX_CARDS, MAX_SLOTS, SLOT_SIZE, _CARD_REC.size)
    if got != want:
        raise FormatError(_WHAT, f"layout {got} is not the v1 layout {want}", "layout")

    processes = []
    live_sum = [[0] * 5 for _ in range(MAX_CARDS)]  # memory, launches, throttled, refused, busy
    for s in range(MAX_SLOTS):
        base = HEADER_SIZE + s * SLOT_SIZE
        state, pid, start = _SLOT_HEAD.unpack_from(data, base)
        if state != _SLOT_LIVE:
            continue
        cards = []
        records = data[base + 32 : base + 32 + MAX_CARDS * _CARD_REC.size]
        for c, rec in enumerate(_CARD_REC.iter_unpack(records)):
            if not any(rec):  # most processes use one card of the sixteen
                cards.append(_UNUSED)
                continue
            cards.append(CardUsage(*rec))
            acc = live_sum[c]
            for i in range(5):  # memory, launches, throttled, refused, busy (not peak)
                acc[i] += rec[i]
        processes.append(ProcessUsage(s, pid, start, tuple(cards)))

    totals = []
    for c in range(MAX_CARDS):
        _tok, _refill, reclaimed_b, r_launch, r_thr, r_ref, r_busy, _until = (
            _CARD_STATE.unpack_from(data, 128 + c * _CARD_STATE.size)
        )
        mem, launches, throttled, refused, busy = live_sum[c]
        totals.append(
            CardTotals(
                memory_bytes=mem,
                launches=r_launch + launches,
                throttled_ns=r_thr + throttled,
                refused_allocs=r_ref + refused,
                busy_ns=r_busy + busy,
                reclaimed_bytes=reclaimed_b,
            )
        )
    return RegionSnapshot(tuple(processes), tuple(totals), reclaimed)


def read_region(path: str | Path) -> RegionSnapshot:
    """Read the region file at ``path``; a missing file is an empty snapshot."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return RegionSnapshot()
    return decode_region(data)


def encode_region(
    processes: tuple[ProcessUsage, ...] = (),
    retired: tuple[CardTotals, ...] = (),
    reclaimed_processes: int = 0,
) -> bytes:
    """A region with these live processes and, per card, retired counters (memory ignored).

    For fakes and tests only: libvgpu is the real writer.
    """
    buf = bytearray(REGION_SIZE)
    _HEADER.pack_into(
        buf,
        0,
        MAGIC,
        VERSION,
        HEADER_SIZE,
        MAX_CARDS,
        MAX_SLOTS,
        SLOT_SIZE,
        _CARD_REC.size,
        reclaimed_processes,
    )
    for c, t in enumerate(retired):
        _CARD_STATE.pack_into(
            buf,
            128 + c * _CARD_STATE.size,
            0,
            0,
            t.reclaimed_bytes,
            t.launches,
            t.throttled_ns,
            t.refused_allocs,
            t.busy_ns,
            0,
        )
    for p in processes:
        base = HEADER_SIZE + p.slot * SLOT_SIZE
        _SLOT_HEAD.pack_into(buf, base, _SLOT_LIVE, p.pid, p.start_time)
        for c, u in enumerate(p.cards):
            _CARD_REC.pack_into(
                buf,
                base + 32 + c * _CARD_REC.size,
                u.memory_bytes,
                u.launches,
                u.throttled_ns,
                u.refused_allocs,
                u.busy_ns,
                u.peak_memory_bytes,
            )
    return bytes(buf)
