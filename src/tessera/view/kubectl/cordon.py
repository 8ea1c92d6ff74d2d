"""``kubectl tessera cordon``, ``uncordon`` and ``drain``: single cards out of service
and back (the pure rules are in view/cordon.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from tessera.view.kubectl.common import (
    Conn,
    Context,
    Kubeconfig,
    fail,
)


def _change_cordons(node: str, cards: list[str], cordon: bool, kubeconfig: str | None,
                    context: str | None) -> frozenset[str]:  # fmt: skip
    """Cordon or uncordon, and say what changed; the UUIDs of the cards named."""
    from tessera.kube.errors import ApiError, NotFound
    from tessera.view.cordon import CordonError, change_cordons, describe, node_map

    api = Conn(kubeconfig, context).client()
    try:
        done = change_cordons(api, node, cards, cordon)
    except NotFound:
        fail(f'nodes "{node}" not found')
    except CordonError as exc:
        fail(str(exc))
    except ApiError as exc:  # 403: cordoning needs patch on nodes, as kubectl cordon does
        fail(f"node {node}: {exc.status} {exc.reason}: {exc.message}")
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


def cordon(
    node: Annotated[str, typer.Argument(help="The node's name.")],
    cards: Annotated[list[str], typer.Argument(help="Cards to cordon: UUIDs or indices.")],
    kubeconfig: Kubeconfig = None,
    context: Context = None,
) -> None:
    """Take cards out of service: no new tenant is placed on them (extender and claims),
    the pods on them keep running. The rest of the node stays in service."""
    _change_cordons(node, cards, True, kubeconfig, context)


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
    api = Conn(kubeconfig, context).client()
    left = drain_cards(api, node, uuids, timeout, typer.echo)
    if left:
        pods = ", ".join(f"{t.namespace}/{t.pod}" + (" (terminating)" if t.terminating else "")
                         for t in left)  # fmt: skip
        fail(f"node {node}: after {timeout:.0f} s, still on the cards: {pods}")
    typer.echo(f"node {node}: drained; the cards stay cordoned (kubectl tessera uncordon)")
