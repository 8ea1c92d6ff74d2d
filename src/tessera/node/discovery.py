"""Discovery: what cards a node has, and the events that say one of them is failing.

One small port, two backends:

* ``NvmlDiscovery`` (``discovery_nvml.py``): NVIDIA's NVML through nvidia-ml-py, on GPU nodes.
* ``FakeDiscovery`` (``discovery_fake.py``): cards from the node CSV the simulator and the dev
  cluster use, with XIDs and probe failures injected by a method or a file.

The agent asks ``facts()`` once at start (cards do not come and go without a reboot),
then loops on ``wait_events`` and ``probe`` for health (``health.py`` decides).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tessera.model.types import Card

__all__ = ["Discovery", "DiscoveryError", "GpuProcess", "NodeFacts", "XidEvent"]


class DiscoveryError(RuntimeError):
    """The backend could not read the node's cards (NVML missing, node not in the file...)."""


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """The node's cards as found at start, plus what the operator wants to see about it."""

    cards: tuple[Card, ...]
    driver_version: str = ""
    cuda_version: str = ""  # "12.4"; "" when unknown
    mig_enabled: frozenset[str] = frozenset()  # UUIDs of cards in MIG mode


@dataclass(frozen=True, slots=True)
class XidEvent:
    """An NVML XID event on one card (``uuid``)."""

    uuid: str
    xid: int


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding device memory on a card, as the driver counts it (NVML's
    running-processes query): its pid in the agent's pid namespace (the host's)."""

    pid: int
    memory_bytes: int


class Discovery(Protocol):
    def facts(self) -> NodeFacts:
        """The node's cards (``healthy`` is True: health is the health tracker's call)."""
        ...

    def wait_events(self, timeout_s: float) -> list[XidEvent]:
        """XID events since the last call; waits up to ``timeout_s`` when there are none."""
        ...

    def probe(self, uuid: str) -> bool:
        """Whether card ``uuid`` answers a cheap query right now."""
        ...

    def utilization(self, uuid: str) -> float | None:
        """Percent of the last sample period the card was busy (None when unknown)."""
        ...

    def processes(self, uuid: str) -> list[GpuProcess]:
        """Every process with device memory on card ``uuid`` (empty when unknown)."""
        ...

    def close(self) -> None: ...
