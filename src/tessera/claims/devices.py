"""A node's cards as DRA devices: the ResourceSlice the node agent publishes (pure).

One device per card, named ``gpu-<index>``, in one pool named after the node. Each device
allows multiple allocations and has three consumable capacities (docs/protocol.md,
"## DRA ResourceSlice"):

* ``memory``: the card's memory. A request that does not name it takes the whole card's
  memory, so a request with no capacity at all is a whole, exclusive card.
* ``compute``: percent of the card's compute, 0..100; not named: 0 (no guaranteed share,
  like ``tessera.io/gpu-memory`` alone on the extender path).
* ``slots``: containers' claims the agent can give this card to (``--slots-per-card``);
  every allocation takes exactly 1, so the scheduler keeps the per-card limit.

A card that is not healthy carries the ``gpu.tessera.io/unhealthy`` NoSchedule taint,
and one an operator cordoned (the Node's ``tessera.io/cordoned-cards``) the
``gpu.tessera.io/cordoned`` one: claims already on it keep their allocation, new claims
do not get it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from tessera.errors import SpecError
from tessera.model.quantity import memory_mib
from tessera.model.types import Card

__all__ = [
    "CAPACITY_COMPUTE",
    "CAPACITY_MEMORY",
    "CAPACITY_SLOTS",
    "CLAIMS_LABEL",
    "CORDONED_TAINT",
    "DRIVER",
    "UNHEALTHY_TAINT",
    "card_taints",
    "claims_pool",
    "device_name",
    "nvlink_islands",
    "resource_slice",
    "semver",
    "slice_cards",
    "slice_devices",
    "slice_name",
]

DRIVER = "gpu.tessera.io"
CAPACITY_MEMORY = "memory"
CAPACITY_COMPUTE = "compute"
CAPACITY_SLOTS = "slots"
UNHEALTHY_TAINT = f"{DRIVER}/unhealthy"
CORDONED_TAINT = f"{DRIVER}/cordoned"
CLAIMS_LABEL = "tessera.io/claims-cards"  # on a Node: its cards offered to claims
SLICE_API = "resource.k8s.io/v1"


def device_name(card: Card) -> str:
    return f"gpu-{card.index}"


def slice_name(node: str) -> str:
    """One slice per node; the driver suffix keeps it apart from other drivers' slices."""
    return f"{node}-{DRIVER}"


def nvlink_islands(cards: Iterable[Card]) -> dict[int, int]:
    """Card index -> the smallest index of the cards it reaches over NVLink (itself if none).

    Published as the ``nvlinkIsland`` attribute, so a claim for several cards can say
    "on one island" with ``matchAttribute`` (DRA has no list attributes by default).
    """
    peers: dict[int, set[int]] = {c.index: set(c.nvlink_peers) for c in cards}
    island: dict[int, int] = {}
    for start in sorted(peers):
        if start in island:
            continue
        seen, todo = {start}, [start]
        while todo:
            for peer in peers.get(todo.pop(), ()):
                if peer in peers and peer not in seen:
                    seen.add(peer)
                    todo.append(peer)
        for index in seen:
            island[index] = min(seen)
    return island


_NUMBERS = re.compile(r"^(\d+)(?:\.(\d+))?(?:\.(\d+))?")


def semver(version: str) -> str | None:
    """A driver version as DRA's ``version`` attribute wants it (semver 2.0), or None.

    NVIDIA versions are ``535.104.05``: semver forbids the leading zero, and some have
    two parts (``550.54``), so the numbers are re-written as ``535.104.5`` / ``550.54.0``.
    """
    m = _NUMBERS.match(version.strip())
    if m is None:
        return None
    return ".".join(str(int(part or 0)) for part in m.groups())


def _device(card: Card, island: int, driver_version: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "uuid": {"string": card.uuid},
        "model": {"string": card.model},
        "index": {"int": card.index},
        "numaNode": {"int": card.numa_node},
        "nvlinkIsland": {"int": island},
        "nvlinkPeers": {"string": ",".join(str(p) for p in sorted(card.nvlink_peers))},
    }
    if driver_version is not None:
        attributes["driverVersion"] = {"version": driver_version}
    mib = card.memory_mib
    device: dict[str, Any] = {
        "name": device_name(card),
        "attributes": attributes,
        "allowMultipleAllocations": True,
        "capacity": {
            CAPACITY_MEMORY: {
                "value": f"{mib}Mi",
                "requestPolicy": {
                    "default": f"{mib}Mi",
                    "validRange": {"min": "1Mi", "max": f"{mib}Mi", "step": "1Mi"},
                },
            },
            CAPACITY_COMPUTE: {
                "value": "100",
                "requestPolicy": {
                    "default": "0",
                    "validRange": {"min": "0", "max": "100", "step": "1"},
                },
            },
            CAPACITY_SLOTS: {
                "value": str(card.slots),
                "requestPolicy": {"default": "1", "validValues": ["1"]},
            },
        },
    }
    taints = card_taints(card)
    if taints:
        device["taints"] = taints
    return device


def card_taints(card: Card) -> list[dict[str, str]]:
    """The taints a card out of service carries in its slice (none when in service)."""
    return [
        {"key": key, "value": "true", "effect": "NoSchedule"}
        for key, on in ((UNHEALTHY_TAINT, not card.healthy), (CORDONED_TAINT, card.cordoned))
        if on
    ]


def resource_slice(
    node: str,
    cards: Iterable[Card],
    generation: int,
    driver_version: str = "",
    node_uid: str = "",
) -> dict[str, Any]:
    """The ResourceSlice for ``cards`` on ``node`` (pool ``node``, one slice in it).

    ``node_uid`` makes the Node its owner, so the slice goes with a deleted node.
    """
    cards = sorted(cards, key=lambda c: c.index)
    island = nvlink_islands(cards)
    version = semver(driver_version) if driver_version else None
    meta: dict[str, Any] = {"name": slice_name(node)}
    if node_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
        ]
    return {
        "apiVersion": SLICE_API,
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [_device(c, island[c.index], version) for c in cards],
        },
    }


def claims_pool(spec: str, indices: Iterable[int], field: str = "--claims-cards") -> frozenset[int]:
    """The card indices offered to claims: ``all``, ``none``, or indices and ranges
    separated by ``,`` or ``_`` (``4-7``, ``0,2,4``, ``0_2_4``; a label value cannot hold
    a comma). Every other card of the node stays on the extender path; none is on both.
    """
    have = frozenset(indices)
    text = spec.strip()
    if text == "all":
        return have
    if text in ("", "none"):
        return frozenset()
    out: set[int] = set()
    for part in re.split(r"[,_]", text):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if m is None:
            rule = "must be all, none, or card indices and ranges such as 4-7 or 0,2,4"
            raise SpecError(field, rule, spec)
        first, last = int(m[1]), int(m[2] or m[1])
        for index in range(first, last + 1):
            if index not in have:
                raise SpecError(field, f"names card {index}, which this node does not have", spec)
            out.add(index)
    return frozenset(out)


def _at(obj: object, where: str, *keys: str) -> Any:
    """obj[keys[0]][keys[1]]..., or a SpecError naming the first missing step's path."""
    for key in keys:
        where = f"{where}.{key}"
        value = obj.get(key) if isinstance(obj, Mapping) else None
        if value is None:
            raise SpecError(where, "is missing")
        obj = value
    return obj


def _int_at(obj: object, where: str, *keys: str) -> int:
    """``_at``'s value as a whole number (an int, or the digits of a quantity string)."""
    value = _at(obj, where, *keys)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    raise SpecError(".".join((where, *keys)), "must be a whole number", value)


def slice_cards(obj: Mapping[str, Any]) -> tuple[str, tuple[Card, ...]]:
    """The node and the cards of a ResourceSlice this driver published: the inverse of
    ``resource_slice`` for what the views show (uuid, index, model, memory, slots,
    health). A slice of another driver is not asked about; a malformed one is refused,
    naming the field."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise SpecError("spec", "must be an object", spec)
    node = spec.get("nodeName") or (spec.get("pool") or {}).get("name")
    if not isinstance(node, str) or not node:
        raise SpecError("spec.nodeName", "must name the node")
    cards = []
    for i, dev in enumerate(spec.get("devices") or []):
        where = f"spec.devices[{i}]"
        if not isinstance(dev, Mapping):
            raise SpecError(where, "must be an object", dev)
        uuid = str(_at(dev, where, "attributes", "uuid", "string"))
        index = _int_at(dev, where, "attributes", "index", "int")
        model = str(_at(dev, where, "attributes", "model", "string"))
        memory = _at(dev, where, "capacity", CAPACITY_MEMORY, "value")
        slots = _int_at(dev, where, "capacity", CAPACITY_SLOTS, "value")
        taints = {t.get("key") for t in dev.get("taints") or [] if isinstance(t, Mapping)}
        mib = memory_mib(memory, f"{where}.capacity.{CAPACITY_MEMORY}.value")
        cards.append(Card(uuid, index, model, mib, healthy=UNHEALTHY_TAINT not in taints,
                          slots=slots, cordoned=CORDONED_TAINT in taints))  # fmt: skip
    return node, tuple(sorted(cards, key=lambda c: c.index))


def slice_devices(obj: Mapping[str, Any]) -> tuple[str, dict[str, Card]]:
    """The pool of a slice this driver published and its cards by device name, as an
    allocation names them (``slice_cards``' rules; a SpecError for a malformed one)."""
    pool, cards = slice_cards(obj)
    return pool, {device_name(c): c for c in cards}
