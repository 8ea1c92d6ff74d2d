"""``kubectl tessera top`` or ``why`` on a large cluster: time to answer, API time aside.

    .venv/bin/python bench/view.py                       # top, 1,000 nodes x 8 cards
    .venv/bin/python bench/view.py --nodes 5000 --pods 40000
    .venv/bin/python bench/view.py --verb why --nodes 5000 --pods 200000 --runs 3

The Node and Pod lists of a cluster of ``--nodes`` nodes of 8 cards with ``--pods``
bound GPU pods (each with its assignment) are made once as the API server would send
them (JSON text). Each run decodes them and runs the real command on them: ``top`` (the
GPU map, sorting, the table, written to a buffer), or ``why`` for a pending pod asking
for 8 whole cards, which fits nowhere (the scheduler's state rebuilt, the filter, the
preemption plan). The anchor beside it only decodes the same JSON, which every client,
kubectl included, pays. Both run with the garbage collector off, as the
``kubectl-tessera`` executable runs; a row beside them runs the command with it on. For
``why``, a row runs it with the pod spec parser's memo at rest (model/podspec.py), as
every pod was parsed before it (``top`` parses only pending pods). Prints p50 / p99 and the
ratio. The API server's own time to list is not included: it depends on the cluster.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from _machine import describe
from _stats import pct
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

from typer.testing import CliRunner  # noqa: E402

from tessera.kube.kinds import NODES, PODS, Kind  # noqa: E402
from tessera.kube.port import ListResult  # noqa: E402
from tessera.model import podspec  # noqa: E402
from tessera.model.annotations import ASSIGNMENT, encode_assignment  # noqa: E402
from tessera.model.clusterspec import make_cards  # noqa: E402
from tessera.model.types import Assignment, CardSlice, ContainerAssignment  # noqa: E402
from tessera.scheduler.heap import collector_paused  # noqa: E402
from tessera.view import kubectl  # noqa: E402
from tests.unit._scheduler_world import node_obj, pod_obj  # noqa: E402


def cluster(nodes: int, pods: int) -> tuple[str, str]:
    node_objs = [node_obj(f"n{i:05d}", 8, "A100") for i in range(nodes)]
    cards = {f"n{i:05d}": make_cards(f"n{i:05d}", 8, "A100") for i in range(nodes)}
    pod_objs = []
    for j in range(pods):
        n = f"n{j % nodes:05d}"
        c = cards[n][(j // nodes) % 8]
        a = Assignment(n, (ContainerAssignment("main", (CardSlice(c.uuid, 4000, 20),)),))
        p = pod_obj(f"p{j}", gpu=1, memory=4000, cores=20, ns=f"ns-{j % 20}",
                    annotations={ASSIGNMENT: encode_assignment(a)})  # fmt: skip
        p["metadata"]["uid"] = f"uid-{j}"
        p["spec"]["nodeName"] = n
        p["status"] = {"phase": "Running"}
        pod_objs.append(p)
    return json.dumps({"items": node_objs}), json.dumps({"items": pod_objs})


PENDING = pod_obj("waiting", gpu=8, ns="ns-0")  # 8 whole cards: fits nowhere
PENDING["metadata"]["uid"] = "uid-waiting"


class ListedApi:
    """What the plugin's client returns, decoded from the lists' JSON on every call."""

    def __init__(self, nodes: str, pods: str) -> None:
        self.text = {NODES.plural: nodes, PODS.plural: pods}

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> Any:
        assert (kind, name) == (PODS, PENDING["metadata"]["name"]), (kind, name)
        return PENDING

    def list(self, kind: Kind, namespace: str | None = None, **_: Any) -> ListResult:
        """The whole list in one page, whatever ``limit`` asks (the API server's pages
        are not what this times)."""
        text = self.text.get(kind.plural, '{"items": []}')  # no claims path: none listed
        return ListResult(json.loads(text)["items"], "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=8000)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--verb", choices=["top", "why"], default="top")
    args = ap.parse_args()
    nodes, pods = cluster(args.nodes, args.pods)
    api = ListedApi(nodes, pods)
    kubectl.common.Conn.client = lambda self: api  # type: ignore[method-assign]
    command = (
        ["top", "--sort-by", "free"] if args.verb == "top" else ["why", "waiting", "-n", "ns-0"]
    )
    runner = CliRunner()
    # How each row runs: the parser's memo on or at rest, the collector off (as the
    # kubectl-tessera executable turns it off) or running (as before that).
    setups = {"floor": (True, False), "ours": (True, False), "collecting": (True, True)}
    if args.verb == "why":
        setups["no memo"] = (False, False)
    times: dict[str, list[float]] = {mode: [] for mode in setups}
    output = ""
    with Progress(transient=True) as progress:
        task = progress.add_task(f"{args.verb}: {args.runs} runs", total=args.runs)
        for _ in range(args.runs):
            for mode, (memo, collecting) in setups.items():
                podspec._MEMO = podspec._Memo()
                if not memo:
                    podspec._MEMO.resting = 1 << 62  # never wakes: every pod parsed
                with contextlib.nullcontext() if collecting else collector_paused():
                    t0 = time.perf_counter()
                    if mode == "floor":
                        json.loads(nodes), json.loads(pods)
                    else:
                        result = runner.invoke(kubectl.app, command)
                    times[mode].append(time.perf_counter() - t0)
                if mode != "floor":
                    assert result.exit_code == 0, result.output
                    output = result.output
            progress.advance(task)
    t = Table(title=f"kubectl tessera {args.verb}: {args.nodes:,} nodes x 8 cards, "
                    f"{args.pods:,} pods, {args.runs} runs ({describe()})")  # fmt: skip
    for col in ("", "p50 ms", "p99 ms", "ratio p50"):
        t.add_column(col, justify="right")
    f50 = pct(times["floor"], 0.5) * 1e3
    labels = {"floor": "decode the lists only (anchor)", "ours": f"{args.verb} (Tessera)",
              "collecting": f"{args.verb}, collector running",
              "no memo": f"{args.verb}, parser memo at rest"}  # fmt: skip
    for mode, label in labels.items():
        if mode not in times:
            continue
        p50 = pct(times[mode], 0.5) * 1e3
        t.add_row(label, f"{p50:.0f}", f"{pct(times[mode], 0.99) * 1e3:.0f}", f"{p50 / f50:.2f}")
    Console().print(t)
    shown = output if args.verb == "why" else f"{output.count(chr(10)):,} lines printed\n"
    print(f"{shown}list JSON {len(nodes) + len(pods):,} bytes")


if __name__ == "__main__":
    main()
