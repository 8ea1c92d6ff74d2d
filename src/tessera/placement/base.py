"""What a placement policy is: a node scorer and a card picker.

A policy answers two questions: which feasible node is best (``NodeScorer``, vectorised
over the candidate rows of a snapshot) and which cards on the chosen node
(``CardPicker``, over the few cards of one node). ``make_policy("spread/binpack")``
pairs the node half of one policy with the card half of another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from tessera.cluster.snapshot import Snapshot
from tessera.model.types import Card, GpuRequest, PodRequest

__all__ = [
    "BoolArray",
    "CardPicker",
    "CardView",
    "Demand",
    "FloatArray",
    "IntArray",
    "NodeScorer",
    "Policy",
    "cpu_used_fraction",
    "gpu_used_fraction",
]

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False, slots=True)
class Demand:
    """One pod's need, resolved against the candidate rows of one snapshot.

    ``primary`` is the pod's largest GPU request (None for a pod without GPUs); node
    scorers reason about it. ``card_ok[i, c]``: the primary request fits card ``c`` of
    row ``rows[i]``; ``need_mem[i, c]``: the MiB it would take there.
    """

    pod: PodRequest
    primary: GpuRequest | None
    rows: IntArray
    card_ok: BoolArray
    need_mem: IntArray


@dataclass(frozen=True, slots=True)
class CardView:
    """The cards of one node as a card picker sees them, the pod's earlier containers
    already taken off (``free_*`` is what is left for the container being placed)."""

    snapshot: Snapshot
    node: str
    cards: tuple[Card, ...]
    free_mem: tuple[int, ...]
    free_cores: tuple[int, ...]

    def free_fraction(self, col: int) -> float:
        """The share of the card still free: the scarcer of memory and cores."""
        card = self.cards[col]
        return min(self.free_cores[col] / 100.0, self.free_mem[col] / card.memory_mib)


class NodeScorer(Protocol):
    """Scores candidate rows; higher is better. Must be deterministic for its inputs."""

    def score_rows(self, snap: Snapshot, demand: Demand) -> FloatArray: ...


class CardPicker(Protocol):
    """Chooses ``count`` of the ``candidates`` (card columns that fit) on one node."""

    def pick(
        self, view: CardView, gpu: GpuRequest, candidates: Sequence[int], count: int
    ) -> list[int]: ...


@dataclass(frozen=True, eq=False, slots=True)
class Policy:
    """A named pairing of a node scorer and a card picker."""

    name: str
    node: NodeScorer
    card: CardPicker


def gpu_used_fraction(snap: Snapshot, rows: IntArray) -> FloatArray:
    """[rows]: share of the node's healthy GPU capacity in use; 1 for a node without GPUs
    (so CPU-only work packs onto GPU-less nodes first)."""
    t = snap.tables
    cards = t.gpu_cards[rows]
    return np.where(cards > 0, 1.0 - t.gpu_free[rows] / np.maximum(cards, 1), 1.0)


def cpu_used_fraction(snap: Snapshot, rows: IntArray) -> FloatArray:
    t = snap.tables
    total = np.maximum(t.cpu_total[rows], 1)
    return np.asarray(1.0 - t.cpu_free[rows] / total, dtype=np.float64)
