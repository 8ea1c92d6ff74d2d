"""Node objects for kwok-managed GPU nodes, built from the core's ``NodeInventory``.

Pure: ``node_manifest`` returns the dict to POST; nothing here talks to a server.

What a GPU node advertises (capacity = allocatable), with N healthy cards:

=============================  ===============================================
``tessera.io/gpu``             N (cards)
``tessera.io/gpu-memory``      sum of the cards' memory, MiB
``tessera.io/gpu-memory-percent``  100 x N
``tessera.io/gpu-cores``       100 x N
=============================  ===============================================

These are node-level totals for kube-scheduler's coarse fit only; which card a pod gets
is the extender's decision, made from the ``tessera.io/inventory`` annotation. Nodes
without cards advertise none of these. Label ``tessera.io/gpu-model`` carries the
model when all cards share one (docs/testenv.md).
"""

from __future__ import annotations

import re
from typing import Any

from tessera.model.annotations import GPU_MODEL, INVENTORY, encode_inventory
from tessera.model.names import ResourceNames
from tessera.model.types import NodeInventory

__all__ = [
    "KWOK_ANNOTATION",
    "KWOK_SELECTOR",
    "MODEL_LABEL",
    "TESTENV_LABEL",
    "label_value",
    "node_manifest",
]

# kwok manages only nodes carrying this annotation (its --manage-nodes-with-annotation-selector).
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
KWOK_SELECTOR = f"{KWOK_ANNOTATION[0]}={KWOK_ANNOTATION[1]}"
# The node label for the card model reuses the key users put on a Pod to ask for a model.
MODEL_LABEL = GPU_MODEL
TESTENV_LABEL = ("tessera.io/testenv", "true")
PODS_PER_NODE = 110

_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9._-]")


def label_value(text: str) -> str:
    """``text`` made into a valid label value (63 chars, alphanumeric at both ends)."""
    cleaned = _LABEL_VALUE_BAD.sub("_", text)[:63]
    return cleaned.strip("._-")


def node_manifest(node: NodeInventory, names: ResourceNames | None = None) -> dict[str, Any]:
    """The Node object for ``node``: capacity, labels and the inventory annotation."""
    names = names or ResourceNames()
    healthy = [c for c in node.cards if c.healthy]
    resources: dict[str, str] = {
        "cpu": f"{node.cpu_milli}m",
        "memory": f"{node.memory_mib}Mi",
        "pods": str(PODS_PER_NODE),
    }
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        TESTENV_LABEL[0]: TESTENV_LABEL[1],
    }
    annotations = {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]}
    if node.cards:
        resources[names.gpu] = str(len(healthy))
        resources[names.memory] = str(sum(c.memory_mib for c in healthy))
        resources[names.memory_percent] = str(100 * len(healthy))
        resources[names.cores] = str(100 * len(healthy))
        annotations[INVENTORY] = encode_inventory(node.cards)
        models = {c.model for c in node.cards}
        if len(models) == 1:
            value = label_value(models.pop())
            if value:
                labels[MODEL_LABEL] = value
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels, "annotations": annotations},
        "spec": {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }
