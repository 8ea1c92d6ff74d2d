"""What an allocated ResourceClaim holds per card model, for the GpuQuota (pure).

A claim counts like a pod on the extender path: per card, the memory it consumed and its
compute share; a card whose whole memory it took is a whole card (all its memory, 100
percent-points and one card), since nothing else can be given that card. The allocation
is read by the node agent's own strict reader (``claim_grant``), pool by pool, with the
cards each pool's ResourceSlice publishes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tessera.claims.allocation import allocated_pools, claim_grant
from tessera.errors import SpecError
from tessera.model.types import Card
from tessera.quota.usage import Usage

__all__ = ["CLAIM_HOLDER", "claim_holding", "claim_key"]

CLAIM_HOLDER = "claim/"  # how a claim is named among a quota's holders (pods have no '/')


def claim_key(namespace: str, name: str) -> str:
    """A claim's key in ``QuotaUsage``, beside its pods' ``<namespace>/<name>``."""
    return f"{namespace}/{CLAIM_HOLDER}{name}"


def claim_holding(
    claim: Mapping[str, object], cards_of: Callable[[str], Mapping[str, Card] | None]
) -> dict[str, Usage]:
    """Per card model, what ``claim``'s allocation holds of this driver's cards (empty
    when it is not allocated on them). ``cards_of(pool)``: the pool's cards by device
    name, None when its slice is not known. Raises SpecError naming the field for a
    device no slice offers or an allocation that does not read."""
    out: dict[str, Usage] = {}
    for pool in sorted(allocated_pools(claim)):
        cards = cards_of(pool)
        if cards is None:
            raise SpecError("status.allocation.devices.results", f"pool {pool} has no known slice")
        by_uuid = {c.uuid: c for c in cards.values()}
        grant = claim_grant(claim, pool, cards)
        for s in grant.assignment.slices:
            card = by_uuid[s.uuid]
            if s.memory_mib >= card.memory_mib:
                used = Usage(card.memory_mib, 100, 1)
            else:
                used = Usage(s.memory_mib, s.cores_percent, 0)
            out[card.model] = out.get(card.model, Usage()) + used
    return out
