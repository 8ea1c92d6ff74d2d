"""Replay with departures: tasks arrive at their trace creation time and leave after their
trace lifetime, so cards free up. The published protocol (``replay``), where nothing
departs, stays the default; this mode answers how a policy does over time.

The rules, in one place:

* Events are taken in time order; at one instant departures come first (a card freed at
  t is free for a task arriving at t), then arrivals in trace order.
* A task that fits nowhere waits. After every departure each waiting task is tried again,
  in arrival order, and each that fits is placed: no head-of-line blocking, as
  kube-scheduler retries every pending pod.
* A placed task runs its trace lifetime (deletion - creation) from the moment it was
  placed. A task without a deletion time, or with one not after its creation, never
  leaves.
* The run ends at the last event (the last arrival or departure); a task still waiting
  then has waited until that moment and counts as never placed.

Measured: the time-weighted GPU allocation (the integral of allocated milli-GPU over the
run, over capacity times the run's length), the mean and peak number of waiting tasks,
and each placed task's wait.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera.cluster import ClusterState
from tessera.errors import PlacementError, SpecError
from tessera.model.csvrows import int_column, rows
from tessera.model.types import NodeInventory
from tessera.simulate.metrics import gpu_capacity_milli
from tessera.simulate.trace import TRACE_NAMESPACE, TraceTask, to_pod_request

__all__ = [
    "DeparturesResult",
    "Lifetime",
    "parse_lifetimes",
    "read_lifetimes",
    "replay_departures",
]


@dataclass(frozen=True, slots=True)
class Lifetime:
    """When a task was created and deleted in the trace (seconds; deleted None: never)."""

    created: int
    deleted: int | None = None

    @property
    def duration(self) -> int | None:
        if self.deleted is None or self.deleted <= self.created:
            return None
        return self.deleted - self.created


def parse_lifetimes(lines: Iterable[str], source: str = "tasks") -> dict[str, Lifetime]:
    """``name`` -> lifetime from a task list's ``creation_time`` and ``deletion_time``
    columns (deletion may be empty); errors name the source, line and column."""
    out: dict[str, Lifetime] = {}
    for where, row in rows(lines, source, ("name", "creation_time", "deletion_time")):
        name = (row.get("name") or "").strip()
        created = int_column(row, "creation_time", where, 0)
        raw = (row.get("deletion_time") or "").strip()
        deleted = int_column(row, "deletion_time", where, 0) if raw else None
        if name in out:
            raise SpecError(f"{where}: column name", "duplicate task name", name)
        out[name] = Lifetime(created, deleted)
    return out


def read_lifetimes(path: str | Path) -> dict[str, Lifetime]:
    p = Path(path)
    with p.open(newline="") as f:
        return parse_lifetimes(f, source=p.name)


@dataclass(frozen=True, slots=True)
class DeparturesResult:
    policy: str
    seed: int
    capacity_milli: int
    tasks: int
    placed_tasks: int
    start: int  # the first arrival
    end: int  # the last event
    allocated_milli_seconds: int  # integral of allocated milli-GPU over [start, end]
    waiting_task_seconds: int  # integral of the number of waiting tasks over [start, end]
    peak_waiting: int
    waits: tuple[int, ...]  # seconds each placed task waited, in placement order

    @property
    def never_placed(self) -> int:
        return self.tasks - self.placed_tasks

    @property
    def time_weighted_allocation(self) -> float:
        span = self.end - self.start
        return self.allocated_milli_seconds / (self.capacity_milli * span) if span else 0.0

    @property
    def mean_waiting(self) -> float:
        span = self.end - self.start
        return self.waiting_task_seconds / span if span else 0.0


_DEPART, _ARRIVE = 0, 1  # at one instant, departures first


def replay_departures(
    nodes: Sequence[NodeInventory],
    tasks: Sequence[TraceTask],
    lifetimes: Mapping[str, Lifetime],
    policy: str,
    seed: int = 0,
) -> DeparturesResult:
    """Replay ``tasks`` at their ``lifetimes`` on an empty cluster of ``nodes``."""
    from tessera.placement import WorkloadMix, make_policy, place

    missing = [t.name for t in tasks if t.name not in lifetimes]
    if missing:
        raise SpecError("lifetimes", f"no creation time for task(s) {missing[:5]}")
    state = ClusterState(nodes)
    mix = WorkloadMix()
    chooser = make_policy(policy, seed=seed, mix=mix)
    capacity = gpu_capacity_milli(nodes)

    # (time, kind, order, task index): order keeps trace order among equal times.
    events: list[tuple[int, int, int, int]] = [
        (lifetimes[t.name].created, _ARRIVE, i, i) for i, t in enumerate(tasks)
    ]
    heapq.heapify(events)
    waiting: list[int] = []  # task indices, in arrival order
    waits: list[int] = []
    allocated = 0
    area = waiting_area = 0
    peak = 0
    start = events[0][0] if events else 0
    now = start

    def try_place(i: int, t: int) -> bool:
        nonlocal allocated
        task = tasks[i]
        pod = to_pod_request(task)
        try:
            decision = place(state.snapshot(), pod, chooser)
        except PlacementError:
            return False
        state.assign(pod, decision.assignment)
        allocated += task.gpu_milli_total
        waits.append(t - lifetimes[task.name].created)
        duration = lifetimes[task.name].duration
        if duration is not None:
            heapq.heappush(events, (t + duration, _DEPART, i, i))
        return True

    while events:
        t, kind, _, i = heapq.heappop(events)
        area += allocated * (t - now)
        waiting_area += len(waiting) * (t - now)
        now = t
        if kind == _DEPART:
            state.release(f"{TRACE_NAMESPACE}/{tasks[i].name}")
            allocated -= tasks[i].gpu_milli_total
            still = []
            for w in waiting:
                if not try_place(w, t):
                    still.append(w)
            waiting = still
        else:
            mix.observe(to_pod_request(tasks[i]))
            if not try_place(i, t):
                waiting.append(i)
        peak = max(peak, len(waiting))
    return DeparturesResult(
        policy=policy,
        seed=seed,
        capacity_milli=capacity,
        tasks=len(tasks),
        placed_tasks=len(waits),
        start=start,
        end=now,
        allocated_milli_seconds=area,
        waiting_task_seconds=waiting_area,
        peak_waiting=peak,
        waits=tuple(waits),
    )
