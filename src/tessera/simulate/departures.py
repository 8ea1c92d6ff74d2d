"""Replay with departures: tasks arrive at their trace creation time, compressed by a
speed-up, and leave after their trace lifetime, so cards free up. The published protocol
(``replay``), where nothing departs, stays the default; this mode answers how a policy
does over time.

The rules, in one place:

* A task arrives at ``creation_time / speedup`` (seconds from the trace's start) and,
  once placed, runs its trace lifetime (``deletion_time - creation_time``, not sped up).
  A task without a deletion time, or with one not after its creation, never leaves.
  The speed-up is the load knob: the openb lists' tasks are short (median lifetime 9
  minutes) and spread over months, so at the trace's own pace the cluster never fills.
* Events are taken in time order; at one instant departures come first (a card freed at
  t is free for a task arriving at t), then arrivals in trace order.
* A task that fits nowhere waits. After every departure the waiting tasks are tried again,
  in arrival order, and each that fits is placed: no head-of-line blocking, as
  kube-scheduler retries every pending pod.
* The replay runs until no event is left; a task still waiting then is never placed.

Measured over the **window** from the 1st to the 99th percentile arrival (nearest rank),
so a few stray tasks weeks before or after the rest do not turn the figures into
averages over an empty cluster: the time-weighted GPU allocation (the integral of
allocated milli-GPU over the window, over capacity times its length), the time-weighted
demand (allocated plus waiting milli-GPU, the load the cluster actually saw), and the
mean and peak number of waiting tasks. Every placed task's wait counts, in or out of the
window.

Retrying only where room appeared: a waiting task failed on every node when it last
tried, and since then nodes only lost room, except the one a task just left. So after a
departure a waiting task can fit only on that node, and is tried there alone, which is
what ``place`` over the whole cluster would pick. Waiting tasks of one shape fail alike,
so after one fails the others of its shape are not tried until the next departure.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera.cluster import ClusterState
from tessera.errors import PlacementError, SpecError
from tessera.model.csvrows import int_column, rows, text_column
from tessera.model.types import NodeInventory, PodRequest
from tessera.simulate.arrivals import arrival_stream
from tessera.simulate.metrics import gpu_capacity_milli
from tessera.simulate.replay import node_order
from tessera.simulate.trace import TRACE_NAMESPACE, TraceTask, to_pod_request

__all__ = [
    "CURVE_POINTS",
    "DEFAULT_ARRIVAL",
    "DEFAULT_SPEEDUP",
    "DeparturesResult",
    "Lifetime",
    "departures_stream",
    "measure_window",
    "parse_lifetimes",
    "read_lifetimes",
    "replay_departures",
    "replay_with_departures",
]

CURVE_POINTS = 100  # samples of allocation and waiting tasks across the window
# The defaults of `tessera simulate --departures`: the openb default list requests 98% of
# the cluster's GPUs in all and its tasks are short, so only copies (3x capacity) and
# arrivals 3,000x faster than the trace's make the cluster contend (docs/simulator.md).
DEFAULT_ARRIVAL = 3.0
DEFAULT_SPEEDUP = 3000.0

Progress = Callable[[int, int], None]  # (events done, events known so far)


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
        name = text_column(row, "name", where)
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
    """One replay with departures: a policy, a seed (node order), a speed-up."""

    policy: str
    seed: int
    speedup: float
    arrival: float  # GPU requested by the stream, x capacity (0: the task list as given)
    capacity_milli: int
    tasks: int
    placed_tasks: int
    window: tuple[float, float]  # measured from, to (replay seconds)
    allocated_milli_seconds: float  # integral of allocated milli-GPU over the window
    demand_milli_seconds: float  # the same of allocated + waiting milli-GPU
    waiting_task_seconds: float  # integral of the number of waiting tasks over the window
    peak_waiting: int  # most tasks waiting at once, in the window
    waits: tuple[float, ...]  # seconds each placed task waited, in placement order
    allocation_curve: tuple[float, ...]  # allocation ratio at CURVE_POINTS + 1 instants
    waiting_curve: tuple[int, ...]  # waiting tasks at the same instants
    seconds: float = 0.0
    cpu_seconds: float = 0.0

    @property
    def span(self) -> float:
        return self.window[1] - self.window[0]

    @property
    def never_placed(self) -> int:
        return self.tasks - self.placed_tasks

    @property
    def time_weighted_allocation(self) -> float:
        return (
            self.allocated_milli_seconds / (self.capacity_milli * self.span) if self.span else 0.0
        )

    @property
    def time_weighted_demand(self) -> float:
        return self.demand_milli_seconds / (self.capacity_milli * self.span) if self.span else 0.0

    @property
    def mean_waiting(self) -> float:
        return self.waiting_task_seconds / self.span if self.span else 0.0

    def wait_quantile(self, q: float) -> float:
        """The ``q`` quantile (nearest rank) of the placed tasks' waits; 0 with none."""
        if not self.waits:
            return 0.0
        ordered = sorted(self.waits)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def measure_window(arrivals: Sequence[float]) -> tuple[float, float]:
    """From the 1st to the 99th percentile of ``arrivals`` (nearest rank)."""
    ordered = sorted(arrivals)
    n = len(ordered)
    return ordered[math.ceil(0.01 * n) - 1 if n else 0], ordered[math.ceil(0.99 * n) - 1]


def _shape(task: TraceTask) -> tuple[int, int, int, int, frozenset[str]]:
    return (task.cpu_milli, task.memory_mib, task.num_gpu, task.gpu_milli, task.gpu_spec)


_DEPART, _ARRIVE = 0, 1  # at one instant, departures first


class _Integral:
    """The integral of a step function over [lo, hi], fed one step at a time."""

    def __init__(self, lo: float, hi: float) -> None:
        self.lo, self.hi, self.total = lo, hi, 0.0

    def add(self, value: float, t0: float, t1: float) -> None:
        a, b = max(t0, self.lo), min(t1, self.hi)
        if b > a:
            self.total += value * (b - a)


def replay_departures(
    nodes: Sequence[NodeInventory],
    tasks: Sequence[TraceTask],
    lifetimes: Mapping[str, Lifetime],
    policy: str,
    seed: int = 0,
    speedup: float = 1.0,
    progress: Progress | None = None,
    arrival: float = 0.0,
) -> DeparturesResult:
    """Replay ``tasks`` at their ``lifetimes`` on an empty cluster of ``nodes`` (in the
    order given: pass ``replay.node_order(nodes, seed)`` for the seeded tie-break)."""
    import time

    from tessera.placement import WorkloadMix, make_policy, place
    from tessera.placement.fit import feasible, resolve_rows

    if not speedup > 0:
        raise SpecError("speedup", "must be > 0", speedup)
    if not tasks:
        raise SpecError("tasks", "must hold at least one task")
    missing = [t.name for t in tasks if t.name not in lifetimes]
    if missing:
        raise SpecError("lifetimes", f"no creation time for task(s) {missing[:5]}")
    started, started_cpu = time.perf_counter(), time.process_time()
    state = ClusterState(nodes)
    mix = WorkloadMix()
    chooser = make_policy(policy, seed=seed, mix=mix)
    capacity = gpu_capacity_milli(nodes)
    pods = [to_pod_request(t) for t in tasks]
    arrive = [lifetimes[t.name].created / speedup for t in tasks]
    lo, hi = measure_window(arrive)
    allocated_area, demand_area, waiting_area = (_Integral(lo, hi) for _ in range(3))
    samples = [lo + (hi - lo) * k / CURVE_POINTS for k in range(CURVE_POINTS + 1)]
    allocation_curve: list[float] = []
    waiting_curve: list[int] = []

    # (time, kind, order, task index): order keeps trace order among equal times.
    events: list[tuple[float, int, int, int]] = [
        (arrive[i], _ARRIVE, i, i) for i in range(len(tasks))
    ]
    heapq.heapify(events)
    node_of: dict[int, str] = {}
    waiting: dict[tuple[int, int, int, int, frozenset[str]], deque[int]] = {}
    n_waiting = waiting_milli = 0
    waits: list[float] = []
    allocated = peak = 0
    now = events[0][0]
    done = 0

    def try_place(i: int, t: float, names: Sequence[str] | None) -> bool:
        nonlocal allocated
        pod: PodRequest = pods[i]
        snap = state.snapshot()
        rows, _ = resolve_rows(snap, names)
        if not feasible(snap, pod, rows)[0].any():  # exact for one GPU container; no reasons
            return False
        try:
            decision = place(snap, pod, chooser, names)
        except PlacementError:
            return False
        state.assign(pod, decision.assignment)
        node_of[i] = decision.node
        allocated += tasks[i].gpu_milli_total
        waits.append(t - arrive[i])
        duration = lifetimes[tasks[i].name].duration
        if duration is not None:
            heapq.heappush(events, (t + duration, _DEPART, i, i))
        return True

    def retry_on(node: str, t: float) -> None:
        """Waiting tasks in arrival order, on the one node that gained room."""
        nonlocal n_waiting, waiting_milli
        heads = [(q[0], key) for key, q in waiting.items()]
        heapq.heapify(heads)
        while heads:
            i, key = heapq.heappop(heads)
            if not try_place(i, t, [node]):
                continue  # the rest of this shape cannot fit either
            queue = waiting[key]
            queue.popleft()
            n_waiting -= 1
            waiting_milli -= tasks[i].gpu_milli_total
            if queue:
                heapq.heappush(heads, (queue[0], key))
            else:
                del waiting[key]

    while events:
        t, kind, _, i = heapq.heappop(events)
        while samples and samples[0] < t:  # a sample sees every event up to its instant
            samples.pop(0)
            allocation_curve.append(allocated / capacity)
            waiting_curve.append(n_waiting)
        allocated_area.add(allocated, now, t)
        demand_area.add(allocated + waiting_milli, now, t)
        waiting_area.add(n_waiting, now, t)
        now = t
        if kind == _DEPART:
            state.release(f"{TRACE_NAMESPACE}/{tasks[i].name}")
            allocated -= tasks[i].gpu_milli_total
            if waiting:
                retry_on(node_of.pop(i), t)
        else:
            mix.observe(pods[i])
            if not try_place(i, t, None):
                waiting.setdefault(_shape(tasks[i]), deque()).append(i)
                n_waiting += 1
                waiting_milli += tasks[i].gpu_milli_total
        if lo <= t <= hi:
            peak = max(peak, n_waiting)
        done += 1
        if progress is not None:
            progress(done, done + len(events))
    for _ in samples:  # the window ends at the last event or after it
        allocation_curve.append(allocated / capacity)
        waiting_curve.append(n_waiting)
    return DeparturesResult(
        policy=policy,
        seed=seed,
        speedup=speedup,
        arrival=arrival,
        capacity_milli=capacity,
        tasks=len(tasks),
        placed_tasks=len(waits),
        window=(lo, hi),
        allocated_milli_seconds=allocated_area.total,
        demand_milli_seconds=demand_area.total,
        waiting_task_seconds=waiting_area.total,
        peak_waiting=peak,
        waits=tuple(waits),
        allocation_curve=tuple(allocation_curve),
        waiting_curve=tuple(waiting_curve),
        seconds=time.perf_counter() - started,
        cpu_seconds=time.process_time() - started_cpu,
    )


def departures_stream(
    tasks: Sequence[TraceTask],
    lifetimes: Mapping[str, Lifetime],
    capacity_milli: int,
    arrival: float,
    seed: int,
) -> tuple[list[TraceTask], dict[str, Lifetime]]:
    """The published protocol's stream (the list shuffled by ``seed``, padded with copies
    to ``arrival`` x capacity) with each task's lifetime; a copy arrives and runs as its
    original did."""
    stream = arrival_stream(tasks, capacity_milli, arrival, seed)
    return stream, {t.name: lifetimes[_original(t.name, lifetimes)] for t in stream}


def _original(name: str, lifetimes: Mapping[str, Lifetime]) -> str:
    """The traced task a copy was made from: copies (``-copy-N``) and variants' copies
    (``-shared-N``, ``-multi-N``) add ``-``-separated suffixes to its name."""
    while name not in lifetimes and "-" in name:
        name = name.rpartition("-")[0]
    if name not in lifetimes:
        raise SpecError("lifetimes", f"no creation time for task {name!r}")
    return name


def replay_with_departures(
    nodes: Sequence[NodeInventory],
    tasks: Sequence[TraceTask],
    lifetimes: Mapping[str, Lifetime],
    policy: str,
    seed: int,
    arrival: float = DEFAULT_ARRIVAL,
    speedup: float = DEFAULT_SPEEDUP,
    progress: Progress | None = None,
) -> DeparturesResult:
    """One experiment of the departures mode: the seed draws the copies and the node order
    (the tie-break, as in the published protocol)."""
    stream, own = departures_stream(tasks, lifetimes, gpu_capacity_milli(nodes), arrival, seed)
    ordered = node_order(nodes, seed)
    return replay_departures(ordered, stream, own, policy, seed, speedup, progress, arrival)
