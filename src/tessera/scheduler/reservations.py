"""The reservation book: the extender's assumed state, kept apart from what it observed.

A reservation is taken when the extender decides where a pod goes (in ``filter``, or in
``bind`` when no decision was taken before). ``SchedulerState`` books it into the
``ClusterState`` at once, in place of whatever the pod's annotation says, so the very
next scheduling cycle already sees those cards as taken -- even though the scheduler's
bind for the first pod has not arrived yet. That is the scheduler's own "assume" step,
for the cards it cannot see; like kube-scheduler's assumed pods, the record lives here,
not in the observed state, and when it goes the pod falls back to what was observed.

A reservation ends in one of three ways:

* confirmed: the pod came back through the watch bound with its
  ``tessera.io/assignment`` (or bound with another: the observed truth wins); the
  record goes and the observed assignment is what stays booked. A successful bind
  alone does not confirm it: the watch may still deliver the pod's events from before
  the bind, and without the record such an event would read as "unbound, no annotation"
  and free the cards;
* released: bind failed, the pod was deleted, or it is being scheduled again;
* expired: ``ttl_s`` passed without a bind (the scheduler chose not to go on, e.g. a
  later plugin rejected the node); reservations being bound never expire, except
* in doubt: the bind's write failed in a way that leaves its outcome unknown (no
  answer, a timeout): the write may have landed, so the cards stay booked until the
  watch shows the pod (bound: confirmed as above) or, if it never does, until
  ``doubt_until``, when the reservation expires.

The book is not thread-safe on its own; the scheduler state guards it with its lock.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.model.types import Assignment, PodRequest

__all__ = ["Reservation", "ReservationBook"]


@dataclass(slots=True)
class Reservation:
    pod_key: str
    uid: str
    request: PodRequest
    assignment: Assignment
    expires_at: float
    binding: bool = False  # a bind is writing it: never expires ...
    doubt_until: float | None = None  # ... unless its write's outcome is unknown

    @property
    def node(self) -> str:
        return self.assignment.node


class ReservationBook:
    def __init__(self, ttl_s: float = 30.0) -> None:
        self.ttl_s = ttl_s
        self._by_key: dict[str, Reservation] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, pod_key: object) -> bool:
        return pod_key in self._by_key

    def get(self, pod_key: str) -> Reservation | None:
        return self._by_key.get(pod_key)

    def add(self, request: PodRequest, uid: str, assignment: Assignment, now: float) -> Reservation:
        r = Reservation(request.key, uid, request, assignment, now + self.ttl_s)
        self._by_key[r.pod_key] = r
        return r

    def put(self, r: Reservation) -> None:
        """Put back a reservation taken out with ``pop``."""
        self._by_key[r.pod_key] = r

    def pop(self, pod_key: str) -> Reservation | None:
        return self._by_key.pop(pod_key, None)

    def expired(self, now: float) -> list[Reservation]:
        """The reservations past their time (not being bound); the caller releases them."""
        return [
            r
            for r in self._by_key.values()
            if (not r.binding and r.expires_at <= now)
            or (r.doubt_until is not None and r.doubt_until <= now)
        ]

    def all(self) -> list[Reservation]:
        return list(self._by_key.values())
