"""What one placed pod holds: the record ``ClusterState`` keeps and the invariants check."""

from __future__ import annotations

from dataclasses import dataclass

from tessera.model.types import Assignment, PodRequest

__all__ = ["Booking"]


@dataclass(frozen=True, slots=True)
class Booking:
    """A placed pod and, per card UUID, the (memory, cores, exclusive) it holds."""

    pod: PodRequest
    assignment: Assignment
    footprint: dict[str, tuple[int, int, bool]]
    slots: dict[str, int]  # per card UUID: the slots (containers) the pod takes there
