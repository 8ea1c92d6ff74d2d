"""A chaos run: GPU pods in bursts while the extender, kube-scheduler and the API server
are restarted and Bindings are held, then the counts that say nothing went wrong.

    .venv/bin/python bench/chaos.py                      # 2,000 pods, 250 nodes x 8 cards
    .venv/bin/python bench/chaos.py --pods 500 --every 8

The e2e harness of the scheduler (tests/e2e/scheduler): a real control plane, kwok GPU
nodes, ``tessera scheduler`` with its webhook and least-privilege RBAC, the real
kube-scheduler. ``--pods`` pods of the e2e mix (fractional, whole-card, multi-card,
model-constrained, some that never fit) arrive in bursts of ``--burst``; every
``--every`` seconds one fault, in turn:

* the extender is SIGKILLed and started again (nothing released, in-flight binds lost);
* kube-scheduler is restarted (its queue and cache are lost);
* kube-apiserver is restarted (every watch breaks, requests in flight fail);

and a validating webhook holds the Binding of one pod in twenty (named ``slow-``) for
12 s, past kube-scheduler's 5 s httpTimeout, so binds are retried while their first
write is still in flight.

Every pod so far has a low PriorityClass. Once the bursts are in and the cluster is
full, ``--urgent`` more pods of the same mix (named ``u-``) come with a high one, so GPU
preemption runs under the same faults: victims evicted while the extender, which holds
the freed nodes in its memory, is killed, and while kube-scheduler forgets its queue.

Afterwards, from the API objects alone (the annotations say who holds which card): no
card over its memory, cores or slots; no pod lost (only low-priority pods may go, by
eviction); every pod that fits is bound; no urgent pod waits that evicting low-priority
pods would place (the placement core's own preemption rule, over every node); no pod has
two Bindings. Prints the counts. Nothing is asserted: a non-zero count is the finding.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _machine import describe
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

from tessera.cluster import ClusterState  # noqa: E402
from tessera.kube import EVENTS, PODS, ApiError, Kind  # noqa: E402
from tessera.kube.kinds import NAMESPACES  # noqa: E402
from tessera.placement.policies import make_policy  # noqa: E402
from tessera.placement.preemption import Holder, choose_preemption  # noqa: E402
from tessera.scheduler.state import pod_priority  # noqa: E402
from tessera.testenv import TestEnv, ensure_binaries  # noqa: E402
from tessera.testenv.process import free_port  # noqa: E402
from tests.e2e.scheduler.checks import book_all, fits_now, request_of  # noqa: E402
from tests.e2e.scheduler.harness import (  # noqa: E402
    Extender,
    Harness,
    gpu_nodes,
    scheduler_config,
)
from tests.e2e.scheduler.test_scheduler_slow_bind import (  # noqa: E402
    WEBHOOKS,
    SlowBinding,
    slow_binding_config,
)
from tests.e2e.scheduler.workload import mixed_pods  # noqa: E402

NS = "chaos"
PRIORITY_CLASSES = Kind("scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", False)
LOW, HIGH = ("chaos-low", 10), ("chaos-high", 1000)


def could_place(state: ClusterState, live: list[dict[str, Any]], pod: dict[str, Any]) -> bool:
    """Whether a pending ``pod`` fits now, or, if urgent, would once lower-priority pods
    were evicted: the rule the extender's preemptor follows, weighed over every node
    rather than its first 100."""
    if fits_now(state, pod):
        return True
    if pod_priority(pod) != HIGH[1]:
        return False
    priority = {f"{NS}/{p['metadata']['name']}": pod_priority(p) for p in live}
    me = pod_priority(pod)
    nodes = []
    for name in state.node_names():
        holders = []
        for key in state.pods_on(name):
            booking = state.booking(key)
            assert booking is not None
            holders.append(Holder("", priority.get(key, me), booking.pod, booking.assignment))
        if any(h.priority < me for h in holders):
            nodes.append((state.node(name), holders))
    return choose_preemption(nodes, request_of(pod), me, make_policy("binpack")) is not None


def names_of(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["name"] for p in pods}


def create_retrying(h: Harness, pod: dict[str, Any]) -> None:
    """Create like a controller: refused while Tessera's webhook or the API server is
    down, and tried again."""
    for _ in range(600):
        try:
            h.admin.create(PODS, pod, NS)
            return
        except ApiError as exc:
            if exc.status == 409 and "already exists" in exc.message:
                return  # an earlier try landed without an answer
            time.sleep(0.5)
    raise RuntimeError(f"{pod['metadata']['name']}: could not be created in 5 minutes")


def slow_binding_webhook(h: Harness) -> SlowBinding:
    pair = h.env.issue_serving_cert("chaos-slow-binding")
    hook = SlowBinding(str(pair.cert), str(pair.key))
    # Ignore, not Fail: the webhook must not stop Bindings when a restart cuts it off.
    h.apply(slow_binding_config("chaos-slow-binding", hook, h.env.ca.pem, NS, "Ignore"))
    return hook


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--burst", type=int, default=250)
    ap.add_argument("--nodes", type=int, default=250)
    ap.add_argument("--every", type=float, default=8.0, help="seconds between faults")
    ap.add_argument("--faults", type=int, default=6, help="at least this many faults")
    ap.add_argument("--urgent", type=int, default=100,
                    help="high-priority pods created once the cluster is full")  # fmt: skip
    args = ap.parse_args()
    console = Console()
    say = lambda m: console.print(m, style="dim")  # noqa: E731
    binaries = ensure_binaries(progress=lambda m: say(f"[testenv] {m}"))
    with tempfile.TemporaryDirectory(prefix="ts-chaos-") as tmp:
        work = Path(tmp)
        port, webhook_port = free_port(), free_port()
        env = TestEnv.start(
            work / "env", binaries=binaries, scheduler_config=scheduler_config(port)
        )
        h = Harness(env, work, gpu_nodes(args.nodes, 8))
        faults: list[str] = []
        stop = threading.Event()
        # A restarted component is tied to the thread that started it (PR_SET_PDEATHSIG
        # fires when that *thread* ends): the chaos thread lives until the env stops.
        release = threading.Event()
        faulting = threading.Lock()  # held while a fault is in progress
        try:
            kubeconfig = h.install_rbac()
            env.create_gpu_nodes(h.nodes)
            serving = env.issue_serving_cert("tessera-webhook")
            h.extender = Extender(work, kubeconfig, port, webhook_port, serving.cert, serving.key)
            h.extender.start()
            h.install_webhooks(webhook_port)
            h.admin.create(NAMESPACES, {"metadata": {"name": NS}})
            h.ensure_default_service_account(NS)
            hook = slow_binding_webhook(h)
            hook.server.handle_error = lambda *_: None  # type: ignore[method-assign]
            for name, value in (LOW, HIGH):
                h.admin.create(PRIORITY_CLASSES, {"metadata": {"name": name}, "value": value})
            pods = mixed_pods(args.pods, h.nodes, seed=23, prefix="p")
            for i, p in enumerate(pods):
                p["spec"]["priorityClassName"] = LOW[0]
                if i % 20 == 7:
                    p["metadata"]["name"] = "slow-" + p["metadata"]["name"]
            urgent = mixed_pods(args.urgent, h.nodes, seed=29, prefix="u")
            for p in urgent:
                p["spec"]["priorityClassName"] = HIGH[0]
            ext = h.extender

            def chaos() -> None:
                kinds = itertools.cycle(("extender", "kube-scheduler", "kube-apiserver"))
                while not stop.wait(args.every):
                    with faulting:
                        if stop.is_set():
                            break
                        fault(next(kinds))
                release.wait()

            def fault(kind: str) -> None:
                t0 = time.monotonic()
                try:
                    if kind == "extender":
                        ext.kill()
                        ext.start()
                    elif kind == "kube-scheduler":
                        env.restart_scheduler(scheduler_config(port))
                    else:
                        env.restart_apiserver()
                    faults.append(f"{kind} ({time.monotonic() - t0:.1f} s)")
                    say(f"  fault: {kind} restarted in {time.monotonic() - t0:.1f} s")
                except Exception as exc:  # report, keep going
                    faults.append(f"{kind} FAILED: {exc}")

            chaos_thread = threading.Thread(target=chaos, daemon=True)
            started = time.monotonic()
            chaos_thread.start()
            with ThreadPoolExecutor(16) as pool:
                for b in range(0, len(pods), args.burst):
                    list(pool.map(lambda p: create_retrying(h, p), pods[b : b + args.burst]))
                    done = min(b + args.burst, len(pods))
                    say(f"  burst {b // args.burst + 1}: {done} pods created")
                    time.sleep(2.0)
                if urgent:
                    list(pool.map(lambda p: create_retrying(h, p), urgent))
                    say(f"  {len(urgent)} urgent pods created")
            # Faults go on until every pod that fits (or, urgent, would fit by preemption)
            # is bound and at least --faults were injected (or 15 minutes pass). Pods are
            # read from the API server, not a watch: evicted pods leave no count behind.
            deadline = time.monotonic() + 900
            problems: list[str] = []
            while time.monotonic() < deadline:
                try:
                    live = h.admin.list(PODS, NS).items
                    _state, problems = book_all(h.admin, live)
                except ApiError:  # the API server is restarting: look again
                    time.sleep(1.0)
                    continue
                pending = [p for p in live if not p["spec"].get("nodeName")]
                waiting = [p for p in pending if could_place(_state, live, p)]
                if not waiting and len(faults) >= args.faults:
                    break
                time.sleep(3.0)
            stop.set()
            settled = time.monotonic() - started
            with faulting:  # a fault in progress finishes first
                pass
            live = h.admin.list(PODS, NS).items
            state, problems = book_all(h.admin, live)
            bound = [p for p in live if p["spec"].get("nodeName")]
            waiting = [p for p in live if not p["spec"].get("nodeName")]
            fits = [p for p in waiting if fits_now(state, p)]
            preemptable = [p for p in waiting if p not in fits and could_place(state, live, p)]
            present = names_of(live)
            gone_low = names_of(pods) - present
            gone_high = names_of(urgent) - present
            urgent_bound = sum(1 for p in bound if pod_priority(p) == HIGH[1])
            preempted = [e for e in h.admin.list(EVENTS, NS).items
                         if e.get("reason") == "TesseraPreempted"]  # fmt: skip
            twice = sorted(n for n, c in hook.seen.items() if c > 1 and n.startswith("slow-"))
            bound_names = {p["metadata"]["name"] for p in bound}
            slow_bound = sum(1 for n in bound_names if n.startswith("slow-"))
            h.admin.delete(WEBHOOKS, "chaos-slow-binding")
            hook.close()
        finally:
            stop.set()
            h.close()
            env.stop()
            release.set()

    t = Table(title=f"Chaos run: {args.pods} pods, {args.nodes} nodes x 8 cards ({describe()})")
    t.add_column("count")
    t.add_column("value", justify="right")
    rows = [
        ("pods created (low priority + urgent)", f"{len(pods)} + {len(urgent)}"),
        ("pods present at the end", len(live)),
        ("low-priority pods gone (evicted: nothing else deletes pods)", len(gone_low)),
        ("TesseraPreempted events seen (best effort: an event may be lost)", len(preempted)),
        ("urgent pods gone (should be 0)", len(gone_high)),
        ("bound (of them urgent)", f"{len(bound)} ({urgent_bound})"),
        ("pending that cannot fit (rightly waiting)", len(waiting) - len(fits)),
        ("pending that fit now (should be 0)", len(fits)),
        ("pending urgent pods that preemption would place (should be 0)", len(preemptable)),
        ("cards over memory / cores / slots, or bound without an assignment", len(problems)),
        ("card invariant violations (check_invariants)", len(state.check_invariants())),
        ("slow- pods bound", slow_bound),
        ("slow- pods whose Binding was sent again (the first lost to a restart)", len(twice)),
        ("faults injected", len(faults)),
        ("seconds until settled", f"{settled:.0f}"),
    ]
    for name, value in rows:
        t.add_row(name, str(value))
    console.print(t)
    console.print("faults: " + ", ".join(faults))
    for p in problems[:10]:
        console.print(f"problem: {p}", style="red")


if __name__ == "__main__":
    main()
