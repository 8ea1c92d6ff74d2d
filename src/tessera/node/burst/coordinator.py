"""The burst-share coordinator: who may use a card's idle compute, decided per card.

Every tick it reads each tenant's usage region, decides per physical card (``decide``, a
pure function) and writes each tenant's allowance file (docs/protocol.md, "## libvgpu").
libvgpu in the tenant holds its burst-share cards to that allowance, never below the
tenant's floor, and falls back to the floor when the file is older than 3 s.

The rule, per card:

* ``fixed-share`` tenants reserve their share; ``best-effort`` tenants are not managed
  (no cap, no floor).
* a ``burst-share`` tenant is *hungry* when it was throttled in the last interval or used
  (nearly) all of its allowance: it reserves its floor and asks for more.
* a burst-share tenant that is not hungry reserves what it uses plus ``headroom`` (up to
  its floor), so its unused floor can be lent out; as soon as it uses most of that
  reservation, it reserves its whole floor again. Lent compute is therefore given back
  within one tick (plus libvgpu's 50 ms allowance poll).
* what is left of 100% is split between the hungry tenants in proportion to their floors.

Under contention libvgpu charges each tenant the GPU time of its measurement windows, which
includes the other tenants' time slices, so tenants are charged more than they use. Given
the card's real utilisation (``card_busy``: NVML's ``nvmlDeviceGetUtilizationRates`` on a
node), the coordinator estimates that overlap, k = Σ charged / utilisation, decides in
real percent (each tenant's charged use divided by k) and writes allowances multiplied by
k, so that what libvgpu charges matches what the coordinator meant.

A tenant whose usage region cannot be read or does not decode (a container may write
anything into its own region, at any moment) is skipped for that tick with a warning:
its allowance file is not rewritten, so libvgpu falls back to its floor once the file is
3 s old, and the other tenants are decided as usual.

The node agent hosts the loop (``Coordinator.run``); tests drive ``tick`` directly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tessera.errors import FormatError
from tessera.model.types import ComputePolicy
from tessera.node.formats.allowance import write_allowance
from tessera.node.formats.limits import Limits
from tessera.node.formats.usage import CardTotals, read_region

__all__ = [
    "Coordinator",
    "Tenant",
    "TenantCard",
    "decide",
]

log = logging.getLogger(__name__)

HEADROOM = 5  # percent a lender keeps above what it uses
SATURATED = 0.8  # using this fraction of its reservation means it wants its floor back
HUNGRY_THROTTLED = 0.02  # throttled this fraction of the interval: wants more
MAX_OVERLAP = 4.0  # never scale allowances by more than this


@dataclass(frozen=True, slots=True)
class TenantCard:
    """One tenant on one card, as the coordinator saw it over the last interval.

    ``used`` and ``throttled`` are fractions of the interval in percent (0..100);
    ``allowance`` and ``reserved`` are what the previous tick decided (initially the floor).
    """

    tenant: str
    policy: ComputePolicy
    floor: int
    used: float = 0.0
    throttled: float = 0.0
    allowance: int = 0
    reserved: int = 0


@dataclass(frozen=True, slots=True)
class Decision:
    allowance: int
    reserved: int


def _hungry(t: TenantCard) -> bool:
    return t.throttled >= HUNGRY_THROTTLED * 100 or t.used >= max(t.allowance, t.floor) - HEADROOM


def decide(card: Sequence[TenantCard]) -> dict[str, Decision]:
    """Allowance and reservation of every fixed- and burst-share tenant on one card."""
    out: dict[str, Decision] = {}
    hungry: list[TenantCard] = []
    reserved_total = 0
    for t in card:
        if t.policy is ComputePolicy.FIXED_SHARE:
            reserved = t.floor
        elif t.policy is ComputePolicy.BEST_EFFORT:
            continue
        elif _hungry(t):
            hungry.append(t)
            reserved = t.floor
        elif t.used >= SATURATED * t.reserved and t.used >= 1.0:
            reserved = t.floor  # ramping up: give its floor back now
        else:
            reserved = min(t.floor, int(t.used) + HEADROOM)
        out[t.tenant] = Decision(allowance=t.floor, reserved=reserved)
        reserved_total += reserved
    spare = max(0, 100 - reserved_total)
    weights = sum(t.floor for t in hungry)
    for t in hungry:
        extra = spare * t.floor // weights if weights else 0
        out[t.tenant] = Decision(allowance=min(100, t.floor + extra), reserved=t.floor)
    return out


@dataclass(frozen=True, slots=True)
class Tenant:
    """A container the coordinator manages: its limits and where its files are on the host."""

    name: str
    limits: Limits
    region: Path
    allowance: Path


@dataclass(slots=True)
class _Seen:
    busy_ns: int
    throttled_ns: int
    at_ns: int
    allowance: int
    reserved: int


class Coordinator:
    """Reads usage, decides per card, writes allowances. ``tenants`` is called every tick."""

    def __init__(
        self,
        tenants: Callable[[], Iterable[Tenant]],
        *,
        card_busy: Callable[[str], float | None] | None = None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self._tenants = tenants
        self._card_busy = card_busy
        self._clock_ns = clock_ns
        self._wall_ms = wall_ms
        self._seen: dict[tuple[str, int], _Seen] = {}
        self._overlap: dict[str, float] = {}
        self._unreadable: set[str] = set()  # tenants warned about, until they read again

    def _totals(self, tenant: Tenant) -> tuple[CardTotals, ...] | None:
        """The tenant's per-card counters, or None (warned once) when its region is bad."""
        try:
            totals = read_region(tenant.region).cards
        except (OSError, FormatError) as exc:
            if tenant.name not in self._unreadable:
                self._unreadable.add(tenant.name)
                log.warning("coordinator skips tenant %s: usage region: %s", tenant.name, exc)
            return None
        self._unreadable.discard(tenant.name)
        return totals

    def _overlap_of(self, uuid: str, charged: float) -> float:
        """Smoothed k = charged / utilisation of a card (1 without a utilisation source)."""
        busy = self._card_busy(uuid) if self._card_busy is not None else None
        k = self._overlap.get(uuid, 1.0)
        if busy is not None and busy >= 5.0:
            measured = min(MAX_OVERLAP, max(1.0, charged / busy))
            k = 0.5 * k + 0.5 * measured
        self._overlap[uuid] = k
        return k

    def tick(self) -> dict[str, dict[int, int]]:
        """One round; returns the allowances written, by tenant and card ordinal."""
        now = self._clock_ns()
        # Tenants name a card by its UUID as the limits file spells it; two spellings of
        # one card (case) are one card, but NVML looks the UUID up exactly as written.
        by_card: dict[str, list[tuple[Tenant, int, TenantCard]]] = {}
        spelled: dict[str, str] = {}
        live: set[tuple[str, int]] = set()
        for tenant in self._tenants():
            totals = self._totals(tenant)
            for card in tenant.limits.cards:
                key = (tenant.name, card.ordinal)
                live.add(key)  # an unreadable tenant keeps its counters for the next tick
                if totals is None:
                    continue
                t = totals[card.ordinal]
                prev = self._seen.get(key)
                if prev is None:
                    prev = _Seen(
                        t.busy_ns, t.throttled_ns, now, card.cores_percent, card.cores_percent
                    )
                dt = max(1, now - prev.at_ns)
                tc = TenantCard(
                    tenant=tenant.name,
                    policy=card.policy,
                    floor=card.cores_percent,
                    used=min(100.0, 100.0 * max(0, t.busy_ns - prev.busy_ns) / dt),
                    throttled=min(100.0, 100.0 * max(0, t.throttled_ns - prev.throttled_ns) / dt),
                    allowance=prev.allowance,
                    reserved=prev.reserved,
                )
                self._seen[key] = _Seen(
                    t.busy_ns, t.throttled_ns, now, prev.allowance, prev.reserved
                )
                by_card.setdefault(card.uuid.lower(), []).append((tenant, card.ordinal, tc))
                spelled.setdefault(card.uuid.lower(), card.uuid)
        for key in set(self._seen) - live:
            del self._seen[key]
        self._unreadable &= {name for name, _ in live}

        written: dict[str, dict[int, int]] = {}
        files: dict[str, tuple[Tenant, dict[int, int]]] = {}
        for uuid, entries in by_card.items():
            k = self._overlap_of(spelled[uuid], sum(tc.used for _, _, tc in entries))
            decisions = decide([replace(tc, used=tc.used / k) for _, _, tc in entries])
            for tenant, ordinal, tc in entries:
                d = decisions.get(tc.tenant)
                if d is None or tc.policy is not ComputePolicy.BURST_SHARE:
                    continue
                seen = self._seen[(tenant.name, ordinal)]
                seen.allowance, seen.reserved = d.allowance, d.reserved
                charged = min(100, round(d.allowance * k))
                files.setdefault(tenant.name, (tenant, {}))[1][ordinal] = charged
        stamp = self._wall_ms()
        for name, (tenant, percent) in files.items():
            write_allowance(tenant.allowance, percent, stamp)
            written[name] = percent
        return written

    def run(self, stop: threading.Event, period_s: float = 0.1) -> None:
        """Tick every ``period_s`` until ``stop`` is set."""
        while not stop.is_set():
            self.tick()
            stop.wait(period_s)
