from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from tessera.kube.fake import FakeKube
from tessera.kube.kinds import NODES
from tessera.model.annotations import decode_inventory, encode_inventory
from tessera.model.clusterspec import make_cards
from tessera.node.cards.inventory import InventoryPublisher
from tessera.node.fakes import MemoryNode
from tessera.node.kube_source import KubeNode

CARDS = make_cards("n1", 2, "T4")


def test_patches_only_when_the_inventory_changes(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tessera.node.cards.inventory")
    node = MemoryNode()
    pub = InventoryPublisher("n1", node)
    assert pub.publish(CARDS)
    assert not pub.publish(CARDS)
    out = (replace(CARDS[0], healthy=False), CARDS[1])
    assert pub.publish(out)
    assert [c.healthy for c in decode_inventory("n1", node.text or "", 0, 0).cards] == [False, True]
    assert len(node.patches) == 2
    assert [r.getMessage() for r in caplog.records] == ["inventory of n1 patched (2 cards)"] * 2


def test_a_restart_that_finds_the_same_inventory_writes_nothing() -> None:
    node = MemoryNode(initial=encode_inventory(CARDS))
    assert not InventoryPublisher("n1", node).publish(CARDS)
    assert node.patches == []


def test_kube_node_reads_and_patches_the_annotation() -> None:
    api = FakeKube()
    api.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    port = KubeNode(api)
    assert port.inventory_text("n1") is None
    pub = InventoryPublisher("n1", port)
    assert pub.publish(CARDS)
    assert port.inventory_text("n1") == encode_inventory(CARDS)
    assert not InventoryPublisher("n1", port).publish(CARDS)


class CountingNode(MemoryNode):
    """A node whose reads are counted, and whose next patch can land unanswered."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.lose_next_answer = False

    def inventory_text(self, node: str) -> str | None:
        self.reads += 1
        return super().inventory_text(node)

    def set_inventory(self, node: str, text: str) -> None:
        super().set_inventory(node, text)
        if self.lose_next_answer:
            self.lose_next_answer = False
            raise TimeoutError("the patch landed; its answer did not")


def test_the_node_is_read_once_then_again_only_after_forget() -> None:
    node = CountingNode()
    pub = InventoryPublisher("n1", node)
    out = (replace(CARDS[0], healthy=False), CARDS[1])
    node.lose_next_answer = True
    with pytest.raises(TimeoutError):
        pub.publish(out)
    pub.forget()  # as the agent does after a failed patch
    assert not pub.publish(out)  # read again: it had landed, so nothing to write
    assert pub.publish(CARDS) and not pub.publish(CARDS)
    assert node.reads == 2 and len(node.patches) == 2
