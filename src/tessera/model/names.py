"""Extended-resource names a Pod may ask for. Configurable; these are the defaults."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PLACEMENT_POLICIES", "ResourceNames"]

# The placement policies a pod may name in tessera.io/placement ("NODE" or "NODE/CARD").
# tessera.placement.POLICIES must equal this tuple.
PLACEMENT_POLICIES = ("binpack", "spread", "topology", "fragmentation", "random", "best-fit")


@dataclass(frozen=True, slots=True)
class ResourceNames:
    gpu: str = "tessera.io/gpu"  # number of distinct cards
    memory: str = "tessera.io/gpu-memory"  # MiB per card
    memory_percent: str = "tessera.io/gpu-memory-percent"  # percent of each card's memory
    cores: str = "tessera.io/gpu-cores"  # percent of each card's compute, 1..100

    def all(self) -> tuple[str, ...]:
        return (self.gpu, self.memory, self.memory_percent, self.cores)
