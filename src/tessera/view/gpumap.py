"""The cluster's GPU map: which pod holds which card, read from the API's objects.

Pure: Node and Pod objects in, a ``GpuMap`` out, decoded with the same functions the
extender uses (the inventory and assignment annotations, ``parse_pod``). Both views --
``kubectl tessera`` and the scheduler's web page -- draw from it. Whatever does not
decode is kept as a problem beside the rest, never dropped silently: a node whose
inventory is refused, a pod whose assignment names another node or cards its node does
not have.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.errors import FormatError, SpecError
from tessera.model import annotations as keys
from tessera.model.names import ResourceNames
from tessera.model.podspec import TERMINAL_PHASES, Compat, parse_pod
from tessera.model.types import Assignment

__all__ = ["CardView", "GpuMap", "Holder", "NodeView", "Pending", "build_map"]

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Holder:
    """One container's slice of one card."""

    namespace: str
    pod: str
    container: str
    memory_mib: int
    cores_percent: int
    policy: str
    exclusive: bool
    phase: str

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


def _summary(pod: Obj, names: ResourceNames, compat: Compat) -> str | None:
    """What a pod asks of Tessera in a few words; None if it asks nothing of it."""
    try:
        request = parse_pod(pod, names=names, compat=compat)
    except SpecError as exc:
        return f"invalid: {exc}"
    if request is None:
        return None
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


def build_map(
    nodes: Iterable[Obj],
    pods: Iterable[Obj],
    names: ResourceNames | None = None,
    compat: Compat | None = None,
) -> GpuMap:
    names = names or ResourceNames()
    compat = compat or Compat()
    node_views: dict[str, NodeView] = {}
    card_node: dict[str, str] = {}
    for obj in nodes:
        name = str(_meta(obj).get("name") or "")
        text = _annotation(obj, keys.INVENTORY)
        if not name or text is None:
            continue  # not a Tessera GPU node
        try:
            inv = keys.decode_inventory(name, text, 0, 0)
        except FormatError as exc:
            node_views[name] = NodeView(name, problem=f"inventory refused: {exc}")
            continue
        cards = tuple(
            CardView(c.uuid, c.index, c.model, c.memory_mib, c.healthy, c.slots)
            for c in sorted(inv.cards, key=lambda c: c.index)
        )
        node_views[name] = NodeView(name, cards)
        for c in cards:
            card_node[c.uuid] = name

    holders: dict[str, list[Holder]] = {}
    pending: list[Pending] = []
    problems: list[tuple[str, str]] = []
    held: dict[str, Assignment] = {}
    for obj in pods:
        meta = _meta(obj)
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        phase = str((obj.get("status") or {}).get("phase") or "")
        node = str((obj.get("spec") or {}).get("nodeName") or "")
        if phase in TERMINAL_PHASES:
            continue
        text = _annotation(obj, keys.ASSIGNMENT)
        if text is None or not node:
            if not node:
                summary = _summary(obj, names, compat)
                if summary is not None:
                    pending.append(Pending(str(meta.get("namespace")), str(meta.get("name")),
                                           summary))  # fmt: skip
            continue
        try:
            a = keys.decode_assignment(key, text)
        except FormatError as exc:
            problems.append((key, str(exc)))
            continue
        if a.node != node:
            problems.append((key, f"assignment names node {a.node}, the pod is bound to {node}"))
            continue
        foreign = sorted({s.uuid for c in a.containers for s in c.slices
                          if card_node.get(s.uuid) != node})  # fmt: skip
        if foreign:
            problems.append((key, f"assignment names cards {node} does not have: {foreign}"))
            continue
        held[key] = a
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
                        phase,
                    )
                )
    out = []
    for name in sorted(node_views):
        nv = node_views[name]
        cards = tuple(
            CardView(
                c.uuid,
                c.index,
                c.model,
                c.memory_mib,
                c.healthy,
                c.slots,
                tuple(sorted(holders.get(c.uuid, ()), key=lambda h: (h.pod_key, h.container))),
            )
            for c in nv.cards
        )
        out.append(NodeView(name, cards, nv.problem))
    return GpuMap(
        tuple(out),
        tuple(sorted(pending, key=lambda p: (p.namespace, p.pod))),
        tuple(sorted(problems)),
        held,
    )
