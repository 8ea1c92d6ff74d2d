"""Cluster specs: the node format the simulator, the dev cluster and the fake node agent share.

The format is the Alibaba 2023 trace's node list (``openb_node_list_gpu_node.csv``):

    sn,cpu_milli,memory_mib,gpu,model

with two optional columns Tessera adds: ``gpu_memory_mib`` (overrides the model's memory)
and ``nvlink`` (``none`` | ``pairs`` | ``all`` | ``cube-mesh``). Cards get deterministic
UUIDs derived from the node name and index, so the same file always yields the same cards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tessera.errors import SpecError
from tessera.model.csvrows import int_column, rows, text_column
from tessera.model.types import Card, NodeInventory

__all__ = [
    "MODELS",
    "ModelSpec",
    "card_uuid",
    "make_cards",
    "parse_nodes_csv",
    "read_nodes_csv",
    "synthetic_nodes",
]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    memory_mib: int
    sm_count: int


# Public figures for the disclosed models. The trace hides G1/G2/G3; the values below
# are assumptions (docs/simulator.md) and do not change any milli-GPU figure.
MODELS: dict[str, ModelSpec] = {
    "P100": ModelSpec(16384, 56),
    "T4": ModelSpec(15360, 40),
    "V100M16": ModelSpec(16384, 80),
    "V100M32": ModelSpec(32768, 80),
    "A10": ModelSpec(24576, 72),
    "A100": ModelSpec(40960, 108),
    "A100-80G": ModelSpec(81920, 108),
    "H100": ModelSpec(81920, 132),
    "H200": ModelSpec(143360, 132),
    "G1": ModelSpec(24576, 72),
    "G2": ModelSpec(32768, 80),
    "G3": ModelSpec(81920, 108),
}

NVLINK_LAYOUTS = ("none", "pairs", "all", "cube-mesh")
_UUID_NAMESPACE = uuid.UUID("6f1f3c1e-7a52-4d0e-9a35-2b0c1c7e5a11")


def card_uuid(node: str, index: int) -> str:
    """A stable, GPU-style UUID for card ``index`` of ``node``."""
    return "GPU-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{node}/{index}"))


def _nvlink_peers(layout: str, index: int, count: int) -> tuple[int, ...]:
    if layout == "none" or count < 2:
        return ()
    if layout == "all":
        return tuple(i for i in range(count) if i != index)
    if layout == "pairs":
        mate = index ^ 1
        return (mate,) if mate < count else ()
    # cube-mesh (DGX-1 style): two fully linked quads, card i also linked to i+4.
    quad = index // 4
    peers = {i for i in range(quad * 4, min(quad * 4 + 4, count)) if i != index}
    cross = index + 4 if index < 4 else index - 4
    if cross < count:
        peers.add(cross)
    return tuple(sorted(peers))


def _default_layout(model: str, count: int) -> str:
    return "cube-mesh" if model.startswith("V100") and count == 8 else "none"


def make_cards(
    node: str,
    count: int,
    model: str,
    memory_mib: int | None = None,
    nvlink: str | None = None,
) -> tuple[Card, ...]:
    """``count`` identical cards for ``node``; NUMA: first half on node 0, rest on 1."""
    if count == 0:
        return ()
    spec = MODELS.get(model)
    if memory_mib is None:
        if spec is None:
            known = ", ".join(sorted(MODELS))
            raise SpecError(
                "model", f"unknown GPU model; give gpu_memory_mib or use one of {known}", model
            )
        memory_mib = spec.memory_mib
    layout = nvlink or _default_layout(model, count)
    if layout not in NVLINK_LAYOUTS:
        raise SpecError("nvlink", f"must be one of {', '.join(NVLINK_LAYOUTS)}", layout)
    return tuple(
        Card(
            uuid=card_uuid(node, i),
            index=i,
            model=model,
            memory_mib=memory_mib,
            sm_count=spec.sm_count if spec else 0,
            numa_node=(0 if count < 4 or i < count // 2 else 1),
            nvlink_peers=_nvlink_peers(layout, i, count),
        )
        for i in range(count)
    )


REQUIRED_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")


def parse_nodes_csv(lines: Iterable[str], source: str = "nodes") -> list[NodeInventory]:
    """Parse node-list CSV text; errors name the source, line and column."""
    nodes: list[NodeInventory] = []
    seen: set[str] = set()
    for where, row in rows(lines, source, REQUIRED_COLUMNS):
        name = text_column(row, "sn", where)
        if name in seen:
            raise SpecError(f"{where}: column sn", "duplicate node name", name)
        seen.add(name)
        count = int_column(row, "gpu", where, 0)
        model = (row.get("model") or "").strip()
        override = (row.get("gpu_memory_mib") or "").strip()
        memory = int_column(row, "gpu_memory_mib", where, 1) if override else None
        try:  # make_cards names its own field: say where the row is
            cards = make_cards(
                name, count, model, memory, nvlink=(row.get("nvlink") or "").strip() or None
            )
        except SpecError as exc:
            raise SpecError(f"{where}: column {exc.field}", exc.rule, exc.value) from None
        nodes.append(
            NodeInventory(
                name=name,
                cards=cards,
                cpu_milli=int_column(row, "cpu_milli", where, 0),
                memory_mib=int_column(row, "memory_mib", where, 0),
            )
        )
    return nodes


def read_nodes_csv(path: str | Path) -> list[NodeInventory]:
    """Read a node-list CSV file (see the module docstring)."""
    p = Path(path)
    with p.open(newline="") as f:
        return parse_nodes_csv(f, source=p.name)


def synthetic_nodes(
    count: int,
    cards_per_node: int,
    model: str,
    cpu_milli: int = 96000,
    memory_mib: int = 393216,
    prefix: str = "node",
) -> list[NodeInventory]:
    """``count`` identical nodes named ``{prefix}-0000``, ``{prefix}-0001``, ..."""
    if count < 0:
        raise SpecError("nodes", "must be >= 0", count)
    if cards_per_node < 0:
        raise SpecError("cards-per-node", "must be >= 0", cards_per_node)
    width = max(4, len(str(max(count - 1, 0))))
    return [
        NodeInventory(
            name=f"{prefix}-{i:0{width}d}",
            cards=make_cards(f"{prefix}-{i:0{width}d}", cards_per_node, model),
            cpu_milli=cpu_milli,
            memory_mib=memory_mib,
        )
        for i in range(count)
    ]
