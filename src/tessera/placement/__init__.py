"""Placement: which node, which cards, or why not — pure functions over a Snapshot.

    from tessera.placement import place, make_policy
    decision = place(state.snapshot(), pod, make_policy("binpack"))

Steps: ``filter_nodes`` (fit, with a reason per failed node), ``score_nodes`` (the
policy's node half), ``pick_cards`` (the policy's card half). docs/placement.md explains
each policy and its cost.
"""

from tessera.placement.base import CardPicker, CardView, Demand, NodeScorer, Policy
from tessera.placement.fit import FilterResult, filter_nodes
from tessera.placement.fragmentation import fragmentation_rate, node_fragmentation
from tessera.placement.mix import RequestClass, WorkloadMix
from tessera.placement.place import Decision, pick_cards, place, score_nodes
from tessera.placement.policies import DEFAULT_POLICY, POLICIES, PolicySet, make_policy

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "CardPicker",
    "CardView",
    "Decision",
    "Demand",
    "FilterResult",
    "NodeScorer",
    "Policy",
    "PolicySet",
    "RequestClass",
    "WorkloadMix",
    "filter_nodes",
    "fragmentation_rate",
    "make_policy",
    "node_fragmentation",
    "pick_cards",
    "place",
    "score_nodes",
]
