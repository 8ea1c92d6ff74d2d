"""Replay a task list on a cluster with one policy, the way the published experiment does.

Tasks arrive one by one (:func:`arrival_stream`); each is placed with the same pure core
the extender uses (``ClusterState`` + ``place``), or dropped when nothing fits; nothing
departs. The policy learns the workload mix online, from the tasks that have arrived so
far (the extender can know no more than that). With ``nodes_to_score`` below 100 each
decision sees only the window of nodes kube-scheduler would hand the extender
(:mod:`tessera.simulate.sampling`).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tessera.cluster import ClusterState
from tessera.errors import PlacementError
from tessera.model.types import NodeInventory
from tessera.simulate.arrivals import arrival_stream
from tessera.simulate.metrics import ReplayResult, gpu_capacity_milli
from tessera.simulate.sampling import ALL_NODES, NodeSearch
from tessera.simulate.trace import TraceTask, to_pod_request
from tessera.simulate.workload import request_class

if TYPE_CHECKING:
    from tessera.cluster.snapshot import Snapshot
    from tessera.model.types import PodRequest
    from tessera.placement.base import Policy
    from tessera.placement.mix import WorkloadMix
    from tessera.placement.place import Decision

__all__ = ["failure_reason", "node_order", "reason_category", "replay", "replay_stream"]

Progress = Callable[[int, int], None]  # (tasks done, tasks in the stream)


def failure_reason(err: PlacementError) -> str:
    """Why a task found no node, in one word: the category most nodes gave.

    ``gpu`` (too few cards with room, or too few cards), ``cpu``, ``memory``, ``model``
    (no card of an allowed model or UUID), ``no-gpu`` (no GPU, or none healthy);
    any other reason is kept as the filter worded it.
    """
    if not err.reasons:
        return "no nodes"
    by_category: Counter[str] = Counter()
    for reason, n in Counter(err.reasons.values()).items():  # few distinct phrases
        by_category[reason_category(reason)] += n
    return by_category.most_common(1)[0][0]


def reason_category(reason: str) -> str:
    """The category of one node's filter reason (see :func:`failure_reason`)."""
    text = reason.lower()
    if text.startswith("insufficient cpu"):
        return "cpu"
    if text.startswith("insufficient memory"):
        return "memory"
    if text.startswith(("no gpu", "no healthy")):
        return "no-gpu"
    if text.startswith("model") or "uuid" in text:
        return "model"
    if text.startswith(("no card", "no free", "fewer than", "cards cannot")):
        return "gpu"  # no room on the cards, or too few cards on the node
    return reason


def replay(
    nodes: Sequence[NodeInventory],
    tasks: Sequence[TraceTask],
    policy: str,
    seed: int,
    arrival: float,
    progress: Progress | None = None,
    make: Callable[[str, int, WorkloadMix], Policy] | None = None,
    nodes_to_score: int = ALL_NODES,
) -> ReplayResult:
    """Run one experiment of the published protocol and measure it (``make``,
    ``nodes_to_score``: as for :func:`replay_stream`).

    Besides the task stream, the seed also shuffles the order of the nodes, as the
    published simulator does (it renames nodes with a random prefix): policies break
    ties between equal nodes by that order, so a node file sorted by model must not
    decide the result.
    """
    stream = arrival_stream(tasks, gpu_capacity_milli(nodes), arrival, seed)
    order = node_order(nodes, seed)
    return replay_stream(
        order, stream, policy, seed, arrival, progress, make=make, nodes_to_score=nodes_to_score
    )


def node_order(nodes: Sequence[NodeInventory], seed: int) -> list[NodeInventory]:
    """The nodes in the order the replay of ``seed`` adds them to the cluster."""
    order = list(nodes)
    random.Random(f"node-order/{seed}").shuffle(order)
    return order


def replay_stream(
    nodes: Sequence[NodeInventory],
    stream: Sequence[TraceTask],
    policy: str,
    seed: int,
    arrival: float,
    progress: Progress | None = None,
    state: ClusterState | None = None,
    make: Callable[[str, int, WorkloadMix], Policy] | None = None,
    nodes_to_score: int = ALL_NODES,
) -> ReplayResult:
    """Place ``stream`` in order on an empty cluster of ``nodes``; ``seed`` drives the
    policy's own randomness, ``arrival`` is only recorded. Pass ``state`` (holding
    ``nodes``) to place onto it and inspect it afterwards, ``make`` (name, seed, mix)
    to replay a policy that is not one of Tessera's (an experiment's variant), and
    ``nodes_to_score`` (kube-scheduler's percentageOfNodesToScore, 0 adaptive) to let
    each decision see only the nodes kube-scheduler would hand the extender."""
    from tessera.placement import WorkloadMix, fragmentation_rate, make_policy

    started, started_cpu = time.perf_counter(), time.process_time()
    capacity = gpu_capacity_milli(nodes)
    if state is None:
        state = ClusterState(nodes)
    mix = WorkloadMix()
    chooser = make(policy, seed, mix) if make else make_policy(policy, seed=seed, mix=mix)

    search = None if nodes_to_score == ALL_NODES else NodeSearch(nodes_to_score)
    arrived = allocated = placed = 0
    retried: Counter[int] = Counter()
    curve = [0.0]
    failed_by_reason: Counter[str] = Counter()
    failed_by_class: Counter[str] = Counter()
    for i, task in enumerate(stream):
        pod = to_pod_request(task)
        mix.observe(pod)
        arrived += task.gpu_milli_total
        try:
            decision, cycles = place_in_cycles(state.snapshot(), pod, chooser, search)
        except PlacementError as err:
            failed_by_reason[failure_reason(err)] += 1
            failed_by_class[request_class(task.num_gpu, task.gpu_milli)] += 1
        else:
            state.assign(pod, decision.assignment)
            allocated += task.gpu_milli_total
            placed += 1
            if cycles > 1:
                retried[cycles] += 1
        while len(curve) * capacity <= 100 * arrived:  # crossed the next whole percent
            curve.append(allocated / capacity)
        if progress is not None:
            progress(i + 1, len(stream))

    mix.freeze()  # measure against every arrival, not the last refresh
    return ReplayResult(
        policy=policy,
        seed=seed,
        arrival=arrival,
        capacity_milli=capacity,
        arrived_tasks=len(stream),
        arrived_milli=arrived,
        placed_tasks=placed,
        allocated_milli=allocated,
        fragmentation_rate=fragmentation_rate(state.snapshot(), mix),
        curve=tuple(curve),
        failed_by_reason=dict(failed_by_reason.most_common()),
        failed_by_class=dict(failed_by_class.most_common()),
        nodes_to_score=nodes_to_score,
        retried_cycles=dict(sorted(retried.items())),
        seconds=time.perf_counter() - started,
        cpu_seconds=time.process_time() - started_cpu,
    )


def place_in_cycles(
    snap: Snapshot, pod: PodRequest, chooser: Policy, search: NodeSearch | None
) -> tuple[Decision, int]:
    """The decision for ``pod`` and the scheduling cycles it took: one over every node
    without ``search``; with it, one per window until a window holds the pod.

    Raises PlacementError, naming every node, once the windows have walked them all.
    """
    from tessera.placement import place

    if search is None:
        return place(snap, pod, chooser), 1
    walked = cycles = 0
    while walked < len(snap):
        names, step = search.window(snap, pod)
        walked, cycles = walked + step, cycles + 1
        if names:
            try:
                return place(snap, pod, chooser, names), cycles
            except PlacementError:
                pass
    # No window held it, so no node can: the whole cluster's error gives every reason.
    return place(snap, pod, chooser), cycles
