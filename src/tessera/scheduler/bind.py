"""The ``bind`` verb: write the pod's assignment, then create its Binding.

1. Under the state lock (microseconds, no I/O): take the reservation filter made for
   this pod on this node, or -- if there is none, or it is for another node -- pick
   cards on the node against the live state (another bind may have taken the cards
   since filter ran) and reserve them. If they no longer fit: fail, nothing written.
2. Without any lock: merge-patch ``tessera.io/assignment`` onto the pod with the
   resourceVersion last seen as a precondition (a 409 means the pod changed: read it,
   and go on only if it is still the same, unbound pod), then POST pods/binding with
   the pod's UID (the API server refuses to bind a pod twice).
3. If either write fails: release the reservation, take the annotation off again when
   it is still ours (best effort, same precondition), and return the error to the
   scheduler, which retries the pod.

Binds of different pods run their API writes in parallel; the only thing they share is
the in-memory state, and a card is booked there before its bind's first write.
"""

from __future__ import annotations

import logging

from tessera.errors import PlacementError
from tessera.kube.errors import ApiError, Conflict
from tessera.kube.kinds import PODS
from tessera.kube.port import KubeApi, Obj
from tessera.model import annotations as keys
from tessera.model.types import Assignment, PodRequest
from tessera.placement.place import pick_cards
from tessera.scheduler.placer import Placer
from tessera.scheduler.state import SchedulerState
from tessera.scheduler.wire import BindingArgs

__all__ = ["BindError", "bind_pod"]

log = logging.getLogger(__name__)


class BindError(Exception):
    """The bind did not happen; ``reason`` is a short label for metrics."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


def _reserve(
    state: SchedulerState, placer: Placer, args: BindingArgs, pod: Obj | None
) -> tuple[Assignment, str]:
    """The assignment to write and the resourceVersion to write it against."""
    key = args.key
    with state.lock:
        info = state.pods.get(key)
        uid = args.pod_uid or (info.uid if info else "")
        res = state.reservations.get(key)
        if res is not None and res.uid == uid and res.node == args.node and state.held(key):
            res.binding = True
            rv = info.resource_version if info and info.uid == uid else res.resource_version
            return res.assignment, rv
        request: PodRequest | None = None
        rv = ""
        if pod is not None:
            request = state.parse(pod)
            rv = str(pod.get("metadata", {}).get("resourceVersion") or "")
        elif info is not None and info.uid == uid:
            request, rv = info.request, info.resource_version
        if request is None:
            raise BindError("unknown-pod", f"pod {key} ({uid}) is not a Tessera pod I know")
        state.release(key)
        snap = state.cluster.snapshot()
        try:
            assignment = pick_cards(snap, request, args.node, placer.policy(request))
            res = state.reserve(request, uid, assignment)
        except PlacementError as exc:
            raise BindError(
                "no-longer-fits", f"pod {key} no longer fits on {args.node}: {exc}"
            ) from None
        res.binding = True
        return assignment, rv


def bind_pod(state: SchedulerState, placer: Placer, api: KubeApi, args: BindingArgs) -> Assignment:
    """Bind as the module docstring says; raises BindError (nothing left half-done)."""
    key = args.key
    pod: Obj | None = None
    with state.lock:
        known = key in state.pods and state.pods[key].uid in (args.pod_uid, "")
    if not known and key not in state.reservations:
        try:
            pod = api.get(PODS, args.pod_name, args.pod_namespace)
        except ApiError as exc:
            raise BindError("api", f"pod {key}: cannot read it: {exc}") from None
        if args.pod_uid and pod.get("metadata", {}).get("uid") != args.pod_uid:
            raise BindError("gone", f"pod {key} ({args.pod_uid}) no longer exists")
    assignment, rv = _reserve(state, placer, args, pod)
    text = keys.encode_assignment(assignment)
    written_rv = ""
    try:
        written_rv = _annotate(api, args, text, rv)
        api.bind(args.pod_namespace, args.pod_name, args.pod_uid, args.node)
    except (ApiError, BindError) as exc:
        with state.lock:
            res = state.reservations.get(key)
            if res is not None and res.assignment == assignment:
                state.release(key)
        if written_rv:
            _unannotate(api, args, written_rv)
        if isinstance(exc, BindError):
            raise
        raise BindError("api", f"pod {key} on {args.node}: {exc}") from None
    with state.lock:
        res = state.reservations.get(key)
        if res is not None and res.assignment == assignment:
            state.reservations.pop(key)  # confirmed; the booking stays
    return assignment


def _annotate(api: KubeApi, args: BindingArgs, text: str, rv: str) -> str:
    """Write the annotation; returns the pod's resourceVersion after the write."""
    for attempt in range(3):
        meta: Obj = {"annotations": {keys.ASSIGNMENT: text}}
        if rv:
            meta["resourceVersion"] = rv
        try:
            out = api.merge_patch(PODS, args.pod_name, {"metadata": meta}, args.pod_namespace)
            return str(out.get("metadata", {}).get("resourceVersion") or "")
        except Conflict:
            if attempt == 2:
                raise
            fresh = api.get(PODS, args.pod_name, args.pod_namespace)
            fmeta = fresh.get("metadata", {})
            if args.pod_uid and fmeta.get("uid") != args.pod_uid:
                raise BindError("gone", f"pod {args.key} was replaced by another pod") from None
            if (fresh.get("spec") or {}).get("nodeName"):
                raise BindError(
                    "already-bound",
                    f"pod {args.key} is already bound to {fresh['spec']['nodeName']}",
                ) from None
            rv = str(fmeta.get("resourceVersion") or "")
    raise AssertionError("unreachable")


def _unannotate(api: KubeApi, args: BindingArgs, rv: str) -> None:
    patch = {"metadata": {"resourceVersion": rv, "annotations": {keys.ASSIGNMENT: None}}}
    try:
        api.merge_patch(PODS, args.pod_name, patch, args.pod_namespace)
    except ApiError as exc:
        log.info(
            "pod %s: assignment annotation left in place (%s); filter clears it", args.key, exc
        )
