"""``kubectl tessera``: the cluster's GPUs as an operator asks about them.

    kubectl tessera top [-n NS] [--model M] [--sort-by node|free|memory|cores] [-o wide|json|yaml]
    kubectl tessera pod NAME [-n NS] [-o json|yaml]
    kubectl tessera why NAME [-n NS]
    kubectl tessera quota [-n NS | -A] [-o wide|json|yaml]
    kubectl tessera capacity [--model M] [-o json|yaml]   (per model: free, allocated, out)
    kubectl tessera cordon NODE CARD...       (CARD: a UUID or an index on the node)
    kubectl tessera uncordon NODE [CARD...]   (no CARD: every card of the node)
    kubectl tessera drain NODE CARD... [--timeout S]   (cordon, then evict the cards' pods)

Installed as the ``kubectl-tessera`` executable (kubectl finds plugins on PATH). Reads
Nodes, Pods, Events, GpuQuotas, and (for the cards on the claims path) ResourceSlices
and ResourceClaims; ``cordon``, ``uncordon`` and ``drain`` patch one Node's
``tessera.io/cordoned-cards`` annotation, and ``drain`` evicts the pods on those cards
(view/cordon.py). All through the user's
kubeconfig, with kubectl's ``--kubeconfig``, ``--context`` and ``-n`` habits. Live use
(memory in use, achieved compute) comes from Prometheus when ``--prometheus URL`` is
given (the node agents' exporter, docs/operations.md); without it the views show
allocation only.
"""

from __future__ import annotations

import contextlib
import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn

import typer

from tessera.view.gpumap import CardView, GpuMap, Holder, NodeView, card_json

__all__ = ["app", "main"]

app = typer.Typer(
    name="kubectl tessera",
    help="Tessera's view of the cluster's GPUs: who holds which card, and why a pod waits.",
    no_args_is_help=True,
    add_completion=False,
)


class Output(enum.StrEnum):
    WIDE = "wide"
    JSON = "json"
    YAML = "yaml"


class SortBy(enum.StrEnum):
    NODE = "node"
    FREE = "free"  # most free memory first
    MEMORY = "memory"  # most allocated memory first
    CORES = "cores"  # most allocated compute first
    USED = "used"  # most memory in use first (needs --prometheus)


Kubeconfig = Annotated[str | None, typer.Option("--kubeconfig", help="Path of the kubeconfig.")]
Context = Annotated[str | None, typer.Option("--context", help="kubeconfig context to use.")]
Namespace = Annotated[str | None, typer.Option("--namespace", "-n", help="Namespace.")]
Out = Annotated[Output | None, typer.Option("--output", "-o", help="wide, json or yaml.")]
Prom = Annotated[
    str | None,
    typer.Option("--prometheus", help="Prometheus base URL for live use (memory, compute)."),
]


@dataclass(frozen=True, slots=True)
class _Conn:
    kubeconfig: str | None
    context: str | None

    def client(self) -> Any:
        from tessera.kube.client import KubeClient

        return KubeClient.from_kubeconfig(self.kubeconfig, self.context, pool_size=4)

    def namespace(self, given: str | None) -> str:
        """``-n``, else the context's namespace, else ``default`` (as kubectl does)."""
        if given:
            return given
        from kubernetes import config as k8s_config

        try:
            contexts, active = k8s_config.list_kube_config_contexts(self.kubeconfig)  # type: ignore[no-untyped-call]
        except Exception:  # in-cluster, or no kubeconfig: kubectl's default
            return "default"
        chosen = next((c for c in contexts if c["name"] == self.context), active)
        return str((chosen or {}).get("context", {}).get("namespace") or "default")


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _get_pod(api: Any, name: str, namespace: str) -> dict[str, Any]:
    """The pod, or exit 1 with kubectl's wording when it does not exist."""
    from tessera.kube.errors import NotFound
    from tessera.kube.kinds import PODS

    try:
        return dict(api.get(PODS, name, namespace))
    except NotFound:
        _fail(f'pods "{name}" not found in namespace {namespace}')


def _load_map(api: Any) -> GpuMap:
    from tessera.kube.kinds import NODES, PODS
    from tessera.view.gpumap import build_map

    slices, claims = _claims_path(api)
    return build_map(api.list(NODES).items, api.list(PODS).items, slices=slices, claims=claims)


def _claims_path(api: Any) -> tuple[list[Any], list[Any]]:
    """Every ResourceSlice and ResourceClaim (the claims path), as listed now."""
    from tessera.kube.errors import ApiError
    from tessera.kube.kinds import RESOURCE_CLAIMS, RESOURCE_SLICES

    def listed(kind: Any) -> list[Any]:
        """The claims path's objects; none where the cluster has no resource.k8s.io/v1
        (404) or the role may not list them (403), said once on stderr."""
        try:
            return list(api.list(kind).items)
        except ApiError as exc:
            if exc.status not in (403, 404):
                raise
            typer.echo(f"note: cannot list {kind.plural} ({exc.status} {exc.reason}): "
                       "cards on the claims path are not shown", err=True)  # fmt: skip
            return []

    slices = listed(RESOURCE_SLICES)
    return slices, listed(RESOURCE_CLAIMS) if slices else []


def _slice_cards(slices: list[Any]) -> dict[str, dict[str, Any]]:
    """Pool -> device name -> card, from this driver's readable slices."""
    from tessera.claims.devices import DRIVER, slice_devices
    from tessera.errors import SpecError

    out: dict[str, dict[str, Any]] = {}
    for obj in slices:
        if (obj.get("spec") or {}).get("driver") != DRIVER:
            continue
        try:
            pool, cards = slice_devices(obj)
        except SpecError:
            continue  # top names it among the claim problems
        out[pool] = cards
    return out


def _preemption_plan(api: Any, state: Any, pod: Any, outcome: Any) -> str:
    """What Tessera's preemption would evict for the pod now (scheduler/preemptor.py)."""
    from tessera.kube.events import EventRecorder
    from tessera.scheduler.preemptor import Preemptor

    if (pod.get("spec") or {}).get("preemptionPolicy") == "Never":
        return "  preemption: none (preemptionPolicy: Never)"
    planner = Preemptor(state, api, EventRecorder(api, "kubectl-tessera"), lambda: False)
    found = planner.plan(pod, outcome.request, list(outcome.failed))
    if found is None:
        return "  preemption: none would help (no pod of lower priority holds cards it could use)"
    victims = ", ".join(map(str, found.victims))
    return f"  preemption: evicting {victims} on {found.node} would make room"


def _emit(obj: Any, output: Output) -> None:
    if output is Output.JSON:
        typer.echo(json.dumps(obj, indent=2, sort_keys=True))
    else:
        import yaml

        typer.echo(yaml.safe_dump(obj, sort_keys=True), nl=False)


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """kubectl's look: upper-case headers, columns padded by three spaces."""
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for r in cells:
        typer.echo("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _mib(n: int) -> str:
    return f"{n}Mi"  # exact: what the pod asked for, in the unit it asked in


# --- live use ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Live:
    used_bytes: float | None = None
    achieved_percent: float | None = None


def _live(url: str | None) -> dict[tuple[str, str, str, str], Live]:
    """(namespace, pod, container, uuid) -> live use, from the exporter via Prometheus."""
    if not url:
        return {}
    from tessera.view.prom import container_use

    try:
        return {k: Live(*v) for k, v in container_use(url).items()}
    except OSError as exc:
        _fail(f"--prometheus {url}: {exc}")


def _use(live: Mapping[tuple[str, str, str, str], Live], h: Holder, uuid: str) -> Live:
    if h.claim:
        return live.get((h.namespace, "", f"claim/{h.claim}", uuid), Live())
    return live.get((h.namespace, h.pod, h.container, uuid), Live())


def _fmt_bytes(v: float | None) -> str:
    return "-" if v is None else _mib(round(v / (1 << 20)))


def _fmt_pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


# --- top --------------------------------------------------------------------------------


def _card_json(n: NodeView, c: CardView, live: Mapping[Any, Live]) -> dict[str, Any]:
    out = card_json(n, c)
    for h, doc in zip(c.holders, out["holders"], strict=True):
        u = _use(live, h, c.uuid)
        doc.update(usedBytes=u.used_bytes, achievedPercent=u.achieved_percent)
    return out


def _sort_key(sort_by: SortBy, live: Mapping[Any, Live]) -> Any:
    def used(nc: tuple[NodeView, CardView]) -> float:
        c = nc[1]
        return sum(_use(live, h, c.uuid).used_bytes or 0 for h in c.holders)

    keys = {
        SortBy.NODE: lambda nc: (nc[0].name, nc[1].index),
        SortBy.FREE: lambda nc: (-(nc[1].memory_mib - nc[1].allocated_mib), nc[0].name),
        SortBy.MEMORY: lambda nc: (-nc[1].allocated_mib, nc[0].name, nc[1].index),
        SortBy.CORES: lambda nc: (-nc[1].allocated_cores, nc[0].name, nc[1].index),
        SortBy.USED: lambda nc: (-used(nc), nc[0].name, nc[1].index),
    }
    return keys[sort_by]


@app.command()
def top(
    namespace: Annotated[
        str | None,
        typer.Option("--namespace", "-n", help="Only cards held by pods of this namespace."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Only cards of this model.")] = None,
    sort_by: Annotated[SortBy, typer.Option("--sort-by", help="Order of the cards.")] = (
        SortBy.NODE
    ),
    output: Out = None,
    prometheus: Prom = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
) -> None:
    """Every GPU node's cards, what is allocated on each and to whom (one row per
    container on a card; a free card has one row of its own)."""
    conn = _Conn(kubeconfig, context)
    gmap = _load_map(conn.client())
    live = _live(prometheus)
    picked = [
        (n, c)
        for n in gmap.nodes
        for c in n.cards
        if (model is None or c.model == model)
        and (namespace is None or any(h.namespace == namespace for h in c.holders))
    ]
    picked.sort(key=_sort_key(sort_by, live))
    broken = [n for n in gmap.nodes if n.problem]
    if output in (Output.JSON, Output.YAML):
        _emit(
            {
                "cards": [_card_json(n, c, live) for n, c in picked],
                "nodeProblems": {n.name: n.problem for n in broken},
                "podProblems": dict(gmap.problems),
                "claimProblems": dict(gmap.claim_problems),
                "pending": [f"{p.namespace}/{p.pod}" for p in gmap.pending],
            },
            output,
        )
        return
    wide = output is Output.WIDE
    headers = ["NODE", "CARD", "MODEL", "MEMORY", "COMPUTE", "POD", "CONTAINER", "SLICE"]
    if live:
        headers += ["USED", "ACHIEVED"]
    if wide:
        headers += ["UUID", "STATE", "SLOTS", "POLICY"]
    rows: list[list[object]] = []
    for n, c in picked:
        card = [n.name, c.index, c.model, f"{c.allocated_mib}/{_mib(c.memory_mib)}",
                f"{c.allocated_cores}%"]  # fmt: skip
        shown: list[Holder | None] = [
            h for h in c.holders if namespace is None or h.namespace == namespace
        ]
        for h in shown or [None]:
            if h is None:
                row: list[object] = [*card, "<free>" if not c.holders else "", "", ""]
                if live:
                    row += ["", ""]
            else:
                size = "whole" if h.exclusive else f"{_mib(h.memory_mib)} {h.cores_percent}%"
                who = [h.pod_key, h.container]
                if h.claim:  # its reserving pods, and the claim in the container column
                    who = [h.pod_key if h.pod else f"{h.namespace}/<none>", f"claim/{h.claim}"]
                row = [*card, *who, size]
                if live:
                    u = _use(live, h, c.uuid)
                    row += [_fmt_bytes(u.used_bytes), _fmt_pct(u.achieved_percent)]
            if wide:
                state = "ok" if c.healthy else "UNHEALTHY"
                if c.cordoned:
                    state = "cordoned" if c.healthy else "UNHEALTHY,cordoned"
                row += [c.uuid, state,
                        f"{len(c.holders)}/{c.slots}", h.policy if h else ""]  # fmt: skip
            rows.append(row)
    if rows:
        _table(headers, rows)
    else:
        typer.echo("No GPU cards found" + (f" held in namespace {namespace}" if namespace else ""))
    for n in broken:
        typer.echo(f"node {n.name}: {n.problem}", err=True)
    for key, why in gmap.problems:
        typer.echo(f"pod {key}: {why}", err=True)
    for key, why in gmap.claim_problems:
        typer.echo(f"{key}: {why}", err=True)
    if gmap.pending:
        waiting = [p for p in gmap.pending if namespace is None or p.namespace == namespace]
        if waiting:
            typer.echo(f"{len(waiting)} GPU pod(s) waiting (kubectl tessera why NAME -n NS)")


# --- pod --------------------------------------------------------------------------------


@app.command()
def pod(
    name: Annotated[str, typer.Argument(help="The pod's name.")],
    namespace: Namespace = None,
    output: Out = None,
    prometheus: Prom = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
) -> None:
    """A pod's cards and limits, as the extender assigned them."""

    conn = _Conn(kubeconfig, context)
    ns = conn.namespace(namespace)
    api = conn.client()
    _get_pod(api, name, ns)
    gmap = _load_map(api)
    key = f"{ns}/{name}"
    live = _live(prometheus)
    problem = dict(gmap.problems).get(key)
    waiting = next((p for p in gmap.pending if (p.namespace, p.pod) == (ns, name)), None)
    assignment = gmap.assignments.get(key)
    cards: list[dict[str, Any]] = []
    table: list[list[object]] = []
    for ca in assignment.containers if assignment is not None else ():
        for s in ca.slices:
            found = gmap.card(s.uuid)
            index, model = (found[1].index, found[1].model) if found else ("?", "?")
            u = live.get((ns, name, ca.name, s.uuid), Live())
            cards.append({"container": ca.name, "init": ca.init, "card": index,
                          "model": model, "uuid": s.uuid, "memoryMiB": s.memory_mib,
                          "coresPercent": s.cores_percent, "policy": str(ca.policy),
                          "exclusive": ca.exclusive, "usedBytes": u.used_bytes,
                          "achievedPercent": u.achieved_percent})  # fmt: skip
            row: list[object] = [
                ca.name + (" (init)" if ca.init else ""),
                index,
                model,
                "whole" if ca.exclusive else _mib(s.memory_mib),
                "100%" if ca.exclusive else f"{s.cores_percent}%",
                str(ca.policy),
                s.uuid,
            ]
            if live:
                row += [_fmt_bytes(u.used_bytes), _fmt_pct(u.achieved_percent)]
            table.append(row)
    if output in (Output.JSON, Output.YAML):
        _emit({"pod": key, "node": assignment.node if assignment else None, "cards": cards,
               "problem": problem, "waiting": waiting.summary if waiting else None},
              output)  # fmt: skip
        return
    if problem:
        typer.echo(f"pod {key}: {problem}")
        raise typer.Exit(1)
    if waiting is not None:
        typer.echo(f"pod {key} is waiting to be placed ({waiting.summary}); see: "
                   f"kubectl tessera why {name} -n {ns}")  # fmt: skip
        return
    if assignment is None:
        typer.echo(f"pod {key} holds no Tessera GPU")
        return
    typer.echo(f"pod {key} on node {assignment.node}")
    headers = ["CONTAINER", "CARD", "MODEL", "MEMORY", "COMPUTE", "POLICY", "UUID"]
    _table(headers + (["USED", "ACHIEVED"] if live else []), table)


# --- why --------------------------------------------------------------------------------


@app.command()
def why(
    name: Annotated[str, typer.Argument(help="The pending pod's name.")],
    namespace: Namespace = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
) -> None:
    """Why a pod is not placed: the placement core's grouped reasons against the cluster
    as it is now, and the scheduler's last recorded events for the pod."""
    from tessera.kube.errors import NotFound
    from tessera.kube.kinds import EVENTS, GPUQUOTAS, NODES, PODS
    from tessera.scheduler.filter import filter_pod
    from tessera.scheduler.placer import Placer
    from tessera.scheduler.reasons import summarise
    from tessera.scheduler.state import SchedulerState
    from tessera.scheduler.wire import ExtenderArgs
    from tessera.view.eligible import ineligible

    conn = _Conn(kubeconfig, context)
    ns = conn.namespace(namespace)
    api = conn.client()
    obj = _get_pod(api, name, ns)
    key = f"{ns}/{name}"
    bound = (obj.get("spec") or {}).get("nodeName")
    if bound:
        typer.echo(f"pod {key} is placed: bound to {bound} (kubectl tessera pod {name} -n {ns})")
        return
    nodes = api.list(NODES).items
    state = SchedulerState()
    state.replace_nodes(nodes)
    state.replace_pods([p for p in api.list(PODS).items if p.get("metadata", {}).get("uid")
                        != obj.get("metadata", {}).get("uid")])  # fmt: skip
    with contextlib.suppress(NotFound):  # the GpuQuota CRD is not installed: no quotas
        state.replace_quotas(api.list(GPUQUOTAS).items)
    # Only the nodes kube-scheduler's own filters would offer (view/eligible.py: cordons,
    # nodeName, nodeSelector, required affinity, taints); the rest are its to judge.
    left_out = ineligible(obj, nodes)
    names = [str(n["metadata"]["name"]) for n in nodes
             if n["metadata"]["name"] not in left_out]  # fmt: skip
    if left_out:
        head = f"kube-scheduler's own filters leave out {len(left_out)} of {len(nodes)} nodes"
        typer.echo(summarise(left_out, head=head))
    outcome = filter_pod(state, Placer(), ExtenderArgs(pod=obj, node_names=names))
    if outcome.spec_error:
        typer.echo(f"pod {key} is refused: {outcome.spec_error}")
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
        typer.echo(_preemption_plan(api, state, obj, outcome))
    events = api.list(EVENTS, ns, field_selector=f"involvedObject.name={name}").items
    recent = sorted(
        (e for e in events if e.get("type") == "Warning"),
        key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""),
    )[-3:]
    for e in recent:
        when = e.get("lastTimestamp") or e.get("eventTime") or ""
        typer.echo(f"  {when} {e.get('reason')}: {e.get('message')}")


# --- quota ------------------------------------------------------------------------------


@app.command()
def quota(
    namespace: Namespace = None,
    all_namespaces: Annotated[
        bool, typer.Option("--all-namespaces", "-A", help="Every namespace.")
    ] = False,
    output: Out = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
) -> None:
    """GpuQuotas and what their namespace's pods and claims hold now, counted from the
    assignments and allocations (the same count the extender enforces; the quota's status
    is the extender's copy)."""
    from tessera.errors import SpecError
    from tessera.kube.errors import NotFound
    from tessera.kube.kinds import GPUQUOTAS
    from tessera.quota.claims import claim_holding, claim_key
    from tessera.quota.spec import parse_quota
    from tessera.quota.usage import QuotaUsage, holding

    conn = _Conn(kubeconfig, context)
    api = conn.client()
    ns = None if all_namespaces else conn.namespace(namespace)
    try:
        objs = api.list(GPUQUOTAS, ns).items
    except NotFound:
        _fail("the GpuQuota resource is not installed (deploy/gpuquota-crd.yaml)")
    from tessera.kube.kinds import NODES, PODS
    from tessera.view.gpumap import build_map

    slices, claims = _claims_path(api)
    gmap = build_map(api.list(NODES).items, api.list(PODS).items, slices=slices, claims=claims)
    model_of = {c.uuid: c.model for n in gmap.nodes for c in n.cards}
    used = QuotaUsage()
    for key, a in gmap.assignments.items():
        used.set_pod(key, key.partition("/")[0], holding(a, lambda u: model_of.get(u, "")))
    cards = _slice_cards(slices)
    for c in claims:
        meta = c.get("metadata") or {}
        ns_, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        try:
            used.set_pod(claim_key(ns_, name), ns_, claim_holding(c, cards.get))
        except SpecError as exc:  # as the extender: a claim that does not read is not counted
            typer.echo(f"note: claim {ns_}/{name} is not counted: {exc}", err=True)
    out: list[dict[str, Any]] = []
    for obj in sorted(objs, key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"])):
        meta = obj["metadata"]
        try:
            q = parse_quota(obj)
        except SpecError as exc:
            out.append({"namespace": meta["namespace"], "quota": meta["name"],
                        "error": str(exc)})  # fmt: skip
            continue
        for lim in q.limits:
            u = used.of(q.namespace, lim)
            out.append({
                "namespace": q.namespace, "quota": q.name, "limit": lim.name,
                "models": sorted(lim.models),
                "memoryMiB": {"used": u.memory_mib, "hard": lim.memory_mib},
                "coresPercent": {"used": u.cores_percent, "hard": lim.cores_percent},
                "cards": {"used": u.cards, "hard": lim.cards},
                "holders": used.holders(q.namespace, lim),
            })  # fmt: skip
    if output in (Output.JSON, Output.YAML):
        _emit({"quotas": out}, output)
        return
    if not out:
        typer.echo("No GpuQuotas found" + (f" in namespace {ns}" if ns else ""))
        return

    def pair(d: Mapping[str, int | None], unit: str = "") -> str:
        return "-" if d["hard"] is None else f"{d['used']}/{d['hard']}{unit}"

    headers = ["NAMESPACE", "QUOTA", "LIMIT", "MODELS", "MEMORY", "CORES", "CARDS"]
    if output is Output.WIDE:
        headers.append("HOLDERS")
    rows = []
    for r in out:
        if "error" in r:
            rows.append([r["namespace"], r["quota"], "INVALID", r["error"], "", "", ""])
            continue
        row = [r["namespace"], r["quota"], r["limit"], ",".join(r["models"]),
               pair(r["memoryMiB"], "Mi"), pair(r["coresPercent"], "%"),
               pair(r["cards"])]  # fmt: skip
        if output is Output.WIDE:
            row.append(",".join(h.partition("/")[2] for h in r["holders"]) or "-")
        rows.append(row)
    _table(headers, rows)


# --- capacity ----------------------------------------------------------------------------


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


@app.command()
def capacity(
    model: Annotated[str | None, typer.Option(help="Only cards of this model.")] = None,
    output: Out = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
) -> None:
    """What the cluster's cards can still take, per model: whole cards free (and how many
    nodes have 1, 2, 4 or 8 of them, since a multi-card pod needs them on one node),
    memory and compute allocated, cards unhealthy or cordoned."""
    from tessera.view import capacity as cap

    rows = cap.capacity(_load_map(_Conn(kubeconfig, context).client()), model)
    if output in (Output.JSON, Output.YAML):
        _emit({"models": [r.json() for r in rows]}, output)
        return
    blocks = "/".join(str(k) for k in cap.BLOCKS)
    headers = ["MODEL", "NODES", "CARDS", "UNHEALTHY", "CORDONED", "FREE", "MOST-FREE",
               f"NODES-FREE-{blocks}", "MEMORY", "COMPUTE"]  # fmt: skip
    table = [
        [r.model, r.nodes, r.cards, r.unhealthy, r.cordoned, r.free, r.most_free_on_a_node,
         "/".join(str(r.nodes_with_free[k]) for k in cap.BLOCKS),
         f"{r.allocated_mib // 1024}/{r.memory_mib // 1024}Gi "
         f"{_pct(r.allocated_mib, r.memory_mib)}",
         _pct(r.allocated_cores, r.cores_percent)]
        for r in rows
    ]  # fmt: skip
    _table(headers, table)


# --- cordon / uncordon ---------------------------------------------------------------


def _change_cordons(node: str, cards: list[str], cordon: bool, kubeconfig: str | None,
                    context: str | None) -> frozenset[str]:  # fmt: skip
    """Cordon or uncordon, and say what changed; the UUIDs of the cards named."""
    from tessera.kube.errors import ApiError, NotFound
    from tessera.view.cordon import CordonError, change_cordons, describe, node_map

    api = _Conn(kubeconfig, context).client()
    try:
        done = change_cordons(api, node, cards, cordon)
    except NotFound:
        _fail(f'nodes "{node}" not found')
    except CordonError as exc:
        _fail(str(exc))
    except ApiError as exc:  # 403: cordoning needs patch on nodes, as kubectl cordon does
        _fail(f"node {node}: {exc.status} {exc.reason}: {exc.message}")
    verb = "cordoned" if cordon else "uncordoned"
    if done.changed:
        typer.echo(f"node {node}: {describe(done.changed)} {verb}")
    if done.unchanged:
        typer.echo(f"node {node}: {describe(done.unchanged)} already {verb}")
    if done.dropped:
        typer.echo(f"node {node}: {', '.join(done.dropped)} (no card the node shows) {verb}")
    if not done.changed and not done.unchanged and not done.dropped:
        typer.echo(f"node {node}: no card was cordoned")
    named = frozenset(c.uuid for c in (*done.changed, *done.unchanged))
    if not cordon:
        return named
    # Who still runs on the cards just taken out: they keep running until they end.
    gmap, _ = node_map(api, node)
    for n in gmap.nodes:
        for c in n.cards:
            if c.uuid in named:
                held = sorted({h.pod_key if h.pod else f"claim/{h.claim}" for h in c.holders})
                typer.echo(f"  card {c.index}: " + (
                    f"{len(held)} tenant(s) keep running: {', '.join(held)}" if held
                    else "no tenants"))  # fmt: skip
    return named


@app.command()
def cordon(
    node: Annotated[str, typer.Argument(help="The node's name.")],
    cards: Annotated[list[str], typer.Argument(help="Cards to cordon: UUIDs or indices.")],
    kubeconfig: Kubeconfig = None,
    context: Context = None,
) -> None:
    """Take cards out of service: no new tenant is placed on them (extender and claims),
    the pods on them keep running. The rest of the node stays in service."""
    _change_cordons(node, cards, True, kubeconfig, context)


@app.command()
def uncordon(
    node: Annotated[str, typer.Argument(help="The node's name.")],
    cards: Annotated[
        list[str] | None, typer.Argument(help="Cards to put back: UUIDs or indices; none: all.")
    ] = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
) -> None:
    """Put cordoned cards back in service."""
    _change_cordons(node, list(cards or []), False, kubeconfig, context)


@app.command()
def drain(
    node: Annotated[str, typer.Argument(help="The node's name.")],
    cards: Annotated[list[str], typer.Argument(help="Cards to empty: UUIDs or indices.")],
    timeout: Annotated[
        float, typer.Option("--timeout", min=0, help="Seconds to wait for the cards to empty.")
    ] = 300.0,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
) -> None:
    """Cordon cards, then evict every pod holding them (the Eviction API: budgets and
    grace periods hold) and wait until none is left. Exit 1 if some are at the timeout."""
    from tessera.view.cordon import drain as drain_cards

    uuids = _change_cordons(node, cards, True, kubeconfig, context)
    api = _Conn(kubeconfig, context).client()
    left = drain_cards(api, node, uuids, timeout, typer.echo)
    if left:
        pods = ", ".join(f"{t.namespace}/{t.pod}" + (" (terminating)" if t.terminating else "")
                         for t in left)  # fmt: skip
        _fail(f"node {node}: after {timeout:.0f} s, still on the cards: {pods}")
    typer.echo(f"node {node}: drained; the cards stay cordoned (kubectl tessera uncordon)")


def main() -> None:
    """The ``kubectl-tessera`` entry point."""
    app(prog_name="kubectl tessera")
