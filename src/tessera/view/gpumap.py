"""The cluster's GPU map: which pod holds which card, read from the API's objects.

Pure: Node and Pod objects in, a ``GpuMap`` out, decoded with the same functions the
extender uses (the inventory and assignment annotations, ``parse_pod``). Both views --
``kubectl tessera`` and the scheduler's web page -- draw from it. With ResourceSlices and
ResourceClaims too, the cards on the claims path are drawn beside the extender's, each
allocated claim a holder of its slice, decoded with the functions the node agent uses
(``slice_cards``, ``claim_grant``). Whatever does not decode is kept as a problem beside
the rest, never dropped silently: a node whose inventory is refused, a pod whose
assignment names another node or cards its node does not have, a slice or a claim that
does not read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.claims.allocation import allocated_pools, claim_grant
from tessera.claims.devices import DRIVER, device_name, slice_cards
from tessera.errors import FormatError, SpecError
from tessera.model import annotations as keys
from tessera.model.names import ResourceNames
from tessera.model.podspec import TERMINAL_PHASES, Compat, parse_pod
from tessera.model.types import Assignment, Card, NodeInventory, PodRequest

__all__ = [
    "CardView",
    "GpuMap",
    "Holder",
    "NodeView",
    "Pending",
    "assemble",
    "build_map",
    "card_json",
    "map_json",
    "summary",
    "unassigned",
]

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Holder:
    """One container's slice of one card, or one DRA claim's (``claim`` set: ``pod`` is
    then the pods it is reserved for, comma-separated, and ``container`` empty)."""

    namespace: str
    pod: str
    container: str
    memory_mib: int
    cores_percent: int
    policy: str
    exclusive: bool
    claim: str = ""

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.pod}"


@dataclass(frozen=True, slots=True)
class CardView:
    uuid: str
    index: int
    model: str
    memory_mib: int
    healthy: bool
    slots: int
    holders: tuple[Holder, ...] = ()
    cordoned: bool = False

    @property
    def allocated_mib(self) -> int:
        return sum(h.memory_mib for h in self.holders)

    @property
    def allocated_cores(self) -> int:
        return sum(h.cores_percent for h in self.holders)


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    cards: tuple[CardView, ...] = ()
    problem: str = ""  # the inventory was refused: why
    held: str = ""  # held for a preempting pod (the scheduler's map only): for whom


@dataclass(frozen=True, slots=True)
class Pending:
    """A pod asking for Tessera resources that is not bound yet."""

    namespace: str
    pod: str
    summary: str  # what it asks, e.g. "1 card 8000 MiB 30%"


@dataclass(frozen=True, slots=True)
class GpuMap:
    nodes: tuple[NodeView, ...]
    pending: tuple[Pending, ...] = ()
    problems: tuple[tuple[str, str], ...] = ()  # (namespace/pod, what is wrong)
    assignments: Mapping[str, Assignment] = field(default_factory=dict)  # pod key -> held
    # ("ResourceSlice NAME" or "ResourceClaim NS/NAME", what is wrong)
    claim_problems: tuple[tuple[str, str], ...] = ()

    def card(self, uuid: str) -> tuple[NodeView, CardView] | None:
        for n in self.nodes:
            for c in n.cards:
                if c.uuid == uuid:
                    return n, c
        return None


def _meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _annotation(obj: Obj, key: str) -> str | None:
    value = (_meta(obj).get("annotations") or {}).get(key)
    return value if isinstance(value, str) else None


def summary(request: PodRequest) -> str:
    """What a pod asks of Tessera in a few words, e.g. "main: 1 card 8000 MiB 30%"."""
    parts = []
    for c in request.containers:
        g = c.gpu
        if g is None:
            continue
        cards = f"{g.count} card" + ("s" if g.count != 1 else "")
        if g.exclusive:
            parts.append(f"{c.name}: {cards} whole")
        else:
            mem = f"{g.memory_mib} MiB" if g.memory_mib is not None else "memory share"
            parts.append(f"{c.name}: {cards} {mem} {g.cores_percent}%")
    return ", ".join(parts)


def unassigned(node: str, *, undecoded: bool = False) -> str:
    """The problem of a GPU pod bound without an assignment the map can read: bound by
    something other than Tessera's scheduler (``spec.nodeName`` set by hand, with the
    webhook off), or its annotation since taken off or broken."""
    if undecoded:
        return (
            f"bound to {node}, its {keys.ASSIGNMENT} annotation does not decode "
            "(the scheduler's log says why): its cards are not known"
        )
    return f"bound to {node} without a {keys.ASSIGNMENT} annotation: its cards are not known"


def assemble(
    inventories: Iterable[NodeInventory],
    held: Mapping[str, Assignment],
    *,
    node_problems: Mapping[str, str] | None = None,
    pending: Iterable[Pending] = (),
    pod_problems: Iterable[tuple[str, str]] = (),
    slices: Iterable[Obj] = (),
    claims: Iterable[Obj] = (),
    held_nodes: Mapping[str, str] | None = None,
) -> GpuMap:
    """The map from decoded parts: each node's cards, and per pod key the assignment it
    holds; with ``slices`` and ``claims``, the claims path's cards beside
    the node's and each allocated claim a holder of its slice; ``held_nodes``: node ->
    for whom the scheduler holds it. A pod whose assignment names cards its node does not
    have is kept as a problem, not drawn."""
    held_nodes = held_nodes or {}
    node_problems = node_problems or {}
    card_node: dict[str, str] = {}
    claim_cards, claim_holders, claim_problems = claims_path(slices, claims)
    invs = {inv.name: inv for inv in inventories}
    for node, found in claim_cards.items():
        inv = invs.get(node)
        invs[node] = (
            dataclasses.replace(inv, cards=inv.cards + found)
            if inv is not None
            else NodeInventory(node, found, 0, 0)
        )
    for inv in invs.values():
        for c in inv.cards:
            card_node[c.uuid] = inv.name
    problems = list(pod_problems)
    holders: dict[str, list[Holder]] = {u: list(hs) for u, hs in claim_holders.items()}
    kept: dict[str, Assignment] = {}
    for key, a in held.items():
        foreign = sorted(
            {s.uuid for ca in a.containers for s in ca.slices if card_node.get(s.uuid) != a.node}
        )
        if foreign:
            problems.append((key, f"assignment names cards {a.node} does not have: {foreign}"))
            continue
        kept[key] = a
        ns, _, pod = key.partition("/")
        for ca in a.containers:
            for s in ca.slices:
                holders.setdefault(s.uuid, []).append(
                    Holder(
                        ns,
                        pod,
                        ca.name,
                        s.memory_mib,
                        s.cores_percent,
                        str(ca.policy),
                        ca.exclusive,
                    )
                )
    names = sorted(invs.keys() | node_problems.keys())
    nodes = []
    for name in names:
        if name not in invs:
            nodes.append(NodeView(name, problem=f"inventory refused: {node_problems[name]}"))
            continue
        cards = tuple(
            CardView(
                c.uuid,
                c.index,
                c.model,
                c.memory_mib,
                c.healthy,
                c.slots,
                tuple(sorted(holders.get(c.uuid, ()), key=lambda h: (h.pod_key, h.container))),
                c.cordoned,
            )
            for c in sorted(invs[name].cards, key=lambda c: c.index)
        )
        nodes.append(NodeView(name, cards, held=held_nodes.get(name, "")))
    return GpuMap(
        tuple(nodes),
        tuple(sorted(pending, key=lambda p: (p.namespace, p.pod))),
        tuple(sorted(problems)),
        kept,
        tuple(sorted(claim_problems)),
    )


def claims_path(
    slices: Iterable[Obj], claims: Iterable[Obj]
) -> tuple[dict[str, tuple[Card, ...]], dict[str, list[Holder]], list[tuple[str, str]]]:
    """The claims path's part of the map: each node's cards from this driver's
    ResourceSlices, each card's holders from the allocated ResourceClaims, and what did
    not decode."""
    cards: dict[str, tuple[Card, ...]] = {}
    problems: list[tuple[str, str]] = []
    for obj in slices:
        if (obj.get("spec") or {}).get("driver") != DRIVER:
            continue
        try:
            node, found = slice_cards(obj)
        except SpecError as exc:
            problems.append((f"ResourceSlice {_meta(obj).get('name', '')}", str(exc)))
            continue
        cards[node] = cards.get(node, ()) + found
    holders: dict[str, list[Holder]] = {}
    for obj in claims:
        meta = _meta(obj)
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        status = obj.get("status") or {}
        reserved = sorted(str(r.get("name")) for r in status.get("reservedFor") or []
                          if isinstance(r, Mapping) and r.get("resource") == "pods")  # fmt: skip
        for pool in sorted(allocated_pools(obj)):
            by_device = {device_name(c): c for c in cards.get(pool, ())}
            try:
                a = claim_grant(obj, pool=pool, cards=by_device).assignment
            except SpecError as exc:
                problems.append((f"ResourceClaim {ns}/{name}", str(exc)))
                continue
            for sl in a.slices:
                holders.setdefault(sl.uuid, []).append(
                    Holder(
                        ns,
                        ",".join(reserved),
                        "",
                        sl.memory_mib,
                        sl.cores_percent,
                        str(a.policy),
                        a.exclusive,
                        claim=name,
                    )
                )
    return cards, holders, problems


def build_map(
    nodes: Iterable[Obj],
    pods: Iterable[Obj],
    names: ResourceNames | None = None,
    compat: Compat | None = None,
    *,
    slices: Iterable[Obj] = (),
    claims: Iterable[Obj] = (),
) -> GpuMap:
    """The map from Node and Pod objects as the API lists them (and ResourceSlices and
    ResourceClaims, for the cards on the claims path)."""
    names = names or ResourceNames()
    compat = compat or Compat()
    inventories: list[NodeInventory] = []
    node_problems: dict[str, str] = {}
    for obj in nodes:
        name = str(_meta(obj).get("name") or "")
        text = _annotation(obj, keys.INVENTORY)
        if not name or text is None:
            continue  # not a Tessera GPU node
        try:
            inv = keys.decode_inventory(name, text, 0, 0)
            cordons = keys.parse_cordoned(_annotation(obj, keys.CORDONED_CARDS))
            inventories.append(keys.with_cordons(inv, cordons))
        except FormatError as exc:
            node_problems[name] = str(exc)

    held: dict[str, Assignment] = {}
    pending: list[Pending] = []
    problems: list[tuple[str, str]] = []
    for obj in pods:
        meta = _meta(obj)
        ns, pod = str(meta.get("namespace", "")), str(meta.get("name", ""))
        key = f"{ns}/{pod}"
        phase = str((obj.get("status") or {}).get("phase") or "")
        node = str((obj.get("spec") or {}).get("nodeName") or "")
        if phase in TERMINAL_PHASES:
            continue
        text = _annotation(obj, keys.ASSIGNMENT)
        if not node or text is None:
            asks = _asks(obj, names, compat)
            if asks is None:
                continue  # asks for no GPU
            if node:
                problems.append((key, unassigned(node)))
            else:
                pending.append(Pending(ns, pod, asks))
            continue
        try:
            a = keys.decode_assignment(key, text)
        except FormatError as exc:
            problems.append((key, str(exc)))
            continue
        if a.node != node:
            problems.append((key, f"assignment names node {a.node}, the pod is bound to {node}"))
            continue
        held[key] = a
    return assemble(
        inventories,
        held,
        node_problems=node_problems,
        pending=pending,
        pod_problems=problems,
        slices=slices,
        claims=claims,
    )


def _asks(obj: Obj, names: ResourceNames, compat: Compat) -> str | None:
    """What a pod asks of GPUs as the map lists it; None for a pod that asks for none."""
    try:
        request = parse_pod(obj, names=names, compat=compat)
    except SpecError as exc:
        return f"invalid: {exc}"
    return None if request is None else summary(request)


def card_json(node: NodeView, card: CardView) -> dict[str, Any]:
    """One card and its holders as the views' JSON (``kubectl tessera top -o json``, the
    scheduler's /gpus.json): camelCase, MiB and percent as in the API."""
    return {
        "node": node.name,
        "index": card.index,
        "uuid": card.uuid,
        "model": card.model,
        "healthy": card.healthy,
        "cordoned": card.cordoned,
        "memoryMiB": card.memory_mib,
        "allocatedMiB": card.allocated_mib,
        "allocatedCoresPercent": card.allocated_cores,
        "slots": card.slots,
        "holders": [
            {
                "namespace": h.namespace,
                "pod": h.pod,
                "container": h.container,
                "memoryMiB": h.memory_mib,
                "coresPercent": h.cores_percent,
                "policy": h.policy,
                "exclusive": h.exclusive,
                "claim": h.claim,
            }
            for h in card.holders
        ],
    }


def map_json(gmap: GpuMap) -> dict[str, Any]:
    """The whole map: nodes with their cards (or their problem), pending pods, problems."""
    return {key: list(items) for key, items in map_parts(gmap)}


def map_parts(gmap: GpuMap) -> list[tuple[str, Iterator[dict[str, Any]]]]:
    """``map_json``'s keys, each with its items made one at a time: a caller that encodes
    them as they come (the scheduler's /gpus.json) never holds the whole document."""
    return [
        (
            "nodes",
            (
                {
                    "name": n.name,
                    "problem": n.problem,
                    "held": n.held,
                    "cards": [card_json(n, c) for c in n.cards],
                }
                for n in gmap.nodes
            ),
        ),
        (
            "pending",
            ({"namespace": p.namespace, "pod": p.pod, "asks": p.summary} for p in gmap.pending),
        ),
        ("podProblems", ({"pod": key, "problem": why} for key, why in gmap.problems)),
        (
            "claimProblems",
            ({"object": key, "problem": why} for key, why in gmap.claim_problems),
        ),
    ]
