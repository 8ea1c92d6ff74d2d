"""``kubectl tessera top`` and ``pod``: who holds which card, with live use from
Prometheus when asked."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from tessera.view.gpumap import CardView, Holder, NodeView, card_json
from tessera.view.kubectl.common import (
    Conn,
    Context,
    Kubeconfig,
    Namespace,
    Out,
    Output,
    Prom,
    emit,
    fail,
    get_pod,
    load_map,
    mib,
    print_table,
)


class SortBy(enum.StrEnum):
    NODE = "node"
    FREE = "free"  # most free memory first
    MEMORY = "memory"  # most allocated memory first
    CORES = "cores"  # most allocated compute first
    USED = "used"  # most memory in use first (needs --prometheus)


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
        fail(f"--prometheus {url}: {exc}")


def _use(live: Mapping[tuple[str, str, str, str], Live], h: Holder, uuid: str) -> Live:
    if h.claim:
        return live.get((h.namespace, "", f"claim/{h.claim}", uuid), Live())
    return live.get((h.namespace, h.pod, h.container, uuid), Live())


def _fmt_bytes(v: float | None) -> str:
    return "-" if v is None else mib(round(v / (1 << 20)))


def _fmt_pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


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
    conn = Conn(kubeconfig, context)
    gmap = load_map(conn.client())
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
        emit(
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
        card = [n.name, c.index, c.model, f"{c.allocated_mib}/{mib(c.memory_mib)}",
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
                size = "whole" if h.exclusive else f"{mib(h.memory_mib)} {h.cores_percent}%"
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
        print_table(headers, rows)
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


def pod(
    name: Annotated[str, typer.Argument(help="The pod's name.")],
    namespace: Namespace = None,
    output: Out = None,
    prometheus: Prom = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
) -> None:
    """A pod's cards and limits, as the extender assigned them."""

    conn = Conn(kubeconfig, context)
    ns = conn.namespace(namespace)
    api = conn.client()
    get_pod(api, name, ns)
    gmap = load_map(api)
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
                "whole" if ca.exclusive else mib(s.memory_mib),
                "100%" if ca.exclusive else f"{s.cores_percent}%",
                str(ca.policy),
                s.uuid,
            ]
            if live:
                row += [_fmt_bytes(u.used_bytes), _fmt_pct(u.achieved_percent)]
            table.append(row)
    if output in (Output.JSON, Output.YAML):
        emit({"pod": key, "node": assignment.node if assignment else None, "cards": cards,
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
    print_table(headers + (["USED", "ACHIEVED"] if live else []), table)
