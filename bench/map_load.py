"""What the GPU map page (``--web``) costs the verbs on a full cluster.

    .venv/bin/python bench/map_load.py                  # 1,000 nodes x 8 cards, 40,000 pods
    .venv/bin/python bench/map_load.py --nodes 5000 --seconds 30

The real ``tessera scheduler`` app with ``--web``, behind its real HTTP server (aiohttp),
over an in-memory API (FakeKube) holding a full cluster (bench/_full.py). One client
plays kube-scheduler: it filters one small pod (500 MiB, 10 %) over every node name, on
a kept-alive connection, for ``--seconds``, in two phases of one run:

* **quiet** (the anchor): nobody looks at the map;
* **map loads**: a second client loads /gpus.json every ``--every`` seconds (0.5: a few
  operators reloading the page), or back to back with ``--every 0``.

* **map loads, built on the loop**: the same, with the map built where the other
  answers are, on the event loop -- as the server did before it moved the build to a
  thread of its own (the bench answers the ``Offload`` in place).

Also timed: one build of the map on its own (``map build``), gzip-encoded as the server
keeps it. The server builds it at most once a second (scheduler/web.py).

Prints p50 / p99 / max of each and the ratio of the loaded filter to the quiet one.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import threading
import time
from typing import Any

from _full import full_cluster
from _machine import describe
from _stats import pct
from rich.console import Console
from rich.table import Table

from tessera.kube import NODES, PODS, FakeKube
from tessera.scheduler.app import Offload, SchedulerApp
from tessera.scheduler.config import SchedulerConfig
from tessera.scheduler.heap import freeze_long_lived
from tessera.scheduler.http import serve
from tessera.scheduler.web import map_body
from tests.unit._scheduler_world import pod_obj


def filters(port: int, pod: dict[str, Any], names: list[str], seconds: float) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"Pod": pod, "NodeNames": names}).encode()
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        conn.request("POST", "/filter", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        answer = json.loads(resp.read())
        out.append(time.perf_counter() - t0)
        assert resp.status == 200 and answer["NodeNames"], answer
    conn.close()
    return out


def load_maps(port: int, every: float, stop: threading.Event, times: list[float]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    while not stop.wait(every):
        t0 = time.perf_counter()
        conn.request("GET", "/gpus.json", headers={"Accept-Encoding": "gzip"})  # a browser
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
        times.append(time.perf_counter() - t0)
    conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=20.0, help="per phase")
    ap.add_argument("--every", type=float, default=0.5, help="seconds between map loads")
    args = ap.parse_args()
    node_objs, pods = full_cluster(args.nodes)
    print(f"syncing {args.nodes:,} full nodes, {len(pods):,} pods ...", flush=True)
    kube = FakeKube(history=len(pods) + 1000)
    for n in node_objs:
        kube.create(NODES, n)
    for p in pods:
        kube.create(PODS, p, p["metadata"]["namespace"])
    app = SchedulerApp(SchedulerConfig(leader_elect=False, web=True), kube)
    app.start()
    assert app.wait_synced(600)
    freeze_long_lived()
    server = serve(app, "127.0.0.1", 0)
    names = [n["metadata"]["name"] for n in node_objs]
    small = kube.create(PODS, pod_obj("small", gpu=1, memory=500, cores=10), "default")
    runs: dict[str, list[float]] = {}
    try:
        runs["map build"] = []
        for _ in range(3):
            t0 = time.perf_counter()
            map_body(app.state, app.claims_book)
            runs["map build"].append(time.perf_counter() - t0)
        print(f"quiet for {args.seconds:.0f} s ...", flush=True)
        runs["filter, quiet (anchor)"] = filters(server.port, small, names, args.seconds)
        print(f"map loads for {args.seconds:.0f} s ...", flush=True)
        stop, loads = threading.Event(), []
        loader = threading.Thread(target=load_maps, args=(server.port, args.every, stop, loads))
        loader.start()
        runs["filter, map loads"] = filters(server.port, small, names, args.seconds)
        stop.set()
        loader.join(300)
        runs["map load (the page's request)"] = loads
        print(f"map loads, built on the loop, for {args.seconds:.0f} s ...", flush=True)
        dispatch = app.dispatch

        def on_the_loop(method: str, path: str, body: bytes, *rest: str) -> Any:
            out = dispatch(method, path, body, *rest)
            return out.work() if isinstance(out, Offload) else out

        app.dispatch = on_the_loop  # type: ignore[method-assign]
        stop, loads = threading.Event(), []
        loader = threading.Thread(target=load_maps, args=(server.port, args.every, stop, loads))
        loader.start()
        runs["filter, map loads, built on the loop"] = filters(
            server.port, small, names, args.seconds
        )
        stop.set()
        loader.join(300)
        app.dispatch = dispatch  # type: ignore[method-assign]
    finally:
        server.stop()
        app.stop()
        kube.close()
    t = Table(title=f"The GPU map page and the verbs: {args.nodes:,} full nodes x 8 cards, "
              f"{len(pods):,} pods ({describe()})")  # fmt: skip
    for col in ("what", "n", "p50 ms", "p99 ms", "max ms"):
        t.add_column(col, justify="right")
    for what, xs in runs.items():
        ms = [x * 1000 for x in xs]
        t.add_row(what, str(len(ms)), f"{statistics.median(ms):.2f}", f"{pct(ms, 0.99):.2f}",
                  f"{max(ms):.2f}")  # fmt: skip
    Console(width=120).print(t)
    quiet = runs["filter, quiet (anchor)"]
    for what in ("filter, map loads", "filter, map loads, built on the loop"):
        loaded = runs[what]
        p50 = statistics.median(loaded) / statistics.median(quiet)
        print(f"{what} / quiet: p50 {p50:.2f}x, "
              f"p99 {pct(loaded, 0.99) / pct(quiet, 0.99):.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
