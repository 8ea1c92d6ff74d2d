"""GPU pods on a real node: the real kubelet and containerd, placed by the real
kube-scheduler with Tessera's extender, their cards handed over by ``tessera node-agent``
through the device plugin protocol, and their slice enforced by libvgpu in the container
(over the fake driver, which sees exactly the cards the Allocate answer names).

One node for the whole module (starting it costs a few seconds); each test leaves no pod
behind.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.model import annotations
from tessera.model.annotations import decode_assignment, encode_assignment
from tessera.model.types import Assignment, CardSlice, ContainerAssignment
from tessera.testenv.process import free_port
from tessera.testenv.realnode import missing_prerequisites
from tests.e2e.realnode import (
    CARDS,
    NODE,
    PROBE,
    RealWorld,
    gpu_pod,
    probe_facts,
    scheduler_config,
)
from tests.e2e.wait import wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites())),
]


@pytest.fixture(scope="module")
def world(testenv_binaries: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealWorld]:
    from tessera.testenv import TestEnv

    port = free_port()
    env = TestEnv.start(
        tmp_path_factory.mktemp("realnode-cp"),
        binaries=testenv_binaries,
        scheduler_config=scheduler_config(port),
        controller_manager=False,
    )
    # Short: unix socket paths inside it (the agent's plugin socket is not, but the
    # node's containerd state is reached through /proc/<pid>/root).
    root = Path(tempfile.mkdtemp(prefix="ts-real-", dir="/tmp"))
    w: RealWorld | None = None
    try:
        w = RealWorld(env, root)
        w.start(port)
        yield w
    finally:
        if w is not None:
            w.stop()
        env.stop()
        shutil.rmtree(root, ignore_errors=True)  # the node's state, images and logs


def probe(world: RealWorld, name: str, memory: int, cores: int = 30) -> dict[str, str]:
    """Run the probe pod to completion; what it printed, parsed."""
    world.create(gpu_pod(name, memory, cores, PROBE, world.devices))
    assert world.wait_phase(name, ("Succeeded", "Failed")) == "Succeeded", world.diagnose(name)
    out = world.logs(name)
    world.delete(name)
    return probe_facts(out)


def assigned_card(pod: dict[str, Any]) -> str:
    text = pod["metadata"]["annotations"][annotations.ASSIGNMENT]
    a = decode_assignment(pod["metadata"]["name"], text)
    return a.containers[0].slices[0].uuid


def test_a_gpu_pod_sees_exactly_its_slice(world: RealWorld) -> None:
    facts = probe(world, "slice-a", memory=1000)
    assert facts["rc"] == "0"
    assert facts["total_mib"] == "1000" and facts["filled"] == "1000" and facts["oom"] == "1"
    assert facts["limits"] == "read-only"
    assert facts["preload"] == "/usr/local/tessera/lib/libvgpu.so"
    assert facts["visible"] == facts["uuid"]
    assert facts["uuid"] in {c.uuid for c in CARDS}


def test_a_tenant_past_its_cap_is_killed_by_the_backstop(world: RealWorld) -> None:
    # The tenant zeroes its usage region between allocations, so libvgpu lets it allocate
    # its cap again and again; the agent sees the driver's per-process figure and kills it.
    # Three tenants in a row: each is pid 1 of its container, and a new container's pid
    # namespace may get the inode of the last one's, which must not hide it.
    cap, rounds = 256, 6
    script = f"exec tool_bypass /var/run/tessera/usage/region {cap} {rounds}"
    for i in range(3):
        name = f"bypass-{i}"
        world.create(gpu_pod(name, cap, 20, script, world.devices))
        assert world.wait_phase(name, ("Succeeded", "Failed"), timeout=60) == "Failed"
        pod = world.pod(name)
        state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert state["exitCode"] == 137, state  # SIGKILL
        assert "bypassed" in world.logs(name)
        [event] = [e for e in world.events(name) if e["reason"] == "TesseraMemoryBackstop"]
        message = event["message"]
        assert "container 'main'" in message and f"{cap * rounds} MiB" in message
        assert f"cap of {cap} MiB" in message and "killed pid" in message
        assert event["type"] == "Warning"
        world.delete(name)
    # The card is usable by the next pod, with its own limits.
    assert probe(world, "after-bypass", memory=700)["total_mib"] == "700"


def slot_of(world: RealWorld, name: str, container: str = "main") -> str:
    statuses = world.pod(name)["status"].get("containerStatuses", [])
    status = next(s for s in statuses if s["name"] == container)
    [resource] = status["allocatedResourcesStatus"][0]["resources"]
    return str(resource["resourceID"])


def test_pods_through_the_same_slot_each_start_with_their_own_limits(world: RealWorld) -> None:
    # Short jobs one after another, at the agent's default cleanup settings: kubelet hands
    # the slot a finished pod had to the next pod at once.
    slots = []
    for i, mib in enumerate((300, 900, 500, 1200)):
        name = f"job-{i}"
        world.create(gpu_pod(name, mib, 10, PROBE, world.devices))
        assert world.wait_phase(name, ("Succeeded", "Failed")) == "Succeeded", world.diagnose(name)
        slots.append(slot_of(world, name))
        out = world.logs(name)
        assert f"total_mib={mib} " in out and f"ok={mib} oom=1" in out, out
        world.delete(name)
    assert len(set(slots)) < len(slots), slots  # a slot was reused


def test_init_container_and_a_restarted_container_keep_their_own_limits(
    world: RealWorld,
) -> None:
    # The init container's slot is handed on to the app container (kubelet does that);
    # the app container fails once and is restarted (PreStartContainer again).
    once = "if [ ! -e /scratch/once ]; then touch /scratch/once; exit 1; fi; "
    pod = gpu_pod(
        "init-restart", 800, 20, once + PROBE, world.devices,
        restart="OnFailure", init_script=PROBE, init_memory=400,
    )  # fmt: skip
    for c in (*pod["spec"]["initContainers"], *pod["spec"]["containers"]):
        c["volumeMounts"].append({"name": "scratch", "mountPath": "/scratch"})
    pod["spec"]["volumes"].append({"name": "scratch", "emptyDir": {}})
    world.create(pod)
    assert world.wait_phase("init-restart", ("Succeeded", "Failed")) == "Succeeded", world.diagnose(
        "init-restart"
    )
    status = world.pod("init-restart")["status"]
    assert status["containerStatuses"][0]["restartCount"] == 1
    assert "total_mib=400 " in world.logs("init-restart", "setup")
    main = world.logs("init-restart", "main")
    assert "total_mib=800 " in main and "ok=800 oom=1" in main, main
    world.delete("init-restart")


def test_restarts_of_kubelet_agent_and_containerd_lose_nothing(world: RealWorld) -> None:
    # A running container starts a new process every half second, each reading its limits
    # afresh; kubelet, the agent and containerd restart under it, and new pods arrive.
    loop = (
        "while true; do if tool_slice >/dev/null; then echo good; else echo BAD; fi; "
        "sleep 0.5; done"
    )
    world.create(gpu_pod("steady", 600, 20, loop, world.devices))
    world.wait_phase("steady", ("Running",))
    before = slot_of(world, "steady")
    registrations = world.agent.log().count("registered with kubelet as")
    world.node.restart_kubelet()
    world.wait_registered(registrations + 1)
    world.agent.stop()
    world.agent.start()
    world.wait_registered(registrations + 2)
    world.node.restart_containerd()
    probes = [probe(world, f"after-restarts-{i}", memory=mib) for i, mib in enumerate((450, 650))]
    assert [p["total_mib"] for p in probes] == ["450", "650"]
    assert world.phase("steady") == "Running", world.diagnose("steady")
    assert slot_of(world, "steady") == before
    # A second long-running pod beside it after the restarts: never the same slot.
    world.create(gpu_pod("steady-2", 600, 20, loop, world.devices))
    world.wait_phase("steady-2", ("Running",))
    assert slot_of(world, "steady-2") != before
    wait_for("steady-2 to check its limits", lambda: "good" in world.logs("steady-2"), 30)
    lines = world.logs("steady").split()
    assert lines.count("good") >= 4 and "BAD" not in lines, lines[-20:]
    assert "BAD" not in world.logs("steady-2").split()
    for name in ("steady", "steady-2"):
        world.delete(name)
    for name in ("steady", "steady-2"):
        world.wait_phase(name, ("Gone",), timeout=60)


@pytest.mark.parametrize(
    ("annotation", "rule"),
    [
        ("not json", "tessera.io/assignment"),
        (None, "was not placed by the Tessera scheduler"),
        ("foreign", "stale"),
    ],
    ids=["malformed", "missing", "other-node"],
)
def test_a_pod_with_a_bad_assignment_never_starts_and_is_told_why(
    world: RealWorld, annotation: str | None, rule: str
) -> None:
    name = f"bad-{rule.split()[0].replace('.', '-').replace('/', '-')}"
    pod = gpu_pod(name, 500, 10, PROBE, world.devices)
    pod["spec"].pop("schedulerName")
    pod["spec"]["nodeName"] = NODE  # past the scheduler, straight to the kubelet
    if annotation == "foreign":
        a = Assignment(
            node="gpu-elsewhere",
            containers=(ContainerAssignment("main", (CardSlice(CARDS[0].uuid, 500, 10),)),),
        )
        annotation = encode_assignment(a)
    if annotation is not None:
        pod["metadata"]["annotations"] = {annotations.ASSIGNMENT: annotation}
    world.create(pod)
    assert world.wait_phase(name, ("Failed", "Succeeded"), timeout=60) == "Failed"
    status = world.pod(name)["status"]
    assert status.get("reason") == "UnexpectedAdmissionError", status
    assert rule in status.get("message", ""), status
    events = [e for e in world.events(name) if e["reason"] == "TesseraAllocateFailed"]
    assert events and rule in events[0]["message"] and name in events[0]["message"]
    world.delete(name)
    world.wait_phase(name, ("Gone",), timeout=60)
    assert probe(world, "after-bad-input", memory=321)["total_mib"] == "321"
