"""Which lower-priority pods to evict so that a pod fits on a node, and on which node
(pure).

kube-scheduler's own preemption cannot do this for Tessera's pods: it judges victims with
its filters, which ignore the GPU resources (``ignoredByScheduler``), so it never finds
one (docs/scheduler.md, "GPU preemption"). The same rule, with the cards counted:

* on a node, every pod of lower priority than the preemptor is a candidate; if the
  preemptor does not fit even with all of them gone, the node cannot help;
* otherwise the candidates are given back one by one, the most important first (higher
  priority, then the key, for equal inputs giving equal answers), as long as the
  preemptor still fits: what is left are the victims, a minimal set in that order;
* among nodes, the one whose most important victim is least important wins, then the one
  with fewer victims, then the lower sum of their priorities, then the first offered.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tessera.cluster.state import ClusterState
from tessera.errors import PlacementError, SpecError
from tessera.model.types import Assignment, NodeInventory, PodRequest
from tessera.placement.base import Policy
from tessera.placement.place import place

__all__ = ["Holder", "Preemption", "choose_preemption", "preemption_on_node"]


@dataclass(frozen=True, slots=True)
class Holder:
    """A pod holding cards on the node, as the scheduler has it booked."""

    uid: str
    priority: int
    request: PodRequest
    assignment: Assignment
    evictable: bool = True  # False: being bound, being evicted, or under a budget: no victim

    @property
    def key(self) -> str:
        return self.request.key

    def __str__(self) -> str:
        return f"{self.key} (priority {self.priority})"


@dataclass(frozen=True, slots=True)
class Preemption:
    node: str
    victims: tuple[Holder, ...]  # the least important first
    decision: Assignment  # where the preemptor goes once they are gone
    for_quota: frozenset[str] = frozenset()  # victims evicted for quota room, not cards

    def rank(self) -> tuple[int, int, int]:
        prios = [v.priority for v in self.victims]
        return max(prios), len(prios), sum(prios)

    def describe(self) -> str:
        """``evicting on NODE for cards: A, B`` and, for a namespace's quota,
        ``for quota room: C`` (each victim with its priority)."""
        cards = [str(v) for v in self.victims if v.key not in self.for_quota]
        quota = [str(v) for v in self.victims if v.key in self.for_quota]
        parts = ([f"on {self.node} for cards: {', '.join(cards)}"] if cards else []) + (
            [f"for quota room: {', '.join(quota)}"] if quota else []
        )
        return "evicting " + "; ".join(parts)


def _fits(state: ClusterState, pod: PodRequest, policy: Policy) -> Assignment | None:
    try:
        return place(state.snapshot(), pod, policy).assignment
    except PlacementError:
        return None


def preemption_on_node(
    inv: NodeInventory,
    holders: Iterable[Holder],
    pod: PodRequest,
    priority: int,
    policy: Policy,
) -> Preemption | None:
    """The fewest, least important victims on ``inv`` that let ``pod`` fit, or None when
    evicting every lower-priority pod there would not be enough (or none is needed).

    The reprieve asks "does the pod still fit?" once a candidate given back. Most answers
    are known without asking: the pod's last placement (the *witness*) still holds when
    the candidate given back holds none of its cards and leaves the node CPU and memory
    enough, since nothing else a booking takes is shared between cards. Only the others
    ask the placement core, which finds a new witness (a whole-card pod on a node of
    shared cards: about one question a card instead of one a pod). The victims are the
    same as with a question every time (tests/unit/test_placement_preemption.py).
    """
    state = ClusterState([inv])
    candidates: list[Holder] = []
    cpu_left, memory_left = inv.cpu_milli, inv.memory_mib
    for h in holders:
        if h.evictable and h.priority < priority:
            candidates.append(h)
            continue
        try:
            state.assign(h.request, h.assignment, placing=False)  # already there
        except (PlacementError, SpecError):
            return None  # the node's bookings do not add up here: do not guess
        cpu_left -= h.request.cpu_milli
        memory_left -= h.request.memory_mib
    if not candidates:
        return None
    witness = _fits(state, pod, policy)
    if witness is None:
        return None  # ...with all of them gone
    witness_cards = set(witness.footprint())
    victims = sorted(candidates, key=lambda h: (h.priority, h.key))
    for h in sorted(candidates, key=lambda h: (-h.priority, h.key)):  # most important first
        try:
            state.assign(h.request, h.assignment, placing=False)  # already there
        except (PlacementError, SpecError):
            continue
        cpu, memory = cpu_left - h.request.cpu_milli, memory_left - h.request.memory_mib
        still = (
            pod.cpu_milli <= cpu
            and pod.memory_mib <= memory
            and h.assignment.footprint().keys().isdisjoint(witness_cards)
        )
        found = witness if still else _fits(state, pod, policy)
        if found is None:
            state.release(h.key)
            continue
        victims.remove(h)
        cpu_left, memory_left = cpu, memory
        if found is not witness:
            witness, witness_cards = found, set(found.footprint())
    decision = _fits(state, pod, policy)
    if not victims or decision is None:
        return None  # it fits as things are: no one need go
    return Preemption(inv.name, tuple(victims), decision)


def choose_preemption(
    nodes: Sequence[tuple[NodeInventory, Sequence[Holder]]],
    pod: PodRequest,
    priority: int,
    policy: Policy,
) -> Preemption | None:
    """The best node to preempt on (see the module's rule), or None."""
    best: Preemption | None = None
    for inv, holders in nodes:
        found = preemption_on_node(inv, holders, pod, priority, policy)
        if found is not None and (best is None or found.rank() < best.rank()):
            best = found
    return best
