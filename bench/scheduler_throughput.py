"""Pods per second through the real kube-scheduler, with the Tessera extender and without.

    .venv/bin/python bench/scheduler_throughput.py                 # 1000 pods, 500 nodes
    .venv/bin/python bench/scheduler_throughput.py --pods 2000 --nodes 1000

One test control plane (testenv: etcd, kube-apiserver, kube-scheduler, kwok) with
``--nodes`` kwok nodes of 8 cards. Two runs of ``--pods`` pods asking for one whole card
(``tessera.io/gpu: 1``):

* **stock**: kube-scheduler without extender; it places the pods by the extended
  resource ``tessera.io/gpu`` the nodes advertise (NodeResourcesFit) -- the anchor;
* **tessera**: kube-scheduler configured by deploy/kube-scheduler-config.yaml, calling
  the ``tessera scheduler`` process (its own process, as deployed) for filter and bind;
  the pods get card assignments.

All pods of a run are created first, while the scheduler runs a profile no pod names
(so creation speed does not count); then kube-scheduler restarts with the run's profile,
and the rate is (pods - 1) / (last bind - first bind), bind times taken from a watch.
Prints both rates and their ratio. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from tessera.kube import PODS, Conflict, Kind, Obj, Reflector, WatchEvent  # noqa: E402
from tessera.kube.client import KubeClient  # noqa: E402
from tessera.model.clusterspec import synthetic_nodes  # noqa: E402
from tessera.testenv import TestEnv, ensure_binaries  # noqa: E402
from tessera.testenv.process import free_port  # noqa: E402

PARKED = {"profiles": [{"schedulerName": "parked"}]}


class BindTimes:
    """When each pod of the namespace got its node (watch event arrival time)."""

    def __init__(self, api: KubeClient, namespace: str) -> None:
        self.times: dict[str, float] = {}
        self.lock = threading.Lock()
        self.r = Reflector(api, PODS, self, namespace=namespace, watch_timeout_s=120)
        self.r.start()
        assert self.r.synced.wait(30)

    def replace(self, items: list[Obj]) -> None:
        for o in items:
            self._see(o)

    def apply(self, event: WatchEvent) -> None:
        if event.type != "DELETED":
            self._see(event.object)

    def _see(self, o: Obj) -> None:
        if (o.get("spec") or {}).get("nodeName"):
            with self.lock:
                self.times.setdefault(o["metadata"]["name"], time.monotonic())


def pod(name: str, scheduler: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "busybox",
                            "resources": {"limits": {"tessera.io/gpu": "1"}}}],
        },
    }  # fmt: skip


def run(env: TestEnv, api: KubeClient, ns: str, pods: int, config: dict[str, Any]) -> float:
    api.create(Kind("v1", "Namespace", "namespaces", False), {"metadata": {"name": ns}})
    sa = Kind("v1", "ServiceAccount", "serviceaccounts", True)
    with contextlib.suppress(Conflict):
        api.create(sa, {"metadata": {"name": "default"}}, ns)
    env.restart_scheduler(PARKED)
    scheduler = config["profiles"][0]["schedulerName"]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: api.create(PODS, pod(f"p-{i:05d}", scheduler), ns), range(pods)))
    watch = BindTimes(api, ns)
    env.restart_scheduler(config)
    deadline = time.monotonic() + 600
    while len(watch.times) < pods and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.r.stop()
    times = sorted(watch.times.values())
    if len(times) < pods:
        raise SystemExit(f"{ns}: only {len(times)} of {pods} pods bound in 600 s")
    return (len(times) - 1) / (times[-1] - times[0])


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument(
        "--qps", type=float, default=0,
        help="kube-scheduler clientConnection.qps for both runs (0: its default, 50)",
    )  # fmt: skip
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tessera-bench-"))
    port = free_port()
    env = TestEnv.start(work / "env", binaries=ensure_binaries(["etcd", "kubernetes", "kwok"]),
                        scheduler_config=PARKED)  # fmt: skip
    ext: subprocess.Popen[bytes] | None = None
    try:
        env.create_gpu_nodes(synthetic_nodes(args.nodes, 8, "A100", prefix="gpu"))
        api = KubeClient.from_kubeconfig(str(env.kubeconfig))
        stock: dict[str, Any] = {
            "profiles": [{"schedulerName": "stock"}],
            "percentageOfNodesToScore": 100,
        }
        client = {"qps": args.qps, "burst": int(args.qps * 2)} if args.qps else {}
        stock["clientConnection"] = dict(client)
        stock_rate = run(env, api, "stock", args.pods, stock)

        log = (work / "extender.log").open("wb")
        ext = subprocess.Popen(
            [sys.executable, "-m", "tessera.cli", "scheduler", f"--kubeconfig={env.kubeconfig}",
             "--host=127.0.0.1", f"--port={port}", "--webhook-port=0", "--no-leader-elect",
             "--log-level=WARNING"],
            stdout=log, stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
        )  # fmt: skip

        for _ in range(300):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/readyz")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        tessera = yaml.safe_load((REPO / "deploy" / "kube-scheduler-config.yaml").read_text())
        tessera.pop("leaderElection", None)
        tessera["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{port}"
        tessera["clientConnection"] = dict(client)
        tessera_rate = run(env, api, "tessera", args.pods, tessera)
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/metrics")
        verbs = _verb_means(c.getresponse().read().decode())
    finally:
        if ext is not None:
            ext.terminate()
            ext.wait(15)
        env.stop()
    qps = f"qps {args.qps:g}" if args.qps else "default qps"
    table = Table(title=f"kube-scheduler throughput, {args.pods} whole-card pods on {args.nodes} "
                  f"kwok nodes, {qps} ({os.cpu_count()} CPUs, {platform.machine()})")  # fmt: skip
    table.add_column("run")
    table.add_column("pods/s", justify="right")
    table.add_row("stock kube-scheduler (extended resource)", f"{stock_rate:.1f}")
    table.add_row("with the Tessera extender (filter + bind)", f"{tessera_rate:.1f}")
    table.add_row("ratio", f"{tessera_rate / stock_rate:.0%}")
    for verb, (count, mean) in sorted(verbs.items()):
        table.add_row(f"  extender {verb}: {count} calls, mean in handler", f"{mean * 1000:.1f} ms")
    Console().print(table)


def _verb_means(text: str) -> dict[str, tuple[int, float]]:
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for line in text.splitlines():
        for kind, store in (("_sum", sums), ("_count", counts)):
            prefix = "tessera_scheduler_verb_seconds" + kind + '{verb="'
            if line.startswith(prefix):
                verb = line[len(prefix) :].split('"', 1)[0]
                store[verb] = type(store.get(verb, 0))(float(line.rsplit(" ", 1)[1]))  # type: ignore[operator]
    return {v: (counts[v], sums[v] / max(counts[v], 1)) for v in counts}


if __name__ == "__main__":
    main()
