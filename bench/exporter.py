"""The node agent's exporter: time of one /metrics exposition on a full node.

    .venv/bin/python bench/exporter.py                    # 8 cards x 16 containers
    .venv/bin/python bench/exporter.py --cards 8 --per-card 16 --scrapes 200

A state folder in a temporary directory holds ``--cards`` x ``--per-card`` allocations,
each with its limits file and a usage region with two live processes. Each scrape runs
the real collector (``tessera.node.exporter``) and renders the text format; the floor
beside it only reads the same files' bytes, which every exporter must do. Prints p50 /
p99 of both and the ratio, and the exposition's size. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from _machine import describe
from _stats import pct
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from prometheus_client import generate_latest  # noqa: E402

from tessera.model.clusterspec import make_cards  # noqa: E402
from tessera.model.types import CardSlice, ContainerAssignment  # noqa: E402
from tessera.node.exporter import AgentMetrics, NodeView  # noqa: E402
from tessera.node.formats.layout import AllocRecord, Layout  # noqa: E402
from tessera.node.formats.limits import encode_limits, limits_for  # noqa: E402
from tessera.node.formats.usage import CardUsage, ProcessUsage, encode_region  # noqa: E402


def fill(layout: Layout, cards: int, per_card: int) -> list[AllocRecord]:
    recs = []
    for c in make_cards("bench-node", cards, "A100"):
        for k in range(per_card):
            aid = f"{c.index:02d}-{k:02d}"
            rec = AllocRecord(aid, (f"{c.uuid}::{k}",), f"uid-{aid}", "ns", f"pod-{aid}",
                              "main", (c.uuid,), True, "v", 0.0)  # fmt: skip
            ca = ContainerAssignment("main", (CardSlice(c.uuid, 2000, 5),))
            layout.write_alloc(rec, encode_limits(limits_for(ca)))
            procs = tuple(
                ProcessUsage(p, 100 + p, 1, (CardUsage(1 << 30, 1000, 10**6, 0, 10**9, 1 << 30),))
                for p in range(2)
            )
            layout.region_path(aid).write_bytes(encode_region(procs))
            recs.append(rec)
    return recs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cards", type=int, default=8)
    ap.add_argument("--per-card", type=int, default=16)
    ap.add_argument("--scrapes", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        layout = Layout(tmp)
        recs = fill(layout, args.cards, args.per_card)
        cards = make_cards("bench-node", args.cards, "A100")
        view = NodeView("bench-node", lambda: cards, lambda: recs, lambda u: 50.0, dict,
                        lambda: {"isolation": "hook"})  # fmt: skip
        metrics = AgentMetrics(view, layout)
        ours: list[float] = []
        floor: list[float] = []
        size = 0
        for _ in range(args.scrapes):  # alternate, so both see the same machine
            t0 = time.perf_counter()
            size = len(generate_latest(metrics.registry))
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for r in recs:
                layout.limits_path(r.alloc_id).read_bytes()
                layout.region_path(r.alloc_id).read_bytes()
            floor.append(time.perf_counter() - t0)
    table = Table(title=f"exporter scrape, {args.cards} cards x {args.per_card} containers "
                        f"({len(recs)}), {args.scrapes} scrapes - {describe()}")  # fmt: skip
    for col in ("", "p50 ms", "p99 ms", "ratio p50"):
        table.add_column(col, justify="right")
    f50, f99 = pct(floor, 0.5) * 1e3, pct(floor, 0.99) * 1e3
    o50, o99 = pct(ours, 0.5) * 1e3, pct(ours, 0.99) * 1e3
    table.add_row("read the files only (floor)", f"{f50:.2f}", f"{f99:.2f}", "1.00")
    table.add_row("tessera exporter", f"{o50:.2f}", f"{o99:.2f}", f"{o50 / f50:.2f}")
    Console().print(table)
    print(f"exposition: {size:,} bytes")


if __name__ == "__main__":
    main()
