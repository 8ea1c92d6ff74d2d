"""The policy names and ``make_policy``.

A name is one policy (``binpack``) or a node-level and a card-level policy joined by a
slash (``spread/binpack``: spread pods over nodes, pack them onto cards).
"""

from __future__ import annotations

from tessera.errors import SpecError
from tessera.model.names import PLACEMENT_POLICIES
from tessera.model.types import PodRequest
from tessera.placement.base import CardPicker, NodeScorer, Policy
from tessera.placement.bestfit import BestFitCards, BestFitNodes
from tessera.placement.binpack import BinpackCards, BinpackNodes
from tessera.placement.fragmentation_policy import FragmentationCards, FragmentationNodes
from tessera.placement.mix import WorkloadMix
from tessera.placement.random_choice import RandomCards, RandomNodes
from tessera.placement.spread import SpreadCards, SpreadNodes
from tessera.placement.topology import TopologyCards, TopologyNodes

__all__ = ["DEFAULT_POLICY", "POLICIES", "PolicySet", "make_policy"]

# The names the pod-spec parser accepts for tessera.io/placement: one list for both.
POLICIES: frozenset[str] = frozenset(PLACEMENT_POLICIES)
DEFAULT_POLICY = "fragmentation"


def _halves(name: str, seed: int, mix: WorkloadMix) -> tuple[NodeScorer, CardPicker]:
    if name == "binpack":
        return BinpackNodes(), BinpackCards()
    if name == "spread":
        return SpreadNodes(), SpreadCards()
    if name == "best-fit":
        return BestFitNodes(), BestFitCards()
    if name == "topology":
        return TopologyNodes(), TopologyCards()
    if name == "random":
        return RandomNodes(seed), RandomCards(seed + 1)
    assert name == "fragmentation"
    nodes = FragmentationNodes(mix)
    return nodes, FragmentationCards(nodes)


def make_policy(name: str, seed: int = 0, mix: WorkloadMix | None = None) -> Policy:
    """The policy called ``name`` (``NODE`` or ``NODE/CARD``, each one of POLICIES).

    ``seed`` drives ``random``; ``mix`` is the workload mix ``fragmentation`` learns from
    (a fresh, empty one when None: observe pods into ``policy``'s mix via the caller).
    """
    parts = name.split("/")
    if len(parts) > 2 or not all(p in POLICIES for p in parts):
        raise SpecError(
            "placement",
            f"must be one of {', '.join(sorted(POLICIES))}, or NODE/CARD of two of them",
            name,
        )
    shared = mix if mix is not None else WorkloadMix()
    node, card = _halves(parts[0], seed, shared)
    if len(parts) == 2:
        _, card = _halves(parts[1], seed, shared)
    return Policy(name=name, node=node, card=card)


class PolicySet:
    """The scheduler's default policy and the per-pod overrides (``tessera.io/placement``),
    each made once and kept, so a policy's caches and random stream live across decisions.
    All share one WorkloadMix."""

    def __init__(
        self, default: str = DEFAULT_POLICY, seed: int = 0, mix: WorkloadMix | None = None
    ) -> None:
        self.mix = mix if mix is not None else WorkloadMix()
        self._seed = seed
        self._made: dict[str, Policy] = {}
        self.default = self.get(default)

    def get(self, name: str) -> Policy:
        """The policy called ``name``; SpecError for a name make_policy refuses."""
        if name not in self._made:
            self._made[name] = make_policy(name, seed=self._seed, mix=self.mix)
        return self._made[name]

    def for_pod(self, pod: PodRequest) -> Policy:
        """The pod's own policy when it names one, else the default."""
        return self.get(pod.placement) if pod.placement else self.default
