"""The cards an operator cordoned on this node, followed from the Node object.

``kubectl tessera cordon`` writes the Node's ``tessera.io/cordoned-cards``; the extender
reads it for the pods it places. The claims path has no extender: kube-scheduler
allocates claims from the node's ResourceSlice, so the agent must taint a cordoned card
there itself. This follows the one Node (a watch on ``metadata.name``, as kubelet keeps
on its own Node) and calls ``on_change`` when the set changes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from tessera.kube.kinds import NODES
from tessera.kube.port import KubeApi, Obj
from tessera.kube.reflector import Reflector, follow_one
from tessera.model import annotations as keys

__all__ = ["NodeCordons"]

log = logging.getLogger(__name__)


class NodeCordons:
    def __init__(self, api: KubeApi, node: str, on_change: Callable[[], None]) -> None:
        self.api = api
        self.node = node
        self._on_change = on_change
        self._mu = threading.Lock()
        self._uuids: frozenset[str] = frozenset()

    def current(self) -> frozenset[str]:
        with self._mu:
            return self._uuids

    def watch(self) -> Reflector:
        """Start following the Node; the caller stops the returned reflector."""
        return follow_one(self.api, NODES, self.node, self.seen)

    def seen(self, obj: Obj | None, version: str) -> None:
        """The Node as listed or changed (None: deleted); each one is the newest, so the
        version is not needed."""
        text = (((obj or {}).get("metadata") or {}).get("annotations") or {}).get(
            keys.CORDONED_CARDS
        )
        uuids = keys.parse_cordoned(text if isinstance(text, str) else None)
        with self._mu:
            if uuids == self._uuids:
                return
            self._uuids = uuids
        log.info("node %s: cordoned cards now %s", self.node, sorted(uuids) or "none")
        self._on_change()
