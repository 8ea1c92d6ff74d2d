"""The node's cards in its ``tessera.io/inventory`` annotation, patched only on change.

The text comes from ``annotations.encode_inventory`` (compact, key-sorted JSON), so equal
inventories are equal bytes and "changed" is a string comparison. The publisher reads the
annotation once at start: an agent restart that finds the same cards writes nothing.
"""

from __future__ import annotations

import logging
import threading

from tessera.model.annotations import encode_inventory
from tessera.model.types import Card
from tessera.node.ports import NodePort

__all__ = ["InventoryPublisher"]

log = logging.getLogger(__name__)


class InventoryPublisher:
    def __init__(self, node: str, port: NodePort) -> None:
        self.node = node
        self.port = port
        self._mu = threading.Lock()
        self._last: str | None = None
        self._loaded = False

    def publish(self, cards: tuple[Card, ...] | list[Card]) -> bool:
        """Patch when the encoded inventory differs from what the node has; True if patched."""
        text = encode_inventory(cards)
        with self._mu:
            if not self._loaded:
                self._last = self.port.inventory_text(self.node)
                self._loaded = True
            if text == self._last:
                return False
            self.port.set_inventory(self.node, text)
            self._last = text
        log.info("inventory of %s patched (%d cards)", self.node, len(cards))
        return True

    def forget(self) -> None:
        """Read the node again before the next publish (after a failed patch)."""
        with self._mu:
            self._loaded = False
