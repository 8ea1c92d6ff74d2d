"""In-memory implementations of the agent's ports, for tests and benchmarks.

Each speaks the same contract as the real adapter in ``kube_source.py``: ``MemoryPods``
for ``PodSource`` (with a switch that makes its cache lag, as a watch can),
``MemoryEvents`` for ``EventSink``, ``MemoryNode`` for ``inventory.NodePort``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from tessera.node.pods import PodInfo, pod_info

__all__ = ["MemoryEvents", "MemoryNode", "MemoryPods"]


class MemoryPods:
    def __init__(self, resource: str, cards: frozenset[str]) -> None:
        self.resource = resource
        self.cards = cards
        self._mu = threading.Lock()
        self._objs: dict[str, Mapping[str, Any]] = {}
        self._cache: dict[str, PodInfo] = {}
        self.lagging = False  # when True, new pods reach the cache only on refresh()
        self.refreshes = 0

    def put(self, obj: Mapping[str, Any]) -> None:
        info = pod_info(obj, self.resource, self.cards)
        with self._mu:
            self._objs[info.uid] = obj
            if not self.lagging:
                self._cache[info.uid] = info

    def delete(self, uid: str) -> None:
        with self._mu:
            self._objs.pop(uid, None)
            if not self.lagging:  # a lagging watch has not seen the deletion yet
                self._cache.pop(uid, None)

    def pods(self) -> list[PodInfo]:
        with self._mu:
            return list(self._cache.values())

    def refresh(self) -> list[PodInfo]:
        with self._mu:
            self.refreshes += 1
            self._cache = {
                uid: pod_info(o, self.resource, self.cards) for uid, o in self._objs.items()
            }
            return list(self._cache.values())


class MemoryEvents:
    def __init__(self) -> None:
        self._mu = threading.Lock()
        self.events: list[tuple[str, str, str]] = []  # (namespace/name, reason, message)

    def warn(self, pod: PodInfo, reason: str, message: str) -> None:
        with self._mu:
            self.events.append((pod.key, reason, message))

    def for_pod(self, key: str) -> list[tuple[str, str, str]]:
        with self._mu:
            return [e for e in self.events if e[0] == key]


class MemoryNode:
    def __init__(self, initial: str | None = None) -> None:
        self.text = initial
        self.patches: list[str] = []

    def inventory_text(self, node: str) -> str | None:
        return self.text

    def set_inventory(self, node: str, text: str) -> None:
        self.text = text
        self.patches.append(text)
