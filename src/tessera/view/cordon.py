"""Cordoning cards: an operator takes single GPUs out of service, the node stays in.

A card in the Node's ``tessera.io/cordoned-cards`` takes no new tenant, from the extender
(placement, preemption) or on the claims path (the node agent taints it in the node's
ResourceSlice); the pods on it keep running. ``kubectl tessera cordon`` and ``uncordon``
edit the annotation through these functions: the cards are named by UUID or by index on
the node, resolved against the node's inventory, and the write carries the Node's
resourceVersion, so two operators editing the list at once do not lose each other's
change (the loser reads again and retries).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tessera.claims.devices import DRIVER, slice_cards, slice_name
from tessera.errors import FormatError, SpecError
from tessera.kube.errors import Conflict, NotFound
from tessera.kube.kinds import NODES, RESOURCE_SLICES
from tessera.kube.port import KubeApi, Obj
from tessera.model import annotations as keys
from tessera.model.types import Card

__all__ = ["CordonChange", "change_cordons", "resolve_cards"]

ATTEMPTS = 5  # reads and writes before giving up on a Node others keep changing


class CordonError(Exception):
    """A card that cannot be named, or a node that is not a Tessera GPU node."""


@dataclass(frozen=True, slots=True)
class CordonChange:
    node: str
    changed: tuple[Card, ...]  # the cards whose state this call changed
    unchanged: tuple[Card, ...]  # the cards named that already were in the asked state
    cordoned: frozenset[str]  # the node's cordoned UUIDs after the write


def _cards(node: Obj, slice_obj: Obj | None) -> tuple[Card, ...]:
    """The node's cards on both paths: the extender's (its inventory annotation) and the
    claims path's (its ResourceSlice)."""
    name = str((node.get("metadata") or {}).get("name", ""))
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(keys.INVENTORY)
    cards: list[Card] = []
    try:
        if isinstance(text, str):
            cards += keys.decode_inventory(name, text, 0, 0).cards
        if slice_obj is not None:
            cards += slice_cards(slice_obj)[1]
    except (FormatError, SpecError) as exc:
        raise CordonError(f"node {name}: {exc}") from None
    if not isinstance(text, str) and slice_obj is None:
        raise CordonError(
            f"node {name} has no {keys.INVENTORY} annotation and no {DRIVER} ResourceSlice: "
            "not a Tessera GPU node"
        )
    return tuple(sorted(cards, key=lambda c: c.index))


def _slice(api: KubeApi, node: str) -> Obj | None:
    try:
        return api.get(RESOURCE_SLICES, slice_name(node))
    except NotFound:
        return None  # no claims path on this node (or no resource.k8s.io at all)


def resolve_cards(
    node: Obj, named: Sequence[str], slice_obj: Obj | None = None
) -> tuple[Card, ...]:
    """The node's cards that ``named`` gives, by UUID or by index; every name must match."""
    cards = _cards(node, slice_obj)
    by_uuid = {c.uuid: c for c in cards}
    by_index = {str(c.index): c for c in cards}
    out: list[Card] = []
    unknown: list[str] = []
    for name in named:
        card = by_uuid.get(name) or by_index.get(name)
        if card is None:
            unknown.append(name)
        elif card not in out:
            out.append(card)
    if unknown:
        node_name = (node.get("metadata") or {}).get("name")
        known = ", ".join(f"{c.index} ({c.uuid})" for c in sorted(cards, key=lambda c: c.index))
        raise CordonError(
            f"node {node_name} has no card {', '.join(unknown)}: give a UUID or an index "
            f"of its cards: {known}"
        )
    return tuple(out)


def change_cordons(api: KubeApi, node: str, named: Sequence[str], cordon: bool) -> CordonChange:
    """Cordon (or uncordon) the cards ``named`` on ``node``; no names with ``cordon``
    False uncordons every card. Nothing is written when nothing changes."""
    slice_obj = _slice(api, node)
    for _ in range(ATTEMPTS):
        obj = api.get(NODES, node)
        meta = obj.get("metadata") or {}
        cards = resolve_cards(obj, named, slice_obj) if named or cordon else _cards(obj, slice_obj)
        if cordon and not cards:
            raise CordonError("name at least one card to cordon")
        before = keys.parse_cordoned((meta.get("annotations") or {}).get(keys.CORDONED_CARDS))
        uuids = {c.uuid for c in cards}
        after = before | uuids if cordon else before - uuids
        if not named and not cordon:
            after = frozenset()  # also the names of cards no longer on the node
        changed = tuple(c for c in cards if (c.uuid in before) != cordon)
        unchanged = tuple(c for c in cards if (c.uuid in before) == cordon)
        if after == before:
            return CordonChange(node, (), unchanged, before)
        value = keys.format_cordoned(after) if after else None  # None removes it
        patch = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {keys.CORDONED_CARDS: value},
            }
        }
        try:
            api.merge_patch(NODES, node, patch)
        except Conflict:
            continue  # someone else changed the Node meanwhile: read it again
        return CordonChange(node, changed, unchanged, frozenset(after))
    raise CordonError(f"node {node} kept changing under {ATTEMPTS} attempts; try again")


def describe(cards: Iterable[Card]) -> str:
    return ", ".join(f"card {c.index} ({c.uuid})" for c in sorted(cards, key=lambda c: c.index))
