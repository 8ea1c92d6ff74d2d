"""``kubectl tessera capacity``: free and allocated cards per model."""

from __future__ import annotations

from typing import Annotated

import typer

from tessera.view.kubectl.common import (
    Conn,
    Context,
    Kubeconfig,
    Out,
    Output,
    emit,
    load_map,
    print_table,
)


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


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

    rows = cap.capacity(load_map(Conn(kubeconfig, context).client()), model)
    if output in (Output.JSON, Output.YAML):
        emit({"models": [r.json() for r in rows]}, output)
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
    print_table(headers, table)
