"""What one replay measured, and the mean and spread of a policy over seeds.

The headline figure is the published one: the GPU allocation ratio, milli-GPU allocated
over milli-GPU capacity, where a task's milli-GPU is num_gpu × gpu_milli. It is read at
the end of the stream (arrivals at the target, 130% by default) and when arrivals first
reach 100% of capacity.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from tessera.model.types import NodeInventory
from tessera.simulate.trace import MILLI_PER_CARD

__all__ = [
    "PUBLISHED",
    "PUBLISHED_FGD",
    "PolicySummary",
    "ReplayResult",
    "Spread",
    "by_policy",
    "gpu_capacity_milli",
    "retry_summary",
    "summarize",
]

# Weng et al., ATC 2023, openb default list, mean of 10 seeds: allocation ratio at 130%
# of capacity arrived (and at 100%). Keyed by the closest Tessera policy.
PUBLISHED_FGD = {1.3: 0.9539, 1.0: 0.9523}
PUBLISHED: dict[str, dict[float, float]] = {
    "fragmentation": PUBLISHED_FGD,
    "best-fit": {1.3: 0.9308, 1.0: 0.9286},
    "random": {1.3: 0.8747},
}


def gpu_capacity_milli(nodes: Iterable[NodeInventory]) -> int:
    """Milli-GPU of every healthy card in ``nodes``."""
    return MILLI_PER_CARD * sum(1 for n in nodes for c in n.cards if c.healthy)


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """One experiment: a policy, a seed, an arrival target, and what happened.

    ``curve[k]`` is the allocation ratio right after the first task that brought the GPU
    arrived to at least k% of capacity (``curve[0]`` = 0), up to the end of the stream.
    """

    policy: str
    seed: int
    arrival: float
    capacity_milli: int
    arrived_tasks: int
    arrived_milli: int
    placed_tasks: int
    allocated_milli: int
    fragmentation_rate: float  # fragmented idle GPU / idle GPU, at the end
    curve: tuple[float, ...]
    failed_by_reason: dict[str, int] = field(default_factory=dict)
    failed_by_class: dict[str, int] = field(default_factory=dict)
    nodes_to_score: int = 100  # kube-scheduler's percentageOfNodesToScore (0: adaptive)
    # Tasks placed only on a later cycle, after windows that could not hold them: how many
    # took each number of cycles (2, 3, ...).
    retried_cycles: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0  # wall time of the replay
    cpu_seconds: float = 0.0  # CPU time of the replay (steadier on a shared machine)

    @property
    def retried_tasks(self) -> int:
        return sum(self.retried_cycles.values())

    @property
    def gpu_allocation_ratio(self) -> float:
        return self.allocated_milli / self.capacity_milli

    @property
    def arrived_ratio(self) -> float:
        return self.arrived_milli / self.capacity_milli

    @property
    def failed_tasks(self) -> int:
        return self.arrived_tasks - self.placed_tasks

    def allocation_at(self, percent: int) -> float | None:
        """Allocation ratio when arrivals first reached ``percent``% (None if never)."""
        return self.curve[percent] if 0 <= percent < len(self.curve) else None


@dataclass(frozen=True, slots=True)
class Spread:
    """Mean and sample standard deviation (0 for a single value)."""

    mean: float
    std: float
    n: int

    @staticmethod
    def of(values: Sequence[float]) -> Spread:
        n = len(values)
        if n == 0:
            return Spread(math.nan, math.nan, 0)
        mean = sum(values) / n
        var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
        return Spread(mean, math.sqrt(var), n)


@dataclass(frozen=True, slots=True)
class PolicySummary:
    """A policy over all its seeds."""

    policy: str
    seeds: tuple[int, ...]
    allocation: Spread  # at the end of the stream
    allocation_at_100: Spread  # when arrivals first reached 100% (n = runs that did)
    fragmentation_rate: Spread
    failed_tasks: Spread
    failed_by_reason: dict[str, float]  # mean count per run
    failed_by_class: dict[str, float]
    seconds: Spread
    cpu_seconds: Spread


def _mean_counts(counts: Sequence[dict[str, int]]) -> dict[str, float]:
    total: Counter[str] = Counter()
    for c in counts:
        total.update(c)
    return {k: v / len(counts) for k, v in total.most_common()}


def retry_summary(runs: Sequence[ReplayResult]) -> tuple[float, int]:
    """Over ``runs`` (one policy's seeds): the tasks an experiment placed only on a later
    window of kube-scheduler's, on average, and the most cycles any one took (1: none)."""
    mean = sum(r.retried_tasks for r in runs) / len(runs) if runs else 0.0
    return mean, max((c for r in runs for c in r.retried_cycles), default=1)


class _OfPolicy(Protocol):
    @property
    def policy(self) -> str: ...


_R = TypeVar("_R", bound=_OfPolicy)


def by_policy(results: Iterable[_R]) -> dict[str, list[_R]]:
    """The runs of each policy, policies in the order they first appear."""
    grouped: dict[str, list[_R]] = {}
    for r in results:
        grouped.setdefault(r.policy, []).append(r)
    return grouped


def summarize(results: Iterable[ReplayResult]) -> list[PolicySummary]:
    """One summary per policy, in the order the policies first appear."""
    out = []
    for policy, runs in by_policy(results).items():
        at_100 = [a for r in runs if (a := r.allocation_at(100)) is not None]
        out.append(
            PolicySummary(
                policy=policy,
                seeds=tuple(r.seed for r in runs),
                allocation=Spread.of([r.gpu_allocation_ratio for r in runs]),
                allocation_at_100=Spread.of(at_100),
                fragmentation_rate=Spread.of([r.fragmentation_rate for r in runs]),
                failed_tasks=Spread.of([r.failed_tasks for r in runs]),
                failed_by_reason=_mean_counts([r.failed_by_reason for r in runs]),
                failed_by_class=_mean_counts([r.failed_by_class for r in runs]),
                seconds=Spread.of([r.seconds for r in runs]),
                cpu_seconds=Spread.of([r.cpu_seconds for r in runs]),
            )
        )
    return out
