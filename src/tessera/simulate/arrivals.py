"""The arrival stream of the published protocol (Weng et al., ATC 2023).

The task list is shuffled by the seed; then random copies of its own tasks (drawn
uniformly, with replacement, from the list as given) are appended until the GPU requested
reaches ``arrival`` times the cluster's GPU capacity. The stream stops before the first
task that would push the requested total past the target, so it never overshoots; when
the list itself already requests more than the target, the stream is its shortest
shuffled prefix that stops there (the published simulator removes random tasks instead;
for a shuffled list both give a random subset of the same total). Tasks without GPUs add
nothing to the total and arrive with the others.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from tessera.errors import SpecError
from tessera.simulate.trace import TraceTask

__all__ = ["arrival_stream"]


def arrival_stream(
    tasks: Sequence[TraceTask], capacity_milli: int, arrival: float, seed: int
) -> list[TraceTask]:
    """The tasks in arrival order; copies are named ``{name}-copy-{n}`` (n from 0)."""
    if arrival <= 0:
        raise SpecError("arrival", "must be > 0", arrival)
    rng = random.Random(seed)
    order = list(tasks)
    rng.shuffle(order)
    target = arrival * capacity_milli
    stream: list[TraceTask] = []
    requested = 0
    for task in order:
        if requested + task.gpu_milli_total > target:
            return stream
        stream.append(task)
        requested += task.gpu_milli_total
    if not any(t.gpu_milli_total for t in tasks):
        return stream  # copies would never reach the target
    while True:
        task = tasks[rng.randrange(len(tasks))]
        if requested + task.gpu_milli_total > target:
            return stream
        stream.append(replace(task, name=f"{task.name}-copy-{len(stream) - len(order)}"))
        requested += task.gpu_milli_total
