"""kube-scheduler's search for feasible nodes (``percentageOfNodesToScore``), for replays.

kube-scheduler does not hand an extender every node. Each scheduling cycle walks the
nodes from where the previous cycle stopped, runs kube-scheduler's own filters, and stops
once it has found ``nodes_to_find`` nodes that pass; only those reach the extender. For
Tessera's pods those filters check CPU and memory: the GPU resources are
``ignoredByScheduler``, their fit is the extender's. A pod the window cannot hold fails
that cycle and is tried again on a later one, which starts where this one stopped.

The numbers are kube-scheduler's (``numFeasibleNodesToFind`` in
pkg/scheduler/schedule_one.go): every node below 100 nodes; a percentage of 0 means
adaptive, 50 % less one point per 125 nodes and at least 5 %; never fewer than 100.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.cluster.snapshot import Snapshot
from tessera.model.types import PodRequest

__all__ = ["ALL_NODES", "NodeSearch", "backoff_wait_s", "nodes_to_find"]

ALL_NODES = 100  # percentageOfNodesToScore that hands the extender every feasible node
MIN_FEASIBLE_NODES = 100
MIN_FEASIBLE_PERCENT = 5
INITIAL_BACKOFF_S = 1.0  # kube-scheduler's podInitialBackoffSeconds
MAX_BACKOFF_S = 10.0  # podMaxBackoffSeconds


def nodes_to_find(percentage: int, all_nodes: int) -> int:
    """How many feasible nodes one cycle looks for, in a cluster of ``all_nodes``."""
    if not 0 <= percentage <= 100:
        raise ValueError(f"percentageOfNodesToScore must be 0..100 (got {percentage})")
    if all_nodes < MIN_FEASIBLE_NODES:
        return all_nodes
    if percentage == 0:  # adaptive
        percentage = max(50 - all_nodes // 125, MIN_FEASIBLE_PERCENT)
    return max(all_nodes * percentage // 100, MIN_FEASIBLE_NODES)


def backoff_wait_s(cycles: int) -> float:
    """The least a pod placed on cycle ``cycles`` waited in kube-scheduler's backoff: 1 s
    after its first unschedulable cycle, doubling, at most 10 s each. (It also waits for a
    cluster event that may make it schedulable, which on a busy cluster comes quickly.)"""
    return float(sum(min(INITIAL_BACKOFF_S * 2.0**k, MAX_BACKOFF_S) for k in range(cycles - 1)))


@dataclass(slots=True)
class NodeSearch:
    """The rotating search of one kube-scheduler; ``start`` carries over between cycles."""

    percentage: int
    start: int = 0

    def __post_init__(self) -> None:
        nodes_to_find(self.percentage, 0)  # refuses a percentage outside 0..100

    def window(self, snap: Snapshot, pod: PodRequest) -> tuple[list[str], int]:
        """One cycle: the nodes that reach the extender, in the order kube-scheduler sends
        them, and how many nodes the cycle walked (the next cycle starts after them)."""
        rows = np.flatnonzero(snap.tables.present)
        n = int(rows.shape[0])
        if n == 0:
            return [], 0
        start = self.start % n
        order = np.concatenate((rows[start:], rows[:start]))
        t = snap.tables
        passes = (t.cpu_free[order] >= pod.cpu_milli) & (t.mem_free[order] >= pod.memory_mib)
        found = np.flatnonzero(passes)
        want = nodes_to_find(self.percentage, n)
        walked = n
        if found.shape[0] >= want and want < n:
            walked = int(found[want - 1]) + 1
            found = found[:want]
        self.start = (start + walked) % n
        return [snap.names[int(r)] for r in order[found]], walked
