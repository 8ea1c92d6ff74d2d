"""What GPU preemption costs the extender, beside what a filter costs on the same cluster.

    .venv/bin/python bench/preemption.py                    # 5,000 nodes x 8 cards, full
    .venv/bin/python bench/preemption.py --nodes 1000 --rounds 50

The extender's state holds ``--nodes`` nodes of 8 A100s (40 GB), every card filled with
five 8,000 MiB / 10 % slices of pods of priority 10 (40 pods a node, 200,000 at 5,000
nodes by default). A pod of priority 1000 asking for one whole card fits nowhere, so:

* **filter** (the anchor): the verb as kube-scheduler calls it, on the same cluster, its
  request refused on every node -- what a pod costs whether or not it preempts;
* **preemption decision**: what the preemptor does before evicting -- the scan of the
  offered nodes (the state lock taken per 200 nodes) for the first 100 that hold a
  lower-priority pod, and the victim choice on each (``placement.preemption``);
* **under a budget**: the decision again, with every pod Running, Ready and covered by a
  PodDisruptionBudget that allows them all -- what reading the budgets ahead adds (the
  Eviction API's rules weighed for each candidate and each set of victims);
* **with no one less important**: the same pod at priority 10 -- the common case, where
  the preemptor stops at once;
* **filter onto a held card**: the one free card of the cluster (its five slices
  released) held for a preempting pod; a small pod of lower priority is placed there
  first, refused by the hold's check (``holds.leaves_room``) and placed again without the
  held node -- the most a hold adds to a filter.

Prints p50 / p99 / max of each over ``--rounds`` and the decision's ratio to filter.
Nothing is evicted and nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _full import SLICES_PER_CARD, full_cluster
from _machine import describe
from _stats import HoldTimer, pct
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

from tessera.model.types import Assignment, CardSlice, ContainerAssignment  # noqa: E402
from tessera.scheduler.budgets import BudgetBook  # noqa: E402
from tessera.scheduler.filter import filter_pod  # noqa: E402
from tessera.scheduler.holds import Hold  # noqa: E402
from tessera.scheduler.placer import Placer  # noqa: E402
from tessera.scheduler.preemption_planner import PreemptionPlanner  # noqa: E402
from tessera.scheduler.state import SchedulerState  # noqa: E402
from tessera.scheduler.wire import ExtenderArgs  # noqa: E402
from tests.unit._scheduler_world import pod_obj  # noqa: E402


def build(nodes: int) -> SchedulerState:
    state = SchedulerState()
    node_objs, pods = full_cluster(nodes)
    for p in pods:  # as the kubelet reports them, and labelled for a budget
        p["metadata"]["labels"] = {"app": "batch"}
        p["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    state.replace_nodes(node_objs)
    state.replace_pods(pods)
    return state


def free_one_card(state: SchedulerState, node: str, request: Any) -> None:
    """Release the slices of ``node``'s first card and hold it for ``request``'s pod, as
    a preemption of them would."""
    card = state.cluster.node(node).cards[0]
    with state.lock:
        victims = [k for k in state.cluster.pods_on(node)
                   if card.uuid in state.cluster.bookings()[k].assignment.footprint()]  # fmt: skip
        for key in victims:  # as the watch delivers their deletion
            ns, _, name = key.partition("/")
            uid = state.pods[key].uid
            state.apply_pod({"metadata": {"namespace": ns, "name": name, "uid": uid}}, True)
        decision = Assignment(node, (ContainerAssignment("main", (CardSlice(
            card.uuid, card.memory_mib, 100),), exclusive=True),))  # fmt: skip
        state.holds.put(Hold(request.key, "u-urgent", 1000, node, frozenset(victims), 1e18,
                             request=request, decision=decision))  # fmt: skip


def budget_over_all(pods: int) -> BudgetBook:
    book = BudgetBook()
    book.replace([{
        "metadata": {"name": "batch", "namespace": "default", "generation": 1},
        "spec": {"selector": {"matchLabels": {"app": "batch"}}},
        "status": {"disruptionsAllowed": pods, "currentHealthy": pods, "desiredHealthy": 0,
                   "observedGeneration": 1},
    }])  # fmt: skip
    return book


def timed(fn: Any, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    print(f"building {args.nodes:,} full nodes ...", flush=True)
    state = build(args.nodes)
    names = sorted(state.cluster.node_names())
    placer = Placer()
    planner = PreemptionPlanner(state, BudgetBook())
    budgeted = PreemptionPlanner(state, budget_over_all(len(state.pods)))

    def pod(priority: int) -> dict[str, Any]:
        p = pod_obj("urgent", gpu=1)
        p["metadata"]["uid"], p["spec"]["priority"] = "u-urgent", priority
        return p

    urgent, peer = pod(1000), pod(10)
    request = state.parse(urgent)
    assert request is not None

    def filter_once() -> None:
        out = filter_pod(state, placer, ExtenderArgs(pod=urgent, node_names=names))
        assert not out.node_names

    def decide(p: dict[str, Any], planner: PreemptionPlanner = planner) -> Any:
        def once() -> Any:
            found = planner.plan(p, request, names)  # what the preemptor weighs
            if p["spec"]["priority"] > 10:
                assert found is not None, "no preemption found"
                assert len(found.victims) == SLICES_PER_CARD, [v.key for v in found.victims]
            return found

        return once

    small = pod_obj("small", gpu=1, memory=8000, cores=10)
    small["metadata"]["uid"], small["spec"]["priority"] = "u-small", 10

    def filter_small() -> Any:
        out = filter_pod(state, placer, ExtenderArgs(pod=small, node_names=names))
        assert not out.node_names  # the one free card is held
        return out

    runs = {
        "filter (the anchor)": timed(filter_once, args.rounds),
        "preemption decision, priority 1000 over 10": timed(decide(urgent), args.rounds),
        "the same, every pod under a budget": timed(decide(urgent, budgeted), args.rounds),
        "preemption, no one less important (priority 10)": timed(decide(peer), args.rounds),
    }
    # The namespace at its GpuQuota (every pod is in it): room comes from its own pods.
    limit = {"name": "a100", "models": ["A100"], "memoryMiB": 8000 * len(state.pods)}
    state.quotas.replace([{"apiVersion": "tessera.io/v1alpha1", "kind": "GpuQuota",
                           "metadata": {"namespace": "default", "name": "gpus",
                                        "resourceVersion": "1"},
                           "spec": {"limits": [limit]}}])  # fmt: skip

    def for_quota() -> None:
        found = planner.plan(urgent, request, names)
        assert found is not None and found.for_quota, "no preemption for quota room"

    lock, state.lock = state.lock, HoldTimer(state.lock)  # type: ignore[assignment]
    runs[f"the same, its namespace at its GpuQuota ({len(state.pods):,} pods in it)"] = timed(
        for_quota, args.rounds
    )
    quota_hold, state.lock = state.lock.longest, lock  # type: ignore[attr-defined]
    state.quotas.replace([])
    free_one_card(state, names[0], request)
    with_hold = timed(filter_small, args.rounds)
    state.holds.clear()
    runs["filter of a small pod, its only room free (the anchor of the next)"] = timed(
        lambda: (filter_pod(state, placer, ExtenderArgs(pod=small, node_names=names)),
                 state.release("default/small")), args.rounds)  # fmt: skip
    runs["the same, that card held for a preempting pod"] = with_hold
    t = Table(title=f"GPU preemption on {args.nodes:,} full nodes x 8 cards, "
              f"{len(state.pods):,} pods ({describe()})")  # fmt: skip
    for col in ("what", "p50 ms", "p99 ms", "max ms"):
        t.add_column(col, justify="right")
    for what, xs in runs.items():
        t.add_row(what, f"{statistics.median(xs) * 1000:.2f}", f"{pct(xs, 0.99) * 1000:.2f}",
                  f"{max(xs) * 1000:.2f}")  # fmt: skip
    Console().print(t)
    anchor = statistics.median(runs["filter (the anchor)"])
    decision = statistics.median(runs["preemption decision, priority 1000 over 10"])
    budget = statistics.median(runs["the same, every pod under a budget"])
    print(f"longest hold of the state lock in a decision for quota room: "
          f"{quota_hold * 1000:.1f} ms")  # fmt: skip
    print(f"preemption decision / filter, p50: {decision / anchor:.1f}x; "
          f"under a budget / without: {budget / decision:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
