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
tessera_claim_*{claim,card}, tessera_claim_*{claim}    the same nine series for each prepared
                                                       DRA claim (memory_limit_bytes, ...,
                                                       unreadable)
tessera_agent_call_seconds{node,call}                  device-plugin calls, histogram
tessera_agent_calls_total{node,call,result}            and their results
tessera_agent_match_corrections_total{node}            Allocate matches corrected at PreStart
tessera_agent_registered{node,plugin}                  1 while kubelet has accepted the plugin
tessera_agent_registration_failures_total             {node,plugin}: those kubelet failed or refused
tessera_agent_info{node,...}                           1; labels cuda_version, driver_version,
                                                       isolation, library
=====================================================  ========================================

``card`` is ``node, uuid, index, model``; ``ctr`` is ``node, namespace, pod, container``
and ``claim`` is ``node, namespace, claim`` (plus ``uuid, model`` with ``card``). A claim
is reported once, whatever the containers that share it (they share its folder). The
card series count containers and claims alike. Cardinality per node is bounded by cards ×
slots: at 8 cards × 16 slots, at most 128 containers or claims × 8 series each.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tessera.errors import FormatError
from tessera.model.types import Card
from tessera.node.formats.layout import LIMITS_IN_FOLDER, REGION_IN_FOLDER, AllocRecord, Layout
from tessera.node.formats.limits import Limits, LimitsFiles
from tessera.node.formats.usage import RegionSnapshot, read_region

__all__ = ["AgentMetrics", "NodeCollector", "NodeView", "Registration"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

MIB = 1 << 20
_NS = 1e-9
_CARD = ["node", "uuid", "index", "model"]
_CTR = ["node", "namespace", "pod", "container"]
_CLAIM = ["node", "namespace", "claim"]
_CALL_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


@dataclass(frozen=True, slots=True)
class Registration:
    """A kubelet plugin's registration: accepted now, and failed or refused so far."""

    registered: bool
    failures: int


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the exporter reads from the agent, as callables (each scrape calls them)."""

    node: str
    cards: Callable[[], tuple[Card, ...]]
    allocations: Callable[[], list[AllocRecord]]
    utilization: Callable[[str], float | None]
    backstop_actions: Callable[[], Mapping[tuple[str, str, str], int]]
    info: Callable[[], Mapping[str, str]]
    # Prepared DRA claims as (uid, namespace, name, card UUID of each slice); none
    # without the claims path.
    claims: Callable[[], list[tuple[str, str, str, tuple[str, ...]]]] = field(default=list)
    # Allocate matches PreStartContainer corrected from kubelet's pod-resources report.
    corrections: Callable[[], int] = field(default=int)
    # Each kubelet plugin the agent serves ("device-plugin", "dra") and where its
    # registration with kubelet stands.
    registrations: Callable[[], Mapping[str, Registration]] = field(default=dict)


@dataclass(frozen=True, slots=True)
class _Tenant:
    """A folder libvgpu reads limits from and writes usage to: a container's or a claim's."""

    key: str  # the folder's name, for the logs
    who: list[str]  # label values: _CTR or _CLAIM
    folder: Path
    cards: tuple[str, ...]  # the slots it holds (a container whose limits do not read too)


class _Series:
    """One kind of tenant's series: tessera_container_* or tessera_claim_*."""

    def __init__(self, prefix: str, labels: list[str]) -> None:
        with_card = [*labels, "uuid", "model"]

        def gauge(name: str, doc: str, names: list[str] = with_card) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{prefix}_{name}", doc, labels=names)

        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(f"{prefix}_{name}", doc, labels=with_card)

        self.limit = gauge("memory_limit_bytes", "Device memory cap")
        self.used = gauge("memory_used_bytes", "Device memory in use")
        self.target = gauge("compute_target_percent", "Compute share of the card (0: best-effort)")
        self.busy = counter(
            "busy_seconds", "Kernel time on the card; rate x 100 is the achieved share in percent"
        )
        self.throttled = counter("throttled_seconds", "Time held back by the limiter")
        self.refused = counter("refused_allocations", "Allocations refused at the cap")
        self.launches = counter("launches", "Kernel launches")
        self.procs = gauge("processes", "Live processes using libvgpu", labels)
        self.bad = gauge(
            "unreadable",
            "1 per file that did not read (file, problem)",
            [*labels, "file", "problem"],
        )

    def families(self) -> tuple[Metric, ...]:
        return (self.limit, self.used, self.target, self.busy, self.throttled, self.refused,
                self.launches, self.procs, self.bad)  # fmt: skip


class NodeCollector(Collector):
    def __init__(self, view: NodeView, layout: Layout) -> None:
        self.view = view
        self.layout = layout
        self._limits = LimitsFiles()
        self._logged: set[tuple[str, str, str]] = set()  # (alloc, file, problem) warned once

    def _read(
        self, t: _Tenant
    ) -> tuple[Limits | None, RegionSnapshot | None, list[tuple[str, str]]]:
        """The tenant's limits and usage region, each None if it did not read, and the
        (file, problem) of each that did not."""
        problems: list[tuple[str, str]] = []

        def problem(file: str, kind: str, exc: Exception) -> None:
            """Marked at every scrape; logged once per tenant, file and problem (a
            scrape every 15 s would repeat it all day)."""
            problems.append((file, kind))
            if (t.key, file, kind) not in self._logged:
                self._logged.add((t.key, file, kind))
                log.warning("exporter: %s %s: %s", "/".join(t.who[1:]), file, exc)

        def attempt(file: str, read: Callable[[], _T]) -> _T | None:
            try:
                return read()
            except FileNotFoundError:
                problems.append((file, "missing"))
            except FormatError as exc:
                problem(file, exc.kind, exc)
            except OSError as exc:
                problem(file, "unreadable", exc)
            return None

        limits = attempt("limits", lambda: self._limits.read(t.folder / LIMITS_IN_FOLDER))
        region = attempt("usage_region", lambda: read_region(t.folder / REGION_IN_FOLDER))
        return limits, region, problems

    def _tenants(self) -> tuple[list[_Tenant], list[_Tenant]]:
        node = self.view.node
        containers = [
            _Tenant(r.alloc_id, [node, r.namespace, r.pod, r.container],
                    self.layout.alloc_dir(r.alloc_id), r.cards)
            for r in self.view.allocations()
        ]  # fmt: skip
        claims = [
            _Tenant(f"claim-{uid}", [node, namespace, name], self.layout.claim_dir(uid), cards)
            for uid, namespace, name, cards in self.view.claims()
        ]
        return containers, claims

    def collect(self) -> Iterator[Metric]:
        v = self.view
        node = v.node
        cards = {c.uuid: c for c in v.cards()}
        containers, claims = self._tenants()
        allocated_mib: dict[str, int] = {}
        allocated_cores: dict[str, int] = {}
        used_bytes: dict[str, int] = {}
        slots_used: dict[str, int] = {}
        kinds = ((_Series("tessera_container", _CTR), containers),
                 (_Series("tessera_claim", _CLAIM), claims))  # fmt: skip
        for series, tenants in kinds:
            for t in tenants:
                for uuid in t.cards:
                    slots_used[uuid] = slots_used.get(uuid, 0) + 1
                limits, region, problems = self._read(t)
                for file, problem in problems:
                    series.bad.add_metric([*t.who, file, problem], 1)
                if region is not None:
                    series.procs.add_metric(t.who, len(region.processes))
                if limits is None:
                    continue
                for lim in limits.cards:
                    model = cards[lim.uuid].model if lim.uuid in cards else ""
                    labels = [*t.who, lim.uuid, model]
                    allocated_mib[lim.uuid] = allocated_mib.get(lim.uuid, 0) + lim.memory_mib
                    allocated_cores[lim.uuid] = allocated_cores.get(lim.uuid, 0) + lim.cores_percent
                    series.limit.add_metric(labels, lim.memory_mib * MIB)
                    series.target.add_metric(labels, lim.cores_percent)
                    if region is None:
                        continue
                    u = region.cards[lim.ordinal]
                    used_bytes[lim.uuid] = used_bytes.get(lim.uuid, 0) + u.memory_bytes
                    series.used.add_metric(labels, u.memory_bytes)
                    series.busy.add_metric(labels, u.busy_ns * _NS)
                    series.throttled.add_metric(labels, u.throttled_ns * _NS)
                    series.refused.add_metric(labels, u.refused_allocs)
                    series.launches.add_metric(labels, u.launches)
        every = containers + claims
        self._limits.keep_only(t.folder / LIMITS_IN_FOLDER for t in every)
        live = {t.key for t in every}
        self._logged = {k for k in self._logged if k[0] in live}

        yield from self._cards(cards, allocated_mib, allocated_cores, used_bytes, slots_used)
        for series, _ in kinds:
            yield from series.families()

        actions = CounterMetricFamily(
            "tessera_container_backstop_actions",
            "Backstop actions on a container over its cap read from the driver",
            labels=[*_CTR, "action"],
        )
        for (pod_key, container, action), n in sorted(v.backstop_actions().items()):
            namespace, _, pod = pod_key.partition("/")
            actions.add_metric([node, namespace, pod, container, action], n)
        yield actions

        corrected = CounterMetricFamily(
            "tessera_agent_match_corrections",
            "Allocate matches that PreStartContainer corrected from kubelet's pod-resources",
            labels=["node"],
        )
        corrected.add_metric([node], v.corrections())
        yield corrected
        yield from self._registrations(v.registrations())

        info = v.info()
        keys = sorted(info)
        agent = GaugeMetricFamily(
            "tessera_agent_info", "The agent's build and settings", labels=["node", *keys]
        )
        agent.add_metric([node, *(info[k] for k in keys)], 1)
        yield agent

    def _registrations(self, plugins: Mapping[str, Registration]) -> Iterator[Metric]:
        registered = GaugeMetricFamily(
            "tessera_agent_registered",
            "1 while kubelet has accepted the kubelet plugin (device-plugin, dra)",
            labels=["node", "plugin"],
        )
        failures = CounterMetricFamily(
            "tessera_agent_registration_failures",
            "Registrations of the kubelet plugin that kubelet failed or refused",
            labels=["node", "plugin"],
        )
        for plugin, r in sorted(plugins.items()):
            registered.add_metric([self.view.node, plugin], 1 if r.registered else 0)
            failures.add_metric([self.view.node, plugin], r.failures)
        yield registered
        yield failures

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
