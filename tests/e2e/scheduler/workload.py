"""The pod mix of the e2e tests: fractional, whole-card, multi-card, model- and
UUID-constrained requests, and some that can never fit -- seeded, so a run repeats."""

from __future__ import annotations

import random
from typing import Any

from tessera.model.annotations import GPU_MODEL, GPU_MODEL_EXCLUDE, GPU_UUID
from tessera.model.types import NodeInventory


def _pod(
    name: str, limits: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        # No schedulerName: the webhook routes GPU pods to Tessera.
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
        },
    }


def mixed_pods(
    count: int, nodes: list[NodeInventory], seed: int = 7, prefix: str = "p"
) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    uuids = [c.uuid for n in nodes for c in n.cards]
    out = []
    for i in range(count):
        name = f"{prefix}-{i:04d}"
        r = rng.random()
        if r < 0.35:  # fractional, MiB
            limits = {
                "tessera.io/gpu-memory": str(rng.choice([2000, 4000, 8000, 12000, 20000])),
                "tessera.io/gpu-cores": str(rng.choice([10, 20, 30, 50])),
            }
            out.append(_pod(name, limits))
        elif r < 0.45:  # fractional, percent of the card
            limits = {"tessera.io/gpu-memory-percent": str(rng.choice([25, 50])),
                      "tessera.io/gpu-cores": str(rng.choice([25, 50]))}  # fmt: skip
            out.append(_pod(name, limits))
        elif r < 0.65:  # one whole card
            out.append(_pod(name, {"tessera.io/gpu": "1"}))
        elif r < 0.75:  # several whole cards
            out.append(_pod(name, {"tessera.io/gpu": str(rng.choice([2, 4, 8]))}))
        elif r < 0.80:  # several fractional cards
            limits = {"tessera.io/gpu": "2", "tessera.io/gpu-memory": "8000",
                      "tessera.io/gpu-cores": "25"}  # fmt: skip
            out.append(_pod(name, limits))
        elif r < 0.88:  # model constraints
            ann = rng.choice(
                [{GPU_MODEL: "A100,H100"}, {GPU_MODEL_EXCLUDE: "T4"}, {GPU_MODEL: "T4"}]
            )
            out.append(_pod(name, {"tessera.io/gpu": "1", "tessera.io/gpu-memory": "6000",
                                   "tessera.io/gpu-cores": "20"}, ann))  # fmt: skip
        elif r < 0.95:  # a named card (may be taken already: then it waits)
            out.append(_pod(name, {"tessera.io/gpu": "1"}, {GPU_UUID: rng.choice(uuids)}))
        elif r < 0.975:  # never fits: more cards than any node has
            out.append(_pod(name, {"tessera.io/gpu": "16"}))
        else:  # never fits: more memory than any card has
            out.append(
                _pod(name, {"tessera.io/gpu-memory": "200000", "tessera.io/gpu-cores": "10"})
            )
    return out
