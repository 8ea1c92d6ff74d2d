"""Extender latency per verb, HTTP included, at 1,000 and 5,000 nodes.

    .venv/bin/python bench/extender.py                      # 1000 and 5000 nodes
    .venv/bin/python bench/extender.py --nodes 5000 --pods 400

The real ``tessera scheduler`` app behind its real HTTP server (aiohttp, HTTP/1.1
keep-alive, as kube-scheduler connects), over an in-memory API (FakeKube) holding
``--nodes`` nodes of 8 cards (mixed models). A client on one kept-alive connection
plays kube-scheduler: for each pod, filter with every node name (nodeCacheCapable),
prioritize (in ``--scored`` mode, where filter returns every feasible node), then bind.
The cluster fills as it goes (fractional, whole-card and multi-card pods), so later
decisions are made on a busy cluster. Bind includes two writes to the in-memory API
(its cost on a real API server is the server's round trips, measured by
bench/scheduler_throughput.py).

Once synced, the heap is frozen out of full GC passes as ``tessera scheduler`` does
(scheduler/heap.py); ``--heap plain`` leaves it as it is, ``--heap both`` runs both. The
full (generation 2) GC passes that ran during the requests are counted, with the longest.
The in-memory API lives in this process, so its objects weigh on a plain heap's passes
too; a real extender's heap holds only its state.

Prints p50 / p99 / max per verb and mode. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _stats import pct
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from tessera.kube import NODES, PODS, FakeKube  # noqa: E402
from tessera.model.annotations import INVENTORY, encode_inventory  # noqa: E402
from tessera.model.clusterspec import make_cards  # noqa: E402
from tessera.scheduler.app import SchedulerApp  # noqa: E402
from tessera.scheduler.config import SchedulerConfig  # noqa: E402
from tessera.scheduler.heap import freeze_long_lived  # noqa: E402
from tessera.scheduler.http import serve  # noqa: E402

MODELS = ("A100", "T4", "V100M32", "H100", "A10")


def node(i: int) -> dict[str, Any]:
    name = f"gpu-{i:05d}"
    cards = make_cards(name, 8, MODELS[i % len(MODELS)])
    return {
        "metadata": {"name": name, "annotations": {INVENTORY: encode_inventory(cards)}},
        "status": {"allocatable": {"cpu": "96", "memory": "384Gi"}},
    }


def pod(i: int, rng: random.Random) -> dict[str, Any]:
    r = rng.random()
    if r < 0.5:
        limits = {"tessera.io/gpu-memory": str(rng.choice([2000, 4000, 8000, 20000])),
                  "tessera.io/gpu-cores": str(rng.choice([10, 20, 50]))}  # fmt: skip
    elif r < 0.8:
        limits = {"tessera.io/gpu": "1"}
    else:
        limits = {"tessera.io/gpu": str(rng.choice([2, 4]))}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{i:05d}", "namespace": "bench"},
        "spec": {
            "schedulerName": "tessera-scheduler",
            "containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}],
        },
    }


class FullPasses:
    """The generation-2 GC passes while ``recording``: how many, and each one's ms."""

    def __init__(self) -> None:
        self.ms: list[float] = []
        self.recording = False
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if not self.recording or info["generation"] != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.ms.append((time.perf_counter() - self._start) * 1000)

    def close(self) -> None:
        gc.callbacks.remove(self._callback)


def run(
    nodes: int, pods: int, scored: bool, seed: int, frozen: bool
) -> tuple[dict[str, list[float]], list[float]]:
    kube = FakeKube(history=pods * 4 + 100)
    for i in range(nodes):
        kube.create(NODES, node(i))
    rng = random.Random(seed)
    created = [kube.create(PODS, pod(i, rng), "bench") for i in range(pods)]
    app = SchedulerApp(SchedulerConfig(leader_elect=False, narrow=not scored), kube)
    app.start()
    assert app.wait_synced(120)
    if frozen:
        freeze_long_lived()
    passes = FullPasses()
    server = serve(app, "127.0.0.1", 0)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    names = [f"gpu-{i:05d}" for i in range(nodes)]
    times: dict[str, list[float]] = {"filter": [], "prioritize": [], "bind": []}

    def call(verb: str, body: dict[str, Any]) -> Any:
        raw = json.dumps(body).encode()
        t0 = time.perf_counter()
        conn.request("POST", f"/{verb}", body=raw, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        out = json.loads(resp.read())
        times[verb].append(time.perf_counter() - t0)
        assert resp.status == 200, out
        return out

    passes.recording = True
    try:
        for p in created:
            rng.shuffle(names)  # the scheduler offers nodes in a rotating order
            args = {"Pod": p, "NodeNames": names}
            out = call("filter", args)
            feasible = out["NodeNames"]
            if not feasible:
                continue
            target = feasible[0]
            if scored and len(feasible) > 1:
                scores = call("prioritize", {"Pod": p, "NodeNames": feasible})
                target = max(scores, key=lambda s: s["Score"])["Host"]
            meta = p["metadata"]
            call("bind", {"PodName": meta["name"], "PodNamespace": "bench",
                          "PodUID": meta["uid"], "Node": target})  # fmt: skip
    finally:
        passes.recording = False
        passes.close()
        conn.close()
        server.stop()
        app.stop()
        kube.close()
        if frozen:
            gc.unfreeze()  # the next run starts from a plain heap
    return times, passes.ms


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, nargs="*", default=[1000, 5000])
    ap.add_argument("--pods", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--heap", choices=["frozen", "plain", "both"], default="frozen",
                    help="freeze the heap after sync, as tessera scheduler does")  # fmt: skip
    args = ap.parse_args()
    console = Console(width=160)  # the table is wider than a pipe's default 80
    machine = platform.processor() or platform.machine()
    table = Table(title=f"Extender latency, HTTP included ({machine}, {os.cpu_count()} CPUs, "
                  f"Python {platform.python_version()})")  # fmt: skip
    columns = ("nodes", "heap", "mode", "verb", "calls", "p50 ms", "p99 ms", "max ms", "mean ms",
               "full GC passes", "longest pass ms")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right")
    heaps = ["plain", "frozen"] if args.heap == "both" else [args.heap]
    for n in args.nodes:
        for heap in heaps:
            for scored in (False, True):
                times, passes = run(n, args.pods, scored, args.seed, heap == "frozen")
                mode = "scored" if scored else "narrow"
                gc_cells = [str(len(passes)), f"{max(passes):.1f}" if passes else "-"]
                for verb, values in times.items():
                    if not values:
                        continue
                    ms = [v * 1000 for v in values]
                    table.add_row(str(n), heap, mode, verb, str(len(ms)), f"{pct(ms, 0.5):.2f}",
                                  f"{pct(ms, 0.99):.2f}", f"{max(ms):.2f}",
                                  f"{statistics.fmean(ms):.2f}", *gc_cells)  # fmt: skip
                    gc_cells = ["", ""]
    console.print(table)


if __name__ == "__main__":
    main()
