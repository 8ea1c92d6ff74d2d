"""The ``filter`` verb: which of the offered nodes can take the pod, and why not the rest.

The decision is taken here, in the scheduling cycle: the placement core chooses the
node and the cards among the nodes the scheduler offers (``place``), and the choice is
reserved at once, so the next cycle -- which may run before this pod's bind arrives --
already sees those cards as taken. With ``narrow`` (the default) only the chosen node is
returned: the scheduler binds where the placement core decided, so a replay of the same
pod sequence through ``place`` gives the same placements. Without it, every feasible
node is returned and ``prioritize`` ranks them (the reserved node first); ``bind`` then
moves the reservation if the scheduler chose another node.

Nothing here touches the API server.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tessera.cluster.snapshot import Snapshot
from tessera.errors import PlacementError, SpecError
from tessera.model.annotations import INVENTORY
from tessera.model.types import Assignment, PodRequest
from tessera.placement.fit import filter_nodes
from tessera.placement.place import place
from tessera.scheduler.holds import leaves_room
from tessera.scheduler.placer import Placer
from tessera.scheduler.state import SchedulerState, pod_priority
from tessera.scheduler.wire import ExtenderArgs

__all__ = ["FilterOutcome", "filter_pod", "ordered_candidates"]

NO_INVENTORY = f"no {INVENTORY} annotation (not a Tessera GPU node)"


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    node_names: list[str]
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    request: PodRequest | None = None
    decision: Assignment | None = None
    spec_error: str = ""
    # The pod is bound already, or its bind is in flight: placed, not unschedulable.
    placed: bool = False

    @property
    def unschedulable(self) -> bool:
        return self.request is not None and not self.node_names and not self.placed


def ordered_candidates(snap: Snapshot, names: Sequence[str]) -> tuple[list[str] | None, list[str]]:
    """The offered names in cluster-state row order (the placement core breaks ties by
    row, whatever order the scheduler offers them in), and the names it does not know.

    None stands for "every node in the snapshot" -- the usual case, offered in a rotating
    order by kube-scheduler -- and lets the placement core skip resolving 5,000 names.
    """
    rows = snap.rows
    if len(names) == len(rows):
        offered = set(names)
        if len(offered) == len(names) and offered == rows.keys():
            return None, []
    unknown = [n for n in names if n not in rows]
    known = sorted(rows[n] for n in names if n in rows)
    return [snap.names[r] for r in known], unknown


def _without_held(snap: Snapshot, names: list[str] | None, held: dict[str, str]) -> list[str]:
    """``names`` (None: every node) less the ``held`` ones, in row order."""
    offered = snap.names if names is None else names
    return [n for n in offered if n and n not in held]


def _unknown_reasons(state: SchedulerState, unknown: list[str]) -> dict[str, str]:
    return {
        n: (f"inventory refused: {state.bad_nodes[n]}" if n in state.bad_nodes else NO_INVENTORY)
        for n in unknown
    }


def _bound_or_binding(state: SchedulerState, key: str, uid: str) -> str:
    """Why the pod must not be placed again, or "" -- lock held.

    kube-scheduler may schedule a pod again that is bound already (its cache has not
    seen the bind) or whose bind it gave up on (its httpTimeout) while the write is
    still queued here. Releasing the cards and placing the pod again would let a second
    bind race the first; the loser fails with Conflict and releases the cards of a bound
    pod to the next one. So the booking stays, and the retry after the outcome finds the
    pod bound (kube-scheduler drops it) or its cards released by the failed write.
    """
    bound = state.bound_node(key, uid)
    if bound:
        return f"the pod is already bound to {bound}"
    res = state.reservations.get(key)
    if res is not None and res.binding and res.uid == uid:
        if res.doubt_until is not None:
            return (
                f"a bind of this pod to {res.node} failed without an answer and may have "
                "landed; retry once the outcome is known"
            )
        return f"a bind of this pod to {res.node} is still in flight; retry after it"
    return ""


def without_models(request: PodRequest, models: Iterable[str]) -> PodRequest:
    """``request`` with ``models`` excluded from every GPU container's cards."""
    gone = frozenset(models)
    containers = tuple(
        dataclasses.replace(
            c, gpu=dataclasses.replace(c.gpu, models_exclude=c.gpu.models_exclude | gone)
        )
        if c.gpu is not None
        else c
        for c in request.containers
    )
    return dataclasses.replace(request, containers=containers)


def _quota_reasons(state: SchedulerState, failed: dict[str, str], excluded: dict[str, str]) -> None:
    """A node whose every card is of a model the pod's quota excludes fails for the quota."""
    for node in list(failed):
        if node not in state.cluster:
            continue
        models = {c.model for c in state.cluster.node(node).cards}
        if models and models <= excluded.keys():
            failed[node] = excluded[min(models)]


def filter_pod(
    state: SchedulerState, placer: Placer, args: ExtenderArgs, *, narrow: bool = True
) -> FilterOutcome:
    try:
        request = state.parse(args.pod)
    except SpecError as exc:
        why = str(exc)
        return FilterOutcome([], unresolvable=dict.fromkeys(args.node_names, why), spec_error=why)
    if request is None:  # asks for no Tessera resource: not ours to judge
        return FilterOutcome(list(args.node_names))
    meta = args.pod.get("metadata", {})
    uid = str(meta.get("uid") or "")
    request = dataclasses.replace(request, uid=uid)
    with state.lock:
        state.expire_reservations()
        why = _bound_or_binding(state, request.key, uid)
        if why:
            failed = dict.fromkeys(args.node_names, why)
            return FilterOutcome([], failed, request=request, placed=True)
        state.release(request.key)  # being scheduled (again): whatever it held is stale
        # Models the namespace's quotas leave no room on are excluded from the placement,
        # under the same lock as the reservation: two cycles cannot both pass the last of
        # a quota.
        excluded = state.quotas.exclusions(request, pod_priority(args.pod))
        asked = without_models(request, excluded) if excluded else request
        placer.observe(uid, request)
        policy = placer.policy(request)
        snap = state.cluster.snapshot()
        names, unknown = ordered_candidates(snap, args.node_names)
        failed = _unknown_reasons(state, unknown)
        # Nodes the preemptor holds for a pod at least as important (scheduler/holds.py);
        # only offered ones are named.
        held = state.holds.against(request.key, pod_priority(args.pod))
        if held:
            offered = set(args.node_names)
            held = {n: hs for n, hs in held.items() if n in offered}
        held_why = {n: hs[0].reason() for n, hs in held.items()}
        if not narrow:  # every feasible node is returned: held ones stay out of reach
            failed.update(held_why)
            names = _without_held(snap, names, held_why)
            result = filter_nodes(snap, asked, names)
            failed.update(result.reasons)
            _quota_reasons(state, failed, excluded)
            if result.feasible:
                try:
                    decision = place(snap, asked, policy, result.feasible)
                    state.reserve(request, uid, decision.assignment)
                except PlacementError:
                    pass  # prioritize and bind decide without a reservation
            return FilterOutcome(result.feasible, failed, request=request)
        try:
            decision = place(snap, asked, policy, names)
            if decision.node in held and not leaves_room(
                state.cluster, held[decision.node], asked, decision.assignment
            ):  # it would take what a preemption freed: no held node then (one more try)
                decision = place(snap, asked, policy, _without_held(snap, names, held_why))
        except PlacementError as exc:
            failed.update(exc.reasons)
            failed.update(held_why)
            _quota_reasons(state, failed, excluded)
            return FilterOutcome([], failed, request=request)
        state.reserve(request, uid, decision.assignment)
        return FilterOutcome([decision.node], {}, request=request, decision=decision.assignment)
