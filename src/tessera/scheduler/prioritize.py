"""The ``prioritize`` verb: the placement policy's node scores on the extender's 0..10.

Scores are scaled linearly from the lowest to the highest score among the offered
nodes that can take the pod (0 and 9); the node the filter reserved gets 10, so with a
high extender weight the scheduler goes where the placement core decided. Nodes that
cannot take the pod get 0. Read-only: takes no reservation.
"""

from __future__ import annotations

from tessera.errors import SpecError
from tessera.placement.place import score_nodes
from tessera.scheduler.filter import ordered_candidates
from tessera.scheduler.placer import Placer
from tessera.scheduler.state import SchedulerState
from tessera.scheduler.wire import MAX_EXTENDER_PRIORITY, ExtenderArgs

__all__ = ["prioritize_pod", "scale"]


def scale(scores: dict[str, float], top: int = MAX_EXTENDER_PRIORITY - 1) -> dict[str, int]:
    """Map raw policy scores to 0..``top`` (all equal -> all ``top``)."""
    if not scores:
        return {}
    lo, hi = min(scores.values()), max(scores.values())
    if hi <= lo:
        return dict.fromkeys(scores, top)
    return {n: round((s - lo) / (hi - lo) * top) for n, s in scores.items()}


def prioritize_pod(state: SchedulerState, placer: Placer, args: ExtenderArgs) -> dict[str, int]:
    out = dict.fromkeys(args.node_names, 0)
    try:
        request = state.parse(args.pod)
    except SpecError:
        return out
    if request is None:
        return out
    with state.lock:
        snap = state.cluster.snapshot()
        names, _ = ordered_candidates(snap, args.node_names)
        reserved = state.reservations.get(request.key)
        scores = score_nodes(snap, request, names, placer.policy(request))
    out.update(scale(scores))
    if reserved is not None and reserved.node in out:
        out[reserved.node] = MAX_EXTENDER_PRIORITY
    return out
