"""The real node's figures: a real kubelet and containerd, the real kube-scheduler with
Tessera's extender, ``tessera node-agent`` (fake cards) and libvgpu in the containers.

    .venv/bin/python bench/realnode.py                  # 100 pods of each kind
    .venv/bin/python bench/realnode.py --pods 20 --bypasses 5

Prints:

1. Pod creation -> Running on the real node, GPU pods (a 1000 MiB / 10 % slice, placed
   by the extender, cards handed over by the agent's Allocate) against the same pods
   without the Tessera resources (the same kube-scheduler, which calls no extender for
   them; the same image, volume and command),
   alternating one pod at a time so both see the same machine; p50/p99/max and the
   ratio of the medians.
2. Allocate as the real kubelet sees it: kubelet's own histogram
   ``kubelet_device_plugin_alloc_duration_seconds`` for ``tessera.io/gpu``, read through
   the API server's node proxy (p50/p99 estimated from its buckets, mean exact).
3. Backstop: a tenant corrupts its usage region and allocates past its cap; the time from
   the allocation that passed the cap (the tenant prints the clock) to the agent's kill
   (the agent's log, millisecond stamps), over ``--bypasses`` pods.

Nothing here is asserted: tests prove behaviour, this prints speed.
"""

from __future__ import annotations

import argparse
import re
import ssl
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

from _machine import describe
from _stats import pct
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

from tessera.kube import PODS, Reflector, WatchEvent  # noqa: E402
from tessera.testenv import TestEnv, ensure_binaries  # noqa: E402
from tessera.testenv.process import free_port  # noqa: E402
from tests.e2e.realnode import NS, RealWorld, gpu_pod, scheduler_config  # noqa: E402

RESOURCE = "tessera.io/gpu"


class RunningTimes:
    """When each pod of the namespace was first seen Running (a watch, not polling)."""

    def __init__(self, world: RealWorld) -> None:
        self.at: dict[str, float] = {}
        self.cond = threading.Condition()
        self.reflector = Reflector(world.api, PODS, self, namespace=NS, watch_timeout_s=60)
        self.reflector.start()
        self.reflector.synced.wait(30)

    def replace(self, items: list[Any]) -> None:
        for o in items:
            self._see(o)

    def apply(self, event: WatchEvent) -> None:
        self._see(event.object)

    def _see(self, obj: Any) -> None:
        if (obj.get("status") or {}).get("phase") == "Running":
            with self.cond:
                self.at.setdefault(obj["metadata"]["name"], time.monotonic())
                self.cond.notify_all()

    def wait(self, name: str, timeout: float = 120) -> float:
        with self.cond:
            self.cond.wait_for(lambda: name in self.at, timeout)
            return self.at[name]


def plain_pod(name: str, devices: Path) -> dict[str, Any]:
    """The GPU pod without its Tessera resources: the same image, volume and command, so
    the difference is the extender and the device plugin, nothing else."""
    pod = gpu_pod(name, 1000, 10, "exec sleep 3600", devices)
    pod["spec"]["containers"][0].pop("resources")
    return pod


def startup(world: RealWorld, pods: int, console: Console) -> dict[str, list[float]]:
    watch = RunningTimes(world)
    out: dict[str, list[float]] = {"gpu": [], "plain": []}
    try:
        for i in range(pods):
            for kind in ("gpu", "plain"):
                name = f"{kind}-{i}"
                pod = (
                    gpu_pod(name, 1000, 10, "exec sleep 3600", world.devices)
                    if kind == "gpu"
                    else plain_pod(name, world.devices)
                )
                pod["spec"]["terminationGracePeriodSeconds"] = 0
                t0 = time.monotonic()
                world.create(pod)
                out[kind].append(watch.wait(name) - t0)
                world.delete(name)
            if (i + 1) % 10 == 0:
                console.print(f"  {i + 1}/{pods} pods of each kind Running", style="dim")
    finally:
        watch.reflector.stop()
    return out


def kubelet_allocate(world: RealWorld) -> tuple[int, float, float, float]:
    """(count, mean, p50, p99) of kubelet's Allocate histogram for the resource."""
    # Straight to the kubelet on 127.0.0.1 as the API server's kubelet client would (the
    # API server's node proxy refuses loopback addresses).
    pki = world.env.pki
    ctx = ssl.create_default_context(cafile=str(world.env.ca.cert_path))
    ctx.load_cert_chain(
        str(pki / "apiserver-kubelet-client.crt"), str(pki / "apiserver-kubelet-client.key")
    )
    url = f"https://127.0.0.1:{world.node.ports['kubelet']}/metrics"
    with urllib.request.urlopen(url, context=ctx, timeout=10) as resp:
        text = resp.read().decode()
    name = "kubelet_device_plugin_alloc_duration_seconds"
    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for line in str(text).splitlines():
        if not line.startswith(name) or f'resource_name="{RESOURCE}"' not in line:
            continue
        value = float(line.rsplit(" ", 1)[1])
        if "_bucket" in line:
            le = re.search(r'le="([^"]+)"', line)
            buckets.append((float(le.group(1)) if le else float("inf"), value))
        elif line.startswith(name + "_sum"):
            total = value
        elif line.startswith(name + "_count"):
            count = value

    def quantile(q: float) -> float:
        for le, c in sorted(buckets):
            if c >= q * count:
                return le
        return float("inf")

    return int(count), total / count if count else 0.0, quantile(0.5), quantile(0.99)


def backstop(world: RealWorld, rounds: int, console: Console) -> list[float]:
    delays = []
    cap = 256
    for i in range(rounds):
        name = f"bypass-{i}"
        script = f"exec tool_bypass /var/run/tessera/usage/region {cap} 6"
        world.create(gpu_pod(name, cap, 10, script, world.devices))
        world.wait_phase(name, ("Failed", "Succeeded"), timeout=60)
        out = world.logs(name).splitlines()
        started = float(next(line.split()[1] for line in out if line.startswith("passed-cap ")))
        pid = next(line.split()[1] for line in out if line.startswith("bypassed "))
        kill = [
            line
            for line in world.agent.log().splitlines()
            if "backstop" in line and "killed pid" in line and name in line
        ]
        when = datetime.strptime(kill[-1][:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        delays.append(when - started)
        world.delete(name)
        console.print(
            f"  bypass {i + 1}/{rounds}: {delays[-1] * 1000:.0f} ms (pid {pid})", style="dim"
        )
    return delays


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pods", type=int, default=100, help="pods of each kind (default 100)")
    ap.add_argument("--bypasses", type=int, default=10, help="backstop rounds (default 10)")
    args = ap.parse_args()
    console = Console()
    binaries = ensure_binaries(progress=lambda m: console.print(f"[testenv] {m}", style="dim"))
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ts-bench-real-", dir="/tmp") as tmp:
        env = TestEnv.start(
            Path(tmp) / "cp",
            binaries=binaries,
            scheduler_config=scheduler_config(port),
            controller_manager=False,
        )
        world = None
        try:
            world = RealWorld(env, Path(tmp) / "w")
            world.start(port)
            console.print(f"real node up; {args.pods} pods of each kind, one at a time")
            times = startup(world, args.pods, console)
            alloc = kubelet_allocate(world)
            delays = backstop(world, args.bypasses, console)
        finally:
            if world is not None:
                world.stop()
            env.stop()

    t = Table(title=f"Pod creation -> Running on a real node ({describe()})")
    for col in ("pods", "count", "p50 ms", "p99 ms", "max ms"):
        t.add_column(col, justify="right")
    for kind, label in (
        ("plain", "no GPU (no extender call)"),
        ("gpu", "GPU slice (extender + Allocate)"),
    ):
        v = times[kind]
        t.add_row(label, str(len(v)), f"{statistics.median(v) * 1000:.0f}",
                  f"{pct(v, 0.99) * 1000:.0f}", f"{max(v) * 1000:.0f}")  # fmt: skip
    ratio = statistics.median(times["gpu"]) / statistics.median(times["plain"])
    t.add_row("ratio GPU / no GPU (p50)", "", f"{ratio:.2f}", "", "")
    console.print(t)
    count, mean, p50, p99 = alloc
    a = Table(title="Allocate as kubelet sees it (kubelet_device_plugin_alloc_duration_seconds)")
    for col in ("calls", "mean ms", "p50 <= ms", "p99 <= ms"):
        a.add_column(col, justify="right")
    a.add_row(str(count), f"{mean * 1000:.2f}", f"{p50 * 1000:.1f}", f"{p99 * 1000:.1f}")
    console.print(a)
    b = Table(title="Backstop: tenant past its cap -> killed (agent polls every 1 s)")
    for col in ("rounds", "p50 ms", "max ms"):
        b.add_column(col, justify="right")
    b.add_row(
        str(len(delays)), f"{statistics.median(delays) * 1000:.0f}", f"{max(delays) * 1000:.0f}"
    )
    console.print(b)


if __name__ == "__main__":
    main()
