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

Prints p50 / p99 / max per verb and mode. Nothing is asserted.
"""

from __future__ import annotations

import argparse
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

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tessera.kube import NODES, PODS, FakeKube  # noqa: E402
from tessera.model.annotations import INVENTORY, encode_inventory  # noqa: E402
from tessera.model.clusterspec import make_cards  # noqa: E402
from tessera.scheduler.app import SchedulerApp  # noqa: E402
from tessera.scheduler.config import SchedulerConfig  # noqa: E402
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


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def run(nodes: int, pods: int, scored: bool, seed: int) -> dict[str, list[float]]:
    kube = FakeKube(history=pods * 4 + 100)
    for i in range(nodes):
        kube.create(NODES, node(i))
    rng = random.Random(seed)
    created = [kube.create(PODS, pod(i, rng), "bench") for i in range(pods)]
    app = SchedulerApp(SchedulerConfig(leader_elect=False, narrow=not scored), kube)
    app.start()
    assert app.wait_synced(120)
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
        conn.close()
        server.stop()
        app.stop()
        kube.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, nargs="*", default=[1000, 5000])
    ap.add_argument("--pods", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    console = Console()
    machine = platform.processor() or platform.machine()
    table = Table(title=f"Extender latency, HTTP included ({machine}, {os.cpu_count()} CPUs, "
                  f"Python {platform.python_version()})")  # fmt: skip
    for col in ("nodes", "mode", "verb", "calls", "p50 ms", "p99 ms", "max ms", "mean ms"):
        table.add_column(col, justify="right")
    for n in args.nodes:
        for scored in (False, True):
            times = run(n, args.pods, scored, args.seed)
            mode = "scored" if scored else "narrow"
            for verb, values in times.items():
                if not values:
                    continue
                ms = [v * 1000 for v in values]
                table.add_row(str(n), mode, verb, str(len(ms)), f"{pct(ms, 0.5):.2f}",
                              f"{pct(ms, 0.99):.2f}", f"{max(ms):.2f}",
                              f"{statistics.fmean(ms):.2f}")  # fmt: skip
    console.print(table)


if __name__ == "__main__":
    main()
