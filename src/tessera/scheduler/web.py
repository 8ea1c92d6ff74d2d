"""The GPU map page (``--web``, off by default): /gpus and the data behind it, /gpus.json.

The map is the extender's own view -- the inventories it holds, the assignments its pods'
annotations say, its refused inventories, the GPU pods still waiting -- copied under the
state lock (references only) and drawn by the same ``tessera.view.gpumap`` as ``kubectl
tessera top``, outside the lock, so a page load never holds up a filter for long. The
claims path (this driver's ResourceSlices and the claims allocated on them) comes from
the claims book (``claims_book``), as ``kubectl tessera top`` draws it.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from tessera.model.types import Assignment
from tessera.scheduler.claims_book import ClaimsBook
from tessera.scheduler.state import SchedulerState
from tessera.view.gpumap import GpuMap, Pending, assemble, map_json, summary

__all__ = ["gpu_map", "map_body", "page"]


def gpu_map(state: SchedulerState, claims: ClaimsBook | None = None) -> GpuMap:
    with state.lock:
        inventories = [state.cluster.node(n) for n in state.cluster.node_names()]
        bad = dict(state.bad_nodes)
        pods = list(state.pods.values())
        observed = {k: h.assignment for k, h in state.observed.items()}
    held: dict[str, tuple[Assignment, str]] = {}
    pending = []
    for p in pods:
        if p.node_name and p.key in observed:
            held[p.key] = (observed[p.key], "")
        elif not p.node_name and p.request is not None:
            ns, _, name = p.key.partition("/")
            pending.append(Pending(ns, name, summary(p.request)))
    return assemble(
        inventories,
        held,
        node_problems=bad,
        pending=pending,
        slices=claims.slices() if claims else (),
        claims=claims.claims() if claims else (),
    )


def map_body(state: SchedulerState, claims: ClaimsBook | None = None) -> bytes:
    return json.dumps(map_json(gpu_map(state, claims)), separators=(",", ":")).encode()


@cache
def page() -> bytes:
    return resources.files("tessera.view").joinpath("page.html").read_bytes()
