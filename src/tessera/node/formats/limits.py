"""The per-container limits file that libvgpu reads (docs/protocol.md, "## libvgpu").

The node agent writes it once per container and mounts it read-only at ``LIMITS_PATH``.
The format is line-oriented ``key=value`` so the C library parses it without a JSON
parser; this module is the only Python code that knows it, and also owns the shared
line syntax used by the allowance file (``parse_lines``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tessera.errors import FormatError
from tessera.model.types import ComputePolicy, ContainerAssignment

__all__ = [
    "ALLOWANCE_PATH",
    "LIMITS_PATH",
    "MAX_CARDS",
    "REGION_PATH",
    "VERSION",
    "CardLimit",
    "Limits",
    "LimitsFiles",
    "decode_limits",
    "encode_limits",
    "limits_for",
    "parse_int",
    "parse_lines",
]

VERSION = 1
MAX_CARDS = 16  # also VG_MAX_CARDS in libvgpu/include/vg_protocol.h
LIMITS_PATH = "/etc/tessera/limits"  # compiled into libvgpu; mounted read-only
REGION_PATH = "/var/run/tessera/usage/region"
ALLOWANCE_PATH = "/var/run/tessera/allowance/allowance"
MAX_CONTEXT_MIB = 1 << 20  # libvgpu's bound for context_mib

_UUID = re.compile(
    r"^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
_INT = re.compile(r"^[0-9]{1,18}$")
_WHAT = "limits file"


@dataclass(frozen=True, slots=True)
class CardLimit:
    """One card as the container sees it: its ordinal, UUID and slice."""

    ordinal: int
    uuid: str
    memory_mib: int
    cores_percent: int
    policy: ComputePolicy


@dataclass(frozen=True, slots=True)
class Limits:
    """Everything libvgpu needs to enforce a container's slices."""

    cards: tuple[CardLimit, ...]
    region: str = REGION_PATH
    allowance: str = ALLOWANCE_PATH
    context_mib: int = 0  # charged against a card's cap for each CUDA context on it


def parse_lines(what: str, text: str) -> dict[str, str]:
    """Split the shared ``key=value`` syntax into a dict, checking ``version`` comes first.

    Blank lines and ``#`` comments are skipped; a duplicate key, a line without ``=`` or a
    ``\\r`` is a FormatError naming ``what`` and the line number.
    """
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line or line.startswith("#"):
            continue
        if "\r" in line:
            raise FormatError(what, f"line {lineno}: carriage return; lines end with \\n only")
        key, sep, value = line.partition("=")
        if not sep or not key:
            raise FormatError(what, f"line {lineno}: expected key=value, got {line!r}")
        if key in out:
            raise FormatError(what, f"line {lineno}: key {key!r} given twice")
        if not out and key != "version":
            raise FormatError(what, f"line {lineno}: the first key must be 'version', got {key!r}")
        out[key] = value
    if "version" not in out:
        raise FormatError(what, "empty: missing 'version'")
    if out["version"] != str(VERSION):
        raise FormatError(
            what, f"unknown version {out['version']!r}; this Tessera reads v{VERSION}"
        )
    return out


def parse_int(what: str, key: str, value: str, lo: int, hi: int) -> int:
    """A decimal integer in ``lo..hi`` (no sign, at most 18 digits), else FormatError."""
    if not _INT.match(value):
        raise FormatError(what, f"{key}: not a decimal integer: {value!r}")
    n = int(value)
    if not lo <= n <= hi:
        raise FormatError(what, f"{key}: {n} is outside {lo}..{hi}")
    return n


def _check(limits: Limits) -> None:
    if not 1 <= len(limits.cards) <= MAX_CARDS:
        raise FormatError(_WHAT, f"cards: need 1..{MAX_CARDS} cards, got {len(limits.cards)}")
    for path_key, path in (("region", limits.region), ("allowance", limits.allowance)):
        if not path.startswith("/") or "\n" in path:
            raise FormatError(_WHAT, f"{path_key}: must be an absolute path on one line")
    if not 0 <= limits.context_mib <= MAX_CONTEXT_MIB:
        raise FormatError(
            _WHAT, f"context_mib: must be 0..{MAX_CONTEXT_MIB}, got {limits.context_mib}"
        )
    seen: set[str] = set()
    for i, c in enumerate(limits.cards):
        key = f"card.{i}"
        if c.ordinal != i:
            raise FormatError(_WHAT, f"{key}: ordinal {c.ordinal} out of order; cards run 0..n-1")
        if not _UUID.match(c.uuid):
            raise FormatError(_WHAT, f"{key}.uuid: not a GPU UUID: {c.uuid!r}")
        if c.uuid.lower() in seen:
            raise FormatError(_WHAT, f"{key}.uuid: {c.uuid} listed twice")
        seen.add(c.uuid.lower())
        if c.memory_mib < 1:
            raise FormatError(_WHAT, f"{key}.memory_mib: must be >= 1, got {c.memory_mib}")
        if not 0 <= c.cores_percent <= 100:
            raise FormatError(_WHAT, f"{key}.cores_percent: must be 0..100, got {c.cores_percent}")
        if c.policy is not ComputePolicy.BEST_EFFORT and c.cores_percent < 1:
            raise FormatError(_WHAT, f"{key}.cores_percent: {c.policy} needs 1..100, got 0")


def encode_limits(limits: Limits) -> str:
    """The file's text. Raises FormatError if ``limits`` breaks a rule of the format."""
    _check(limits)
    lines = [
        "# written by the tessera node agent; read-only in the container",
        f"version={VERSION}",
        f"region={limits.region}",
        f"allowance={limits.allowance}",
        f"cards={len(limits.cards)}",
    ]
    if limits.context_mib:
        lines.append(f"context_mib={limits.context_mib}")
    for c in limits.cards:
        p = f"card.{c.ordinal}."
        lines += [
            f"{p}uuid={c.uuid}",
            f"{p}memory_mib={c.memory_mib}",
            f"{p}cores_percent={c.cores_percent}",
            f"{p}policy={c.policy.value}",
        ]
    return "\n".join(lines) + "\n"


def decode_limits(text: str) -> Limits:
    """Parse the file's text; FormatError names the key and the rule on bad input."""
    kv = parse_lines(_WHAT, text)

    def need(key: str) -> str:
        if key not in kv:
            raise FormatError(_WHAT, f"missing key {key!r}")
        return kv[key]

    n = parse_int(_WHAT, "cards", need("cards"), 1, MAX_CARDS)
    cards = []
    for i in range(n):
        p = f"card.{i}."
        policy_text = need(p + "policy")
        try:
            policy = ComputePolicy(policy_text)
        except ValueError:
            allowed = ", ".join(x.value for x in ComputePolicy)
            raise FormatError(
                _WHAT, f"{p}policy: {policy_text!r} is not one of {allowed}"
            ) from None
        cards.append(
            CardLimit(
                ordinal=i,
                uuid=need(p + "uuid"),
                memory_mib=parse_int(_WHAT, p + "memory_mib", need(p + "memory_mib"), 1, 1 << 40),
                cores_percent=parse_int(
                    _WHAT, p + "cores_percent", need(p + "cores_percent"), 0, 100
                ),
                policy=policy,
            )
        )
    has_burst = any(c.policy is ComputePolicy.BURST_SHARE for c in cards)
    allowance = kv.get("allowance")
    if allowance is None and has_burst:
        raise FormatError(_WHAT, "missing key 'allowance' (a card is burst-share)")
    limits = Limits(
        cards=tuple(cards),
        region=need("region"),
        allowance=allowance if allowance is not None else ALLOWANCE_PATH,
        context_mib=parse_int(_WHAT, "context_mib", kv.get("context_mib", "0"), 0, MAX_CONTEXT_MIB),
    )
    _check(limits)
    return limits


def limits_for(
    assignment: ContainerAssignment,
    *,
    card_order: Iterable[str] | None = None,
    region: str = REGION_PATH,
    allowance: str = ALLOWANCE_PATH,
    context_mib: int = 0,
) -> Limits:
    """The limits of one container from its assignment.

    ``card_order`` is the order of UUIDs the node agent exposes to the container (its
    ``NVIDIA_VISIBLE_DEVICES``), which fixes the ordinals; by default the assignment's
    order. An exclusive container gets its full slices at 100% compute with no throttling
    (``fixed-share`` at 100 never throttles).
    """
    by_uuid = {s.uuid: s for s in assignment.slices}
    order = list(card_order) if card_order is not None else list(by_uuid)
    if sorted(order) != sorted(by_uuid):
        raise FormatError(
            _WHAT, f"card_order {order} is not the assignment's cards {list(by_uuid)}"
        )
    policy = assignment.policy
    cards = []
    for i, uuid in enumerate(order):
        s = by_uuid[uuid]
        cores = 100 if assignment.exclusive else s.cores_percent
        card_policy = ComputePolicy.FIXED_SHARE if assignment.exclusive else policy
        if card_policy is ComputePolicy.BEST_EFFORT:
            cores = 0
        elif cores == 0:
            # No compute reserved on this card: nothing to cap or guarantee.
            card_policy = ComputePolicy.BEST_EFFORT
        cards.append(CardLimit(i, uuid, s.memory_mib, cores, card_policy))
    limits = Limits(cards=tuple(cards), region=region, allowance=allowance, context_mib=context_mib)
    _check(limits)
    return limits


class LimitsFiles:
    """Limits files read through a cache: a file is parsed again only when its mtime
    changes (PreStartContainer may correct it). Not thread-safe: one per reader."""

    def __init__(self) -> None:
        self._cache: dict[Path, tuple[int, Limits]] = {}

    def read(self, path: Path) -> Limits:
        """The file's limits; OSError or FormatError (naming the key and rule) if not."""
        mtime = path.stat().st_mtime_ns
        cached = self._cache.get(path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        limits = decode_limits(path.read_text())
        self._cache[path] = (mtime, limits)
        return limits

    def keep_only(self, paths: Iterable[Path]) -> None:
        """Forget the files not in ``paths`` (allocations that are gone)."""
        keep = set(paths)
        for gone in set(self._cache) - keep:
            del self._cache[gone]
