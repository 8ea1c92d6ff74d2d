"""Filter latency while the extender re-lists 50,000 pods (or 50,000 claims).

    .venv/bin/python bench/relist.py                     # 5,000 nodes x 8 cards, 50,000 pods
    .venv/bin/python bench/relist.py --nodes 1000 --pods 10000
    .venv/bin/python bench/relist.py --what claims       # 50,000 allocated ResourceClaims
    .venv/bin/python bench/relist.py --known             # the state holds them already

The extender's state (``SchedulerState``) holds ``--nodes`` nodes of 8 cards. A
re-list (what the pod reflector does after its watch expired) delivers ``--pods`` bound
pods, each with its assignment, none of which the state has seen (with ``--known``, all
of which it holds already, unchanged, as after a watch that expired while nothing
changed); meanwhile a client thread calls ``filter`` for new pods one after another, as
kube-scheduler would, and times each call. Each re-list decodes the list's JSON, as the
reflector does, and ends as the extender's does, with what it made frozen out of later
collections (scheduler/heap.py) and the decoded objects let go. Three ways, in one run:

* **chunked** (Tessera now): the pods are decoded outside the verbs' lock and booked 500
  at a time (``SchedulerState.replace_pods``) inside ``listing()``: the collector's
  pass before the list, the collector paused during it, the freeze with no pass, and
  the decoded objects let go 500 at a time (``kube.reflector.let_go``);
* **chunked, collector running**: the same, as it was before: the collector running,
  then a pass over the whole heap and the freeze, the decoded objects freed at once;
* **whole** (the anchor, as before): decoded and booked under the lock in one go.

With ``--what claims`` the re-list is the claim reflector's instead (the claims book,
which counts claims against GpuQuotas): ``--pods`` claims allocated on the ResourceSlices
of ``--nodes`` more nodes, each claim 8,000 MiB / 10 % of one card. **chunked** counts
them outside the lock and applies 500 at a time; **whole** does it all under the lock.

Prints filter p50 / p99 / max during the re-list, and the re-list's own duration.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _full import spread_cluster
from _machine import describe
from _stats import pct
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

from tessera.claims.devices import resource_slice  # noqa: E402
from tessera.kube.reflector import let_go  # noqa: E402
from tessera.model.clusterspec import make_cards  # noqa: E402
from tessera.scheduler.claims_book import ClaimsBook  # noqa: E402
from tessera.scheduler.filter import filter_pod  # noqa: E402
from tessera.scheduler.heap import freeze_listed, freeze_long_lived, listing  # noqa: E402
from tessera.scheduler.placer import Placer  # noqa: E402
from tessera.scheduler.state import SchedulerState  # noqa: E402
from tessera.scheduler.wire import ExtenderArgs  # noqa: E402
from tests.unit._scheduler_world import pod_obj  # noqa: E402


def claims_world(nodes: int, claims: int) -> tuple[list[Any], list[Any]]:
    """``nodes`` claims-path nodes' slices, and ``claims`` claims allocated on them."""
    slices = [resource_slice(f"c{i}", make_cards(f"c{i}", 8, "A100"), 1) for i in range(nodes)]
    out = []
    consumed = {"memory": "8000Mi", "compute": "10", "slots": "1"}
    for j in range(claims):
        result = {"request": "gpu", "driver": "gpu.tessera.io", "pool": f"c{j % nodes}",
                  "device": f"gpu-{(j // nodes) % 8}", "consumedCapacity": consumed}  # fmt: skip
        out.append({"metadata": {"namespace": f"team-{j % 50}", "name": f"claim-{j}",
                                 "uid": f"cuid-{j}"},
                    "status": {"allocation": {"devices": {"results": [result]}}}})  # fmt: skip
    return slices, out


def run(
    mode: str, nodes: list[Any], listed: str, slices: list[Any] | None = None, known: bool = False
) -> tuple[list[float], float]:
    """``listed``: the list's JSON, decoded by the re-list as the reflector decodes it;
    ``slices`` given, its items are claims, re-listed into a claims book; ``known``: the
    pods are booked from the same list before."""
    state, placer = SchedulerState(), Placer()
    state.replace_nodes(nodes)
    if known:
        state.replace_pods(json.loads(listed))
    book = ClaimsBook(state)
    if slices is not None:
        book.slices_handler.replace(slices)
    # The heap as the extender's earlier lists leave it: frozen (the bench's own lists
    # of objects to re-list with it, which the extender would not hold).
    freeze_long_lived()
    names = [n["metadata"]["name"] for n in nodes]
    done = threading.Event()
    waits: list[float] = []

    def relist() -> None:
        with listing() if mode == "chunked" else contextlib.nullcontext():
            pods = json.loads(listed)
            if slices is not None:
                if mode != "whole":
                    book.claims_handler.replace(pods)
                else:
                    with state.lock:  # the lock is re-entrant: the chunks become one hold
                        book.claims_handler.replace(pods)
            elif mode != "whole":
                state.pods_handler.replace(pods)
            else:
                with state.lock:
                    state.replace_pods(pods, chunk=len(pods))
            if mode == "chunked":
                freeze_listed()  # as the extender does after a list, in the pause
        if mode != "chunked":
            freeze_long_lived()  # as it did before: a pass over the heap, then the freeze
            del pods  # as it did before: the list's objects freed at once
        else:
            let_go(pods)  # as the reflector lets them go now
        done.set()

    t0 = time.perf_counter()
    thread = threading.Thread(target=relist)
    thread.start()
    i = 0
    while not done.is_set():
        p = pod_obj(f"new-{i}", gpu=1, memory=2000, cores=20)
        p["metadata"]["uid"] = f"new-uid-{i}"
        s = time.perf_counter()
        filter_pod(state, placer, ExtenderArgs(pod=p, node_names=names))
        waits.append(time.perf_counter() - s)
        with state.lock:
            state.release(f"default/new-{i}")  # keep the cluster as the re-list leaves it
        i += 1
    thread.join()
    took = time.perf_counter() - t0
    gc.unfreeze()  # the next run starts from the same heap
    return waits, took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=50_000, help="pods, or claims, re-listed")
    ap.add_argument("--what", choices=["pods", "claims"], default="pods")
    ap.add_argument("--known", action="store_true", help="the state holds the pods already")
    args = ap.parse_args()
    console = Console()
    slices = None
    if args.what == "claims":
        nodes, _ = spread_cluster(args.nodes, 0)
        slices, pods = claims_world(args.nodes, args.pods)
    else:
        nodes, pods = spread_cluster(args.nodes, args.pods)
    listed = json.dumps(pods)
    del pods
    t = Table(
        title=f"filter during a re-list of {args.pods:,} {'known ' * args.known}{args.what}, "
        f"{args.nodes:,} nodes "
        f"({describe()})"
    )
    for col in ("re-list", "filters", "p50 ms", "p99 ms", "max ms", "re-list s"):
        t.add_column(col, justify="right")
    results = {}
    labels = {
        "whole": "whole, under the lock (anchor)",
        "collecting": "chunked, collector running",
        "chunked": "chunked (Tessera)",
    }
    for mode, label in labels.items():
        waits, took = run(mode, nodes, listed, slices, args.known)
        results[mode] = waits
        q = sorted(waits)
        t.add_row(
            label,
            str(len(q)),
            f"{statistics.median(q) * 1000:.1f}",
            f"{pct(q, 0.99) * 1000:.1f}",
            f"{q[-1] * 1000:.1f}",
            f"{took:.1f}",
        )
    console.print(t)
    for mode in ("whole", "collecting"):
        ratio = max(results[mode]) / max(results["chunked"])
        console.print(f"longest filter wait: {labels[mode]} / Tessera = {ratio:.1f}x")


if __name__ == "__main__":
    main()
