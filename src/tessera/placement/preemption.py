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
from tessera.placement.cards import fits_exactly
from tessera.placement.fit import feasible, resolve_rows
from tessera.placement.place import place

__all__ = ["Holder", "Preemption", "choose_preemption", "preemption_on_node"]


@dataclass(frozen=True, slots=True)
class Holder:
    """A pod holding cards on the node, as the scheduler has it booked."""

    uid: str
    priority: int
    request: PodRequest
    assignment: Assignment
    evictable: bool = True  # False: being bound, or already being evicted: never a victim

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

    def rank(self) -> tuple[int, int, int]:
        prios = [v.priority for v in self.victims]
        return max(prios), len(prios), sum(prios)


def _fits(state: ClusterState, pod: PodRequest, policy: Policy) -> Assignment | None:
    try:
        return place(state.snapshot(), pod, policy).assignment
    except PlacementError:
        return None


def _fit_only(state: ClusterState, pod: PodRequest) -> bool:
    """Whether ``pod`` fits on the one node of ``state``: the placement core's fit test
    without its scores, card choice and reasons (the reprieve asks it once a holder)."""
    snap = state.snapshot()
    rows, _ = resolve_rows(snap, None)
    ok, _ = feasible(snap, pod, rows)
    if not ok.any():
        return False
    return len(pod.gpu_containers()) <= 1 or fits_exactly(snap, pod, snap.names[int(rows[0])])


def preemption_on_node(
    inv: NodeInventory,
    holders: Iterable[Holder],
    pod: PodRequest,
    priority: int,
    policy: Policy,
) -> Preemption | None:
    """The fewest, least important victims on ``inv`` that let ``pod`` fit, or None when
    evicting every lower-priority pod there would not be enough (or none is needed)."""
    state = ClusterState([inv])
    candidates: list[Holder] = []
    for h in holders:
        if h.evictable and h.priority < priority:
            candidates.append(h)
            continue
        try:
            state.assign(h.request, h.assignment)
        except (PlacementError, SpecError):
            return None  # the node's bookings do not add up here: do not guess
    if not candidates or not _fit_only(state, pod):
        return None  # ...with all of them gone
    victims = sorted(candidates, key=lambda h: (h.priority, h.key))
    for h in sorted(candidates, key=lambda h: (-h.priority, h.key)):  # most important first
        try:
            state.assign(h.request, h.assignment)
        except (PlacementError, SpecError):
            continue
        if _fit_only(state, pod):
            victims.remove(h)
        else:
            state.release(h.key)
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
