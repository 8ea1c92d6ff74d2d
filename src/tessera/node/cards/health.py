"""Card health: XID events take a card out, a quiet period and a probe bring it back.

Pure state; the agent feeds it events and calls ``tick`` (clock and probe injected).

When a card goes Unhealthy: on a *critical* XID (every XID except those an application
causes on its own context: 13, 31, 43, 45, 68, 109 by default, the same exclusions the
NVIDIA device plugin makes), or when the probe fails.

When it "clears": ``recovery_s`` seconds have passed since the last critical XID or
failed probe on that card, **and** a probe succeeds at that moment. A card that keeps
failing stays out; one that is quiet and answers comes back without anyone restarting
the agent (the NVIDIA plugin never brings a card back).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["APPLICATION_XIDS", "CardHealth", "HealthTracker"]

# XIDs caused by an application on its own context; the card itself is fine.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(slots=True)
class CardHealth:
    healthy: bool = True
    reason: str = ""
    last_fault: float = float("-inf")


class HealthTracker:
    def __init__(
        self,
        uuids: Iterable[str],
        recovery_s: float = 30.0,
        ignored_xids: frozenset[int] = APPLICATION_XIDS,
    ) -> None:
        self.recovery_s = recovery_s
        self.ignored_xids = ignored_xids
        self._cards = {u: CardHealth() for u in uuids}

    def healthy(self, uuid: str) -> bool:
        c = self._cards.get(uuid)
        return c is not None and c.healthy

    def reason(self, uuid: str) -> str:
        c = self._cards.get(uuid)
        return "" if c is None else c.reason

    def snapshot(self) -> dict[str, bool]:
        return {u: c.healthy for u, c in self._cards.items()}

    def is_critical(self, xid: int) -> bool:
        return xid not in self.ignored_xids

    def on_xid(self, uuid: str, xid: int, now: float) -> bool:
        """Record an XID; True when the card just went Unhealthy."""
        c = self._cards.get(uuid)
        if c is None or not self.is_critical(xid):
            return False
        return self._fault(c, f"XID {xid}", now)

    def on_probe_failure(self, uuid: str, now: float) -> bool:
        c = self._cards.get(uuid)
        if c is None:
            return False
        return self._fault(c, "probe failed", now)

    def _fault(self, c: CardHealth, reason: str, now: float) -> bool:
        was = c.healthy
        c.healthy = False
        c.reason = reason
        c.last_fault = now
        return was

    def tick(self, now: float, probe: Callable[[str], bool]) -> set[str]:
        """Probe every card; return the UUIDs whose health changed (either way)."""
        changed: set[str] = set()
        for uuid, c in self._cards.items():
            ok = probe(uuid)
            if c.healthy:
                if not ok and self.on_probe_failure(uuid, now):
                    changed.add(uuid)
                continue
            if not ok:
                c.last_fault = now  # still failing: the quiet period starts again
                continue
            if now - c.last_fault >= self.recovery_s:
                c.healthy = True
                c.reason = ""
                changed.add(uuid)
        return changed
