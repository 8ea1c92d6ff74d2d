"""Clusters for the benches, as the API server would list them, every pod bound with its
assignment annotation: a full one (``full_cluster``) and one with pods spread thin
(``spread_cluster``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

from tessera.model.annotations import ASSIGNMENT, encode_assignment  # noqa: E402
from tessera.model.clusterspec import make_cards  # noqa: E402
from tessera.model.types import Assignment, CardSlice, ContainerAssignment  # noqa: E402
from tests.unit._scheduler_world import node_obj, pod_obj  # noqa: E402

CARD_MIB = make_cards("x", 1, "A100")[0].memory_mib
SLICES_PER_CARD = CARD_MIB // 8000  # as many 8,000 MiB slices as a card holds


def full_cluster(nodes: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``nodes`` nodes of 8 A100s (40 GB), each card holding as many 8,000 MiB / 10 %
    slices as it fits, every pod of priority 10."""
    node_objs = [node_obj(f"n{i}", 8, cpu="512") for i in range(nodes)]
    pods = []
    for i in range(nodes):
        name = f"n{i}"
        for c in make_cards(name, 8, "A100"):
            for s in range(SLICES_PER_CARD):
                a = Assignment(name, (ContainerAssignment("main", (CardSlice(c.uuid, 8000, 10),)),))
                p = pod_obj(f"{name}-{c.index}-{s}", gpu=1, memory=8000, cores=10,
                            annotations={ASSIGNMENT: encode_assignment(a)})  # fmt: skip
                meta, spec = p["metadata"], p["spec"]
                meta["uid"], meta["resourceVersion"] = f"u-{meta['name']}", "1"
                spec["nodeName"], spec["priority"] = name, 10
                pods.append(p)
    return node_objs, pods


def spread_cluster(
    nodes: int, pods: int, models: tuple[str, ...] = ("A100",), namespaces: tuple[str, ...] = ()
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``nodes`` nodes of 8 cards (of ``models`` in turn) and ``pods`` pods of 1,000 MiB /
    10 %, the n-th on node n mod ``nodes``, each node's cards filled in turn; in
    ``namespaces`` in turn (none: ``default``)."""
    node_objs = [node_obj(f"n{i}", 8, models[i % len(models)]) for i in range(nodes)]
    cards = {f"n{i}": make_cards(f"n{i}", 8, models[i % len(models)]) for i in range(nodes)}
    pod_objs = []
    for j in range(pods):
        n = f"n{j % nodes}"
        c = cards[n][(j // nodes) % 8]
        a = Assignment(n, (ContainerAssignment("main", (CardSlice(c.uuid, 1000, 10),)),))
        ns = namespaces[j % len(namespaces)] if namespaces else "default"
        p = pod_obj(f"p{j}", gpu=1, memory=1000, cores=10, ns=ns,
                    annotations={ASSIGNMENT: encode_assignment(a)})  # fmt: skip
        p["metadata"]["uid"] = f"uid-{j}"
        p["metadata"]["resourceVersion"] = str(j)
        p["spec"]["nodeName"] = n
        pod_objs.append(p)
    return node_objs, pod_objs
