"""Nodes held for preempting pods: what the preemptor freed goes to the pod it freed it for.

When the preemptor evicts pods on a node for a pod P, it holds the node for P: until P is
placed (or the hold ends), ``filter`` places another pod of P's priority or lower there
only where P's own placement -- the one the preemptor chose, on the victims' cards --
still books once the victims are gone (``leaves_room``); and the preemptor weighs no
victims there for such pods. Without the hold, a lower-priority pod scheduled while P
waits -- for its victims' grace periods, then for kube-scheduler's backoff -- takes the
freed cards, and P preempts it in turn: churn that evicts two pods for one. It is
kube-scheduler's nominated node, kept in the extender because kube-scheduler cannot see
the cards (docs/scheduler.md, "GPU preemption").

What is held is P's placement, not the node: the node's other cards stay in use while the
victims sit out their grace periods, which may be minutes. A hold whose placement is not
known (taken over from an annotation without one) holds the whole node. A more
important pod is never held off: it may take the node, and P's preemption is then
weighed again.

A hold ends when P is bound, when P is gone, ``keep_s`` after the last victim went
(kube-scheduler tries P again within its backoff, at most 10 s), or when a victim was
never seen going (``until``: the eviction did not take; the preemption is weighed again).
The book lives in the leader's memory, and each preemption is also written on P
(``tessera.io/preempting``: the node, the victims and P's placement). A new leader, or
the same one restarted, holds P's placement again from that annotation while any victim
is still there; without it, it would see P still not fit while the victims terminate
and evict a second set for it.

Not thread-safe on its own: the scheduler state's lock guards it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tessera.cluster.state import ClusterState
from tessera.errors import PlacementError, SpecError
from tessera.model.types import Assignment, PodRequest

__all__ = ["Hold", "HoldBook", "leaves_room"]


@dataclass(slots=True)
class Hold:
    """``node`` held for the pod ``key`` (UID ``uid``) while ``victims`` go."""

    key: str
    uid: str
    priority: int
    node: str
    victims: frozenset[str]
    until: float  # no victim seen going by then: the eviction did not take
    freed_at: float | None = None  # when the last victim went
    request: PodRequest | None = None  # the pod's, and where the preemptor placed it:
    decision: Assignment | None = None  # None holds the whole node

    def reason(self) -> str:
        return (
            f"held for {self.key} (priority {self.priority}), which preempted pods here "
            "and has not been placed yet"
        )


class HoldBook:
    def __init__(self) -> None:
        self._by_key: dict[str, Hold] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: str) -> bool:
        return key in self._by_key

    def __iter__(self) -> Iterator[Hold]:
        return iter(list(self._by_key.values()))  # a copy: the caller may drop holds

    def get(self, key: str) -> Hold | None:
        return self._by_key.get(key)

    def put(self, hold: Hold) -> None:
        """Hold a node for ``hold.key``, in place of any earlier hold for it."""
        self._by_key[hold.key] = hold

    def drop(self, key: str) -> None:
        self._by_key.pop(key, None)

    def clear(self) -> None:
        self._by_key.clear()

    def victims(self) -> set[str]:
        """Every pod some hold waits to see go."""
        return {v for h in self._by_key.values() for v in h.victims}

    def against(self, key: str, priority: int) -> dict[str, list[Hold]]:
        """The nodes held against a pod ``key`` of ``priority``, each with its holds:
        those for another pod at least as important (empty, and cheap, when nothing is
        held)."""
        out: dict[str, list[Hold]] = {}
        for h in self._by_key.values():
            if h.key != key and h.priority >= priority:
                out.setdefault(h.node, []).append(h)
        return out


def leaves_room(
    cluster: ClusterState, holds: Iterable[Hold], pod: PodRequest, assignment: Assignment
) -> bool:
    """Whether ``pod`` placed by ``assignment`` on a held node leaves each hold's pod its
    placement once the victims are gone: both booked, on a copy of the node, with the
    victims' bookings left out."""
    holds = list(holds)
    kept = [(h.request, h.decision) for h in holds if h.request and h.decision]
    if len(kept) < len(holds):
        return False  # a placement not known: the whole node is held
    leaving = {v for h in holds for v in h.victims} | {h.key for h in holds} | {pod.key}
    try:
        scratch = cluster.node_without(assignment.node, leaving)
        scratch.assign(pod, assignment, placing=False)
        for request, decision in kept:
            scratch.assign(request, decision, placing=False)
    except (PlacementError, SpecError):
        return False
    return True
