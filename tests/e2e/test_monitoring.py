"""Monitoring end to end: pods placed by the real kube-scheduler with the extender, started
through the node agent (test kubelet), their libvgpu usage regions written as a running
container's library would; a real Prometheus scrapes the agent's exporter and the
extender. Every query of every Grafana dashboard in the chart must parse and return
series, every template variable must have values, and ``kubectl tessera top
--prometheus`` must show the live use of the pod's slice. The chart's alert rules load
and evaluate, and fire on what they name: an inventory that does not decode, an unhealthy
card."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.kube.kinds import NODES, PODS
from tessera.model.annotations import INVENTORY
from tessera.node.formats.usage import CardUsage, ProcessUsage, encode_region
from tests.e2e.agent_world import NODE, NS, SLOTS, World, gpu_pod, kpod, world
from tests.e2e.plugin import rows, run
from tests.e2e.prometheus import Prometheus
from tests.e2e.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

__all__ = ["world"]  # the fixture, imported

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((REPO / "charts" / "tessera" / "dashboards").glob("*.json"))
RULES = REPO / "charts" / "tessera" / "rules" / "tessera.rules.yaml"
GIB = 1 << 30
_LABEL_VALUES = re.compile(r"^label_values\((?P<match>.+),\s*(?P<label>\w+)\)$")


class Busy(threading.Thread):
    """Rewrites a container's usage region the way libvgpu does: one live process whose
    kernel time grows at ``share`` of wall time, with memory in use."""

    def __init__(self, region: Path, share: float, memory: int) -> None:
        super().__init__(daemon=True)
        self.region, self.share, self.memory = region, share, memory
        self.stop = threading.Event()

    def run(self) -> None:
        busy = 0
        while not self.stop.wait(0.05):  # fine steps: a 1 s scrape sees 19-21 of them
            busy += int(0.05e9 * self.share)
            use = CardUsage(memory_bytes=self.memory, launches=busy // 10**6, busy_ns=busy)
            data = encode_region((ProcessUsage(0, 42, 1, (use,)),))
            tmp = self.region.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, self.region)


def _substitute(expr: str) -> str:
    return expr.replace("$node", NODE).replace("$namespace", NS).replace("$pod", "mon-a")


def _panels(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]


def test_every_dashboard_query_returns_series_and_top_shows_live_use(
    world: World, tmp_path: Path
) -> None:
    w = world
    assert len(DASHBOARDS) == 3, DASHBOARDS
    inv = wait_for("the agent to publish the inventory", w.inventory, timeout=60)
    w.kubelet.wait_devices(len(inv.cards) * SLOTS, timeout=30)
    (w.root / "faults" / "utilization").write_text(f"{inv.cards[0].uuid} 45\n")
    for name, memory, cores in (("mon-a", 6000, 30), ("mon-b", 2000, 10)):
        w.api.create(PODS, gpu_pod(name, memory=memory, cores=cores), NS)

    def bound() -> list[dict[str, Any]] | None:
        pods = [w.pod(n) for n in ("mon-a", "mon-b")]
        return pods if all(p["spec"].get("nodeName") for p in pods) else None

    pods = wait_for("both pods bound by kube-scheduler", bound, 60, 0.2)
    regions = {}
    for obj in pods:
        (started,) = w.kubelet.run(kpod(obj))
        usage = Path(started.mount("/var/run/tessera/usage").host_path)
        regions[obj["metadata"]["name"]] = usage / "region"
    busy = Busy(regions["mon-a"], 0.5, 3 * GIB)
    busy.start()
    prom = Prometheus(tmp_path, {"tessera-node-agent": f"127.0.0.1:{w.metrics_port}",
                                 "tessera-scheduler": f"127.0.0.1:{w.extender_port}"},
                      rule_files=(RULES,))  # fmt: skip
    prom.start()
    try:
        wait_for("both targets up", lambda: set(prom.targets_up().values()) == {"up"}, 30, 0.5,
                 lambda: str(prom.targets_up()))  # fmt: skip

        def has_rate() -> bool:
            r = prom.query('rate(tessera_container_busy_seconds_total{pod="mon-a"}[1m]) > 0')
            return bool(r.get("data", {}).get("result"))

        def counter() -> str:
            q = 'tessera_container_busy_seconds_total{pod="mon-a"}[30s]'
            return f"{prom.query(q)}\nbusy thread alive: {busy.is_alive()}"

        wait_for("a rate of kernel time for mon-a", has_rate, 60, 0.5, counter)

        def two_scrapes_each() -> bool:
            # rate() needs two samples of a series: the dashboards' rates over the
            # extender's counters must not be judged after its first scrape alone.
            result = prom.query("count_over_time(up[1m]) >= 2").get("data", {}).get("result")
            return len(result or []) == 2

        wait_for("two scrapes of each target", two_scrapes_each, 30, 0.5, prom.log_tail)

        empty: list[str] = []
        for path in DASHBOARDS:
            dashboard = json.loads(path.read_text())
            for var in dashboard["templating"]["list"]:
                if var["type"] != "query":
                    continue
                m = _LABEL_VALUES.match(_substitute(var["query"]["query"]))
                assert m, f"{path.name}: variable {var['name']}: not label_values(...)"
                if not prom.label_values(m["label"], m["match"]):
                    empty.append(f"{path.name}: variable {var['name']}")
            for title, expr in _panels(dashboard):
                answer = prom.query(_substitute(expr))
                assert answer.get("status") == "success", f"{path.name}: {title}: {answer}"
                if not answer["data"]["result"]:
                    empty.append(f"{path.name}: {title}: {expr}")
        assert empty == [], "queries with no series:\n" + "\n".join(empty)

        r = run(w.env.kubeconfig, "top", "-n", NS, "--prometheus", prom.url)
        by_pod = {row["POD"]: row for row in rows(r.stdout)}
        assert by_pod[f"{NS}/mon-a"]["USED"] == "3072Mi", r.stdout
        achieved = int(by_pod[f"{NS}/mon-a"]["ACHIEVED"].rstrip("%"))
        assert 40 <= achieved <= 60, r.stdout  # 50 % of wall time between two scrapes
        # Started, no CUDA use yet.
        assert (by_pod[f"{NS}/mon-b"]["USED"], by_pod[f"{NS}/mon-b"]["ACHIEVED"]) == ("0Mi", "0%")

        _alerts_load_and_fire(w, prom, inv.cards[-1].uuid)
    finally:
        busy.stop.set()
        prom.stop()


def _alerts_load_and_fire(w: World, prom: Prometheus, spare_card: str) -> None:
    names = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}

    def evaluated() -> bool:
        rules = prom.rules()
        return set(rules) == names and all(r["health"] == "ok" for r in rules.values())

    wait_for("every alert rule loaded and evaluated", evaluated, 30, 0.5,
             lambda: str(prom.rules()))  # fmt: skip
    # One extender leads, and the rule sees it: the sum it compares is there and is 1.
    [leaders] = prom.query("sum(tessera_scheduler_leader)")["data"]["result"]
    assert leaders["value"][1] == "1"
    assert prom.alert_state("TesseraSchedulerNoLeader") == "inactive"
    # The agent is registered with kubelet, and says so.
    [plugin] = prom.query("tessera_agent_registered")["data"]["result"]
    assert (plugin["metric"]["plugin"], plugin["value"][1]) == ("device-plugin", "1")
    assert prom.alert_state("TesseraAgentNotRegistered") == "inactive"
    # An inventory that does not decode: the extender counts a state problem.
    broken = {"apiVersion": "v1", "kind": "Node",
              "metadata": {"name": "mon-broken", "annotations": {INVENTORY: "{oops"}}}  # fmt: skip
    w.api.create(NODES, broken)
    try:
        wait_for("TesseraSchedulerStateProblems to fire",
                 lambda: prom.alert_state("TesseraSchedulerStateProblems") == "firing", 60, 0.5,
                 lambda: str(prom.rules()["TesseraSchedulerStateProblems"]))  # fmt: skip
    finally:
        w.api.delete(NODES, "mon-broken")
    # A critical XID takes a card out; the alert waits 5 minutes before it fires.
    with (w.root / "faults" / "xid").open("a") as f:
        f.write(f"{spare_card} 79\n")
    wait_for("TesseraCardUnhealthy to be pending",
             lambda: prom.alert_state("TesseraCardUnhealthy") == "pending", 60, 0.5,
             lambda: str(prom.query("tessera_card_healthy == 0")))  # fmt: skip
