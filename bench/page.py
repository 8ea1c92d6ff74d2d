"""The GPU map page at 1,000 nodes x 8 cards: time to first render in headless Chromium.

    .venv/bin/python bench/page.py                       # 1,000 nodes, 8,000 pods
    .venv/bin/python bench/page.py --nodes 5000 --pods 40000

The page (src/tessera/view/page.html) and the JSON the scheduler would serve for the
cluster (``tessera.scheduler.web`` builds the same map) are served from a local HTTP
server; Chromium (Debian) loads the page headless and prints the DOM once the script
has drawn every tile. Each run is a fresh browser, so the anchor beside it is the same
page over a one-node map: browser start and page load, without the map. Prints p50 of
both and the difference. Needs the chromium binary. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from _machine import describe
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

from tessera.model.clusterspec import make_cards  # noqa: E402
from tessera.model.types import Assignment, CardSlice, ContainerAssignment, NodeInventory  # noqa: E402
from tessera.view.gpumap import assemble, map_json  # noqa: E402


def map_file(folder: Path, nodes: int, pods: int) -> None:
    invs = [NodeInventory(f"n{i:05d}", make_cards(f"n{i:05d}", 8, "A100"), 96000, 393216)
            for i in range(nodes)]  # fmt: skip
    held = {}
    for j in range(pods):
        inv = invs[j % nodes]
        c = inv.cards[(j // nodes) % 8]
        a = Assignment(inv.name, (ContainerAssignment("main", (CardSlice(c.uuid, 4000, 20),)),))
        held[f"ns-{j % 20}/p{j}"] = (a, "")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpus.json").write_text(json.dumps(map_json(assemble(invs, held))))
    shutil.copyfile(REPO / "src" / "tessera" / "view" / "page.html", folder / "gpus.html")


def render_s(chromium: str, url: str, profile: Path) -> float:
    t0 = time.perf_counter()
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                          f"--user-data-dir={profile}", "--virtual-time-budget=60000",
                          "--dump-dom", url], capture_output=True, text=True, timeout=300,
                         check=True).stdout  # fmt: skip
    elapsed = time.perf_counter() - t0
    assert 'data-ready="1"' in dom, "the page did not finish drawing"
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=8000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("needs chromium (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        map_file(root / "big", args.nodes, args.pods)
        map_file(root / "one", 1, 0)
        handler = functools.partial(SimpleHTTPRequestHandler, directory=str(root))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_address[1]
        runs: dict[str, list[float]] = {"one": [], "big": []}
        for i in range(args.runs):
            for name in runs:
                runs[name].append(render_s(chromium, f"http://127.0.0.1:{port}/{name}/gpus.html",
                                           root / f"profile-{name}-{i}"))  # fmt: skip
        server.shutdown()
        size = (root / "big" / "gpus.json").stat().st_size
    one, big = statistics.median(runs["one"]), statistics.median(runs["big"])
    t = Table(title=f"GPU map page, headless Chromium, {args.runs} runs ({describe()})")
    for col in ("map", "p50 s", "max s"):
        t.add_column(col, justify="right")
    t.add_row("1 node (anchor: browser start + page)", f"{one:.2f}", f"{max(runs['one']):.2f}")
    t.add_row(f"{args.nodes:,} nodes x 8 cards, {args.pods:,} pods", f"{big:.2f}",
              f"{max(runs['big']):.2f}")  # fmt: skip
    Console().print(t)
    print(f"map drawn in {big - one:.2f} s beyond the anchor; gpus.json {size:,} bytes")


if __name__ == "__main__":
    main()
