"""Every annotation key Tessera reads or writes, and the codecs of its system annotations.

This is the only module that knows the keys and the byte formats; adapters call these
functions and never index ``annotations[...]`` themselves. Formats are versioned: the
encoders write ``"v": 1``; the decoders refuse a version they do not know. The formats
are documented byte for byte in docs/protocol.md.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from tessera.errors import FormatError
from tessera.model.types import (
    DEFAULT_SLOTS,
    Assignment,
    Card,
    CardSlice,
    ComputePolicy,
    ContainerAssignment,
    NodeInventory,
)

__all__ = [
    "ASSIGNMENT",
    "COMPUTE_POLICY",
    "CORDONED_CARDS",
    "GPU_MANAGER_CORE",
    "GPU_MANAGER_CORE_LIMIT",
    "GPU_MANAGER_MEMORY",
    "GPU_MODEL",
    "GPU_MODEL_EXCLUDE",
    "GPU_UUID",
    "GPU_UUID_EXCLUDE",
    "HAMI_GPU",
    "HAMI_GPU_CORES",
    "HAMI_GPU_MEMORY",
    "HAMI_GPU_MEMORY_PERCENT",
    "HAMI_GPU_TYPE",
    "HAMI_GPU_TYPE_EXCLUDE",
    "HAMI_GPU_UUID",
    "HAMI_GPU_UUID_EXCLUDE",
    "INVENTORY",
    "PLACEMENT",
    "PREEMPTING",
    "PREFIX",
    "Preempting",
    "decode_assignment",
    "decode_inventory",
    "decode_preempting",
    "encode_assignment",
    "encode_inventory",
    "encode_preempting",
    "format_cordoned",
    "parse_cordoned",
    "with_cordons",
]

PREFIX = "tessera.io/"

# Set by users on a Pod.
GPU_MODEL = PREFIX + "gpu-model"
GPU_MODEL_EXCLUDE = PREFIX + "gpu-model-exclude"
GPU_UUID = PREFIX + "gpu-uuid"
GPU_UUID_EXCLUDE = PREFIX + "gpu-uuid-exclude"
COMPUTE_POLICY = PREFIX + "compute-policy"
PLACEMENT = PREFIX + "placement"

# --- Compatibility mode (docs/api.md): keys of other projects, read, never written ----
# HAMi (Project-HAMi/HAMi), default resource names and pod annotations.
HAMI_GPU = "nvidia.com/gpu"  # resource: number of cards
HAMI_GPU_MEMORY = "nvidia.com/gpumem"  # resource: MiB per card
HAMI_GPU_MEMORY_PERCENT = "nvidia.com/gpumem-percentage"  # resource: percent of each card
HAMI_GPU_CORES = "nvidia.com/gpucores"  # resource: percent of each card's compute
HAMI_GPU_TYPE = "nvidia.com/use-gputype"  # annotation: comma list of models allowed
HAMI_GPU_TYPE_EXCLUDE = "nvidia.com/nouse-gputype"  # annotation: models refused
HAMI_GPU_UUID = "nvidia.com/use-gpuuuid"  # annotation: card UUIDs allowed
HAMI_GPU_UUID_EXCLUDE = "nvidia.com/nouse-gpuuuid"  # annotation: card UUIDs refused
# tkestack GPU-manager.
GPU_MANAGER_CORE = "tencent.com/vcuda-core"  # resource: 100 per card
GPU_MANAGER_MEMORY = "tencent.com/vcuda-memory"  # resource: 256 MiB units
GPU_MANAGER_CORE_LIMIT = "tencent.com/vcuda-core-limit"  # annotation: utilisation cap
# --------------------------------------------------------------------------------------

# Written by Tessera.
INVENTORY = PREFIX + "inventory"  # on each Node, by the node agent
ASSIGNMENT = PREFIX + "assignment"  # on each placed Pod, by the extender's bind
# Set by an operator (`kubectl tessera cordon`) on a Node: a comma list of the UUIDs of
# cards that take no new tenant. Read by the extender and the node agent.
CORDONED_CARDS = PREFIX + "cordoned-cards"
# Set by the scheduler on a pending pod when a quota of its namespace goes up: the update
# makes kube-scheduler try the pod again (scheduler/quota_writer.py). The value is the
# time of the nudge (Unix seconds); nothing reads it.
QUOTA_RETRY = PREFIX + "quota-retry"
# Set by the scheduler on a pending pod it preempted for: the node and the pods evicted
# there. A new leader reads it back to keep holding the node (scheduler/holds.py).
PREEMPTING = PREFIX + "preempting"

VERSION = 1


def _dumps(obj: Any) -> str:
    # Compact and key-sorted so equal values give equal bytes (patch only on change).
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def _loads(what: str, text: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, TypeError) as exc:
        raise FormatError(what, f"not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise FormatError(what, "must be a JSON object")
    if obj.get("v") != VERSION:
        raise FormatError(what, f"unknown version {obj.get('v')!r}; this Tessera reads v{VERSION}")
    return obj


def _field(what: str, obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in obj:
        raise FormatError(what, f"missing field {key!r}")
    value = obj[key]
    # bool is an int in Python; refuse it where a number is meant.
    if isinstance(value, bool) and kind is not bool:
        raise FormatError(what, f"field {key!r} must be {_kind_name(kind)}, got {value!r}")
    if not isinstance(value, kind):
        raise FormatError(what, f"field {key!r} must be {_kind_name(kind)}, got {value!r}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {int: "an integer", str: "a string", bool: "true or false", list: "a list",
             dict: "an object"}  # fmt: skip
    if isinstance(kind, tuple):
        return " or ".join(names.get(k, k.__name__) for k in kind)
    return names.get(kind, kind.__name__)


def _non_negative(what: str, key: str, value: int) -> int:
    if value < 0:
        raise FormatError(what, f"field {key!r} must be >= 0, got {value}")
    return value


# --- inventory (Node) -------------------------------------------------------------


def encode_inventory(cards: tuple[Card, ...] | list[Card]) -> str:
    """The ``tessera.io/inventory`` value for a node with ``cards``."""
    return _dumps(
        {
            "v": VERSION,
            "cards": [
                {
                    "uuid": c.uuid,
                    "index": c.index,
                    "model": c.model,
                    "memoryMiB": c.memory_mib,
                    "smCount": c.sm_count,
                    "numa": c.numa_node,
                    "nvlink": list(c.nvlink_peers),
                    "healthy": c.healthy,
                    "slots": c.slots,
                }
                for c in sorted(cards, key=lambda c: c.index)
            ],
        }
    )


def decode_inventory(node: str, text: str, cpu_milli: int, memory_mib: int) -> NodeInventory:
    """Parse a node's ``tessera.io/inventory``; CPU and memory come from its allocatable."""
    what = f"node {node}: annotation {INVENTORY}"
    obj = _loads(what, text)
    raw_cards = _field(what, obj, "cards", list)
    cards: list[Card] = []
    seen_uuid: set[str] = set()
    seen_index: set[int] = set()
    for i, raw in enumerate(raw_cards):
        where = f"{what}: cards[{i}]"
        if not isinstance(raw, dict):
            raise FormatError(where, "must be a JSON object")
        uuid = _field(where, raw, "uuid", str)
        if not uuid:
            raise FormatError(where, "field 'uuid' must not be empty")
        index = _non_negative(where, "index", _field(where, raw, "index", int))
        if uuid in seen_uuid:
            raise FormatError(where, f"duplicate uuid {uuid!r}")
        if index in seen_index:
            raise FormatError(where, f"duplicate index {index}")
        seen_uuid.add(uuid)
        seen_index.add(index)
        nvlink = _field(where, raw, "nvlink", list)
        if not all(isinstance(p, int) and not isinstance(p, bool) for p in nvlink):
            raise FormatError(where, "field 'nvlink' must be a list of card indices")
        memory = _field(where, raw, "memoryMiB", int)
        if memory <= 0:
            raise FormatError(where, f"field 'memoryMiB' must be > 0, got {memory}")
        numa = _field(where, raw, "numa", int)
        if numa < -1:
            raise FormatError(where, f"field 'numa' must be >= -1, got {numa}")
        # Absent from inventories written before it: the node agent's default.
        slots = _field(where, raw, "slots", int) if "slots" in raw else DEFAULT_SLOTS
        if slots < 1:
            raise FormatError(where, f"field 'slots' must be >= 1, got {slots}")
        cards.append(
            Card(
                uuid=uuid,
                index=index,
                model=_field(where, raw, "model", str),
                memory_mib=memory,
                sm_count=_non_negative(where, "smCount", _field(where, raw, "smCount", int)),
                numa_node=numa,
                nvlink_peers=tuple(nvlink),
                healthy=_field(where, raw, "healthy", bool),
                slots=slots,
            )
        )
    return NodeInventory(name=node, cards=tuple(cards), cpu_milli=cpu_milli, memory_mib=memory_mib)


def parse_cordoned(text: str | None) -> frozenset[str]:
    """The card UUIDs a Node's ``tessera.io/cordoned-cards`` names. Items are trimmed and
    empty ones skipped, so a hand-written ``a, b,`` reads as two; a UUID of no card on the
    node takes nothing out."""
    if not text:
        return frozenset()
    return frozenset(item.strip() for item in text.split(",") if item.strip())


def format_cordoned(uuids: Iterable[str]) -> str:
    """The annotation's value for ``uuids``: sorted, comma-separated, no spaces."""
    return ",".join(sorted(set(uuids)))


def with_cordons(inv: NodeInventory, cordoned: frozenset[str]) -> NodeInventory:
    """``inv`` with the cards ``cordoned`` names marked (the others unmarked)."""
    if not cordoned and not any(c.cordoned for c in inv.cards):
        return inv
    cards = tuple(replace(c, cordoned=c.uuid in cordoned) for c in inv.cards)
    return replace(inv, cards=cards)


# --- assignment (Pod) -------------------------------------------------------------


def encode_assignment(assignment: Assignment) -> str:
    """The ``tessera.io/assignment`` value for a placed pod."""
    return _dumps(_assignment_obj(assignment))


def _assignment_obj(assignment: Assignment) -> dict[str, Any]:
    return {
        "v": VERSION,
        "node": assignment.node,
        "containers": [
            {
                "name": c.name,
                "init": c.init,
                "policy": str(c.policy),
                "exclusive": c.exclusive,
                "cards": [
                    {"uuid": s.uuid, "memoryMiB": s.memory_mib, "cores": s.cores_percent}
                    for s in c.slices
                ],
            }
            for c in assignment.containers
        ],
    }


def decode_assignment(pod: str, text: str) -> Assignment:
    """Parse a pod's ``tessera.io/assignment``; ``pod`` (namespace/name) is for messages."""
    what = f"pod {pod}: annotation {ASSIGNMENT}"
    return _assignment_of(what, _loads(what, text))


def _assignment_of(what: str, obj: Mapping[str, Any]) -> Assignment:
    """The strings are interned: a scheduler keeps every bound pod's assignment, and pods
    repeat their node's name, their cards' UUIDs and their containers' names."""
    node = sys.intern(_field(what, obj, "node", str))
    if not node:
        raise FormatError(what, "field 'node' must not be empty")
    containers: list[ContainerAssignment] = []
    for i, raw in enumerate(_field(what, obj, "containers", list)):
        where = f"{what}: containers[{i}]"
        if not isinstance(raw, dict):
            raise FormatError(where, "must be a JSON object")
        policy_text = _field(where, raw, "policy", str)
        try:
            policy = ComputePolicy(policy_text)
        except ValueError:
            allowed = ", ".join(p.value for p in ComputePolicy)
            raise FormatError(
                where, f"field 'policy' must be one of {allowed}, got {policy_text!r}"
            ) from None
        slices: list[CardSlice] = []
        for j, rs in enumerate(_field(where, raw, "cards", list)):
            w = f"{where}: cards[{j}]"
            if not isinstance(rs, dict):
                raise FormatError(w, "must be a JSON object")
            cores = _non_negative(w, "cores", _field(w, rs, "cores", int))
            if cores > 100:
                raise FormatError(w, f"field 'cores' must be <= 100, got {cores}")
            slices.append(
                CardSlice(
                    uuid=sys.intern(_field(w, rs, "uuid", str)),
                    memory_mib=_non_negative(w, "memoryMiB", _field(w, rs, "memoryMiB", int)),
                    cores_percent=cores,
                )
            )
        containers.append(
            ContainerAssignment(
                name=sys.intern(_field(where, raw, "name", str)),
                slices=tuple(slices),
                policy=policy,
                exclusive=_field(where, raw, "exclusive", bool),
                init=_field(where, raw, "init", bool),
            )
        )
    return Assignment(node=node, containers=tuple(containers))


@dataclass(frozen=True, slots=True)
class Preempting:
    """A pod's ``tessera.io/preempting``: pods (namespace/name) evicted on ``node`` for it."""

    node: str
    victims: frozenset[str]
    placement: Assignment | None = None  # where the pod is to go once they are gone


def encode_preempting(
    node: str, victims: Iterable[str], placement: Assignment | None = None
) -> str:
    obj: dict[str, Any] = {"node": node, "v": VERSION, "victims": sorted(victims)}
    if placement is not None:
        obj["placement"] = _assignment_obj(placement)
    return _dumps(obj)


def decode_preempting(pod: str, text: str) -> Preempting:
    """Parse a pod's ``tessera.io/preempting``; ``pod`` (namespace/name) is for messages."""
    what = f"pod {pod}: annotation {PREEMPTING}"
    obj = _loads(what, text)
    node = _field(what, obj, "node", str)
    if not node:
        raise FormatError(what, "field 'node' must not be empty")
    victims = _field(what, obj, "victims", list)
    if not victims or not all(isinstance(v, str) and "/" in v for v in victims):
        raise FormatError(what, "field 'victims' must list pods as namespace/name")
    placement = None
    if "placement" in obj:
        where = f"{what}: placement"
        raw = _field(what, obj, "placement", dict)
        if raw.get("v") != VERSION:
            raise FormatError(where, f"unknown version {raw.get('v')!r}")
        placement = _assignment_of(where, raw)
        if placement.node != node:
            raise FormatError(where, f"node {placement.node!r} is not the field 'node' {node!r}")
    return Preempting(node, frozenset(victims), placement)
