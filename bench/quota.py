"""Filter latency with GpuQuotas in force, against the same cluster without them.

    .venv/bin/python bench/quota.py                      # 5,000 nodes, 50 namespaces
    .venv/bin/python bench/quota.py --nodes 1000 --filters 200

The extender's state holds ``--nodes`` nodes of 8 cards (A100 and T4 nodes alternating)
and ``--pods`` bound pods spread over ``--namespaces`` namespaces. Each namespace has a
GpuQuota of two limits (A100 memory and cores, T4 whole cards) with room left, so
every filter computes the quota's exclusions and then places as usual. ``--filters``
new pods, in namespaces taken in turn, are filtered one after another (each released
after, so every call sees the same cluster), once with the quotas and once without,
rounds alternating. Prints p50 / p99 / max per run and the p99 ratio. Nothing is
asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _full import spread_cluster
from _machine import describe
from _stats import HoldTimer, pct
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

from tessera.kube import FakeKube  # noqa: E402
from tessera.scheduler.filter import filter_pod  # noqa: E402
from tessera.scheduler.placer import Placer  # noqa: E402
from tessera.scheduler.quota_writer import QuotaWriter  # noqa: E402
from tessera.scheduler.state import SchedulerState  # noqa: E402
from tessera.scheduler.wire import ExtenderArgs  # noqa: E402
from tests.unit._scheduler_world import pod_obj  # noqa: E402

MODELS = ("A100", "T4")


def world(nodes: int, pods: int, namespaces: int) -> tuple[list[Any], list[Any], list[Any]]:
    names = tuple(f"ns-{k}" for k in range(namespaces))
    node_objs, pod_objs = spread_cluster(nodes, pods, MODELS, names)
    limits = [
        {"name": "a100", "models": ["A100"], "memoryMiB": 10**9, "coresPercent": 10**7},
        {"name": "t4", "models": ["T4"], "cards": 1000},
    ]
    quotas = [
        {
            "apiVersion": "tessera.io/v1alpha1",
            "kind": "GpuQuota",
            "metadata": {"namespace": f"ns-{k}", "name": "gpus", "resourceVersion": "1"},
            "spec": {"limits": limits},
        }
        for k in range(namespaces)
    ]
    return node_objs, pod_objs, quotas


def timed_filters(state: SchedulerState, names: list[str], count: int, namespaces: int,
                  tag: str) -> list[float]:  # fmt: skip
    placer = Placer()
    out = []
    for i in range(count):
        ns = f"ns-{i % namespaces}"
        p = pod_obj(f"{tag}-{i}", gpu=1, memory=2000, cores=20, ns=ns)
        p["metadata"]["uid"] = f"{tag}-uid-{i}"
        s = time.perf_counter()
        filter_pod(state, placer, ExtenderArgs(pod=p, node_names=names))
        out.append(time.perf_counter() - s)
        with state.lock:
            state.release(f"{ns}/{tag}-{i}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=20_000)
    ap.add_argument("--namespaces", type=int, default=50)
    ap.add_argument("--filters", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    console = Console()
    nodes, pods, quotas = world(args.nodes, args.pods, args.namespaces)
    state = SchedulerState()
    state.replace_nodes(nodes)
    state.replace_pods(pods)
    names = [n["metadata"]["name"] for n in nodes]
    timed_filters(state, names, 20, args.namespaces, "warm")
    runs: dict[str, list[float]] = {"without quotas": [], "with quotas": []}
    for r in range(args.rounds):
        for label in list(runs) if r % 2 == 0 else list(reversed(runs)):
            with state.lock:
                state.quotas.replace(quotas if label == "with quotas" else [])
            runs[label] += timed_filters(state, names, args.filters, args.namespaces, f"r{r}")
    t = Table(title=f"filter with GpuQuotas: {args.nodes:,} nodes x 8 cards, {args.pods:,} "
                    f"bound pods, {args.namespaces} namespaces ({describe()})")  # fmt: skip
    for col in ("run", "filters", "p50 ms", "p99 ms", "max ms"):
        t.add_column(col, justify="right")
    for label, waits in runs.items():
        q = sorted(waits)
        t.add_row(label, str(len(q)), f"{statistics.median(q) * 1000:.2f}",
                  f"{pct(q, 0.99) * 1000:.2f}", f"{q[-1] * 1000:.2f}")  # fmt: skip
    console.print(t)
    ratio = pct(sorted(runs["with quotas"]), 0.99) / pct(sorted(runs["without quotas"]), 0.99)
    console.print(f"filter p99, with quotas / without: {ratio:.2f}x")
    # The leader's status round, every 5 s: what the verbs wait for while it reads the use.
    with state.lock:
        state.quotas.replace(quotas)
    writer = QuotaWriter(state, FakeKube(), lambda: True)
    lock, state.lock = state.lock, HoldTimer(state.lock)  # type: ignore[assignment]
    start = time.perf_counter()
    writer._write_statuses()
    took, longest = time.perf_counter() - start, state.lock.longest  # type: ignore[attr-defined]
    state.lock = lock
    console.print(f"a GpuQuota status round ({len(quotas)} quotas): {took * 1000:.0f} ms, the "
                  f"longest hold of the state lock {longest * 1000:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
