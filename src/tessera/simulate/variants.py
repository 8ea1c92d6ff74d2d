"""Workload variants of a task list: the same total GPU demand, another mix.

The published FGD figures come from one mix, the openb default list (28% of its GPU
demand on shared cards, 7% in multi-card tasks). A placement policy that reads the mix it
observes must hold on other mixes too, so the simulator makes them from the list itself,
in steps, without inventing task shapes:

* ``shared``: whole single cards give way to shared-card tasks until shared-card tasks
  carry ``share`` of the GPU demand;
* ``multi``: whole single cards give way to multi-card tasks (2, 4, 8 cards) until those
  carry ``share`` of it.

Tasks taken out are single whole-card tasks drawn at random; tasks put in are copies of
the list's own tasks of the growing class, drawn at random (a copy keeps its CPU, memory
and model constraint, which the trace ties to its GPU request), named
``{name}-{kind}-{n}``. Tasks are removed while the added GPU exceeds the removed, so the
total GPU demand stays within one whole card of the list's. Seeded: the same arguments
give the same list.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import replace

from tessera.errors import SpecError
from tessera.simulate.trace import MILLI_PER_CARD, TraceTask

__all__ = ["KINDS", "demand_share", "make_variant", "parse_variant"]


def _is_shared(t: TraceTask) -> bool:
    return t.num_gpu == 1 and t.gpu_milli < MILLI_PER_CARD


def _is_multi(t: TraceTask) -> bool:
    return t.num_gpu > 1


def _is_single_whole(t: TraceTask) -> bool:
    return t.num_gpu == 1 and t.gpu_milli == MILLI_PER_CARD


KINDS: dict[str, Callable[[TraceTask], bool]] = {"shared": _is_shared, "multi": _is_multi}


def demand_share(tasks: Sequence[TraceTask], kind: str) -> float:
    """The part of the list's GPU demand that tasks of ``kind`` carry."""
    of_kind = KINDS[kind]
    total = sum(t.gpu_milli_total for t in tasks)
    return sum(t.gpu_milli_total for t in tasks if of_kind(t)) / total if total else 0.0


def make_variant(
    tasks: Sequence[TraceTask], kind: str, share: float, seed: int = 0
) -> list[TraceTask]:
    """``tasks`` with single whole-card tasks swapped for ``kind`` tasks until those carry
    ``share`` of the GPU demand (see the module docstring)."""
    if kind not in KINDS:
        raise SpecError("variant", f"must be one of {', '.join(sorted(KINDS))}", kind)
    of_kind = KINDS[kind]
    donors = [t for t in tasks if of_kind(t)]
    if not donors:
        raise SpecError("variant", f"the task list has no {kind} task to copy", kind)
    now = demand_share(tasks, kind)
    total = sum(t.gpu_milli_total for t in tasks)
    singles = [i for i, t in enumerate(tasks) if _is_single_whole(t)]
    reachable = now + sum(tasks[i].gpu_milli_total for i in singles) / total  # a donor: > 0
    if not now <= share <= reachable:
        raise SpecError(
            "variant share", f"must be between {now:.3f} (the list's) and {reachable:.3f}", share
        )
    rng = random.Random(f"variant/{kind}/{share}/{seed}")
    rng.shuffle(singles)
    removed: set[int] = set()
    added: list[TraceTask] = []
    gained = removed_milli = 0  # GPU milli the kind has gained, the single cards lost
    while gained < (share - now) * total:
        copy = donors[rng.randrange(len(donors))]
        added.append(replace(copy, name=f"{copy.name}-{kind}-{len(added)}"))
        gained += copy.gpu_milli_total
        while removed_milli < gained and singles:
            i = singles.pop()
            removed.add(i)
            removed_milli += tasks[i].gpu_milli_total
    return [t for i, t in enumerate(tasks) if i not in removed] + added


def parse_variant(text: str) -> tuple[str, float]:
    """``KIND:SHARE`` (``shared:0.6``) -> (kind, share)."""
    kind, sep, share = text.partition(":")
    if not sep or kind not in KINDS:
        raise SpecError(
            "variant", f"must be KIND:SHARE with KIND one of {', '.join(sorted(KINDS))}", text
        )
    try:
        value = float(share)
    except ValueError:
        raise SpecError("variant", "SHARE must be a number between 0 and 1", text) from None
    return kind, value
