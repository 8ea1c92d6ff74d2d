"""The node agent against the test kubelet, over the real v1beta1 gRPC protocol.

Everything runs in-process on unix sockets in a short temporary folder: the fake
discovery backend, in-memory pods (the API server's part), the agent's real wiring, and
``KubeletDouble`` (registration, ListAndWatch, GetPreferredAllocation, Allocate,
PreStartContainer, pod-resources List, restart).
"""

from __future__ import annotations

import logging
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from tessera.model import annotations
from tessera.model.annotations import decode_inventory, encode_assignment
from tessera.model.clusterspec import make_cards
from tessera.model.types import Assignment, CardSlice, ComputePolicy, ContainerAssignment
from tessera.node.agent import Agent, AgentConfig
from tessera.node.cards.fake import FakeDiscovery
from tessera.node.deviceplugin.v1beta1 import api_pb2 as pb
from tessera.node.deviceplugin.v1beta1 import api_pb2_grpc as pbg
from tessera.node.fakes import MemoryEvents, MemoryNode, MemoryPods
from tessera.node.formats.allowance import decode_allowance
from tessera.node.formats.layout import CONTAINER_ETC_DIR, LD_SO_PRELOAD, Layout
from tessera.node.formats.limits import decode_limits, limits_for
from tessera.node.formats.usage import CardTotals, encode_region
from tessera.node.isolation import FakeMps, Isolation, MpsSupervisor, Visibility
from tessera.node.kubelet.podresources import PodResourcesClient
from tessera.node.ports import PodResourcesView
from tests._logs import logged
from tests.integration.agent_metrics import one, probe, scrape
from tests.integration.kubelet_double import AdmissionError, KContainer, KPod, KubeletDouble
from tests.unit._wait import eventually

NODE = "node-a"
AGENT_LOG = "tessera.node.agent"
RES = "tessera.io/gpu"
SLOTS = 8
CARDS = make_cards(NODE, 2, "A100")
U0, U1 = CARDS[0].uuid, CARDS[1].uuid
BURST = ComputePolicy.BURST_SHARE


class SwitchablePodResources:
    """pod-resources that a test can turn off (kubelet without the API, or a blip)."""

    def __init__(self, inner: PodResourcesClient) -> None:
        self.inner = inner
        self.on = True

    def view(self) -> PodResourcesView | None:
        return self.inner.view() if self.on else None


@dataclass
class Env:
    root: Path
    discovery: FakeDiscovery
    pods: MemoryPods
    events: MemoryEvents
    node: MemoryNode
    podres: SwitchablePodResources
    agent: Agent
    kubelet: KubeletDouble
    lib: Path

    def new_agent(self, lib: Path | None = None, **cfg: object) -> Agent:
        self.discovery = FakeDiscovery(CARDS)
        self.agent = make_agent(self, lib or self.lib, **cfg)
        return self.agent

    def restart_agent(self, lib: Path | None = None, **cfg: object) -> Agent:
        """Stop the agent and start a new one with ``cfg``; back once kubelet has heard
        from it and has every slot again."""
        registered = len(self.kubelet.registrations)
        self.agent.stop()
        self.new_agent(lib, **cfg).start()
        self.kubelet.wait(lambda: len(self.kubelet.registrations) > registered, timeout=5)
        self.kubelet.wait_devices(len(CARDS) * SLOTS)
        return self.agent


def make_agent(env: Env, lib: Path, **cfg: object) -> Agent:
    config = AgentConfig(
        node=NODE,
        resource=RES,
        plugin_dir=env.root / "dp",
        state_dir=env.root / "state",
        slots_per_card=SLOTS,
        libvgpu=lib,
        recovery_s=0.3,
        health_interval_s=0.05,
    )  # cleanup at its production defaults: slots are reused long before it runs
    for k, v in cfg.items():
        setattr(config, k, v)
    return Agent(config, env.discovery, env.pods, env.events, env.node, env.podres)


@pytest.fixture
def env() -> Iterator[Env]:
    # unix socket paths are limited to 107 bytes: a short folder, not pytest's tmp_path.
    root = Path(tempfile.mkdtemp(prefix="ts-dp-", dir="/tmp"))
    lib = root / "libvgpu-1.so"
    lib.write_bytes(b"\x7fELF fake libvgpu v1")
    kubelet = KubeletDouble(root / "dp", root / "pr" / "kubelet.sock", RES, seed=1)
    kubelet.start()
    e = Env(
        root=root,
        discovery=FakeDiscovery(CARDS),
        pods=MemoryPods(RES, frozenset(c.uuid for c in CARDS)),
        events=MemoryEvents(),
        node=MemoryNode(),
        podres=SwitchablePodResources(PodResourcesClient(root / "pr" / "kubelet.sock", RES)),
        agent=None,  # type: ignore[arg-type]
        kubelet=kubelet,
        lib=lib,
    )
    e.agent = make_agent(e, lib)
    e.agent.start()
    kubelet.wait_devices(len(CARDS) * SLOTS)
    yield e
    e.agent.stop()
    kubelet.stop()
    shutil.rmtree(root, ignore_errors=True)


# --- pods ---------------------------------------------------------------------------


def pod_obj(
    name: str,
    containers: list[tuple[str, list[tuple[str, int, int]]]],
    created: int,
    node: str = NODE,
    init: tuple[str, ...] = (),
    annotation: str | None = None,
    policy: ComputePolicy = ComputePolicy.FIXED_SHARE,
) -> tuple[dict[str, object], KPod, Assignment]:
    """A bound Pod dict with its assignment; ``containers``: (name, [(uuid, MiB, cores)])."""
    assignment = Assignment(
        node=node,
        containers=tuple(
            ContainerAssignment(
                name=cname,
                slices=tuple(CardSlice(u, m, c) for u, m, c in slices),
                policy=policy,
                init=cname in init,
            )
            for cname, slices in containers
        ),
    )
    text = encode_assignment(assignment) if annotation is None else annotation
    spec_containers = [
        {"name": cname, "resources": {"limits": {RES: str(len(slices))}}}
        for cname, slices in containers
        if cname not in init
    ]
    spec_init = [
        {"name": cname, "resources": {"limits": {RES: str(len(slices))}}}
        for cname, slices in containers
        if cname in init
    ]
    uid = f"uid-{name}"
    obj: dict[str, object] = {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": uid,
            "creationTimestamp": f"2026-11-21T10:{created // 60:02d}:{created % 60:02d}Z",
            "annotations": {annotations.ASSIGNMENT: text} if text else {},
        },
        "spec": {"nodeName": NODE, "containers": spec_containers, "initContainers": spec_init},
        "status": {"phase": "Pending"},
    }
    kpod = KPod(
        "default",
        name,
        uid,
        [KContainer(cname, len(slices), cname in init) for cname, slices in containers],
    )
    return obj, kpod, assignment


def check_started(env: Env, started: list, assignment: Assignment) -> None:
    """Every container's visible cards and limits file equal its assignment."""
    by_name = {c.name: c for c in assignment.containers}
    assert {s.container for s in started} == set(by_name)
    for s in started:
        ca = by_name[s.container]
        uuids = [x.uuid for x in ca.slices]
        assert s.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)
        assert sorted(d.split("::")[0] for d in s.devices) == sorted(uuids)
        etc = s.mount(CONTAINER_ETC_DIR)
        assert etc.read_only
        limits = decode_limits((Path(etc.host_path) / "limits").read_text())
        assert limits == limits_for(ca, card_order=uuids)
        preload = s.mount(LD_SO_PRELOAD)
        assert preload.read_only
        assert Path(preload.host_path).read_text() == "/usr/local/tessera/lib/libvgpu.so\n"
        # Limits travel only in the read-only file, never in the environment.
        assert not any("MEM" in k or "CORE" in k or "LIMIT" in k for k in s.envs)


# --- tests --------------------------------------------------------------------------


def test_registers_and_lists_slots_with_health_and_numa(env: Env) -> None:
    k = env.kubelet
    assert len(k.registrations) == 1
    assert env.agent.metrics is not None
    registered = {"node": NODE, "plugin": "device-plugin"}
    registry = env.agent.metrics.registry  # set once Register has returned to the agent
    eventually(lambda: registry.get_sample_value("tessera_agent_registered", registered) == 1)
    assert set(k.devices.values()) == {"Healthy"}
    assert sorted(k.devices) == sorted(f"{c.uuid}::{i}" for c in CARDS for i in range(SLOTS))
    assert k.topology[f"{U0}::0"] == [CARDS[0].numa_node]
    assert env.kubelet.endpoint is not None
    opts = env.kubelet.endpoint.options
    assert opts.get_preferred_allocation_available and opts.pre_start_required
    inv = decode_inventory(NODE, env.node.text or "", 0, 0)
    assert [c.uuid for c in inv.cards] == [U0, U1] and all(c.healthy for c in inv.cards)
    assert len(env.node.patches) == 1


def test_published_inventory_carries_the_slots_per_card(env: Env) -> None:
    """Placement reads the slot count from the inventory: it must be the agent's flag."""
    assert SLOTS != 16  # not the codec's default, so the assertion sees the flag
    inv = decode_inventory(NODE, env.node.text or "", 0, 0)
    assert [c.slots for c in inv.cards] == [SLOTS] * len(CARDS)
    env.agent.stop()
    env.new_agent(slots_per_card=3).start()
    inv = decode_inventory(NODE, env.node.text or "", 0, 0)
    assert [c.slots for c in inv.cards] == [3] * len(CARDS)


def test_concurrent_pending_pods_with_different_slices_of_one_card(env: Env) -> None:
    # Six pods pending on the node at once, all bound before kubelet admits any, four of
    # them holding different slices of card 0. kubelet admits them in an order that is
    # not creation order (pods reach it in different batches).
    specs = [
        ("p0", [("main", [(U0, 1000, 10)])]),
        ("p1", [("main", [(U0, 2000, 20)])]),
        ("p2", [("main", [(U0, 3000, 30)])]),
        ("p3", [("main", [(U0, 4000, 15)])]),
        ("p4", [("main", [(U1, 5000, 50)])]),
        ("p5", [("main", [(U0, 6000, 5), (U1, 7000, 5)])]),
    ]
    made = [pod_obj(n, c, created=i) for i, (n, c) in enumerate(specs)]
    for obj, _, _ in made:
        env.pods.put(obj)
    order = [3, 0, 5, 2, 4, 1]
    for i in order:
        _, kpod, assignment = made[i]
        check_started(env, env.kubelet.run(kpod), assignment)
    assert env.agent.allocator is not None and env.agent.allocator.corrections == 0
    assert env.events.events == []


def test_admission_in_creation_order_without_pod_resources(env: Env) -> None:
    env.podres.on = False
    made = [
        pod_obj(f"q{i}", [("main", [(U0, 1000 * (i + 1), 10 + i)])], created=i) for i in range(4)
    ]
    for obj, _, _ in made:
        env.pods.put(obj)
    for _, kpod, assignment in made:
        check_started(env, env.kubelet.run(kpod), assignment)


def test_prestart_corrects_a_wrong_guess(env: Env) -> None:
    # pod-resources is down at Allocate time, so the agent guesses by creation order
    # (r0, the older); kubelet is in fact admitting r1. PreStartContainer asks
    # pod-resources again and rewrites the limits file before the container starts.
    r0 = pod_obj("r0", [("main", [(U0, 1111, 11)])], created=0)
    r1 = pod_obj("r1", [("main", [(U0, 2222, 22)])], created=1)
    env.pods.put(r0[0])
    env.pods.put(r1[0])
    env.podres.on = False
    env.kubelet.admit(r1[1])
    env.podres.on = True
    started = env.kubelet.start_containers(r1[1])
    check_started(env, started, r1[2])
    assert env.agent.metrics is not None
    registry = env.agent.metrics.registry
    assert registry.get_sample_value("tessera_agent_match_corrections_total", {"node": NODE}) == 1
    check_started(env, env.kubelet.run(r0[1]), r0[2])


def test_concurrent_allocate_calls_each_get_their_own_pod(env: Env) -> None:
    # No lock spans calls: eight Allocate calls race from threads, each for a different
    # pod (unique cards per pod on a wider node), and each gets its own assignment.
    env.agent.stop()
    env.kubelet.stop()
    wide = make_cards(NODE, 8, "A100")
    env.discovery = FakeDiscovery(wide)
    env.pods = MemoryPods(RES, frozenset(c.uuid for c in wide))
    env.podres.on = False
    env.agent = make_agent(env, env.lib)
    env.agent.discovery = env.discovery
    env.agent.pods = env.pods
    env.agent.start()
    made = [
        pod_obj(f"c{i}", [("main", [(wide[i].uuid, 500 + i, 10)])], created=i) for i in range(8)
    ]
    for obj, _, _ in made:
        env.pods.put(obj)
    results: dict[str, pb.AllocateResponse] = {}
    errors: list[Exception] = []
    sock = f"unix://{env.agent.plugin.socket_path}" if env.agent.plugin else ""

    def call(i: int) -> None:
        with grpc.insecure_channel(sock) as ch:
            stub = pbg.DevicePluginStub(ch)
            try:
                results[f"c{i}"] = stub.Allocate(
                    pb.AllocateRequest(
                        container_requests=[
                            pb.ContainerAllocateRequest(
                                devices_ids=[f"{wide[i].uuid}::{i % SLOTS}"]
                            )
                        ]
                    )
                )
            except grpc.RpcError as exc:  # pragma: no cover - reported below
                errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in random.sample(range(8), 8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i in range(8):
        resp = results[f"c{i}"].container_responses[0]
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == wide[i].uuid
        etc = next(m for m in resp.mounts if m.container_path == CONTAINER_ETC_DIR)
        assert decode_limits((Path(etc.host_path) / "limits").read_text()).cards[0].memory_mib == (
            500 + i
        )


def test_init_container_devices_are_reused_by_the_app_container(env: Env) -> None:
    obj, kpod, assignment = pod_obj(
        "i0",
        [("setup", [(U1, 1000, 10)]), ("main", [(U1, 3000, 30)])],
        created=0,
        init=("setup",),
    )
    env.pods.put(obj)
    check_started(env, env.kubelet.run(kpod), assignment)


def test_lagging_watch_is_covered_by_a_fresh_read(env: Env) -> None:
    env.pods.lagging = True
    obj, kpod, assignment = pod_obj("lag", [("main", [(U0, 1234, 12)])], created=0)
    env.pods.put(obj)
    assert env.pods.pods() == []
    check_started(env, env.kubelet.run(kpod), assignment)
    assert env.pods.refreshes >= 1


def test_kubelet_restart_reregisters_and_keeps_allocations(env: Env) -> None:
    a = pod_obj("k0", [("main", [(U0, 1000, 10)])], created=0)
    env.pods.put(a[0])
    check_started(env, env.kubelet.run(a[1]), a[2])
    t0 = time.monotonic()
    env.kubelet.restart()
    env.kubelet.wait_devices(len(CARDS) * SLOTS, timeout=5)
    assert env.kubelet.registrations[-1] - t0 < 2.0
    # The pod admitted before the restart still holds its slots; new pods get others.
    b = pod_obj("k1", [("main", [(U0, 2000, 20)])], created=1)
    env.pods.put(b[0])
    started = env.kubelet.run(b[1])
    check_started(env, started, b[2])
    assert set(started[0].devices).isdisjoint(env.kubelet.pod_devices[(a[1].uid, "main")])


def test_a_kubelet_back_under_the_plugins_socket_is_registered_with_once_it_answers(
    env: Env,
) -> None:
    """A new kubelet.sock with the plugin's own socket still there: the agent sees the new
    kubelet by its socket, and keeps asking while the new kubelet refuses."""
    plugin = env.agent.plugin
    assert plugin is not None
    before = plugin.registrations
    env.kubelet.refuse_registers = 3
    env.kubelet.restart(clear=False)
    env.kubelet.wait_devices(len(CARDS) * SLOTS, timeout=5)
    assert env.kubelet.refuse_registers == 0
    assert plugin.register_failures == 3 and plugin.registrations == before + 1


def test_the_burst_coordinator_runs_with_a_period_and_not_at_zero(env: Env) -> None:
    assert env.agent.coordinator is not None  # the hook backend's default: on
    env.agent.stop()
    env.new_agent(coordinator_period_s=0).start()
    assert env.agent.coordinator is None


def test_agent_restart_in_the_middle_loses_nothing(env: Env) -> None:
    a = pod_obj("g0", [("main", [(U0, 1000, 10)])], created=0)
    b = pod_obj("g1", [("main", [(U0, 2000, 20)])], created=1)
    env.pods.put(a[0])
    env.pods.put(b[0])
    env.kubelet.admit(a[1])  # allocated, not started yet
    env.restart_agent()
    check_started(env, env.kubelet.start_containers(a[1]), a[2])
    check_started(env, env.kubelet.run(b[1]), b[2])
    # The restarted agent found the node's inventory unchanged: no second patch.
    assert len(env.node.patches) == 1


def test_library_upgrade_does_not_swap_the_library_under_running_pods(env: Env) -> None:
    a = pod_obj("v0", [("main", [(U0, 1000, 10)])], created=0)
    env.pods.put(a[0])
    old = env.kubelet.run(a[1])[0].mount("/usr/local/tessera/lib").host_path
    lib2 = env.root / "libvgpu-2.so"
    lib2.write_bytes(b"\x7fELF fake libvgpu v2")
    env.restart_agent(lib=lib2, cleanup_grace_s=0.0)
    b = pod_obj("v1", [("main", [(U1, 1000, 10)])], created=1)
    env.pods.put(b[0])
    new = env.kubelet.run(b[1])[0].mount("/usr/local/tessera/lib").host_path
    assert new != old
    assert (Path(old) / "libvgpu.so").read_bytes() == b"\x7fELF fake libvgpu v1"
    assert (Path(new) / "libvgpu.so").read_bytes() == b"\x7fELF fake libvgpu v2"
    allocator = env.agent.allocator
    assert allocator is not None
    allocator.cleanup(grace_s=0.0)
    assert Path(old).exists()  # v0 still runs on it
    env.pods.delete(a[1].uid)
    env.kubelet.remove(a[1])
    allocator.cleanup(grace_s=0.0)
    assert not Path(old).exists() and Path(new).exists()


def test_cleanup_removes_folders_of_gone_containers_only(env: Env) -> None:
    a = pod_obj("d0", [("main", [(U0, 1000, 10)])], created=0)
    b = pod_obj("d1", [("main", [(U1, 1000, 10)])], created=1)
    for p in (a, b):
        env.pods.put(p[0])
    sa = env.kubelet.run(a[1])[0]
    sb = env.kubelet.run(b[1])[0]
    env.pods.delete(a[1].uid)
    env.kubelet.remove(a[1])
    assert env.agent.allocator is not None
    removed = env.agent.allocator.cleanup(grace_s=0.0)
    assert len(removed) == 1
    assert not Path(sa.mount(CONTAINER_ETC_DIR).host_path).exists()
    assert Path(sb.mount(CONTAINER_ETC_DIR).host_path).exists()


def test_the_resource_endpoint_and_visibility_flags_reach_kubelet_and_the_container(
    env: Env,
) -> None:
    env.restart_agent(endpoint="vgpu.sock", visibility=Visibility.CDI)
    assert (env.root / "dp" / "vgpu.sock").exists() and not (
        env.root / "dp" / "tessera.sock"
    ).exists()
    obj, kpod, _ = pod_obj("vis", [("main", [(U1, 1000, 10)])], created=0)
    env.pods.put(obj)
    (s,) = env.kubelet.run(kpod)
    assert [d.name for d in s.response.cdi_devices] == [f"nvidia.com/gpu={U1}"]
    assert "NVIDIA_VISIBLE_DEVICES" not in s.envs
    # Registered under another resource name, it does not serve pods asking for ours.
    env.restart_agent(resource="example.com/vgpu")
    obj, kpod, _ = pod_obj("other", [("main", [(U0, 1000, 10)])], created=1)
    env.pods.put(obj)
    with pytest.raises(AdmissionError, match=f"cannot allocate unregistered device {RES}"):
        env.kubelet.run(kpod)


def test_the_cleanup_loop_removes_a_gone_containers_folder_on_its_own(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """The loop, not a test's call: every cleanup_interval_s, past cleanup_grace_s."""
    caplog.set_level(logging.INFO, logger=AGENT_LOG)
    env.restart_agent(cleanup_interval_s=0.05, cleanup_grace_s=0.5)
    a = pod_obj("l0", [("main", [(U0, 1000, 10)])], created=0)
    env.pods.put(a[0])
    folder = Path(env.kubelet.run(a[1])[0].mount(CONTAINER_ETC_DIR).host_path)
    env.pods.delete(a[1].uid)
    env.kubelet.remove(a[1])
    told = "removed the folders of 1 gone container(s)"
    deadline = time.monotonic() + 5
    while (
        folder.exists() or told not in logged(caplog, AGENT_LOG)
    ) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not folder.exists() and told in logged(caplog, AGENT_LOG)


# --- bad input ----------------------------------------------------------------------


def _stub(env: Env) -> pbg.DevicePluginStub:
    assert env.agent.plugin is not None
    return pbg.DevicePluginStub(grpc.insecure_channel(f"unix://{env.agent.plugin.socket_path}"))


def test_unknown_device_ids_are_refused_with_their_names(env: Env) -> None:
    with pytest.raises(grpc.RpcError) as info:
        _stub(env).Allocate(
            pb.AllocateRequest(
                container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=["nvidia0", f"{U0}::{SLOTS}"])
                ]
            )
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "nvidia0" in info.value.details() and f"{U0}::{SLOTS}" in info.value.details()


def test_pod_without_assignment_is_rejected_with_an_event(env: Env) -> None:
    obj, kpod, _ = pod_obj("n0", [("main", [(U0, 1000, 10)])], created=0, annotation="")
    env.pods.put(obj)
    with pytest.raises(AdmissionError) as info:
        env.kubelet.run(kpod)
    assert info.value.status == grpc.StatusCode.FAILED_PRECONDITION
    assert "default/n0" in str(info.value) and annotations.ASSIGNMENT in str(info.value)
    assert env.events.for_pod("default/n0")


def test_malformed_assignment_is_rejected_with_an_event(env: Env) -> None:
    obj, kpod, _ = pod_obj("m0", [("main", [(U0, 1000, 10)])], created=0, annotation="{oops")
    env.pods.put(obj)
    with pytest.raises(AdmissionError) as info:
        env.kubelet.run(kpod)
    assert "not valid JSON" in str(info.value)
    (event,) = env.events.for_pod("default/m0")
    assert "not valid JSON" in event[2]


def test_stale_assignment_is_rejected_and_other_pods_still_run(env: Env) -> None:
    stale = pod_obj("s0", [("main", [(U0, 1000, 10)])], created=0, node="node-b")
    good = pod_obj("s1", [("main", [(U0, 1000, 10)])], created=1)
    env.pods.put(stale[0])
    env.pods.put(good[0])
    with pytest.raises(AdmissionError) as info:
        env.kubelet.run(stale[1])
    assert "stale" in str(info.value) and "node-b" in str(info.value)
    assert env.events.for_pod("default/s0")
    check_started(env, env.kubelet.run(good[1]), good[2])


# --- health -------------------------------------------------------------------------


def test_xid_takes_a_card_out_and_it_comes_back_when_quiet(env: Env) -> None:
    k = env.kubelet
    env.discovery.inject_xid(U0, 13)  # an application fault: the card is fine
    time.sleep(0.2)
    assert k.health_of(U0) == {"Healthy"}
    env.discovery.set_probe(U0, False)
    env.discovery.inject_xid(U0, 79)  # fell off the bus
    assert k.wait(lambda: k.health_of(U0) == {"Unhealthy"}, timeout=3)
    assert k.health_of(U1) == {"Healthy"}
    inv = decode_inventory(NODE, env.node.text or "", 0, 0)
    assert [c.healthy for c in inv.cards] == [False, True]
    time.sleep(0.6)  # quiet, but the probe still fails: stays out
    assert k.health_of(U0) == {"Unhealthy"}
    env.discovery.set_probe(U0, True)
    assert k.wait(lambda: k.health_of(U0) == {"Healthy"}, timeout=3)
    inv = decode_inventory(NODE, env.node.text or "", 0, 0)
    assert all(c.healthy for c in inv.cards)


def test_an_xid_alone_takes_a_card_out_for_its_quiet_period(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    # The probe answers throughout: only the XID can take the card out, and the quiet
    # period (recovery_s) with a good probe brings it back.
    caplog.set_level(logging.WARNING, logger=AGENT_LOG)
    k = env.kubelet
    env.discovery.inject_xid(U0, 79)
    assert k.wait(lambda: k.health_of(U0) == {"Unhealthy"}, timeout=3)
    assert k.health_of(U1) == {"Healthy"}
    assert k.wait(lambda: k.health_of(U0) == {"Healthy"}, timeout=3)
    assert logged(caplog, AGENT_LOG) == [
        f"card {U0} is Unhealthy (XID 79)",
        f"card {U0} is Healthy again",
    ]


# --- MPS backend --------------------------------------------------------------------


def _mps_agent(env: Env) -> FakeMps:
    env.agent.stop()
    mps = FakeMps()
    env.discovery = FakeDiscovery(CARDS)
    env.agent = make_agent(env, env.lib, isolation=Isolation.MPS)
    env.agent.mps = MpsSupervisor(mps)
    env.agent.discovery = env.discovery
    env.agent.start()
    env.kubelet.wait(lambda: len(env.kubelet.registrations) >= 2, timeout=5)
    env.kubelet.wait_devices(len(CARDS) * SLOTS)
    return mps


def test_mps_backend_gives_per_client_limits_and_keeps_the_daemon_up(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=AGENT_LOG)
    mps = _mps_agent(env)
    assert mps.starts == 1
    assert env.agent.coordinator is None  # burst-share lending is the hook backend's
    obj, kpod, _ = pod_obj("m", [("main", [(U0, 4096, 25), (U1, 4096, 25)])], created=0)
    env.pods.put(obj)
    (s,) = env.kubelet.run(kpod)
    assert s.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert s.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M,1=4096M"
    assert s.mount("/tmp/nvidia-mps").host_path == str(env.root / "state" / "mps" / "pipe")
    mps.crash()
    deadline = time.monotonic() + 3
    while (mps.starts < 2 or not logged(caplog, AGENT_LOG)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert mps.running() and env.agent.mps.restarts == 1
    assert logged(caplog, AGENT_LOG) == ["MPS control daemon was down; restarted"]


@pytest.mark.parametrize("same_slice", [True, False])
def test_under_mps_a_wrong_guess_is_corrected_only_when_the_settings_agree(
    env: Env, same_slice: bool
) -> None:
    # As in test_prestart_corrects_a_wrong_guess, Allocate guesses r0 while kubelet
    # admits r1. MPS limits are environment variables, fixed at Allocate: PreStart can
    # rewrite nothing, so it lets the container start only if r0's settings are r1's.
    _mps_agent(env)
    r0 = pod_obj("r0", [("main", [(U0, 2222, 22)])], created=0)
    r1 = pod_obj("r1", [("main", [(U0, 2222 if same_slice else 1111, 22)])], created=1)
    env.pods.put(r0[0])
    env.pods.put(r1[0])
    env.podres.on = False
    env.kubelet.admit(r1[1])
    env.podres.on = True
    if same_slice:
        (s,) = env.kubelet.start_containers(r1[1])
        assert s.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2222M"
        assert env.agent.allocator is not None and env.agent.allocator.corrections == 1
        return
    with pytest.raises(grpc.RpcError) as err:
        env.kubelet.start_containers(r1[1])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "got the MPS settings of default/r0/main" in (err.value.details() or "")


def test_app_container_reusing_init_slots_on_other_cards_is_refused(env: Env) -> None:
    # kubelet gives the app container the init container's slot (card 1), but its
    # assignment says card 0: a clear error, not the init container's limits.
    obj, kpod, _ = pod_obj(
        "bad-init",
        [("setup", [(U1, 1000, 10)]), ("main", [(U0, 3000, 30)])],
        created=0,
        init=("setup",),
    )
    env.pods.put(obj)
    with pytest.raises(AdmissionError) as info:
        env.kubelet.run(kpod)
    assert "'main'" in str(info.value) and "'setup'" in str(info.value)
    assert env.events.for_pod("default/bad-init")


def test_inventory_patch_that_failed_is_retried(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger=AGENT_LOG)
    calls = {"n": 0}
    real = env.node.set_inventory

    def flaky(node: str, text: str) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("API server away")
        real(node, text)

    env.node.set_inventory = flaky  # type: ignore[method-assign]
    env.discovery.set_utilization(U0, 37.0)
    env.discovery.set_probe(U1, False)
    env.discovery.inject_xid(U1, 79)
    deadline = time.monotonic() + 3
    while calls["n"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    inv = decode_inventory(NODE, env.node.text or "", 0, 0)
    assert [c.healthy for c in inv.cards] == [True, False]
    assert logged(caplog, AGENT_LOG) == [f"could not patch the inventory of {NODE}; will retry"]


def test_agent_restart_between_preferred_and_allocate(env: Env) -> None:
    # kubelet asked for a preference, then the agent restarted before Allocate: the new
    # agent has no memory of the preference and matches the slots by their cards.
    a = pod_obj("h0", [("main", [(U0, 1000, 10)])], created=0)
    b = pod_obj("h1", [("main", [(U1, 2000, 20)])], created=1)
    env.pods.put(a[0])
    env.pods.put(b[0])
    k = env.kubelet
    k.pod_manager[b[1].uid] = b[1]  # kubelet is admitting h1 (it is in its pod manager)
    avail = sorted(i for i, h in k.devices.items() if h == "Healthy")
    pref = _stub(env).GetPreferredAllocation(
        pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(available_deviceIDs=avail, allocation_size=1)
            ]
        )
    )
    ids = list(pref.container_responses[0].deviceIDs)
    assert [i.split("::")[0] for i in ids] == [U1]
    env.agent.stop()
    env.new_agent().start()
    k.wait(lambda: len(k.registrations) >= 2, timeout=5)
    k.wait_devices(len(CARDS) * SLOTS)
    resp = _stub(env).Allocate(
        pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
    )
    # Matched from the cards alone until kubelet's pod-resources confirms it at PreStart.
    assert [r.confirmed for r in Layout(env.root / "state").read_allocs()] == [False]
    k.pod_devices[(b[1].uid, "main")] = ids
    _stub(env).PreStartContainer(pb.PreStartContainerRequest(devices_ids=ids))
    assert [r.confirmed for r in Layout(env.root / "state").read_allocs()] == [True]
    etc = next(
        m for m in resp.container_responses[0].mounts if m.container_path == CONTAINER_ETC_DIR
    )
    limits = decode_limits((Path(etc.host_path) / "limits").read_text())
    assert limits == limits_for(b[2].containers[0], card_order=[U1])


def test_preference_keeps_the_slots_kubelet_must_include_and_the_lowest_free_elsewhere(
    env: Env,
) -> None:
    # kubelet hands an init container's slot on to the app container (must_include) and
    # asks for the rest: the answer keeps that slot, and on the other card takes the
    # lowest free slot, whatever order kubelet listed them in.
    obj, kpod, _ = pod_obj("m0", [("main", [(U0, 1000, 10), (U1, 1000, 10)])], created=0)
    env.pods.put(obj)
    env.kubelet.pod_manager[kpod.uid] = kpod
    must = f"{U0}::5"
    avail = [f"{u}::{k}" for u in (U0, U1) for k in (7, 3, 5, 2)]
    pref = _stub(env).GetPreferredAllocation(
        pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=avail, must_include_deviceIDs=[must], allocation_size=2
                )
            ]
        )
    )
    assert sorted(pref.container_responses[0].deviceIDs) == sorted([must, f"{U1}::2"])


def test_a_rejected_pod_still_listed_by_kubelet_is_not_mistaken_for_the_admitted_one(
    env: Env,
) -> None:
    x = pod_obj("x-rejected", [("main", [(U0, 1000, 10)])], created=0)
    y = pod_obj("y-admitted", [("main", [(U1, 2000, 20)])], created=1)
    env.pods.put(x[0])
    env.pods.put(y[0])
    # kubelet rejected x before calling the plugin; its pod manager still lists it, and
    # the agent's watch has not yet seen it Failed (the API server has).
    env.kubelet.pod_manager[x[1].uid] = x[1]
    env.pods.lagging = True
    failed = dict(x[0])
    failed["status"] = {"phase": "Failed"}
    env.pods.put(failed)
    check_started(env, env.kubelet.run(y[1]), y[2])
    assert env.agent.allocator is not None and env.agent.allocator.corrections == 0


# --- burst-share coordinator --------------------------------------------------------


def test_hosted_coordinator_lends_idle_compute_and_ignores_a_garbled_region(env: Env) -> None:
    a = pod_obj("burst", [("main", [(U0, 1000, 30)])], created=0, policy=BURST)
    b = pod_obj("fixed", [("main", [(U0, 1000, 40)])], created=1)
    c = pod_obj("garbled", [("main", [(U0, 1000, 10)])], created=2, policy=BURST)
    for p in (a, b, c):
        env.pods.put(p[0])
    dirs = {}
    for p in (a, b, c):
        (s,) = env.kubelet.run(p[1])
        dirs[p[1].name] = Path(s.mount("/var/run/tessera/usage").host_path).parent
    (dirs["garbled"] / "usage" / "region").write_bytes(b"not a region")
    allowance = dirs["burst"] / "allowance" / "allowance"
    busy = 0
    deadline = time.monotonic() + 10
    percent: dict[int, int] = {}
    while time.monotonic() < deadline:
        busy += 10**9  # the burst tenant is throttled all the time: it wants more
        region = encode_region(retired=(CardTotals(busy_ns=busy, throttled_ns=busy),))
        (dirs["burst"] / "usage" / "region").write_bytes(region)
        time.sleep(0.15)
        if allowance.exists():
            _, percent = decode_allowance(allowance.read_text())
            if percent.get(0, 0) > 30:
                break
    # 100 - 40 (fixed) - 30 (its own floor) = 30 spare, all lent to the hungry tenant.
    assert percent == {0: 60}
    assert env.agent.coordinator is not None and env.agent.coordinator.ticks > 0


def test_pod_with_two_gpu_containers_gets_each_its_own_slice(env: Env) -> None:
    obj, kpod, assignment = pod_obj(
        "two",
        [("trainer", [(U0, 8000, 60), (U1, 8000, 60)]), ("sidecar", [(U0, 1000, 5)])],
        created=0,
    )
    env.pods.put(obj)
    check_started(env, env.kubelet.run(kpod), assignment)


# --- lifecycles: slots reused at once ------------------------------------------------


def _finish(env: Env, made: tuple[dict[str, object], KPod, Assignment], how: str) -> None:
    """Pod ``made`` ends ``how``; kubelet frees its slots at once (cleanup has not run)."""
    obj, kpod, _ = made
    if how == "deleted":
        env.pods.delete(kpod.uid)
    else:
        env.pods.put({**obj, "status": {"phase": how}})
    env.kubelet.remove(kpod)


@pytest.mark.parametrize("how", ["Succeeded", "Failed", "deleted"])
@pytest.mark.parametrize("lagging", [False, True], ids=["watch-current", "watch-lagging"])
def test_a_slot_reused_at_once_carries_the_new_pods_limits(
    env: Env, how: str, lagging: bool
) -> None:
    a = pod_obj("reuse-a", [("main", [(U0, 10000, 20)])], created=0)
    env.pods.put(a[0])
    first = env.kubelet.run(a[1])
    check_started(env, first, a[2])
    env.pods.lagging = lagging  # the agent's watch may not show the end of A yet
    _finish(env, a, how)
    b = pod_obj("reuse-b", [("main", [(U0, 40000, 60)])], created=1)
    env.pods.put(b[0])
    second = env.kubelet.run(b[1])
    assert second[0].devices == first[0].devices  # kubelet handed B the slot A had
    check_started(env, second, b[2])
    assert (
        second[0].mount(CONTAINER_ETC_DIR).host_path != first[0].mount(CONTAINER_ETC_DIR).host_path
    )  # B's own folder: A's usage region is not B's
    assert env.events.events == []


def test_many_pods_through_one_slot_each_run_with_their_own_limits(env: Env) -> None:
    # A short-lived job after another on the same card, each ending before the next
    # starts: the lowest free slot is the same one every time.
    seen: set[str] = set()
    for i in range(6):
        made = pod_obj(f"job{i}", [("main", [(U1, 1000 * (i + 1), 5 * (i + 1))])], created=i)
        env.pods.put(made[0])
        started = env.kubelet.run(made[1])
        check_started(env, started, made[2])
        seen.update(started[0].devices)
        _finish(env, made, "Succeeded" if i % 2 else "deleted")
    assert len(seen) == 1


def test_a_restarted_container_keeps_its_limits(env: Env) -> None:
    a = pod_obj("restart", [("main", [(U0, 3000, 30)])], created=0)
    env.pods.put(a[0])
    check_started(env, env.kubelet.run(a[1]), a[2])
    # The container exits and kubelet starts it again: PreStartContainer, no Allocate.
    check_started(env, env.kubelet.start_containers(a[1]), a[2])
    check_started(env, env.kubelet.start_containers(a[1]), a[2])


def test_a_limits_file_deleted_under_a_running_container_is_restored_at_its_restart(
    env: Env,
) -> None:
    a = pod_obj("lost", [("main", [(U0, 3000, 30)])], created=0)
    b = pod_obj("bystander", [("main", [(U1, 2000, 20)])], created=1)
    env.pods.put(a[0])
    env.pods.put(b[0])
    sa = env.kubelet.run(a[1])[0]
    check_started(env, env.kubelet.run(b[1]), b[2])
    (Path(sa.mount(CONTAINER_ETC_DIR).host_path) / "limits").unlink()
    check_started(env, env.kubelet.start_containers(a[1]), a[2])
    [(key, reason, message)] = env.events.events
    assert key == "default/lost" and reason == "TesseraLimitsRestored"
    assert "limits file" in message and "main" in message
    check_started(env, env.kubelet.start_containers(b[1]), b[2])  # nothing else disturbed


def test_kubelet_asking_again_for_a_container_gets_its_answer_and_no_new_record(
    env: Env,
) -> None:
    a = pod_obj("long", [("main", [(U0, 1000, 10)])], created=0)
    env.pods.put(a[0])
    [started] = env.kubelet.run(a[1])
    stub = _stub(env)
    again = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=started.devices)]
    )
    answers = {stub.Allocate(again, timeout=10).SerializeToString() for _ in range(300)}
    assert len(answers) == 1  # a restart race gets the same answer every time
    assert env.agent.allocator is not None
    assert len(env.agent.allocator.ledger.records()) == 1  # and a long run no new records


def test_the_agents_context_charge_reaches_every_limits_file(env: Env) -> None:
    # --context-mib: libvgpu charges each CUDA context against the cap; the agent writes
    # the charge into the limits file of every container it starts.
    env.restart_agent(context_mib=300)
    obj, kpod, assignment = pod_obj("c0", [("main", [(U0, 4000, 20)])], created=0)
    env.pods.put(obj)
    started = env.kubelet.run(kpod)
    limits = decode_limits(
        (Path(started[0].mount(CONTAINER_ETC_DIR).host_path) / "limits").read_text()
    )
    ca = assignment.containers[0]
    assert limits == limits_for(ca, card_order=[U0], context_mib=300)


# --- exporter -----------------------------------------------------------------------


def test_readyz_follows_kubelets_registration_of_the_plugin(env: Env) -> None:
    env.restart_agent(metrics_port=0, metrics_address="127.0.0.1")
    eventually(lambda: probe(env.agent, "/readyz") == (200, "ok\n"))
    # A new kubelet that will not take the plugin for now: not ready, and counted.
    env.kubelet.refuse_registers = 10**6
    env.kubelet.restart(clear=False)
    waiting = (503, f"kubelet has not registered the device plugin {RES}\n")
    eventually(lambda: probe(env.agent, "/readyz") == waiting)
    assert probe(env.agent, "/healthz") == (200, "ok\n")  # alive all the same
    m = scrape(env.agent)
    assert one(m, "tessera_agent_registered", plugin="device-plugin") == 0
    assert one(m, "tessera_agent_registration_failures_total", plugin="device-plugin") >= 1
    env.kubelet.refuse_registers = 0
    eventually(lambda: probe(env.agent, "/readyz") == (200, "ok\n"))


def test_exporter_shows_cards_containers_and_calls_and_survives_a_bad_region(
    env: Env,
) -> None:
    env.restart_agent(metrics_port=0, metrics_address="127.0.0.1")
    a = pod_obj("ex-a", [("main", [(U0, 10000, 30)])], created=0)
    b = pod_obj("ex-b", [("main", [(U0, 6000, 20), (U1, 2000, 10)])], created=1)
    c = pod_obj("ex-c", [("main", [(U1, 1000, 5)])], created=2)
    regions = {}
    for p in (a, b, c):
        env.pods.put(p[0])
        (s,) = env.kubelet.run(p[1])
        regions[p[1].name] = Path(s.mount("/var/run/tessera/usage").host_path) / "region"
    from tessera.node.formats.usage import CardUsage, ProcessUsage

    live = ProcessUsage(0, 7, 1, (CardUsage(memory_bytes=3 << 30, launches=5, busy_ns=2 * 10**9),))
    regions["ex-a"].write_bytes(
        encode_region((live,), retired=(CardTotals(launches=10, refused_allocs=2),))
    )
    regions["ex-c"].write_bytes(b"TSVGPU\x00\x01 cut short")
    env.discovery.set_utilization(U0, 37.0)
    env.discovery.set_probe(U1, False)
    env.discovery.inject_xid(U1, 79)
    assert env.kubelet.wait(lambda: env.kubelet.health_of(U1) == {"Unhealthy"}, timeout=3)
    with pytest.raises(grpc.RpcError):
        _stub(env).Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["x"])])
        )

    m = scrape(env.agent)
    gib = 1 << 30
    mib = 1 << 20
    assert one(m, "tessera_card_memory_total_bytes", uuid=U0) == CARDS[0].memory_mib * mib
    assert one(m, "tessera_card_memory_allocated_bytes", uuid=U0) == 16000 * mib
    assert one(m, "tessera_card_memory_allocated_bytes", uuid=U1) == 3000 * mib
    assert one(m, "tessera_card_compute_allocated_percent", uuid=U0) == 50
    assert one(m, "tessera_card_memory_used_bytes", uuid=U0) == 3 * gib
    assert one(m, "tessera_card_slots_used", uuid=U0) == 2
    assert one(m, "tessera_card_slots", uuid=U0) == SLOTS
    assert one(m, "tessera_card_healthy", uuid=U0) == 1
    assert one(m, "tessera_card_utilization_percent", uuid=U0) == 37.0
    assert not [k for k in m if k[0] == "tessera_card_utilization_percent" and ("uuid", U1) in k[1]]
    assert one(m, "tessera_card_healthy", uuid=U1) == 0
    main_a = {"namespace": "default", "pod": "ex-a", "container": "main", "node": NODE}
    assert one(m, "tessera_container_memory_used_bytes", **main_a) == 3 * gib
    assert one(m, "tessera_container_memory_limit_bytes", **main_a) == 10000 * mib
    assert one(m, "tessera_container_compute_target_percent", **main_a) == 30
    assert one(m, "tessera_container_launches_total", **main_a) == 15
    assert one(m, "tessera_container_refused_allocations_total", **main_a) == 2
    assert one(m, "tessera_container_busy_seconds_total", **main_a) == 2.0
    assert one(m, "tessera_container_processes", **main_a) == 1
    # b's cards are listed one by one, each with its model.
    assert one(m, "tessera_container_memory_limit_bytes", pod="ex-b", uuid=U1) == 2000 * mib
    assert one(m, "tessera_container_memory_limit_bytes", pod="ex-b", model="A100", uuid=U0)
    # c's region is cut short: marked, its limits still shown, everything else served.
    assert one(m, "tessera_container_unreadable", pod="ex-c", file="usage_region") == 1
    assert one(m, "tessera_container_unreadable", pod="ex-c", problem="truncated") == 1
    assert one(m, "tessera_container_memory_limit_bytes", pod="ex-c") == 1000 * mib
    assert not [k for k in m if k[0] == "tessera_container_memory_used_bytes" and
                ("pod", "ex-c") in k[1]]  # fmt: skip
    assert not [k for k in m if k[0] == "tessera_container_unreadable" and ("pod", "ex-a") in k[1]]
    assert one(m, "tessera_agent_calls_total", call="Allocate", result="ok") == 3
    assert one(m, "tessera_agent_calls_total", call="Allocate", result="INVALID_ARGUMENT") == 1
    assert one(m, "tessera_agent_call_seconds_count", call="Allocate") == 4
    assert one(m, "tessera_agent_info", node=NODE, library=env.agent.allocator.lib_version,
               driver_version="fake-0.0", cuda_version="12.4") == 1  # fmt: skip
