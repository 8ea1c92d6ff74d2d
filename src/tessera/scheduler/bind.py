"""The ``bind`` verb: bind the pod with its card assignment, in one API write.

1. Under the state lock (microseconds, no I/O): take the reservation filter made for
   this pod on this node, or -- if there is none, or it is for another node -- pick
   cards on the node against the live state (another bind may have taken the cards
   since filter ran) and reserve them. If they no longer fit: fail, nothing written.
2. Without any lock: POST pods/binding carrying the pod's UID (the API server refuses a
   replaced pod, and a pod already bound) and the ``tessera.io/assignment`` annotation,
   which the API server merges onto the pod in the same write that sets its node
   (BindingREST: node name, annotations and the PodScheduled condition in one
   GuaranteedUpdate). The pod is bound with its cards, or not at all: no reader -- the
   node agent, a restarted extender -- ever sees a bound pod without its assignment, or
   an assignment on a pod that was never bound.
3. If the write fails: release the reservation and return the error to the scheduler,
   which retries the pod. If it failed in a way that leaves its outcome unknown (no
   answer, a 504 or 500: ``outcome_unknown``), the Binding may have landed all the same:
   the reservation is kept *in doubt* -- its cards stay booked and ``filter`` refuses the
   pod as still in flight -- until the watch shows the pod (bound: confirmed) or
   ``bind_doubt_s`` passes (then it expires). Releasing it would let the next pod take
   the cards of a pod that may be bound to them. A Conflict because an earlier try of
   this same bind landed (same UID, node and assignment; ``bind_once`` reads the pod to
   tell) is not a failure: the pod is bound as decided. If the write succeeds, the reservation stays
   until the watch shows the pod bound with this assignment (``SchedulerState.apply_update``
   confirms it): the watch may still deliver events from before the bind, and an
   unbound pod without a reservation would be released.
4. A pod the watch already shows bound is not bound again: a new pick of cards would
   release the booking the API server holds, for a write that can only fail.

``begin_bind`` is step 1 and ``write_failed`` step 3; the caller does the write between
them, so the HTTP server can wait for it without holding its event loop
(``SchedulerApp.dispatch``).

Binds of different pods run their API writes in parallel; the only thing they share is
the in-memory state, where a card is booked before its bind's write.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.errors import PlacementError, SpecError
from tessera.kube.errors import ApiError, Conflict, NotFound, outcome_unknown
from tessera.kube.kinds import PODS
from tessera.kube.port import KubeApi, Obj
from tessera.model import annotations as keys
from tessera.model.types import Assignment, PodRequest
from tessera.placement.cards import fits_exactly
from tessera.placement.place import pick_cards
from tessera.scheduler.filter import without_models
from tessera.scheduler.holds import leaves_room
from tessera.scheduler.placer import Placer
from tessera.scheduler.state import SchedulerState, pod_priority
from tessera.scheduler.wire import BindingArgs

__all__ = ["BindError", "PendingBind", "begin_bind", "release_pending", "write_failed"]


class BindError(Exception):
    """The bind did not happen; ``reason`` is a short label for metrics."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


def _reserve(
    state: SchedulerState, placer: Placer, args: BindingArgs, pod: Obj | None
) -> Assignment:
    """The assignment to write, reserved."""
    key = args.key
    with state.lock:
        info = state.pods.get(key)
        uid = args.pod_uid or (info.uid if info else "")
        bound = state.bound_node(key, uid)
        if bound:  # step 4 of the module docstring
            raise BindError("already-bound", f"pod {key} is already bound to {bound}")
        res = state.reservations.get(key)
        if res is not None and res.uid == uid and res.node == args.node:
            res.binding = True
            return res.assignment
        request: PodRequest | None = None
        if pod is not None:
            try:
                request = state.parse(pod)
            except SpecError as exc:
                raise BindError("bad-spec", f"pod {key}: {exc}") from None
        elif info is not None and info.uid == uid:
            request = info.request
        if request is None:
            raise BindError("unknown-pod", f"pod {key} ({uid}) is not a Tessera pod I know")
        state.release(key)
        snap = state.cluster.snapshot()
        priority = pod_priority(pod) if pod is not None else (info.priority if info else 0)
        excluded = state.quotas.exclusions(request, priority)
        asked = without_models(request, excluded) if excluded else request
        try:
            assignment = pick_cards(snap, asked, args.node, placer.policy(request))
        except PlacementError as exc:
            why = next(iter(excluded.values()), "") if excluded else ""
            if why and args.node in snap.rows and fits_exactly(snap, request, args.node):
                # it would fit but for its quota
                raise BindError("quota", f"pod {key}: {why}") from None
            raise BindError(
                "no-longer-fits", f"pod {key} no longer fits on {args.node}: {why or exc}"
            ) from None
        why = state.quotas.refusal(request, assignment, priority)
        if why:
            raise BindError("quota", f"pod {key}: {why}")
        holds = state.holds.against(key, priority).get(args.node)
        if holds and not leaves_room(state.cluster, holds, request, assignment):
            raise BindError("held", f"pod {key}: {args.node} is {holds[0].reason()}")
        try:
            res = state.reserve(request, uid, assignment)
        except PlacementError as exc:
            raise BindError(
                "no-longer-fits", f"pod {key} no longer fits on {args.node}: {exc}"
            ) from None
        res.binding = True
        return assignment


@dataclass(frozen=True, slots=True)
class PendingBind:
    """A bind decided and reserved, waiting for its one API write."""

    args: BindingArgs
    assignment: Assignment
    annotations: dict[str, str]


def begin_bind(
    state: SchedulerState, placer: Placer, api: KubeApi, args: BindingArgs
) -> PendingBind:
    """Step 1 of the module docstring: the assignment to write, reserved.

    Raises BindError (nothing reserved). Reads the pod from the API only when the state
    has neither seen it nor reserved for it (a bind reaching a restarted extender).
    """
    key = args.key
    pod: Obj | None = None
    with state.lock:
        known = key in state.pods and state.pods[key].uid in (args.pod_uid, "")
    if not known and key not in state.reservations:
        try:
            pod = api.get(PODS, args.pod_name, args.pod_namespace)
        except NotFound:  # deleted since kube-scheduler read it: not the API's trouble
            raise BindError("gone", f"pod {key} no longer exists") from None
        except ApiError as exc:
            raise BindError("api", f"pod {key}: cannot read it: {exc}") from None
        if args.pod_uid and pod.get("metadata", {}).get("uid") != args.pod_uid:
            raise BindError("gone", f"pod {key} ({args.pod_uid}) no longer exists")
    assignment = _reserve(state, placer, args, pod)
    return PendingBind(args, assignment, {keys.ASSIGNMENT: keys.encode_assignment(assignment)})


def release_pending(state: SchedulerState, pending: PendingBind) -> None:
    """Step 3's release: drop the bind's reservation (if it is still this bind's)."""
    with state.lock:
        state.unreserve(pending.args.key, pending.assignment)


def write_failed(state: SchedulerState, pending: PendingBind, exc: ApiError) -> BindError:
    """Step 3: the write failed; release the reservation (or keep it in doubt) and say why."""
    where = f"pod {pending.args.key} on {pending.args.node}"
    if outcome_unknown(exc):
        with state.lock:
            kept = state.doubt(pending.args.key, pending.assignment)
        if kept:
            return BindError(
                "outcome-unknown",
                f"{where}: {exc}; the Binding may have landed, so its cards stay reserved "
                f"until the pod is seen (at most {state.doubt_s:.0f} s)",
            )
    release_pending(state, pending)
    reason = "conflict" if isinstance(exc, Conflict) else "api"
    return BindError(reason, f"{where}: {exc}")
