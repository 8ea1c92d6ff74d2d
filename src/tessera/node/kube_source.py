"""The agent's ports over the Kubernetes API (``tessera.kube``): pods, Events, the Node.

* ``KubePods``: pods with ``spec.nodeName=<node>``, kept by a ``Reflector`` (list, then
  watch, re-list on 410); ``refresh`` is a fresh list for when the watch lags kubelet.
* ``KubeEvents``: Warning Events on a pod through the off-path ``EventRecorder``.
* ``KubeNode``: reads and merge-patches the node's ``tessera.io/inventory``.
* ``KubeClaims``: reads a ResourceClaim for the DRA plugin's prepare.
"""

from __future__ import annotations

import threading
from typing import Any

from tessera.kube.events import EventRecorder
from tessera.kube.kinds import NODES, PODS, RESOURCE_CLAIMS
from tessera.kube.port import KubeApi, Obj, WatchEvent
from tessera.kube.reflector import Reflector
from tessera.model import annotations as ann
from tessera.node.pods import PodInfo, pod_info

__all__ = ["KubeClaims", "KubeEvents", "KubeNode", "KubePods"]


class KubePods:
    def __init__(self, api: KubeApi, node: str, resource: str, cards: frozenset[str]) -> None:
        self.api = api
        self.resource = resource
        self.cards = cards
        self.selector = f"spec.nodeName={node}"
        self._mu = threading.Lock()
        self._pods: dict[str, PodInfo] = {}
        self.reflector = Reflector(api, PODS, self, field_selector=self.selector)

    def start(self, timeout_s: float = 30.0) -> bool:
        self.reflector.start()
        return self.reflector.synced.wait(timeout_s)

    def stop(self) -> None:
        self.reflector.stop()

    def _info(self, obj: Obj) -> PodInfo:
        return pod_info(obj, self.resource, self.cards)

    # ReflectorHandler
    def replace(self, items: list[Obj]) -> None:
        fresh = {i.uid: i for i in map(self._info, items)}
        with self._mu:
            self._pods = fresh

    def apply(self, event: WatchEvent) -> None:
        info = self._info(event.object)
        with self._mu:
            if event.type == "DELETED":
                self._pods.pop(info.uid, None)
            else:
                self._pods[info.uid] = info

    # PodSource
    def pods(self) -> list[PodInfo]:
        with self._mu:
            return list(self._pods.values())

    def refresh(self) -> list[PodInfo]:
        items = self.api.list(PODS, None, field_selector=self.selector).items
        self.replace(items)
        return self.pods()


class KubeEvents:
    def __init__(self, recorder: EventRecorder) -> None:
        self.recorder = recorder

    def warn(self, pod: PodInfo, reason: str, message: str) -> None:
        obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid},
        }
        self.recorder.record(obj, reason, message)


class KubeNode:
    def __init__(self, api: KubeApi) -> None:
        self.api = api

    def inventory_text(self, node: str) -> str | None:
        meta = self.api.get(NODES, node).get("metadata") or {}
        value = (meta.get("annotations") or {}).get(ann.INVENTORY)
        return None if value is None else str(value)

    def set_inventory(self, node: str, text: str) -> None:
        self.api.merge_patch(NODES, node, {"metadata": {"annotations": {ann.INVENTORY: text}}})


class KubeClaims:
    def __init__(self, api: KubeApi) -> None:
        self.api = api

    def claim(self, namespace: str, name: str) -> Obj:
        # A fresh GET, not a watch cache: kubelet calls prepare right after allocation.
        return self.api.get(RESOURCE_CLAIMS, name, namespace)
