"""An extender that decides nothing: the floor under bench/scheduler_throughput.py.

    python bench/null_extender.py KUBECONFIG PORT

It speaks the same protocol as ``tessera scheduler`` on the same stack (aiohttp, binds
through the same ``AioBinder`` on the loop), and watches pods and nodes as Tessera
does, but filter places by counting -- the n-th pod goes to the (n // 8)-th offered
node in name order, which is where binpack puts the benchmark's one-card pods on its
8-card nodes -- and bind writes a fixed annotation. What it costs the control plane is
the cost of an extender hop itself; the gap between it and ``tessera scheduler`` is
Tessera's own work. Not for use outside the benchmark.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from tessera.kube import NODES, PODS, Obj, Reflector, WatchEvent
from tessera.kube.binder import AioBinder
from tessera.kube.client import KubeClient


class _Ignore:
    """A reflector handler that drops what it gets (the events are still decoded)."""

    def replace(self, items: list[Obj]) -> None:
        pass

    def apply(self, event: WatchEvent) -> None:
        pass


def main() -> None:
    kubeconfig, port = sys.argv[1], int(sys.argv[2])
    api = KubeClient.from_kubeconfig(kubeconfig)
    for kind in (PODS, NODES):
        Reflector(api, kind, _Ignore()).start()
    binder = AioBinder(api)
    turn = itertools.count()

    async def filter_(request: web.Request) -> web.Response:
        names = sorted(json.loads(await request.read())["NodeNames"])
        return web.json_response({"NodeNames": [names[next(turn) // 8 % len(names)]]})

    async def bind(request: web.Request) -> web.Response:
        b = json.loads(await request.read())
        await binder.bind(
            b["PodNamespace"], b["PodName"], b["PodUID"], b["Node"], {"bench/null": "1"}
        )
        return web.json_response({"Error": ""})

    async def ready(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.add_routes(
        [web.post("/filter", filter_), web.post("/bind", bind), web.get("/readyz", ready)]
    )
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


if __name__ == "__main__":
    main()
