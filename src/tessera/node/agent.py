"""`tessera node-agent`: one process per GPU node, wiring the parts together.

    discovery ──► health tracker ──► device plugin (ListAndWatch) + inventory annotation
    pods (watch) + pod-resources ──► allocator ──► device plugin (Preferred/Allocate/PreStart)
    cleanup loop: folders of containers that are gone, claims kubelet never unprepared;
        MPS daemon supervision
    backstop loop: device memory per container from the driver, against its cap
    exporter: /metrics of cards, containers and the agent, read at scrape time; /readyz
        (kubelet has registered every plugin served) and /healthz on the same port
    claims (--claims-cards): those cards go to a ResourceSlice and the DRA kubelet plugin
        (prepare/unprepare) instead of the device plugin and the inventory; no card is on
        both paths (docs/claims.md)

Every outside dependency comes in through the constructor (discovery backend, pod source,
event sink, node port, MPS control), so tests run the real wiring with fakes.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from tessera.claims.devices import CLAIMS_LABEL, DRIVER, claims_pool, device_name
from tessera.errors import SpecError
from tessera.kube.errors import ApiError
from tessera.kube.kinds import NODES
from tessera.kube.port import KubeApi
from tessera.kube.reflector import Reflector
from tessera.model.types import DEFAULT_SLOTS, Card
from tessera.node.allocation.allocator import Allocator
from tessera.node.backstop import Backstop, BackstopMode
from tessera.node.burst.tenants import AllocationTenants, CoordinatorHost
from tessera.node.cards.cordons import NodeCordons
from tessera.node.cards.health import HealthTracker
from tessera.node.cards.inventory import InventoryPublisher
from tessera.node.dra.prepare import ClaimPreparer
from tessera.node.dra.server import DraPluginServer
from tessera.node.dra.slices import SlicePublisher
from tessera.node.exporter import AgentMetrics, NodeView, Registration
from tessera.node.formats.layout import Layout
from tessera.node.isolation import Isolation, MpsSupervisor, Visibility
from tessera.node.kube_source import KubeClaims
from tessera.node.kubelet.plugin import DevicePluginServer
from tessera.node.ports import (
    Discovery,
    EventSink,
    MpsControl,
    NodeFacts,
    NodePort,
    PodResources,
    PodSource,
    StartError,
)
from tessera.node.probes import serve

__all__ = ["Agent", "AgentConfig"]

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _step(what: str) -> Iterator[None]:
    """A fault of the node in one start step, as a StartError that names the step (the
    operator reads one line, not a traceback)."""
    try:
        yield
    except StartError:
        raise
    # grpc says RuntimeError when it cannot bind; a daemon's command, SubprocessError.
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        raise StartError(f"{what}: {exc}") from exc


@dataclass(slots=True)
class AgentConfig:
    node: str
    resource: str = "tessera.io/gpu"
    plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    endpoint: str = "tessera.sock"
    state_dir: Path = Path("/var/lib/tessera")
    slots_per_card: int = DEFAULT_SLOTS
    isolation: Isolation = Isolation.HOOK
    visibility: Visibility = Visibility.ENV
    libvgpu: Path | None = None
    recovery_s: float = 30.0
    health_interval_s: float = 1.0
    coordinator_period_s: float = 0.1  # burst-share ticks (hook backend only); 0: off
    cleanup_interval_s: float = 30.0
    cleanup_grace_s: float = 60.0
    backstop: BackstopMode = BackstopMode.KILL
    backstop_slack_mib: int = 512  # per process: the driver context NVML counts
    backstop_interval_s: float = 1.0
    context_mib: int = 0  # libvgpu's charge per CUDA context (limits file context_mib)
    metrics_port: int | None = None  # the exporter's /metrics; None: not served
    metrics_address: str = "0.0.0.0"
    # Card indices offered to DRA claims: all, none, "4-7" or "0,2"; "" reads the node label.
    claims_cards: str = "none"
    dra_plugin_dir: Path = Path("/var/lib/kubelet/plugins")
    dra_registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    cdi_dir: Path = Path("/var/run/cdi")


class Agent:
    def __init__(
        self,
        cfg: AgentConfig,
        discovery: Discovery,
        pods: PodSource,
        events: EventSink,
        node_port: NodePort | None,
        podres: PodResources | None,
        mps: MpsControl | None = None,
        kube: KubeApi | None = None,
    ) -> None:
        self.cfg = cfg
        self.kube = kube  # ResourceSlices and ResourceClaims, for the claims path
        self.discovery = discovery
        self.pods = pods
        self.events = events
        self.podres = podres
        self.inventory = InventoryPublisher(cfg.node, node_port) if node_port else None
        self.mps = MpsSupervisor(mps) if mps is not None else None
        self.layout = Layout(cfg.state_dir)
        self.facts: NodeFacts | None = None
        self.tracker: HealthTracker | None = None
        self.allocator: Allocator | None = None
        self.plugin: DevicePluginServer | None = None
        self.coordinator: CoordinatorHost | None = None
        self.backstop: Backstop | None = None
        self.metrics: AgentMetrics | None = None
        self.claim_cards: frozenset[str] = frozenset()  # UUIDs on the claims path
        self.slices: SlicePublisher | None = None
        self.dra: DraPluginServer | None = None
        self._slice_watch: Reflector | None = None
        self.cordons: NodeCordons | None = None  # followed with the claims path only
        self._cordon_watch: Reflector | None = None
        self.preparer: ClaimPreparer | None = None
        self._metrics_server: WSGIServer | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # --- state -----------------------------------------------------------------------

    def cards(self) -> tuple[Card, ...]:
        """The node's cards with their current health and cordons (their slots are the
        advertised ones since ``start``)."""
        assert self.facts is not None and self.tracker is not None
        cordoned = self.cordons.current() if self.cordons is not None else frozenset()
        return tuple(
            replace(c, healthy=self.tracker.healthy(c.uuid), cordoned=c.uuid in cordoned)
            for c in self.facts.cards
        )

    def _publish(self) -> None:
        cards = self.cards()
        if self.inventory is not None:
            try:
                self.inventory.publish(tuple(c for c in cards if c.uuid not in self.claim_cards))
            except Exception:
                log.exception("could not patch the inventory of %s; will retry", self.cfg.node)
                self.inventory.forget()
        if self.slices is not None:
            try:
                self.slices.publish(c for c in cards if c.uuid in self.claim_cards)
            except Exception:
                log.exception("could not write the ResourceSlice of %s; will retry", self.cfg.node)
                self.slices.forget()
        if self.dra is not None and self.tracker is not None:  # kubelet's pod status shows it
            health = {
                device_name(c): "" if c.healthy else self.tracker.reason(c.uuid) or "unhealthy"
                for c in cards
                if c.uuid in self.claim_cards
            }
            self.dra.report_health(health)

    # --- lifecycle -------------------------------------------------------------------

    def start(self, facts: NodeFacts | None = None) -> None:
        """Serve. ``facts``: the cards as the caller already read them (the CLI reads them
        to check its flags: one walk of the cards, one view of them); None reads them."""
        cfg = self.cfg
        self.facts = facts if facts is not None else self.discovery.facts()
        mig = sorted(self.facts.mig_enabled)
        if mig:
            log.warning("cards in MIG mode are not shared by Tessera yet: %s", mig)
        # Every part of the agent counts a card's slots as the inventory and the slice
        # advertise them (--slots-per-card), not as discovery left them.
        cards = tuple(
            replace(c, slots=cfg.slots_per_card)
            for c in self.facts.cards
            if c.uuid not in self.facts.mig_enabled
        )
        self.facts = replace(self.facts, cards=cards)
        self.tracker = HealthTracker((c.uuid for c in cards), recovery_s=cfg.recovery_s)
        with _step(f"installing libvgpu {cfg.libvgpu} into {self.layout.lib_root}"):
            lib_version = self.layout.install_library(cfg.libvgpu)
        if self.mps is not None:
            with _step("starting the MPS control daemon"):
                self.mps.check()
        pool = self._claims_pool(cards)
        self.preparer = None
        self.claim_cards = frozenset(c.uuid for c in cards if c.index in pool)
        if self.claim_cards:
            self._start_claims(tuple(c for c in cards if c.uuid in self.claim_cards), lib_version)
        every_card = cards  # the backstop watches both paths' cards
        cards = tuple(c for c in cards if c.uuid not in self.claim_cards)  # the extender's
        self.allocator = Allocator(
            node=cfg.node,
            cards=cards,
            slots_per_card=cfg.slots_per_card,
            layout=self.layout,
            lib_version=lib_version,
            pods=self.pods,
            podres=self.podres,
            events=self.events,
            isolation=cfg.isolation,
            visibility=cfg.visibility,
            context_mib=cfg.context_mib,
        )
        if self.preparer is not None:
            self.allocator.claim_libs = self.preparer.lib_versions
        self.plugin = DevicePluginServer(
            allocator=self.allocator,
            cards=cards,
            resource=cfg.resource,
            plugin_dir=cfg.plugin_dir,
            events=self.events,
            slots_per_card=cfg.slots_per_card,
            endpoint=cfg.endpoint,
        )
        self.metrics = self._metrics(lib_version)
        self.plugin.on_call = self.metrics.on_call
        if cfg.metrics_port is not None:  # before kubelet hears of the plugin
            with _step(f"serving /metrics on {cfg.metrics_address}:{cfg.metrics_port}"):
                self._metrics_server = serve(
                    cfg.metrics_port, cfg.metrics_address, self.metrics.registry, self.not_ready
                )
        self._publish()
        with _step(f"serving the device plugin in {cfg.plugin_dir}"):
            self.plugin.start()
        if cfg.isolation is Isolation.HOOK and cfg.coordinator_period_s > 0:
            claims = self.preparer.prepared if self.preparer is not None else list
            tenants = AllocationTenants(self.layout, self.allocator.allocations, claims)
            self.coordinator = CoordinatorHost(
                tenants, cfg.coordinator_period_s, card_busy=self.discovery.utilization
            )
            self.coordinator.start()
        if cfg.backstop is not BackstopMode.OFF:
            self.backstop = Backstop(
                cfg.node,
                self.discovery,
                tuple(c.uuid for c in every_card),
                self.pods,
                self.events,
                mode=cfg.backstop,
                slack_mib=cfg.backstop_slack_mib,
                claim_slices=self.preparer.held_by_claim if self.preparer is not None else None,
            )
        self._stop.clear()
        loops = [("health", self._health_loop), ("cleanup", self._cleanup_loop)]
        if self.backstop is not None:
            loops.append(("backstop", self._backstop_loop))
        for name, target in loops:
            t = threading.Thread(target=target, name=f"agent-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        log.info(
            "node agent up on %s: %d card(s), %d slot(s) each, isolation %s, driver %s",
            cfg.node,
            len(cards),
            cfg.slots_per_card,
            cfg.isolation,
            self.facts.driver_version or "unknown",
        )

    def _claims_pool(self, cards: tuple[Card, ...]) -> frozenset[int]:
        """Card indices for claims: the flag, or (flag "") the node's label, else none.

        A bad flag stops the agent (the operator is there); a bad label is logged and
        offers nothing to claims, so the extender path keeps working on that node.
        """
        indices = [c.index for c in cards]
        if self.cfg.claims_cards:
            return claims_pool(self.cfg.claims_cards, indices)
        if self.kube is None:
            return frozenset()
        try:
            node = self.kube.get(NODES, self.cfg.node)
        except ApiError as exc:  # kubelet restarts the agent: that is the retry
            raise StartError(f"reading node {self.cfg.node}'s {CLAIMS_LABEL} label: {exc}") from exc
        labels = node["metadata"].get("labels") or {}
        text = str(labels.get(CLAIMS_LABEL, "none"))
        try:
            return claims_pool(text, indices, field=f"label {CLAIMS_LABEL}")
        except SpecError as exc:
            log.error("node %s: %s; no card goes to claims", self.cfg.node, exc)
            return frozenset()

    def _start_claims(self, cards: tuple[Card, ...], lib_version: str) -> None:
        assert self.facts is not None
        if self.kube is None:
            raise StartError("--claims-cards needs the Kubernetes API (ResourceSlices, claims)")
        cfg = self.cfg
        self.preparer = preparer = ClaimPreparer(
            node=cfg.node,
            cards=cards,
            layout=self.layout,
            lib_version=lib_version,
            claims=KubeClaims(self.kube),
            cdi_dir=cfg.cdi_dir,
            isolation=cfg.isolation,
            visibility=cfg.visibility,
            context_mib=cfg.context_mib,
        )
        self.slices = SlicePublisher(self.kube, cfg.node, self.facts.driver_version)
        self._slice_watch = self.slices.watch()
        # A cordoned card is tainted in the slice (the extender reads cordons itself).
        self.cordons = NodeCordons(self.kube, cfg.node, on_change=self._publish)
        self._cordon_watch = self.cordons.watch()
        self.dra = DraPluginServer(preparer, cfg.dra_plugin_dir, cfg.dra_registry_dir)
        with _step(f"serving the DRA plugin in {cfg.dra_plugin_dir}"):
            self.dra.start()
        log.info("claims path on %s: cards %s", cfg.node, sorted(c.index for c in cards))

    def _metrics(self, lib_version: str) -> AgentMetrics:
        assert self.facts is not None and self.allocator is not None
        allocator = self.allocator
        info = {
            "driver_version": self.facts.driver_version or "unknown",
            "cuda_version": self.facts.cuda_version or "unknown",
            "isolation": str(self.cfg.isolation),
            "library": lib_version,
        }
        view = NodeView(
            node=self.cfg.node,
            cards=self.cards,
            allocations=allocator.allocations,
            utilization=self.discovery.utilization,
            backstop_actions=lambda: self.backstop.actions if self.backstop else {},
            info=lambda: info,
            claims=lambda: self.preparer.prepared_claims() if self.preparer else [],
            corrections=lambda: allocator.corrections,
            registrations=self._registrations,
        )
        return AgentMetrics(view, self.layout)

    def not_ready(self) -> str:
        """Why kubelet cannot use the agent yet ("" once it has every plugin it serves)."""
        if self.plugin is None:
            return "starting"
        names = {
            "device-plugin": f"device plugin {self.cfg.resource}",
            "dra": f"DRA driver {DRIVER}",
        }
        waiting = [names[p] for p, r in self._registrations().items() if not r.registered]
        return f"kubelet has not registered the {' nor the '.join(waiting)}" if waiting else ""

    def _registrations(self) -> dict[str, Registration]:
        out = {}
        if self.plugin is not None:
            out["device-plugin"] = Registration(
                self.plugin.registered, self.plugin.register_failures
            )
        if self.dra is not None:
            # kubelet says nothing when it stops: the device plugin's check tells.
            silent = self.plugin is not None and self.plugin.kubelet_silent
            accepted = self.dra.registered.is_set() and not silent
            out["dra"] = Registration(accepted, self.dra.refusals)
        return out

    @property
    def metrics_port(self) -> int | None:
        """The port /metrics is served on (the real one when configured as 0)."""
        return self._metrics_server.server_port if self._metrics_server else None

    def stop(self) -> None:
        self._stop.set()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None
        # Join first: NVML must not free the event set under a thread waiting on it.
        for t in self._threads:
            t.join(self.cfg.health_interval_s + 5)
        self._threads.clear()
        self.discovery.close()
        if self.coordinator is not None:
            self.coordinator.stop()
        if self.plugin is not None:
            self.plugin.stop()
        if self.dra is not None:
            self.dra.stop()
        for watch in (self._slice_watch, self._cordon_watch):
            if watch is not None:
                watch.stop()
        self._slice_watch = self._cordon_watch = None

    # --- loops -----------------------------------------------------------------------

    def _apply_health(self, changed: set[str]) -> None:
        assert self.tracker is not None and self.plugin is not None
        if not changed:
            return
        for uuid in sorted(changed):
            ok = self.tracker.healthy(uuid)
            log.warning(
                "card %s is %s%s",
                uuid,
                "Healthy again" if ok else "Unhealthy",
                "" if ok else f" ({self.tracker.reason(uuid)})",
            )
        self.plugin.set_health(self.tracker.snapshot())
        self._publish()

    def health_step(self, wait_s: float) -> None:
        """One turn of the health loop: XID events (waiting up to ``wait_s``), then probes."""
        assert self.tracker is not None
        changed: set[str] = set()
        for ev in self.discovery.wait_events(wait_s):
            if self.tracker.on_xid(ev.uuid, ev.xid, time.monotonic()):
                changed.add(ev.uuid)
        changed |= self.tracker.tick(time.monotonic(), self.discovery.probe)
        self._apply_health(changed)
        if not changed:
            # Retries a patch that failed (API server away); a string compare otherwise.
            self._publish()

    def _health_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.health_step(self.cfg.health_interval_s)
                if self.mps is not None and self.mps.check():
                    log.warning("MPS control daemon was down; restarted")
            except Exception:
                log.exception("health loop")
                self._stop.wait(self.cfg.health_interval_s)

    def _backstop_loop(self) -> None:
        assert self.backstop is not None
        while not self._stop.wait(self.cfg.backstop_interval_s):
            try:
                self.backstop.tick()
            except Exception:
                log.exception("backstop loop")

    def sweep_claims(self, grace_s: float) -> list[str]:
        """Unprepare the prepared claims kubelet will not (see ClaimPreparer.sweep)."""
        assert self.preparer is not None
        return self.preparer.sweep(time.time(), grace_s, self._claims_in_use)

    def _claims_in_use(self) -> set[tuple[str, str]]:
        live = [p for p in self.pods.pods() if p.node == self.cfg.node and not p.terminal]
        return {(p.namespace, name) for p in live for name in p.claims}

    def _cleanup_loop(self) -> None:
        while not self._stop.wait(self.cfg.cleanup_interval_s):
            try:
                assert self.allocator is not None
                removed = self.allocator.cleanup(self.cfg.cleanup_grace_s)
                if removed:
                    log.info("removed the folders of %d gone container(s)", len(removed))
                if self.preparer is not None:
                    self.sweep_claims(self.cfg.cleanup_grace_s)
            except Exception:
                log.exception("cleanup loop")
