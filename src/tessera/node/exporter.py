"""The node agent's Prometheus exporter: cards, containers, and the agent itself.

Everything is read at scrape time, nothing is cached between scrapes except parsed limits
files (by mtime): the cards and their health from the agent, the allocation records, each
container's limits file (what libvgpu enforces) and its libvgpu usage region (what it
uses). A file that does not read marks that container with
``tessera_container_unreadable`` and the scrape goes on for every other one.

Series (labels in braces; docs/operations.md lists them with what to watch):

=====================================================  ========================================
tessera_card_memory_total_bytes{card}                  the card's device memory
tessera_card_memory_allocated_bytes{card}              sum of the containers' caps on it
tessera_card_memory_used_bytes{card}                   sum of their live use (usage regions)
tessera_card_compute_allocated_percent{card}           sum of their compute shares
tessera_card_utilization_percent{card}                 the driver's utilisation (absent if unknown)
tessera_card_healthy{card}                             1 healthy, 0 not
tessera_card_slots{card}, tessera_card_slots_used      containers it may take / holds
tessera_container_memory_limit_bytes{ctr,card}         the cap
tessera_container_memory_used_bytes{ctr,card}          live use of its processes
tessera_container_compute_target_percent{ctr,card}     its share (0: best-effort)
tessera_container_busy_seconds_total{ctr,card}         kernel time; rate × 100 = achieved %
tessera_container_throttled_seconds_total{ctr,card}    time held back by the limiter
tessera_container_refused_allocations_total{ctr,card}  allocations refused at the cap
tessera_container_launches_total{ctr,card}             kernel launches
tessera_container_processes{ctr}                       live processes using libvgpu
tessera_container_backstop_actions_total{ctr,action}   backstop kills / warnings
tessera_container_unreadable{ctr,file,problem}         1 per file that did not read
tessera_agent_call_seconds{node,call}                  device-plugin calls, histogram
tessera_agent_calls_total{node,call,result}            and their results
tessera_agent_info{driver_version,isolation,library}   1
=====================================================  ========================================

``card`` is ``node, uuid, index, model``; ``ctr`` is ``node, namespace, pod, container``
(plus ``uuid, model`` with ``card``). Cardinality per node is bounded by cards × slots:
at 8 cards × 16 slots, at most 128 containers × 8 series each.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tessera.errors import FormatError
from tessera.model.types import Card
from tessera.node.formats.layout import AllocRecord, Layout
from tessera.node.formats.limits import Limits, LimitsFiles
from tessera.node.formats.usage import RegionSnapshot, read_region

__all__ = ["AgentMetrics", "NodeCollector", "NodeView"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

MIB = 1 << 20
_NS = 1e-9
_CARD = ["node", "uuid", "index", "model"]
_CTR = ["node", "namespace", "pod", "container"]
_CALL_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the exporter reads from the agent, as callables (each scrape calls them)."""

    node: str
    cards: Callable[[], tuple[Card, ...]]
    allocations: Callable[[], list[AllocRecord]]
    utilization: Callable[[str], float | None]
    backstop_actions: Callable[[], Mapping[tuple[str, str, str], int]]
    info: Callable[[], Mapping[str, str]]


class NodeCollector(Collector):
    def __init__(self, view: NodeView, layout: Layout) -> None:
        self.view = view
        self.layout = layout
        self._limits = LimitsFiles()
        self._logged: set[tuple[str, str, str]] = set()  # (alloc, file, problem) warned once

    def _read(
        self, rec: AllocRecord
    ) -> tuple[Limits | None, RegionSnapshot | None, list[tuple[str, str]]]:
        """The container's limits and usage region, each None if it did not read, and the
        (file, problem) of each that did not."""
        problems: list[tuple[str, str]] = []

        def attempt(file: str, read: Callable[[], _T]) -> _T | None:
            try:
                return read()
            except FileNotFoundError:
                problems.append((file, "missing"))
            except FormatError as exc:
                problems.append((file, exc.kind))
                if (rec.alloc_id, file, exc.kind) not in self._logged:
                    self._logged.add((rec.alloc_id, file, exc.kind))
                    log.warning("exporter: %s/%s: %s", rec.pod_key, rec.container, exc)
            except OSError as exc:
                problems.append((file, "unreadable"))
                log.warning("exporter: %s/%s %s: %s", rec.pod_key, rec.container, file, exc)
            return None

        limits = attempt("limits", lambda: self._limits.read(self.layout.limits_path(rec.alloc_id)))
        region = attempt("usage_region", lambda: read_region(self.layout.region_path(rec.alloc_id)))
        return limits, region, problems

    def collect(self) -> Iterator[Metric]:
        v = self.view
        node = v.node
        cards = {c.uuid: c for c in v.cards()}
        records = v.allocations()

        def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        def counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=labels)

        ctr_card = [*_CTR, "uuid", "model"]
        c_limit = gauge("tessera_container_memory_limit_bytes", "Device memory cap", ctr_card)
        c_used = gauge("tessera_container_memory_used_bytes", "Device memory in use", ctr_card)
        c_target = gauge(
            "tessera_container_compute_target_percent",
            "Compute share of the card (0: best-effort)",
            ctr_card,
        )
        c_busy = counter(
            "tessera_container_busy_seconds",
            "Kernel time on the card; rate x 100 is the achieved share in percent",
            ctr_card,
        )
        c_throttled = counter(
            "tessera_container_throttled_seconds", "Time held back by the limiter", ctr_card
        )
        c_refused = counter(
            "tessera_container_refused_allocations", "Allocations refused at the cap", ctr_card
        )
        c_launches = counter("tessera_container_launches", "Kernel launches", ctr_card)
        c_procs = gauge("tessera_container_processes", "Live processes using libvgpu", _CTR)
        c_bad = gauge(
            "tessera_container_unreadable",
            "1 per file of the container that did not read (file, problem)",
            [*_CTR, "file", "problem"],
        )
        allocated_mib: dict[str, int] = {}
        allocated_cores: dict[str, int] = {}
        used_bytes: dict[str, int] = {}
        slots_used: dict[str, int] = {}

        for rec in records:
            who = [node, rec.namespace, rec.pod, rec.container]
            for uuid in rec.cards:
                slots_used[uuid] = slots_used.get(uuid, 0) + 1
            limits, region, problems = self._read(rec)
            for file, problem in problems:
                c_bad.add_metric([*who, file, problem], 1)
            if region is not None:
                c_procs.add_metric(who, len(region.processes))
            if limits is None:
                continue
            for lim in limits.cards:
                model = cards[lim.uuid].model if lim.uuid in cards else ""
                labels = [*who, lim.uuid, model]
                allocated_mib[lim.uuid] = allocated_mib.get(lim.uuid, 0) + lim.memory_mib
                allocated_cores[lim.uuid] = allocated_cores.get(lim.uuid, 0) + lim.cores_percent
                c_limit.add_metric(labels, lim.memory_mib * MIB)
                c_target.add_metric(labels, lim.cores_percent)
                if region is None:
                    continue
                t = region.cards[lim.ordinal]
                used_bytes[lim.uuid] = used_bytes.get(lim.uuid, 0) + t.memory_bytes
                c_used.add_metric(labels, t.memory_bytes)
                c_busy.add_metric(labels, t.busy_ns * _NS)
                c_throttled.add_metric(labels, t.throttled_ns * _NS)
                c_refused.add_metric(labels, t.refused_allocs)
                c_launches.add_metric(labels, t.launches)
        self._limits.keep_only(self.layout.limits_path(r.alloc_id) for r in records)
        live = {r.alloc_id for r in records}
        self._logged = {k for k in self._logged if k[0] in live}

        yield from self._cards(cards, allocated_mib, allocated_cores, used_bytes, slots_used)
        yield from (c_limit, c_used, c_target, c_busy, c_throttled, c_refused, c_launches)
        yield from (c_procs, c_bad)

        actions = counter(
            "tessera_container_backstop_actions",
            "Backstop actions on a container over its cap read from the driver",
            [*_CTR, "action"],
        )
        for (pod_key, container, action), n in sorted(v.backstop_actions().items()):
            namespace, _, pod = pod_key.partition("/")
            actions.add_metric([node, namespace, pod, container, action], n)
        yield actions

        info = v.info()
        keys = sorted(info)
        agent = gauge("tessera_agent_info", "The agent's build and settings", ["node", *keys])
        agent.add_metric([node, *(info[k] for k in keys)], 1)
        yield agent

    def _cards(
        self,
        cards: Mapping[str, Card],
        allocated_mib: Mapping[str, int],
        allocated_cores: Mapping[str, int],
        used_bytes: Mapping[str, int],
        slots_used: Mapping[str, int],
    ) -> Iterator[Metric]:
        names = (
            ("tessera_card_memory_total_bytes", "Device memory of the card"),
            ("tessera_card_memory_allocated_bytes", "Sum of the containers' memory caps"),
            ("tessera_card_memory_used_bytes", "Sum of the containers' memory in use"),
            ("tessera_card_compute_allocated_percent", "Sum of the containers' compute shares"),
            ("tessera_card_utilization_percent", "The driver's utilisation of the card"),
            ("tessera_card_healthy", "1 when the card is healthy"),
            ("tessera_card_slots", "Containers the card may be given to"),
            ("tessera_card_slots_used", "Containers holding the card"),
        )
        fams = [GaugeMetricFamily(n, d, labels=_CARD) for n, d in names]
        total, alloc, used, cores, util, healthy, slots, held = fams
        for uuid, c in sorted(cards.items(), key=lambda kv: kv[1].index):
            labels = [self.view.node, uuid, str(c.index), c.model]
            total.add_metric(labels, c.memory_mib * MIB)
            alloc.add_metric(labels, allocated_mib.get(uuid, 0) * MIB)
            used.add_metric(labels, used_bytes.get(uuid, 0))
            cores.add_metric(labels, allocated_cores.get(uuid, 0))
            busy = self.view.utilization(uuid)
            if busy is not None:
                util.add_metric(labels, busy)
            healthy.add_metric(labels, 1 if c.healthy else 0)
            slots.add_metric(labels, c.slots)
            held.add_metric(labels, slots_used.get(uuid, 0))
        yield from fams


class AgentMetrics:
    """The agent's registry: the node collector plus the device-plugin call series."""

    def __init__(self, view: NodeView, layout: Layout) -> None:
        self.node = view.node
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NodeCollector(view, layout))
        self.call_seconds = Histogram(
            "tessera_agent_call_seconds",
            "Device-plugin calls kubelet makes, per container",
            ["node", "call"],
            buckets=_CALL_BUCKETS,
            registry=self.registry,
        )
        self.calls = Counter(
            "tessera_agent_calls",
            "Device-plugin calls by result (ok or the gRPC status)",
            ["node", "call", "result"],
            registry=self.registry,
        )

    def on_call(self, call: str, result: str, seconds: float) -> None:
        self.call_seconds.labels(self.node, call).observe(seconds)
        self.calls.labels(self.node, call, result).inc()
