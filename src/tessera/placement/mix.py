"""The workload mix: how common each kind of request has been.

The fragmentation policy weighs each kind ("class") of request by how often it has been
seen. A class is what decides whether a request fits: CPU, memory and the GPU shape
(count, memory, cores, whole card, allowed models) of the pod's largest GPU container.

The weights the policy uses are a frozen copy taken at growing intervals (after 32, 256,
2048, ... observations, and whenever ``freeze`` is called), so tables built on them stay
valid between refreshes instead of changing with every pod.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from tessera.model.types import ComputePolicy, GpuRequest, PodRequest

__all__ = ["RequestClass", "WorkloadMix"]


@dataclass(frozen=True, slots=True)
class RequestClass:
    """The part of a pod that decides where it fits."""

    cpu_milli: int
    memory_mib: int
    gpu: GpuRequest | None  # the largest GPU request, its UUIDs and compute policy dropped

    @staticmethod
    def of(pod: PodRequest) -> RequestClass:
        from tessera.placement.fit import primary_request

        gpu = primary_request(pod)
        if gpu is not None:
            # One pod's card UUIDs and its compute policy do not make a class.
            gpu = dataclasses.replace(
                gpu,
                uuids=frozenset(),
                uuids_exclude=frozenset(),
                policy=ComputePolicy.FIXED_SHARE,
            )
        return RequestClass(pod.cpu_milli, pod.memory_mib, gpu)


class WorkloadMix:
    """Counts of request classes seen, with a frozen, versioned copy for scoring."""

    def __init__(self, pods: Iterable[PodRequest] = (), *, max_classes: int = 64) -> None:
        self._counts: Counter[RequestClass] = Counter()
        self._seen = 0
        self._next_freeze = 32
        self._max_classes = max_classes
        self._frozen: tuple[tuple[RequestClass, float], ...] = ()
        self.version = 0
        for pod in pods:
            self.observe(pod)
        if self._seen:
            self.freeze()

    def observe(self, pod: PodRequest) -> None:
        """Count ``pod``'s class; refreshes the frozen weights at growing intervals."""
        self._counts[RequestClass.of(pod)] += 1
        self._seen += 1
        if self._seen >= self._next_freeze:
            self._next_freeze = self._seen * 8
            self.freeze()

    def freeze(self) -> None:
        """Take the current counts as the weights the policy uses (bumps ``version``).

        Classes with the same GPU shape are merged, their CPU and memory averaged by
        count: the card-level measure only depends on the shape, and a few dozen classes
        keep the measure's arrays small (its cost is linear in the number of classes).
        """
        merged: dict[GpuRequest | None, list[int]] = {}
        for c, n in self._counts.items():
            acc = merged.setdefault(c.gpu, [0, 0, 0])
            acc[0] += n
            acc[1] += n * c.cpu_milli
            acc[2] += n * c.memory_mib
        classes = [
            (RequestClass(cpu // n, mem // n, gpu), n) for gpu, (n, cpu, mem) in merged.items()
        ]
        # Most common first; ties in a fixed order whatever the arrival order.
        classes.sort(key=lambda cn: (-cn[1], repr(cn[0])))
        top = classes[: self._max_classes]
        total = sum(n for _, n in top)
        self._frozen = tuple((c, n / total) for c, n in top)
        self.version += 1

    def weights(self) -> tuple[tuple[RequestClass, float], ...]:
        """The frozen (class, weight) pairs; weights sum to 1 (empty before any freeze)."""
        return self._frozen

    @property
    def seen(self) -> int:
        return self._seen
