"""``kubectl tessera why``: why a pending pod fits nowhere, and what GPU preemption
would do (or is doing) for it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from tessera.view.kubectl.common import (
    Conn,
    Context,
    Kubeconfig,
    Namespace,
    claims_path,
    get_pod,
    load_map,
)


def _planner(api: Any, state: Any) -> tuple[Any, str]:
    """The preemptor's planner (scheduler/preemption_planner.py), with the cluster's
    PodDisruptionBudgets, and what could not be read; it holds for each pending
    pod what its own preemption is freeing (its ``tessera.io/preempting``), as the
    leader does, so other pods are judged against those holds."""
    from tessera.kube.errors import ApiError
    from tessera.kube.kinds import POD_DISRUPTION_BUDGETS
    from tessera.scheduler.budgets import BudgetBook
    from tessera.scheduler.preemption_planner import PreemptionPlanner
    from tessera.scheduler.preemptor import adopt_holds

    budgets, unread = BudgetBook(), ""
    try:
        budgets.replace(list(api.list(POD_DISRUPTION_BUDGETS).items))
    except ApiError as exc:
        unread = f" (PodDisruptionBudgets not weighed: {exc})"
    planner = PreemptionPlanner(state, budgets)
    with state.lock:
        adopt_holds(state, until=float("inf"))
    return planner, unread


def _preemption_plan(planner: Any, unread: str, state: Any, pod: Any, outcome: Any) -> str:
    """What Tessera's preemption would evict for the pod now (scheduler/preemption_planner.py)."""
    if (pod.get("spec") or {}).get("preemptionPolicy") == "Never":
        return "  preemption: none (preemptionPolicy: Never)"
    under_way = _preemption_under_way(state, pod)
    if under_way:
        return under_way
    nodes = list(outcome.failed)
    found = planner.plan(pod, outcome.request, nodes)
    if found is not None:
        return f"  preemption: {found.describe()} would make room{unread}"
    blocked = planner.blocked(pod, outcome.request, nodes)
    if blocked is not None and blocked[1]:
        found, why = blocked
        refusals = "; ".join(f"{key}: {reason}" for key, reason in why.items())
        return (
            f"  preemption: {found.describe()} would make room, but the Eviction API would "
            f"refuse {refusals} (tried again while the pod waits)"
        )
    return "  preemption: none would help (no pod of lower priority holds cards it could use)"


def _preemption_under_way(state: Any, pod: Any) -> str:
    """The pod's own preemption while its victims are still there (its
    ``tessera.io/preempting``), or "" when there is none or it is over."""
    from tessera.errors import FormatError
    from tessera.model.annotations import PREEMPTING, decode_preempting

    meta = pod.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(PREEMPTING)
    if not isinstance(text, str):
        return ""
    try:
        record = decode_preempting(f"{meta.get('namespace')}/{meta.get('name')}", text)
    except FormatError as exc:
        return f"  preemption: {exc}"
    left = [
        f"{v} (terminating)" if state.pods[v].terminating else v
        for v in sorted(record.victims)
        if v in state.pods
    ]
    if not left:
        return ""
    return (
        f"  preemption: under way on {record.node}, the node held for this pod; waiting "
        f"for {', '.join(left)} to go"
    )


def _claims_lines(
    api: Any, pod: Any, nodes: list[Any], namespace: str, offered: set[str]
) -> list[str]:
    """Where each of the pod's claims stands, and the room for each request on the claims
    path's cards of the ``offered`` nodes (view/claim_wait.py). The map lists the pods
    again, a page at a time."""
    from tessera.kube.errors import ApiError
    from tessera.kube.kinds import DEVICE_CLASSES, RESOURCE_CLAIMS
    from tessera.view.claim_wait import explain

    slices, claims = claims_path(api)
    if not slices:  # claims are listed only beside slices; the pod's own still say much
        with contextlib.suppress(ApiError):
            claims = list(api.list(RESOURCE_CLAIMS, namespace).items)
    gmap = load_map(api, (slices, claims), nodes)
    mine = {
        str(c["metadata"]["name"]): c
        for c in claims
        if c.get("metadata", {}).get("namespace") == namespace
    }
    classes = None  # not readable: the lines say its selectors were not
    with contextlib.suppress(ApiError):
        classes = {str(c["metadata"]["name"]): c for c in api.list(DEVICE_CLASSES).items}
    return explain(pod, mine, slices, gmap, classes, offered)


def why(
    name: Annotated[str, typer.Argument(help="The pending pod's name.")],
    namespace: Namespace = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
) -> None:
    """Why a pod is not placed: the placement core's grouped reasons against the cluster
    as it is now (for a pod on the claims path, where each of its claims stands), and
    the scheduler's last recorded events for the pod."""
    from tessera.kube.errors import ApiError, NotFound
    from tessera.kube.kinds import EVENTS, GPUQUOTAS, NAMESPACES, NODES, PODS
    from tessera.kube.reflector import list_pages
    from tessera.scheduler.filter import filter_pod
    from tessera.scheduler.placer import Placer
    from tessera.scheduler.reasons import summarise
    from tessera.scheduler.state import SchedulerState
    from tessera.scheduler.wire import ExtenderArgs
    from tessera.view.eligible import ineligible, placed_form

    conn = Conn(kubeconfig, context)
    ns = conn.namespace(namespace)
    api = conn.client()
    obj = get_pod(api, name, ns)
    key = f"{ns}/{name}"
    bound = (obj.get("spec") or {}).get("nodeName")
    if bound:
        typer.echo(f"pod {key} is placed: bound to {bound} (kubectl tessera pod {name} -n {ns})")
        return
    nodes = api.list(NODES).items
    state = SchedulerState()
    state.replace_nodes(nodes)
    me = (obj.get("metadata") or {}).get("uid")
    placed: list[Any] = []  # what view/eligible.py reads of each placed pod

    def others() -> Iterator[list[Any]]:
        """The other pods a page at a time, keeping only each one's placed form: whole
        objects of 200,000 pods would be gigabytes."""
        for page in list_pages(api, PODS):
            rest = [p for p in page if (p.get("metadata") or {}).get("uid") != me]
            placed.extend(f for p in rest if (f := placed_form(p)) is not None)
            yield rest

    # No verb waits on this lock here: no pause between pages.
    state.replace_pod_pages(others(), pause_s=0)
    with contextlib.suppress(NotFound):  # the GpuQuota CRD is not installed: no quotas
        state.quotas.replace(api.list(GPUQUOTAS).items)
    # Only the nodes kube-scheduler's own filters would offer (view/eligible.py: cordons,
    # nodeName, nodeSelector, required affinity, taints); the rest are its to judge.
    # Namespaces' labels, for affinity terms that select namespaces by label.
    namespace_labels: dict[str, Any] | None = None
    try:
        namespace_labels = {str(n["metadata"]["name"]): n["metadata"].get("labels") or {}
                            for n in api.list(NAMESPACES).items}  # fmt: skip
    except ApiError as exc:
        typer.echo(f"namespaces not read ({exc}): a namespaceSelector that is not empty "
                   "selects none; anti-affinity terms count the namespaces they name, pod "
                   "affinity terms with such a selector are not weighed")  # fmt: skip
    left_out = ineligible(obj, nodes, placed, namespace_labels)
    names = [str(n["metadata"]["name"]) for n in nodes
             if n["metadata"]["name"] not in left_out]  # fmt: skip
    if left_out:
        head = f"kube-scheduler's own filters leave out {len(left_out)} of {len(nodes)} nodes"
        typer.echo(summarise(left_out, head=head))
    planner, unread = _planner(api, state)
    outcome = filter_pod(state, Placer(), ExtenderArgs(pod=obj, node_names=names))
    if outcome.spec_error:
        typer.echo(f"pod {key} is refused: {outcome.spec_error}")
    elif outcome.request is None and (obj.get("spec") or {}).get("resourceClaims"):
        typer.echo(f"pod {key} is on the claims path: kube-scheduler's own allocator places "
                   "it, not Tessera's extender")  # fmt: skip
        for line in _claims_lines(api, obj, nodes, ns, set(names)):
            typer.echo(line)
    elif outcome.request is None:
        typer.echo(f"pod {key} asks for no Tessera GPU resource; Tessera does not place it")
    elif outcome.decision is not None:
        cards = [s.uuid for c in outcome.decision.containers for s in c.slices]
        typer.echo(
            f"pod {key} fits now: node {outcome.decision.node}, cards {', '.join(cards)}. "
            "If it still waits, kube-scheduler has not tried it again yet, or something "
            "other than GPUs holds it (see its events below)."
        )
    elif not names:
        typer.echo(f"pod {key} fits nowhere: kube-scheduler's own filters offer it no node")
    else:
        failed = {**outcome.failed, **outcome.unresolvable}
        typer.echo(f"pod {key} fits nowhere: {summarise(failed, len(names))}")
        typer.echo(_preemption_plan(planner, unread, state, obj, outcome))
    events = api.list(EVENTS, ns, field_selector=f"involvedObject.name={name}").items
    recent = sorted((e for e in events if e.get("type") == "Warning"), key=_last_seen)[-3:]
    for e in recent:
        typer.echo(f"  {_last_seen(e)} {e.get('reason')}: {e.get('message')}")


def _last_seen(event: Any) -> str:
    """When an Event was last seen: ``lastTimestamp`` where a core recorder wrote it; one
    recorded through events.k8s.io/v1 (kube-scheduler's) has only ``eventTime``, its
    first time, and ``series.lastObservedTime`` once it repeats."""
    series = event.get("series") or {}
    return str(event.get("lastTimestamp") or series.get("lastObservedTime")
               or event.get("eventTime") or "")  # fmt: skip
