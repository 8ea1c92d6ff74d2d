"""Every port of the node agent: what it asks of the outside, in one place.

* ``Discovery``: the node's cards and their faults. Backends: ``cards.nvml`` (NVIDIA's
  NVML through nvidia-ml-py, on GPU nodes) and ``cards.fake`` (cards from the node CSV
  the simulator and the dev cluster use, faults injected by a method or a file). The
  agent asks ``facts()`` once at start (cards do not come and go without a reboot), then
  loops on ``wait_events`` and ``probe`` for health (``cards.health`` decides) and on
  ``processes`` for the memory backstop.
* ``PodSource`` and ``EventSink``: the pods bound to this node, and Events on them
  (``kube_source.py`` against the API server, ``fakes.py`` in memory).
* ``PodResources``: kubelet's pod-resources ``List`` (``kubelet.podresources``).
* ``NodePort``: the node's inventory annotation (``kube_source.KubeNode``, ``fakes.MemoryNode``).
* ``MpsControl``: the MPS control daemon (``isolation.MpsDaemon``, ``isolation.FakeMps``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from tessera.model.types import Card
from tessera.node.pods import PodInfo

__all__ = [
    "Discovery",
    "DiscoveryError",
    "EventSink",
    "GpuProcess",
    "MpsControl",
    "NodeFacts",
    "NodePort",
    "PodResources",
    "PodResourcesView",
    "PodSource",
    "StartError",
    "XidEvent",
    "warn_best_effort",
]


log = logging.getLogger(__name__)


class DiscoveryError(RuntimeError):
    """The backend could not read the node's cards (NVML missing, node not in the file...)."""


class StartError(RuntimeError):
    """The node cannot host the agent as configured (a port taken, a folder it cannot
    write, a daemon that will not start); the message names the step that failed."""


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


class PodSource(Protocol):
    """Pods bound to this node (a watch-fed cache) with a fresh read for when it lags."""

    def pods(self) -> list[PodInfo]: ...

    def refresh(self) -> list[PodInfo]: ...


class EventSink(Protocol):
    """Warning Events on a pod (kubectl describe shows why its container did not start)."""

    def warn(self, pod: PodInfo, reason: str, message: str) -> None: ...


def warn_best_effort(events: EventSink, pod: PodInfo, reason: str, message: str) -> None:
    """``events.warn``, never raising: an Event only explains; the caller's answer (a gRPC
    error, a kill, a restored file) stands whether or not it could be posted."""
    try:
        events.warn(pod, reason, message)
    except Exception:
        log.exception("could not post an Event on %s", pod.key)


class NodePort(Protocol):
    def inventory_text(self, node: str) -> str | None:
        """The node's current ``tessera.io/inventory`` value (None when absent)."""
        ...

    def set_inventory(self, node: str, text: str) -> None:
        """Merge-patch the node's ``tessera.io/inventory`` to ``text``."""
        ...


@dataclass(frozen=True, slots=True)
class PodResourcesView:
    """kubelet's pod-resources ``List``: pods it has admitted (or is admitting) and slots."""

    pods: frozenset[tuple[str, str]]  # (namespace, name)
    held: dict[tuple[str, str, str], frozenset[str]] = field(default_factory=dict)

    def owner_of(self, slots: frozenset[str]) -> tuple[str, str, str] | None:
        for key, ids in self.held.items():
            if ids == slots:
                return key
        return None

    def holds(self, slots: Iterable[str]) -> bool:
        want = set(slots)
        return any(want & ids for ids in self.held.values())


class PodResources(Protocol):
    def view(self) -> PodResourcesView | None:
        """A fresh List; None when kubelet's pod-resources socket does not answer."""
        ...


class MpsControl(Protocol):
    def start(self) -> None: ...

    def running(self) -> bool: ...

    def stop(self) -> None: ...
