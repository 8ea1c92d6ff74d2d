"""Doubles of the node agent's pod source and kubelet's pod-resources, for the unit
tests of the allocation pieces: each answers what the test set and counts what it was
asked. (``tessera.node.fakes.MemoryPods`` is the fuller one, parsing pod objects.)"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.node.pods import PodInfo
from tessera.node.ports import PodResourcesView


@dataclass
class Pods:
    """The watch cache (``cached``) and a fresh list (``fresh``, default the same),
    counting the fresh lists."""

    cached: list[PodInfo]
    fresh: list[PodInfo] | None = None
    refreshes: int = 0

    def pods(self) -> list[PodInfo]:
        return list(self.cached)

    def refresh(self) -> list[PodInfo]:
        self.refreshes += 1
        return list(self.cached if self.fresh is None else self.fresh)


@dataclass
class Kubelet:
    """pod-resources: the pods kubelet lists (default: those holding slots) and the
    slots each container holds, counting the reads."""

    pods: set[tuple[str, str]] | None = None
    held: dict[tuple[str, str, str], frozenset[str]] = field(default_factory=dict)
    views: int = 0

    def view(self) -> PodResourcesView:
        self.views += 1
        listed = self.pods if self.pods is not None else {(ns, n) for ns, n, _ in self.held}
        return PodResourcesView(frozenset(listed), self.held)
