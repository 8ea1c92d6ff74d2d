"""One scheduling decision: filter, score, pick cards.

``place`` is what the extender and the simulator call; ``filter_nodes``, ``score_nodes``
and ``pick_cards`` are the same steps one at a time, for the extender's verbs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tessera.cluster.snapshot import Snapshot
from tessera.errors import PlacementError
from tessera.model.types import Assignment, PodRequest
from tessera.placement.base import BoolArray, Demand, IntArray, Policy
from tessera.placement.binpack import BinpackCards
from tessera.placement.cards import assign_cards, fits_exactly
from tessera.placement.fit import feasible, reasons, resolve_rows

__all__ = ["Decision", "pick_cards", "place", "score_nodes"]


@dataclass(frozen=True, slots=True)
class Decision:
    """Where the pod goes, on which cards, and the node's score under the policy."""

    node: str
    assignment: Assignment
    score: float


def _candidates(
    snap: Snapshot, pod: PodRequest, names: Sequence[str] | None, exact: bool = True
) -> tuple[Demand, IntArray, BoolArray]:
    """The Demand restricted to feasible rows, plus all rows and the feasible mask.

    ``exact``: check a pod with several GPU containers node by node (Python, one card pick
    per node); place() skips it and tries the nodes best first instead.
    """
    rows, _ = resolve_rows(snap, names)
    ok, demand = feasible(snap, pod, rows)
    if exact and len(pod.gpu_containers()) > 1:
        for i in np.flatnonzero(ok).tolist():
            ok[i] = fits_exactly(snap, pod, snap.names[int(rows[i])])
    kept = Demand(
        pod=pod,
        primary=demand.primary,
        rows=rows[ok],
        card_ok=demand.card_ok[ok],
        need_mem=demand.need_mem[ok],
    )
    return kept, rows, ok


def score_nodes(
    snap: Snapshot, pod: PodRequest, names: Sequence[str] | None, policy: Policy
) -> dict[str, float]:
    """Score of each node in ``names`` that can take ``pod``; higher is better.

    Nodes that cannot take the pod are left out. Scores compare within one call only.
    """
    demand, _, _ = _candidates(snap, pod, names)
    scores = policy.node.score_rows(snap, demand)
    return {
        snap.names[r]: float(s) for r, s in zip(demand.rows.tolist(), scores.tolist(), strict=True)
    }


def pick_cards(snap: Snapshot, pod: PodRequest, node: str, policy: Policy) -> Assignment:
    """Concrete cards on ``node`` for every GPU container of ``pod``."""
    if node not in snap.rows:
        raise PlacementError(
            f"node {node} is not in the cluster state", {node: "node not in the cluster state"}
        )
    return assign_cards(snap, pod, node, policy.card)


def summarise(total: int, why: dict[str, str]) -> str:
    """ "0/12 nodes fit: 7 insufficient cpu, 5 model T4 excluded" (most common first)."""
    counts = Counter(why.values()).most_common()
    parts = ", ".join(f"{n} {reason}" for reason, n in counts)
    return f"0/{total} nodes fit" + (f": {parts}" if parts else "")


def place(
    snap: Snapshot, pod: PodRequest, policy: Policy, names: Sequence[str] | None = None
) -> Decision:
    """The best node for ``pod`` under ``policy`` and its cards.

    Raises PlacementError with a reason per node when no node can take it. Ties go to the
    node that came first into the cluster state, so equal inputs give equal decisions.
    """
    demand, rows, ok = _candidates(snap, pod, names, exact=False)
    if demand.rows.shape[0]:
        scores = policy.node.score_rows(snap, demand)
        # The best first (argmax keeps the first of equals); the full stable order only
        # when its cards do not work out (several GPU containers).
        best = int(np.argmax(scores))
        rest = np.argsort(-scores, kind="stable").tolist() if len(pod.gpu_containers()) > 1 else []
        for i in [best, *(j for j in rest if j != best)]:
            node = snap.names[int(demand.rows[i])]
            try:
                assignment = assign_cards(snap, pod, node, policy.card)
            except PlacementError:  # only with several GPU containers
                try:  # the tightest-first pick, which filter_nodes checks with
                    assignment = assign_cards(snap, pod, node, BinpackCards())
                except PlacementError:
                    continue
            return Decision(node=node, assignment=assignment, score=float(scores[i]))
    why = reasons(snap, pod, rows[~ok])
    together = "cards cannot hold all GPU containers together"
    why.update(dict.fromkeys((snap.names[r] for r in demand.rows.tolist()), together))
    raise PlacementError(f"pod {pod.key}: {summarise(int(rows.shape[0]), why)}", why)
