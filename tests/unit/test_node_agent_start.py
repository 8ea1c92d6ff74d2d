"""The node agent's start on a node that cannot host it as configured: one ``StartError``
naming the step (the CLI prints it as one line), and kubelet never hears of a plugin
that is not whole."""

from __future__ import annotations

import logging
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.kube import NODES, FakeKube
from tessera.kube.errors import Unavailable
from tessera.model.clusterspec import make_cards
from tessera.node.agent import Agent, AgentConfig
from tessera.node.backstop import Backstop, BackstopMode
from tessera.node.cards.fake import FakeDiscovery
from tessera.node.fakes import MemoryEvents, MemoryNode, MemoryPods
from tessera.node.isolation import Isolation, MpsDaemon
from tessera.node.ports import MpsControl, NodeFacts, StartError, XidEvent
from tests._logs import logged
from tests.integration.agent_metrics import one, scrape

NODE = "node-a"
AGENT_LOG = "tessera.node.agent"
RES = "tessera.io/gpu"
CARDS = make_cards(NODE, 2, "T4")


@pytest.fixture
def root() -> Iterator[Path]:
    # unix socket paths are limited to 107 bytes: a short folder, not pytest's tmp_path.
    path = Path(tempfile.mkdtemp(prefix="ts-start-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class CountingDiscovery(FakeDiscovery):
    def __init__(self) -> None:
        super().__init__(CARDS)
        self.reads = 0

    def facts(self) -> NodeFacts:
        self.reads += 1
        return super().facts()


def _agent(
    root: Path,
    mps: MpsControl | None = None,
    discovery: FakeDiscovery | None = None,
    kube: FakeKube | None = None,
    **cfg: object,
) -> Agent:
    config = AgentConfig(node=NODE, resource=RES, plugin_dir=root / "dp", state_dir=root / "state")
    for k, v in cfg.items():
        setattr(config, k, v)
    pods = MemoryPods(RES, frozenset(c.uuid for c in CARDS))
    disc = discovery if discovery is not None else FakeDiscovery(CARDS)
    return Agent(config, disc, pods, MemoryEvents(), MemoryNode(), None, mps, kube=kube)


def _start_fails(agent: Agent) -> str:
    try:
        with pytest.raises(StartError) as caught:
            agent.start()
        return str(caught.value)
    finally:
        agent.stop()


def test_a_metrics_port_in_use_stops_the_start_before_kubelet_hears_of_the_plugin(
    root: Path,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        agent = _agent(root, metrics_port=port, metrics_address="127.0.0.1")
        told = _start_fails(agent)
    assert told.startswith(f"serving /metrics on 127.0.0.1:{port}: "), told
    assert "Address already in use" in told
    assert not (root / "dp" / "tessera.sock").exists()  # the plugin never served


def test_a_libvgpu_that_is_not_there_is_named(root: Path) -> None:
    missing = root / "libvgpu.so"
    told = _start_fails(_agent(root, libvgpu=missing))
    assert told.startswith(f"installing libvgpu {missing} into {root / 'state'}"), told
    assert "No such file or directory" in told


def test_a_plugin_folder_it_cannot_make_is_named(root: Path) -> None:
    (root / "dp").write_text("a file where the folder should be")
    told = _start_fails(_agent(root))
    assert told.startswith(f"serving the device plugin in {root / 'dp'}: "), told


def test_a_dra_plugin_folder_it_cannot_make_is_named(root: Path) -> None:
    (root / "plugins").write_text("a file where the folder should be")
    kube = FakeKube()
    kube.create(NODES, {"metadata": {"name": NODE}})
    agent = _agent(root, kube=kube, claims_cards="all", dra_plugin_dir=root / "plugins",
                   dra_registry_dir=root / "registry", cdi_dir=root / "cdi")  # fmt: skip
    told = _start_fails(agent)
    assert told.startswith(f"serving the DRA plugin in {root / 'plugins'}: "), told


def test_an_mps_daemon_that_will_not_start_is_named(root: Path) -> None:
    for binary, said in [
        ("tessera-no-such-mps-control", "tessera-no-such-mps-control not found on PATH"),
        ("false", "returned non-zero exit status 1"),
    ]:
        daemon = MpsDaemon(root / "mps", root / "mps-log", binary=binary)
        told = _start_fails(_agent(root, daemon, isolation=Isolation.MPS))
        assert told.startswith("starting the MPS control daemon: ") and said in told, told
        assert not (root / "dp" / "tessera.sock").exists()


def test_claims_without_the_api_is_a_start_error(root: Path) -> None:
    told = _start_fails(_agent(root, claims_cards="1"))
    assert told == "--claims-cards needs the Kubernetes API (ResourceSlices, claims)"


def test_a_node_that_can_host_it_starts(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=AGENT_LOG)
    agent = _agent(root, metrics_port=0, metrics_address="127.0.0.1", slots_per_card=6)
    try:
        agent.start()
        assert logged(caplog, AGENT_LOG) == [
            "node agent up on node-a: 2 card(s), 6 slot(s) each, isolation hook, driver fake-0.0"
        ]
        assert (root / "dp" / "tessera.sock").exists()
        assert agent.metrics_port is not None and agent.metrics_port > 0
        socket.create_connection(("127.0.0.1", agent.metrics_port), timeout=5).close()
        # Served on the address asked for only (an operator keeps /metrics off the node's
        # other addresses this way).
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.2", agent.metrics_port), timeout=5).close()
    finally:
        agent.stop()


def test_the_cards_read_by_the_caller_are_the_ones_served(root: Path) -> None:
    discovery = CountingDiscovery()
    facts = discovery.facts()  # as the CLI reads them, for its pod filter and flags
    agent = _agent(root, discovery=discovery)
    try:
        agent.start(facts)
        assert discovery.reads == 1
        assert [c.uuid for c in agent.cards()] == [c.uuid for c in facts.cards]
    finally:
        agent.stop()
    agent = _agent(root, discovery=discovery)
    try:
        agent.start()  # none given: it reads them
        assert discovery.reads == 2
    finally:
        agent.stop()


def test_the_backstop_watches_unless_it_is_turned_off(root: Path) -> None:
    for mode, watching in [(BackstopMode.KILL, True), (BackstopMode.WARN, True),
                           (BackstopMode.OFF, False)]:  # fmt: skip
        agent = _agent(root, backstop=mode)
        try:
            agent.start()
            # Named for a thread dump; daemons, so that a stuck loop cannot hold the
            # process at exit.
            loops = {t.name: t.daemon for t in threading.enumerate() if t.name.startswith("agent-")}
            backstop = {"agent-backstop": True} if watching else {}
            assert loops == {"agent-health": True, "agent-cleanup": True, **backstop}, mode
        finally:
            agent.stop()
        assert "agent-backstop" not in {t.name for t in threading.enumerate()}


def test_a_claims_label_it_cannot_read_is_a_start_error(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kube = FakeKube()  # --claims-cards "" (the chart's default) reads the node's label
    told = _start_fails(_agent(root, kube=kube, claims_cards=""))
    assert told == (
        "reading node node-a's tessera.io/claims-cards label: 404 NotFound: "
        'nodes "node-a" not found'
    )
    kube.create(NODES, {"metadata": {"name": NODE}})
    kube.fail_next("get", Unavailable(0, "Unavailable", "connection refused"))
    told = _start_fails(_agent(root, kube=kube, claims_cards=""))
    assert told.endswith("label: 0 Unavailable: connection refused"), told
    agent = _agent(root, kube=kube, claims_cards="")  # the node there, no label: no claims
    caplog.clear()
    try:
        agent.start()
        assert agent.claim_cards == frozenset()
    finally:
        agent.stop()
    # No label is "none", not a bad label: nothing to tell the operator.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_card_in_mig_mode_is_named_and_not_served(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=AGENT_LOG)
    facts = NodeFacts(cards=CARDS, driver_version="550.54", mig_enabled=frozenset({CARDS[1].uuid}))
    agent = _agent(root, slots_per_card=6)
    try:
        agent.start(facts)
        # The other card is served, with the slots the flag advertises.
        assert [(c.uuid, c.slots) for c in agent.cards()] == [(CARDS[0].uuid, 6)]
        assert agent.allocator is not None and agent.plugin is not None
        assert [c.uuid for c in agent.plugin.cards] == [CARDS[0].uuid]
    finally:
        agent.stop()
    assert (
        logged(caplog, AGENT_LOG)[0]
        == f"cards in MIG mode are not shared by Tessera yet: ['{CARDS[1].uuid}']"
    )


class FailingOnce(FakeDiscovery):
    """Cards whose first event wait fails, as a driver call may once."""

    def __init__(self) -> None:
        super().__init__(CARDS)
        self.waits = 0

    def wait_events(self, timeout_s: float) -> list[XidEvent]:
        self.waits += 1
        if self.waits == 1:
            raise RuntimeError("the driver went away")
        return super().wait_events(timeout_s)


def test_the_health_and_backstop_loops_tick_and_outlive_a_failing_turn(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ticks: list[float] = []

    def tick(self: Backstop) -> list[object]:
        ticks.append(time.monotonic())
        if len(ticks) == 1:
            raise RuntimeError("NVML said no")
        return []

    monkeypatch.setattr(Backstop, "tick", tick)
    discovery = FailingOnce()
    agent = _agent(root, discovery=discovery, health_interval_s=0.05, backstop_interval_s=0.05)
    try:
        agent.start()
        deadline = time.monotonic() + 5
        while (len(ticks) < 3 or discovery.waits < 3) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        agent.stop()
    assert len(ticks) >= 3 and discovery.waits >= 3
    failed = [(r.getMessage(), r.exc_info is not None) for r in caplog.records
              if r.name == AGENT_LOG and r.levelno == logging.ERROR]  # fmt: skip
    assert sorted(failed) == [("backstop loop", True), ("health loop", True)]


def test_metrics_show_the_backstops_actions_and_serve_with_it_turned_off(root: Path) -> None:
    """Also: the driver's versions in tessera_agent_info, "unknown" where NVML said none."""
    runs = [(BackstopMode.KILL, "fake-0.0", "12.4"), (BackstopMode.OFF, "", "")]
    for mode, driver, cuda in runs:
        found = FakeDiscovery(CARDS, driver_version=driver, cuda_version=cuda)
        agent = _agent(root, discovery=found, backstop=mode, metrics_port=0,
                       metrics_address="127.0.0.1")  # fmt: skip
        try:
            agent.start()
            if agent.backstop is not None:
                agent.backstop.actions[("team/p", "main", "killed")] += 2
            samples = scrape(agent)
        finally:
            agent.stop()
        actions = "tessera_container_backstop_actions_total"
        if agent.backstop is not None:
            assert one(samples, actions, node=NODE, namespace="team", pod="p", container="main",
                       action="killed") == 2  # fmt: skip
        else:
            assert not [name for name, _ in samples if name == actions]
        versions = {"driver_version": driver or "unknown", "cuda_version": cuda or "unknown"}
        assert one(samples, "tessera_agent_info", isolation="hook", **versions) == 1
