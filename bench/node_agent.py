"""Node agent figures, against the test kubelet over the real device plugin protocol.

    .venv/bin/python bench/node_agent.py                    # defaults below
    .venv/bin/python bench/node_agent.py --pods 100 --rounds 20

Prints:

1. Allocate latency (p50/p99/max) with ``--pods`` pods pending on one node at once
   (all bound before kubelet admits any; kubelet admits them one at a time, as it does),
   each holding a different slice of one of the node's 8 cards; also the latency of
   GetPreferredAllocation and PreStartContainer, measured at the kubelet's side of the
   socket (what kubelet waits for).
2. Time from a kubelet restart (plugin folder cleared, new kubelet.sock) to the
   plugin's re-registration, over ``--rounds`` restarts.
3. Time from an injected critical XID to every slot of the card Unhealthy in the
   kubelet's ListAndWatch, and from the fault clearing (probe good again, after the
   ``--recovery`` quiet period) back to Healthy.

Nothing here is asserted: tests prove behaviour, this prints speed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _machine import describe
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tessera.model import annotations  # noqa: E402
from tessera.model.annotations import encode_assignment  # noqa: E402
from tessera.model.clusterspec import make_cards  # noqa: E402
from tessera.model.types import Assignment, CardSlice, ContainerAssignment  # noqa: E402
from tessera.node.agent import Agent, AgentConfig  # noqa: E402
from tessera.node.cards.fake import FakeDiscovery  # noqa: E402
from tessera.node.fakes import MemoryEvents, MemoryNode, MemoryPods  # noqa: E402
from tessera.node.kubelet.podresources import PodResourcesClient  # noqa: E402
from tests.integration.kubelet_double import KContainer, KPod, KubeletDouble  # noqa: E402

NODE = "bench-node"
RES = "tessera.io/gpu"


class Timed:
    """Wraps the kubelet double's stub to time each RPC at the kubelet's side."""

    def __init__(self, stub: object) -> None:
        self.stub = stub
        self.times: dict[str, list[float]] = {}

    def __getattr__(self, name: str) -> object:
        fn = getattr(self.stub, name)

        def call(*a: object, **kw: object) -> object:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.times.setdefault(name, []).append(time.perf_counter() - t0)

        return call


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=100)
    ap.add_argument("--cards", type=int, default=8)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--recovery", type=float, default=2.0, help="quiet seconds before recovery")
    ap.add_argument("--interval", type=float, default=1.0, help="health loop interval, s")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="ts-bench-", dir="/tmp"))
    cards = make_cards(NODE, args.cards, "A100")
    uuids = frozenset(c.uuid for c in cards)
    kubelet = KubeletDouble(root / "dp", root / "pr" / "kubelet.sock", RES)
    kubelet.start()
    discovery = FakeDiscovery(cards)
    pods = MemoryPods(RES, uuids)
    lib = root / "libvgpu.so"
    lib.write_bytes(b"bench")
    cfg = AgentConfig(
        node=NODE,
        resource=RES,
        plugin_dir=root / "dp",
        state_dir=root / "state",
        slots_per_card=args.slots,
        libvgpu=lib,
        recovery_s=args.recovery,
        health_interval_s=args.interval,
        cleanup_interval_s=3600,
    )
    podres = PodResourcesClient(root / "pr" / "kubelet.sock", RES)
    agent = Agent(cfg, discovery, pods, MemoryEvents(), MemoryNode(), podres)
    console = Console()
    try:
        agent.start()
        kubelet.wait_devices(args.cards * args.slots)

        # 1. Allocate with N pods pending at once.
        kpods = []
        for i in range(args.pods):
            card = cards[i % args.cards].uuid
            a = Assignment(
                NODE, (ContainerAssignment("main", (CardSlice(card, 512 + i, 1 + i % 7),)),)
            )
            uid = f"uid-{i}"
            pods.put(
                {
                    "metadata": {
                        "name": f"p{i:03d}",
                        "namespace": "bench",
                        "uid": uid,
                        "creationTimestamp": f"2026-11-21T10:00:{i % 60:02d}.{i:06d}Z",
                        "annotations": {annotations.ASSIGNMENT: encode_assignment(a)},
                    },
                    "spec": {
                        "nodeName": NODE,
                        "containers": [{"name": "main", "resources": {"limits": {RES: "1"}}}],
                    },
                }
            )
            kpods.append(KPod("bench", f"p{i:03d}", uid, [KContainer("main", 1)]))
        assert kubelet.endpoint is not None
        timed = Timed(kubelet.endpoint.stub)
        kubelet.endpoint.stub = timed  # type: ignore[assignment]
        t0 = time.perf_counter()
        for kp in kpods:
            kubelet.run(kp)
        wall = time.perf_counter() - t0

        t1 = Table(title=f"Allocate path, {args.pods} pods pending on one node ({describe()})")
        for col in ("call", "n", "p50 ms", "p99 ms", "max ms"):
            t1.add_column(col, justify="right" if col != "call" else "left")
        for name in ("GetPreferredAllocation", "Allocate", "PreStartContainer"):
            xs = timed.times.get(name, [])
            t1.add_row(
                name,
                str(len(xs)),
                f"{pct(xs, 50) * 1e3:.2f}",
                f"{pct(xs, 99) * 1e3:.2f}",
                f"{max(xs) * 1e3:.2f}",
            )
        console.print(t1)
        console.print(f"{args.pods} pods admitted and started in {wall:.2f} s")

        # 2. kubelet restart -> re-registration.
        reg = []
        for _ in range(args.rounds):
            before = len(kubelet.registrations)
            kubelet.restart()
            t_up = time.monotonic()  # new kubelet.sock is serving
            kubelet.wait(lambda b=before: len(kubelet.registrations) > b, timeout=10)
            reg.append(kubelet.registrations[-1] - t_up)
            kubelet.wait_devices(args.cards * args.slots)
        t2 = Table(title=f"kubelet restart -> plugin re-registered ({args.rounds} restarts)")
        for col in ("p50 ms", "p99 ms", "max ms"):
            t2.add_column(col, justify="right")
        t2.add_row(*(f"{v * 1e3:.0f}" for v in (pct(reg, 50), pct(reg, 99), max(reg))))
        console.print(t2)

        # 3. XID -> Unhealthy -> Healthy.
        down, up = [], []
        prefix = cards[0].uuid
        for _ in range(5):
            discovery.set_probe(prefix, False)
            t = time.monotonic()
            discovery.inject_xid(prefix, 79)
            kubelet.wait(lambda: kubelet.health_of(prefix) == {"Unhealthy"}, timeout=10)
            down.append(time.monotonic() - t)
            discovery.set_probe(prefix, True)
            t = time.monotonic()
            kubelet.wait(lambda: kubelet.health_of(prefix) == {"Healthy"}, timeout=60)
            up.append(time.monotonic() - t)
        t3 = Table(
            title=(
                f"Health: XID 79 -> Unhealthy, probe good -> Healthy "
                f"(recovery {args.recovery:g} s, loop {args.interval:g} s; 5 rounds)"
            )
        )
        for col in ("transition", "median s", "max s"):
            t3.add_column(col, justify="right" if col != "transition" else "left")
        t3.add_row("XID -> Unhealthy", f"{statistics.median(down):.3f}", f"{max(down):.3f}")
        t3.add_row("fault clears -> Healthy", f"{statistics.median(up):.3f}", f"{max(up):.3f}")
        console.print(t3)
    finally:
        agent.stop()
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
